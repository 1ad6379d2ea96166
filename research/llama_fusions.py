"""Three fusions of the Llama decoder layer, as patches of transformers' forwards (issue 31's 10 ms).

Why: `tilewise bench llama` at 768d022 (H200, 4 x 4096 tokens a step) has hf_tilewise 2 % under
1.05x Liger. The step profile (bench/results/logs/llama-step-profile-c0709cc.log) has 113 bf16 add
kernels a step (5.54 ms, 7 a layer, at ~4 TB/s: they are cheap each and many) that no kernel of
ours or Liger's absorbs: two residual adds forward, their two gradient sums backward, and three sums
of input gradients (dX of q / k / v: two; of gate / up: one, or a beta = 1 GEMM). Each fusion here
removes some of them:

    add_norm      the residual add before post_attention_layernorm and the norm, one kernel a
                  direction (`add_rms_norm`): forward reads x and r, writes the sum and y; backward
                  adds the residual path's gradient into dx. Per layer one add forward and one
                  gradient sum backward go; the kernel gains one read and one write forward and one
                  read backward. Predicted: -1.0 to -1.5 ms a step.
    add_norm_next the same for the MLP's residual add and the *next* layer's input_layernorm (the
                  model's final norm after the last layer): the layer hands its normed output to the
                  next one (identity-checked, else the next layer norms as usual). With add_norm no
                  residual add or residual gradient sum is left. Predicted: another -1.0 to -1.5 ms.
    qkv           one projection GEMM for q, k and v (weights concatenated each step, 12 MiB), one
                  RoPE launch over the fused output, and a backward that writes dq, dk (RoPE's
                  transposed rotation) and dv into one (tokens, q + 2 kv) gradient: one dX GEMM with
                  K = 3072 instead of three and two adds, one dW GEMM instead of three. Predicted:
                  -1.5 to -3 ms. Arithmetic at 4 x 4096 a layer: backward dX 3 GEMMs (~0.33 ms at
                  ~650 TFLOP/s) + 2 adds (~0.1 ms) -> 1 GEMM (~0.31 ms) + dv's copy (~0.01 ms):
                  ~-0.13 ms; forward and dW ~-0.01 each: ~-2.3 ms a step.
    gate_up       one GEMM for gate and up (weights concatenated each step, 64 MiB a layer: ~0.5 ms
                  a step that fused parameters would not pay), SwiGLU on the two halves of each row,
                  its backward writing one (tokens, 2 x intermediate) gradient: one dX GEMM with
                  K = 16384 (no beta = 1 pass over dX), one dW GEMM. Predicted: -0.5 to +0.5 ms
                  (its GEMMs are large and near peak already; the weights' copy costs ~0.03 ms a
                  layer, the beta = 1 read of dX it saves ~0.02 ms).

On the GPU (~2 min; with `research/llama_step_ceilings.py`, which times each of them in one run):
    PYTHONPATH=src python3 research/llama_fusions.py --check          # small model, fp32 and bf16
On the CPU (Triton's interpreter, attention through the fp32 reference):
    TRITON_INTERPRET=1 PYTHONPATH=src python3 research/llama_fusions.py --check

These patches are research: the integration (`apply_tilewise`) does none of this yet.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import tilewise
from tilewise import apply_rotary_qkv
from tilewise.settings import triton_interpret
from tilewise.runtime.triton_launch import launch as _launch

# The residual add + RMSNorm and the q / k / v RoPE are the library's (tilewise.add_rms_norm,
# tilewise.apply_rotary_qkv); the patches below only wire them into the decoder.


def add_rms_norm(x, residual, weight, eps):
    calls["add_norm"] += 1
    return tilewise.add_rms_norm(x, residual, weight, eps)


def _attend(impl):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama import modeling_llama as ml

    return ml.eager_attention_forward if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]


def _attention_forward(original):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        if any(kwargs.get(n) is not None for n in ("cache", "past_key_values")) or position_embeddings is None:
            return original(self, hidden_states, position_embeddings=position_embeddings,
                            attention_mask=attention_mask, **kwargs)
        for n in ("cache", "past_key_values", "cache_position", "use_cache"):
            kwargs.pop(n, None)
        p = (self.q_proj, self.k_proj, self.v_proj)
        w = torch.cat([m.weight for m in p])
        b = torch.cat([m.bias for m in p]) if p[0].bias is not None else None
        qkv = F.linear(hidden_states, w, b)
        calls["qkv"] += 1
        D = self.head_dim
        H, Hkv = self.q_proj.out_features // D, self.k_proj.out_features // D
        cos, sin = position_embeddings
        q, k, v = apply_rotary_qkv(qkv, cos, sin, H, Hkv)
        dropout = self.attention_dropout if self.training else 0.0
        out, weights = _attend(self.config._attn_implementation)(self, q, k, v, attention_mask, dropout=dropout,
                                                                 scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights

    return forward


# --------------------------------------------------------------------------- gate and up: one GEMM


@triton.jit
def _swiglu_halves_kernel(GU, DY, Y, DGU, I, nblk, BLOCK: tl.constexpr, BACKWARD: tl.constexpr):
    # row r of GU is [gate (I), up (I)]; y[r] = silu(gate) * up; backward writes [dgate, dup] into DGU
    pid = tl.program_id(0)
    r = (pid // nblk).to(tl.int64)
    c = (pid % nblk) * BLOCK + tl.arange(0, BLOCK)
    m = c < I
    g = tl.load(GU + r * 2 * I + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + r * 2 * I + I + c, mask=m, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    if BACKWARD:
        dy = tl.load(DY + r * I + c, mask=m, other=0.0).to(tl.float32)
        tl.store(DGU + r * 2 * I + c, (dy * u * sig * (1.0 + g * (1.0 - sig))).to(DGU.dtype.element_ty), mask=m)
        tl.store(DGU + r * 2 * I + I + c, (dy * g * sig).to(DGU.dtype.element_ty), mask=m)
    else:
        tl.store(Y + r * I + c, (g * sig * u).to(Y.dtype.element_ty), mask=m)


SWIGLU_BLOCK = 1024  # 8 bf16 a thread at 4 warps: 16-byte accesses


def _swiglu_halves_run(gu, dy=None):
    T, I2 = gu.shape
    inter = I2 // 2
    nblk = triton.cdiv(inter, SWIGLU_BLOCK)
    if dy is None:
        y = torch.empty((T, inter), dtype=gu.dtype, device=gu.device)
        _launch(_swiglu_halves_kernel, (T * nblk,), gu, gu, y, y, inter, nblk, BLOCK=SWIGLU_BLOCK,
                BACKWARD=False, num_warps=4)
        return y
    dgu = torch.empty_like(gu)
    _launch(_swiglu_halves_kernel, (T * nblk,), gu, dy, dy, dgu, inter, nblk, BLOCK=SWIGLU_BLOCK,
            BACKWARD=True, num_warps=4)
    return dgu


class _SwiGLUHalves(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gu):
        gu2 = gu.reshape(-1, gu.shape[-1]).contiguous()
        ctx.save_for_backward(gu2)
        ctx.shape = gu.shape
        return _swiglu_halves_run(gu2).view(*gu.shape[:-1], gu.shape[-1] // 2)

    @staticmethod
    def backward(ctx, dy):
        (gu2,) = ctx.saved_tensors
        return _swiglu_halves_run(gu2, dy.reshape(gu2.shape[0], -1).contiguous()).view(ctx.shape)


def _mlp_forward(self, x):
    w = torch.cat([self.gate_proj.weight, self.up_proj.weight])
    b = torch.cat([self.gate_proj.bias, self.up_proj.bias]) if self.gate_proj.bias is not None else None
    gu = F.linear(x, w, b)
    calls["gate_up"] += 1
    if gu.device.type == "cpu" and not triton_interpret():
        g, u = gu.chunk(2, -1)
        return self.down_proj(F.silu(g) * u)
    return self.down_proj(_SwiGLUHalves.apply(gu))


# --------------------------------------------------------------------------- the decoder layer


def _decoder_forward(handoff: dict | None):
    """LlamaDecoderLayer.forward with the post-attention residual add fused into its norm; with
    ``handoff`` (a dict shared by the model's layers) the MLP's residual add fused into the next
    layer's input norm too (``self._tw_next``: that norm's module)."""

    def forward(self, hidden_states, **kwargs):
        pre = handoff.pop(id(self), None) if handoff is not None else None
        if pre is not None and pre[0] is hidden_states:
            h = pre[1]
        else:
            h = self.input_layernorm(hidden_states)
        h, _ = self.self_attn(hidden_states=h, **kwargs)
        norm = self.post_attention_layernorm
        h, residual = add_rms_norm(h, hidden_states, norm.weight, norm.variance_epsilon)
        h = self.mlp(h)
        nxt = getattr(self, "_tw_next", None) if handoff is not None else None
        if nxt is None:
            return residual + h
        owner, nnorm = nxt
        y, s = add_rms_norm(h, residual, nnorm.weight, nnorm.variance_epsilon)
        handoff[id(owner)] = (s, y)
        return s

    return forward


class _HandoffNorm(torch.nn.Module):
    """The model's final norm, taking the last layer's handed-off output when it matches."""

    def __init__(self, norm, handoff):
        super().__init__()
        self.norm = norm
        self._handoff = handoff

    @property
    def weight(self):
        return self.norm.weight

    @property
    def variance_epsilon(self):
        return self.norm.variance_epsilon

    def forward(self, hidden_states):
        pre = self._handoff.pop(id(self), None)
        return pre[1] if pre is not None and pre[0] is hidden_states else self.norm(hidden_states)


def apply_fusions(model, *, add_norm=False, add_norm_next=False, qkv=False, gate_up=False):
    """Patch ``model`` (a LlamaForCausalLM after ``apply_tilewise``) in place; the class forwards for
    attention and MLP (module globals of transformers, as the bench's snapshot restores them), the
    decoder layers' forward per instance."""
    import types

    from transformers.models.llama import modeling_llama as ml

    if qkv:
        ml.LlamaAttention.forward = _attention_forward(ml.LlamaAttention.forward)
    if gate_up:
        for m in model.modules():
            if hasattr(m, "gate_proj") and hasattr(m, "up_proj") and hasattr(m, "down_proj"):
                m.forward = types.MethodType(_mlp_forward, m)
    if add_norm or add_norm_next:
        layers = list(model.model.layers)
        handoff = {} if add_norm_next else None
        if add_norm_next:
            model.model.norm = _HandoffNorm(model.model.norm, handoff)
            for i, layer in enumerate(layers):
                nxt = layers[i + 1] if i + 1 < len(layers) else model.model.norm
                norm = nxt.input_layernorm if i + 1 < len(layers) else nxt.norm
                object.__setattr__(layer, "_tw_next", (nxt, norm))  # not a submodule: no state-dict keys
        for layer in layers:
            layer.forward = types.MethodType(_decoder_forward(handoff), layer)
    return model


# --------------------------------------------------------------------------- check


calls = {"add_norm": 0, "qkv": 0, "gate_up": 0}  # the check's proof that a patch ran


def _check(device, dtype, variants):
    import transformers

    import tilewise.integrations.transformers as tw_hf
    from tilewise.ops.attention.reference import reference as attention_reference

    if device == "cpu":
        tw_hf._attention = attention_reference
    from tilewise.bench.suites import llama as L

    config = transformers.LlamaConfig(vocab_size=211, hidden_size=96, intermediate_size=200, num_hidden_layers=3,
                                      num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=256, attention_dropout=0.0, tie_word_embeddings=True,
                                      use_cache=False)
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)
    with torch.no_grad():
        for n, p in base.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    ids = torch.randint(0, config.vocab_size, (2, 77), generator=torch.Generator().manual_seed(1)).to(device)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    ok = True

    def run(fusions):
        from tilewise.integrations.transformers import apply_tilewise

        snap = L._snapshot()
        calls.update(dict.fromkeys(calls, 0))
        try:
            model = apply_tilewise(copy.deepcopy(base)).train()
            apply_fusions(model, **fusions)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            used = {k for k, v in calls.items() if v}
            want = {k for k in ("add_norm", "qkv", "gate_up") if fusions.get(k)}
            if used != want:
                raise AssertionError(f"fusions {sorted(want)} asked for, {sorted(used)} ran")
            return float(loss), {n.replace("norm.norm.", "norm."): p.grad.float()
                                 for n, p in model.named_parameters() if p.grad is not None}
        finally:
            L._restore(snap)

    ref_loss, ref_grads = run({})
    print(f"  {device} {str(dtype)[6:]}: unfused loss {ref_loss:.6f}", flush=True)
    for name, fusions in variants.items():
        loss, grads = run(fusions)
        worst = max(float((grads[n] - g).norm() / g.norm().clamp_min(1e-12)) for n, g in ref_grads.items())
        missing = set(ref_grads) - set(grads)
        good = abs(loss - ref_loss) <= tol * abs(ref_loss) and worst <= tol and not missing
        ok &= good
        print(f"  {device} {str(dtype)[6:]:<9} {name:<14} loss {loss:.6f}  "
              f"worst grad rel. err. {worst:.2e}{'  MISSING ' + str(missing) if missing else ''}  "
              f"{'ok' if good else 'FAIL'}", flush=True)
    return ok


VARIANTS = {"add_norm": dict(add_norm=True), "add_norm_next": dict(add_norm=True, add_norm_next=True),
            "qkv": dict(qkv=True), "gate_up": dict(gate_up=True),
            "all": dict(add_norm=True, add_norm_next=True, qkv=True, gate_up=True)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="each fusion against the unfused model: loss and every grad")
    a = p.parse_args(argv)
    if not a.check:
        p.print_help()
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not triton_interpret():
        sys.exit("on the CPU run it under TRITON_INTERPRET=1 (the kernels run in Triton's interpreter)")
    ok = _check(device, torch.float32, VARIANTS)
    if device == "cuda":
        ok &= _check(device, torch.bfloat16, VARIANTS)
    print("llama_fusions check:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
