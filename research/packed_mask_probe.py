"""Question: what does this machine's transformers hand a mask builder for packed sequences (position_ids
that restart, no attention_mask)? The packed-documents patch recognised 5.25's structure on the CPU host
and found none on the H200 machine. Prints the version and the mask function's closures, two levels down.

    python research/packed_mask_probe.py
"""
import torch
import transformers
from transformers import masking_utils

print("transformers", transformers.__version__)
seen = {}


def builder(batch_size, **kw):
    seen.update(kw)
    return None


masking_utils.AttentionMaskInterface.register("probe", builder)
transformers.modeling_utils.AttentionInterface.register("probe", lambda m, q, k, v, mask, **kw: (
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2), None))
config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1)
model = transformers.LlamaForCausalLM(config)
model.set_attn_implementation("probe")
pos = torch.cat([torch.arange(5), torch.arange(4)])[None]
model(torch.randint(0, 50, (1, 9)), position_ids=pos, use_cache=False)


def show(fn, depth=0):
    code = getattr(fn, "__code__", None)
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ()))) if code else {}
    print("  " * depth, getattr(fn, "__qualname__", fn), {k: type(v).__name__ for k, v in cells.items()})
    if depth < 3:
        for v in cells.values():
            for f in (v if isinstance(v, tuple) else (v,)):
                if callable(f) and hasattr(f, "__code__"):
                    show(f, depth + 1)


print({k: (type(v).__name__ if not isinstance(v, (int, str, bool)) else v) for k, v in seen.items()})
show(seen.get("mask_function"))
