"""tilewise.integrations.transformers: the "tilewise" attention implementation, its mask builder and
apply_tilewise, against transformers' own SDPA / eager paths on small random models.

On the CPU the attention call is the fp32 reference (same keywords as flash_attention) and RMSNorm,
RoPE and SwiGLU run in Triton's interpreter; on the GPU every kernel is the real one."""

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tilewise.integrations.transformers as tw_hf  # noqa: E402
from transformers import masking_utils  # noqa: E402
from tilewise.ops.attention.reference import reference as attention_reference  # noqa: E402

VOCAB = 97


def _config(family="llama", **kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    base.update(kw)
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config}[family]
    return cls(**base)


def _model(config, impl, device="cpu", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl)
    with torch.no_grad():  # non-trivial norm weights: a swapped norm that drops them shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model.to(device=device, dtype=dtype).eval()


def _pair(config, device="cpu", dtype=torch.float32):
    ref = _model(config, "sdpa", device, dtype)
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(tw_hf.NAME)
    return ref, ours


@pytest.fixture
def cpu_attention(monkeypatch):
    """The attention calls the reference and records the keywords of each call."""
    calls = []

    def fake(q, k, v, **kw):
        calls.append({n: (tuple(t.shape) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()})
        return attention_reference(q, k, v, **kw)

    monkeypatch.setattr(tw_hf, "_attention", fake)
    return calls


def _ids(B, S, seed=1, device="cpu"):
    return torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(seed)).to(device)


def _assert_grads_close(ours, ref, rel_tol):
    """Every parameter gradient of ``ours`` within ``rel_tol`` of ``ref``'s, as the relative error of the
    whole tensor (bf16 noise on the GPU)."""
    for (n, p), q in zip(ours.named_parameters(), ref.parameters()):
        rel = (p.grad.float() - q.grad.float()).norm() / q.grad.float().norm().clamp_min(1e-12)
        assert rel < rel_tol, (n, rel.item())


def _same_training(ref, ours, lr, lo, rtol, atol):
    """The two models' losses (``lr``, ``lo``: their outputs) and, after backward, every parameter's
    gradient equal within (rtol, atol)."""
    torch.testing.assert_close(lo.loss, lr.loss, rtol=rtol, atol=atol)
    lr.loss.backward()
    lo.loss.backward()
    for (n, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=10 * rtol, atol=atol, msg=n)


def test_registered():
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    assert AttentionInterface._global_mapping[tw_hf.NAME] is tw_hf.attention_forward
    assert AttentionMaskInterface._global_mapping[tw_hf.NAME] is tw_hf.mask_builder
    assert AttentionInterface._global_mapping[tw_hf.AUTO_NAME] is tw_hf.auto_attention_forward
    assert AttentionMaskInterface._global_mapping[tw_hf.AUTO_NAME] is tw_hf.mask_builder


def test_prefer_sdpa_rules():
    from tilewise.ops.attention.configs import SDPA_RULES, prefer_sdpa

    h200 = (9, 0)
    assert all(prefer_sdpa(h200, D, S, c, True) for D in (64, 128) for c in (False, True) for S in (1024, 16384))
    # D 64 causal forward + backward: ours between 4096 and 16384 only
    assert [prefer_sdpa(h200, 64, S, True, True) for S in (2048, 4096, 8192, 16383, 16384)] == [
        True, False, False, False, True]
    assert prefer_sdpa(h200, 64, 8192, False, True)
    assert prefer_sdpa(h200, 64, 4096, True, False) and not prefer_sdpa(h200, 64, 8192, True, False)
    assert prefer_sdpa(h200, 128, 16384, False, False)
    assert not prefer_sdpa(h200, 96, 4096, True, True)  # a head dim not measured: flash_attention
    assert not prefer_sdpa((8, 0), 64, 4096, True, True)  # a GPU not measured: flash_attention
    assert all(v is None or (min(v) > 0 and v[0] < v[1] if isinstance(v, tuple) else v > 0)
               for v in SDPA_RULES.values())


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Records the calls "tilewise_auto" gives to SDPA (the real function runs)."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append(dict(kw, shape=tuple(q.shape)))
        return real(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def test_auto_attention_routes_by_the_rules(cpu_attention, sdpa_calls, monkeypatch):
    """On a GPU the rules cover (here: an H200's capability given to the CPU tensors), a plain training
    call at head dim 64 goes to SDPA, as does an inference one below S 8192; a padded batch, and any
    call on a device without rules, goes to flash_attention. Logits agree with the model's own SDPA."""
    config = _config(hidden_size=256, intermediate_size=320, num_attention_heads=4, num_key_value_heads=2)
    ref = _model(config, "sdpa", dtype=torch.bfloat16)
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(tw_hf.AUTO_NAME)
    ids = _ids(2, 12)
    with torch.no_grad():
        want = ref(ids).logits.float()
    del sdpa_calls[:]
    with torch.no_grad():  # the CPU has no rules: flash_attention (here its reference)
        got = ours(ids).logits.float()
    assert len(cpu_attention) == 2 and not sdpa_calls
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)

    monkeypatch.setattr(tw_hf, "_capability", lambda device: (9, 0))
    del cpu_attention[:]
    with torch.no_grad():
        got = ours(ids).logits.float()
    assert not cpu_attention and len(sdpa_calls) == 2
    assert all(c["is_causal"] and c["enable_gqa"] and c["shape"] == (2, 4, 12, 64) for c in sdpa_calls)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)

    del sdpa_calls[:]
    ours.train()
    ours(ids, labels=ids).loss.backward()  # gradients follow: the forward + backward rule
    assert not cpu_attention and len(sdpa_calls) == 2

    del sdpa_calls[:]
    am = torch.ones_like(ids)
    am[0, :3] = 0
    with torch.no_grad():
        ours(ids, attention_mask=am)
    assert len(cpu_attention) == 2 and not sdpa_calls  # padding: flash_attention's key mask


def test_apply_tilewise_attention_keyword(monkeypatch):
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    for value, impl in (("auto", tw_hf.AUTO_NAME), (True, tw_hf.NAME), (False, "sdpa")):
        model = tw_hf.apply_tilewise(_model(_config(), "sdpa"), attention=value)
        assert model.config._attn_implementation == impl
    assert tw_hf.apply_tilewise(_model(_config(), "sdpa")).config._attn_implementation == tw_hf.AUTO_NAME
    with pytest.raises(ValueError, match="'attention'"):
        tw_hf.apply_tilewise(_model(_config(), "sdpa"), attention="sdpa")


def test_unpadded_causal_gets_no_mask(cpu_attention):
    ref, ours = _pair(_config())
    ids = _ids(2, 11)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    assert cpu_attention and all(c["causal"] and "mask" not in c and "bias" not in c for c in cpu_attention)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_is_a_key_mask(cpu_attention, side):
    """The padded batch's logits equal SDPA's at every real token; the kernel gets a (B, 1, 1, Sk)
    key mask, never an (Sq, Sk) one (without the mask builder the padding would be ignored)."""
    ref, ours = _pair(_config())
    B, S = 3, 13
    ids = _ids(B, S)
    am = torch.ones(B, S, dtype=torch.long)
    for b, n in enumerate((0, 4, 9)):  # tokens of padding per row
        if n:
            (am[b, :n] if side == "left" else am[b, S - n:]).zero_()
    with torch.no_grad():
        a, r = ours(ids, attention_mask=am).logits, ref(ids, attention_mask=am).logits
    keep = am.bool()
    torch.testing.assert_close(a[keep], r[keep], rtol=1e-4, atol=1e-4)
    assert all(c["mask"] == (B, 1, 1, S) and c["causal"] for c in cpu_attention)


def test_generation_with_cache_is_bottom_right(cpu_attention):
    """Greedy generation over a dynamic KV cache, left-padded prompt: the same tokens as SDPA; the
    steps after the prompt run causal with bottom-right alignment (one query, every cached key)."""
    ref, ours = _pair(_config())
    ids = _ids(2, 9)
    am = torch.ones_like(ids)
    am[1, :3] = 0
    kw = dict(attention_mask=am, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kw), ref.generate(ids, **kw))
    steps = [c for c in cpu_attention if c.get("align") == "bottom_right"]
    assert len(steps) == 2 * 5  # 2 layers x the 5 steps after the prompt


def test_sliding_window_is_a_window(cpu_attention):
    config = _config("mistral", sliding_window=4)
    ref, ours = _pair(config)
    ids = _ids(2, 15)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    assert all(c["window"] == (3, 0) and "mask" not in c for c in cpu_attention)


@pytest.fixture
def cpu_varlen(monkeypatch):
    """The packed path's varlen attention runs its reference (the CPU rule) and records each call's
    offsets and keywords; transformers' dense SDPA mask builder raises."""
    from tilewise.ops.attention.varlen import reference as varlen_reference

    calls = []

    def fake(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        calls.append({"cu": cu_q.tolist(), "max": max_q, "shape": tuple(q.shape), **kw})
        assert cu_q is cu_k and max_q == max_k
        kw.pop("check_seqlens")
        return varlen_reference(q, k, v, cu_q, cu_k, **kw)

    def dense(*a, **k):
        raise AssertionError("a dense mask was built for packed sequences")

    monkeypatch.setattr(tw_hf, "_attention_varlen", fake)
    monkeypatch.setattr(tw_hf.masking_utils, "sdpa_mask", dense)
    return calls


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_packed_sequences_run_as_varlen_documents(family, cpu_attention, cpu_varlen):
    """position_ids that restart in each row (packed documents, no attention_mask; Mistral with its sliding
    window): each row's documents reach flash_attention_varlen as sequences (offsets over the two rows,
    no dense mask), and the logits and every gradient equal transformers' own SDPA model's."""
    config = _config(family, **({"sliding_window": 3} if family == "mistral" else {}))
    ref, ours = _pair(config)
    ids = _ids(2, 14)
    pos = torch.stack([torch.cat([torch.arange(5), torch.arange(6), torch.arange(3)]),
                       torch.cat([torch.arange(9), torch.arange(5)])])
    got = ours(ids, position_ids=pos, use_cache=False).logits  # (use_cache=False: packing is looked for
    want = ref(ids, position_ids=pos, use_cache=False).logits  # only without a cache)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        causal = ref(ids, position_ids=pos, use_cache=True).logits  # packing not seen: one causal sequence
    assert not torch.allclose(causal[0, 5:], want[0, 5:], atol=1e-3)  # the packing changes the answer
    assert not cpu_attention and len(cpu_varlen) == 2  # one call a layer, none dense
    window = (2, 0) if family == "mistral" else None
    assert all(c["cu"] == [0, 5, 11, 14, 23, 28] and c["max"] == 9 and c["shape"] == (28, 4, 16)
               and c["causal"] and c["window"] == window for c in cpu_varlen)
    got.square().mean().backward()
    want.square().mean().backward()
    for (name, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_packed_documents_under_graph_capture_take_a_dense_mask(cpu_attention, cpu_varlen, monkeypatch):
    """While a CUDA graph is captured (no host reads: no offsets) the documents become a dense
    same-document mask with causal (and the window): the same logits, and no varlen call."""
    monkeypatch.setattr(tw_hf, "_capturing", lambda t: True)
    ref, ours = _pair(_config())
    ids = _ids(2, 14)
    pos = torch.stack([torch.cat([torch.arange(5), torch.arange(6), torch.arange(3)]),
                       torch.cat([torch.arange(9), torch.arange(5)])])
    with torch.no_grad():
        got = ours(ids, position_ids=pos, use_cache=False).logits
        want = ref(ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not cpu_varlen and len(cpu_attention) == 2
    assert all(c["mask"] == (2, 1, 14, 14) and c["causal"] for c in cpu_attention)


def test_document_offsets_are_computed_once_a_forward(cpu_attention, cpu_varlen, monkeypatch):
    """Every layer of a forward shares the document ids: one host copy (the longest length) a forward;
    a new batch of ids, and a change to the same tensor, are read again."""
    reads = []
    nonzero = torch.Tensor.nonzero
    monkeypatch.setattr(torch.Tensor, "nonzero", lambda self, *a, **k: reads.append(1) or nonzero(self, *a, **k))
    docs = torch.tensor([[0, 0, 1, 1, 1, 2]])
    first = tw_hf._document_offsets(docs)
    assert tw_hf._document_offsets(docs) is first and len(reads) == 1
    assert first[0].tolist() == [0, 2, 5, 6] and first[1] == 3 and first[0].dtype == torch.int32
    docs[0, 5] = 1  # the same tensor, changed: its version moved
    assert tw_hf._document_offsets(docs)[0].tolist() == [0, 2, 6] and len(reads) == 2
    assert tw_hf._document_offsets(torch.tensor([[0, 1]]))[0].tolist() == [0, 1, 2] and len(reads) == 3


def test_other_mask_functions_stay_dense(cpu_attention):
    """Only transformers' packed-sequence mask (over causal or sliding causal) becomes documents: a mask
    function of another shape, and one whose base is not causal, are not read as documents."""
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    ids = masking_utils.find_packed_sequence_indices(pos)
    packed = masking_utils.and_masks(masking_utils.remap_positions_for_packed_sequence(
        masking_utils.causal_mask_function, pos), masking_utils.packed_sequence_mask_function(ids))
    assert tw_hf._packed_documents(packed) is ids
    # transformers 5.17 (the H200 machine's): the same without the positions' remap
    assert tw_hf._packed_documents(masking_utils.and_masks(
        masking_utils.causal_mask_function, masking_utils.packed_sequence_mask_function(ids))) is ids
    bidirectional = masking_utils.and_masks(masking_utils.remap_positions_for_packed_sequence(
        masking_utils.bidirectional_mask_function, pos), masking_utils.packed_sequence_mask_function(ids))
    extra = masking_utils.and_masks(packed, masking_utils.causal_mask_function)
    for fn in (bidirectional, extra, masking_utils.causal_mask_function,
               masking_utils.and_masks(masking_utils.causal_mask_function, masking_utils.causal_mask_function)):
        assert tw_hf._packed_documents(fn) is None


def test_gemma2_softcap_and_sliding_layers(cpu_attention):
    """Gemma 2 (any model on transformers' attention interface takes attn_implementation="tilewise"):
    attention-logit softcap, its own scaling, alternating sliding-window layers; against eager."""
    config = transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
                                       attn_logit_softcapping=5.0, query_pre_attn_scalar=24)
    ref = _model(config, "eager")
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(tw_hf.NAME)
    ids = _ids(2, 13)
    am = torch.ones_like(ids)
    am[1, :5] = 0
    with torch.no_grad():
        got, want = ours(ids, attention_mask=am).logits, ref(ids, attention_mask=am).logits
    keep = am.bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-4, atol=1e-4)
    assert {c.get("window") for c in cpu_attention} == {(3, 0), None}
    assert all(c["softcap"] == 5.0 and c["scale"] == 24 ** -0.5 and c["mask"] == (2, 1, 1, 13) for c in cpu_attention)


def _span(q_length, kv_length, q_offset=0):
    # the query span as the installed transformers passes it (5.x: lengths; 4.5x: cache_position)
    import inspect

    from transformers.masking_utils import sdpa_mask

    if "q_length" in inspect.signature(sdpa_mask).parameters:
        return dict(q_length=q_length, kv_length=kv_length, q_offset=q_offset)
    return dict(cache_position=torch.arange(q_offset, q_offset + q_length), kv_length=kv_length)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_tilewise_attention_compiles(family, monkeypatch):
    """torch.compile of a model on attn_implementation="tilewise" (Mistral: a sliding window): the mask
    builder's look into transformers' mask functions crashed Dynamo (a closure cell it had read); now one
    graph, no break, and the loss of the eager model."""
    import torch._dynamo

    modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    kw = dict(sliding_window=5) if family == "mistral" else {}
    model = _model(_config(family, **kw), "sdpa").train()
    model.set_attn_implementation(tw_hf.NAME)
    ids = _ids(2, 16)
    want = model(input_ids=ids, labels=ids, use_cache=False).loss
    torch._dynamo.reset()
    e = torch._dynamo.explain(model)(input_ids=ids, labels=ids, use_cache=False)
    assert e.graph_break_count == 0 and e.graph_count == 1, [str(b.reason)[:200] for b in e.break_reasons]
    got = torch.compile(model, backend="eager")(input_ids=ids, labels=ids, use_cache=False).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_mask_builder_shapes():
    from transformers.masking_utils import causal_mask_function

    full = torch.ones(2, 6, dtype=torch.bool)
    assert tw_hf.mask_builder(2, **_span(6, 6), attention_mask=None) is None
    assert tw_hf.mask_builder(2, **_span(6, 6), attention_mask=full) is None
    pad = full.clone()
    pad[0, :2] = False
    assert torch.equal(tw_hf.mask_builder(2, **_span(6, 6), mask_function=causal_mask_function, attention_mask=pad),
                       pad)
    assert torch.equal(tw_hf.mask_builder(2, **_span(1, 6, 5), attention_mask=pad), pad)  # a cached step
    dense = tw_hf.mask_builder(2, **_span(2, 8, 3), attention_mask=None)  # a static cache's extra slots
    assert dense.shape == (2, 1, 2, 8) and dense.dtype == torch.bool
    assert dense[0, 0, 0].tolist() == [True] * 4 + [False] * 4


def test_autocast_over_fp32_weights(cpu_attention, monkeypatch):
    """transformers' Trainer with bf16=True: fp32 weights under autocast, so the attention's output is
    bf16 and the residual stream fp32. apply_tilewise's defaults raised there (add_rms_norm takes one
    dtype); now the residual adds run in the promoted dtype as transformers' layer does them, and the
    loss and gradients match the untouched model's under the same autocast (bf16 noise)."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    ref = _model(_config(), "sdpa").train()
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref))
    ids = _ids(2, 9)
    heads = []
    real = tw_hf.linear_cross_entropy
    monkeypatch.setattr(tw_hf, "linear_cross_entropy", lambda x, w, *a, **k: heads.append((x.dtype, w.dtype))
                        or real(x, w, *a, **k))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lr, lo = ref(ids, labels=ids, use_cache=False), ours(ids, labels=ids, use_cache=False)
    _same_training(ref, ours, lr, lo, rtol=2e-2, atol=2e-2)
    assert heads == [(torch.bfloat16, torch.bfloat16)]  # the lm head's GEMMs in autocast's dtype, not fp32


def test_tilewise_attention_under_autocast_over_fp32_weights(monkeypatch):
    """attn_implementation="tilewise" alone under autocast over fp32 weights: transformers' RoPE returns
    fp32 q and k beside a bf16 v, and flash_attention raised on the mixed dtypes; the hook casts them to
    autocast's dtype as autocast casts SDPA's inputs. flash_attention's own checks, then the reference
    (Triton's interpreter computes bf16 attention wrongly); loss against the model's own SDPA."""
    calls = []

    def checked(q, k, v, **kw):
        tw_hf.flash_attention(q[:, :, :0], k[:, :, :0], v[:, :, :0], **kw)  # its checks, on no rows
        calls.append({t.dtype for t in (q, k, v)})
        return attention_reference(q, k, v, **kw)

    monkeypatch.setattr(tw_hf, "_attention", checked)
    ref = _model(_config(), "sdpa").train()
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(tw_hf.NAME)
    ids = _ids(2, 9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lr, lo = ref(ids, labels=ids, use_cache=False), ours(ids, labels=ids, use_cache=False)
    _same_training(ref, ours, lr, lo, rtol=2e-2, atol=2e-2)
    assert calls and all(c == {torch.bfloat16} for c in calls)


def test_a_deep_copy_runs_its_own_weights(cpu_attention, monkeypatch):
    """copy.deepcopy of a patched model (TRL's reference models, EMA copies) must run the copy's
    weights: the patches held the original's modules in closures (the attention's own forward for the
    KV-cache path, the final norm's forward, the next layer's norm), so a copy mixed in the original's
    weights (logits off by 0.78 with a cache; the training loss too). The copy, its weights changed,
    against a plain model with those weights; the original unchanged."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    plain = _model(_config(), "sdpa")
    original = tw_hf.apply_tilewise(copy.deepcopy(plain))
    ids = _ids(2, 9)
    with torch.no_grad():
        before = original(ids).logits
    twin = copy.deepcopy(original)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.25)
    plain.load_state_dict(twin.state_dict())
    with torch.no_grad():  # eval with a KV cache: the attention's own forward
        torch.testing.assert_close(twin(ids).logits, plain(ids).logits, rtol=1e-4, atol=1e-4)
    twin.train()
    plain.train()
    _same_training(plain, twin, plain(ids, labels=ids, use_cache=False), twin(ids, labels=ids, use_cache=False),
                   rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(original(ids).logits, before)


def test_a_patched_model_is_freed_by_del(monkeypatch):
    """``del model`` frees a patched model without the cycle collector: its forwards were bound methods in
    the modules' ``__dict__`` (each holding its module), so the model was a reference cycle and its memory
    (on a GPU: its weights) stayed allocated until a collection; the llama bench counted a freed
    candidate's 2.3 GiB in the next one's peak. The classes keep their names, save_pretrained's too; a
    second apply_tilewise leaves them as they are (a subclass of the subclass sent the final norm's forward
    into itself)."""
    import gc
    import weakref

    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    model = tw_hf.apply_tilewise(_model(_config(), "sdpa"), residual_norm=True, fuse_qkv=True)
    assert type(model).__name__ == "LlamaForCausalLM" and isinstance(model, modeling.LlamaForCausalLM)
    assert type(model.model.layers[0]).__name__ == "LlamaDecoderLayer"
    assert "forward" not in vars(model) and "forward" not in vars(model.model.norm)
    tw_hf.apply_tilewise(model, residual_norm=True, fuse_qkv=True)  # again: no subclass of the subclass
    assert type(model.model.norm).__mro__[1] is type(model.model.norm)._tilewise_base
    x = torch.randn(2, 3, model.config.hidden_size)
    torch.testing.assert_close(model.model.norm(x), type(model.model.norm)._tilewise_base.forward(model.model.norm, x))
    refs = [weakref.ref(m) for m in (model, model.model.layers[0], model.model.norm)]
    enabled = gc.isenabled()
    gc.disable()
    try:
        del model
        assert [r() is None for r in refs] == [True] * len(refs)
    finally:
        if enabled:
            gc.enable()


def test_the_patched_forward_keeps_its_signature(monkeypatch):
    """transformers' Trainer keeps a dataset's columns by the names in ``inspect.signature(model.forward)``;
    the fused loss's forward showed ``(*args, labels=None, **kwargs)``, so the Trainer dropped input_ids."""
    import inspect

    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)  # undone after the test
    plain = _model(_config(), "sdpa")
    ours = tw_hf.apply_tilewise(copy.deepcopy(plain))
    assert inspect.signature(ours.forward) == inspect.signature(plain.forward)
    assert {"input_ids", "attention_mask", "labels"} <= set(inspect.signature(ours.forward).parameters)


def test_trainer_steps_match_the_unpatched_model(cpu_attention, monkeypatch, tmp_path):
    """Three optimizer steps of transformers' Trainer (default column filtering, gradient accumulation
    over two micro-batches, so num_items_in_batch) on apply_tilewise's model: the logged losses equal
    the unpatched model's (it raised "You must specify exactly one of input_ids or inputs_embeds")."""
    pytest.importorskip("accelerate")
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    rows = [{"input_ids": ids, "labels": ids} for ids in (_ids(1, 12, seed=i)[0] for i in range(16))]

    def losses(patch):
        model = _model(_config(), "sdpa")
        if patch:
            tw_hf.apply_tilewise(model)
        args = transformers.TrainingArguments(output_dir=str(tmp_path / str(patch)), per_device_train_batch_size=4,
                                              gradient_accumulation_steps=2, max_steps=3, learning_rate=1e-3,
                                              logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                                              seed=0, data_seed=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    want = losses(False)
    got = losses(True)
    assert len(got) == len(want) == 3
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-4)


def test_errors():
    module = torch.nn.Module()
    module.train()
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="dropout"):
        tw_hf.attention_forward(module, q, q, q, None, dropout=0.1)
    with pytest.raises(ValueError, match="'attention_mask' has shape"):
        tw_hf.attention_args(module, q, q, torch.ones(1, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="'model' must be a transformers PreTrainedModel"):
        tw_hf.apply_tilewise(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="hidden_act='silu'"):
        tw_hf.apply_tilewise(_model(_config(hidden_act="gelu"), "sdpa"))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB))
    with pytest.raises(ValueError, match="is not a Llama, Mistral, Qwen2 or Qwen3 model"):
        tw_hf.apply_tilewise(gpt2)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_apply_tilewise_swaps_layers_and_keeps_parameters(cpu_attention, family, monkeypatch):
    """Every RMSNorm and MLP is tilewise's, holding the very same Parameters (state dict unchanged);
    the logits (norm, rope, swiglu in Triton's interpreter) equal the untouched model's."""
    from tilewise.nn import RMSNorm, SwiGLU

    modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)  # undone after the test
    ref = _model(_config(family), "sdpa")
    ours = copy.deepcopy(ref)
    params = dict(ours.named_parameters())
    keys = list(ours.state_dict())
    assert tw_hf.apply_tilewise(ours) is ours
    assert dict(ours.named_parameters()).keys() == params.keys()
    assert all(p is params[n] for n, p in ours.named_parameters())
    assert list(ours.state_dict()) == keys
    norms = [m for m in ours.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all(isinstance(m, RMSNorm) for m in norms)
    assert sum(isinstance(m, SwiGLU) for m in ours.modules()) == 2
    assert modeling.apply_rotary_pos_emb is tw_hf.rotary_pos_emb
    ids = _ids(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    assert cpu_attention


def test_apply_tilewise_on_a_saved_and_reloaded_model(tmp_path, cpu_attention, monkeypatch):
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    ref = _model(_config(), "sdpa")
    ref.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    tw_hf.apply_tilewise(back)
    ids = _ids(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["mean", "num_items"])
def test_fused_loss_matches_transformers_loss(cpu_attention, monkeypatch, mode):
    """Training with labels (ignored positions, padding): apply_tilewise's loss (one
    linear_cross_entropy, in Triton's interpreter) and every parameter's gradient equal the
    untouched model's; in eval mode the model's own head runs and logits come back."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    ref = _model(_config(), "sdpa").train()
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref))
    ids = _ids(3, 11)
    am = torch.ones_like(ids)
    am[2, 8:] = 0
    labels = ids.masked_fill(am == 0, -100)
    labels[0, :4] = -100
    kw = {"num_items_in_batch": torch.tensor(17)} if mode == "num_items" else {}
    lr = ref(ids, attention_mask=am, labels=labels, **kw)
    lo = ours(ids, attention_mask=am, labels=labels, **kw)
    assert lo.logits.shape[1] == 0  # no (tokens, vocab) logits in the fused path
    _same_training(ref, ours, lr, lo, 1e-5, 1e-5)
    ours.eval()
    with torch.no_grad():
        out = ours(ids, attention_mask=am, labels=labels)
    assert out.logits.shape == (3, 11, VOCAB) and out.loss is not None


def test_fused_loss_counts_its_targets_before_the_forward(cpu_attention, monkeypatch):
    """The fused loss's target count (a host read) is made before the base model's forward is queued and handed to
    linear_cross_entropy, which then reads it instead of counting after the forward (draining the GPU's queue);
    the loss and gradients stay the untouched model's."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    order, handed = [], []
    real_count, real_lce = tw_hf.TargetCount, tw_hf.linear_cross_entropy

    class Count(real_count):
        def __init__(self, *a, **k):
            order.append("count")
            super().__init__(*a, **k)

    def lce(*a, **k):
        handed.append(k.get("target_count"))
        return real_lce(*a, **k)

    monkeypatch.setattr(tw_hf, "TargetCount", Count)
    monkeypatch.setattr(tw_hf, "linear_cross_entropy", lce)
    ref = _model(_config(), "sdpa").train()
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref))
    ours.model.register_forward_pre_hook(lambda *_: order.append("forward"))
    ids = _ids(2, 10)
    labels = ids.clone()
    labels[1, :3] = -100
    lr = ref(ids, labels=labels)
    lo = ours(ids, labels=labels)
    assert order == ["count", "forward"]
    # shifted labels: the last position of each row and labels[1, 1:3] do not count
    assert len(handed) == 1 and isinstance(handed[0], real_count) and handed[0].result() == 2 * 9 - 2
    _same_training(ref, ours, lr, lo, 1e-5, 1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_embedding_gradient_goes_sparse_into_the_heads(cpu_attention, monkeypatch, tied):
    """With the embedding tied to the lm head, a fused-loss training forward runs the embedding as
    ``_EmbeddingRows``: its backward adds its tokens' rows into the head's dense gradient in place, and that
    very tensor becomes the parameter's .grad (no copy by autograd); every gradient equals the untouched
    model's. Untied, in eval, or with sparse_embedding_grad=False: the embedding runs as it is, and no
    forward is left on the module after a call."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    handed = []
    real = tw_hf._EmbeddingRows.backward

    def backward(ctx, grad_out):
        out = real(ctx, grad_out)
        handed.append(out[1].data_ptr())  # not the tensor: a second reference would make autograd copy it
        return out

    monkeypatch.setattr(tw_hf._EmbeddingRows, "backward", staticmethod(backward))
    ref = _model(_config(tie_word_embeddings=tied), "sdpa").train()
    assert (ref.get_input_embeddings().weight is ref.get_output_embeddings().weight) == tied
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref))
    ids = _ids(2, 9)
    lr = ref(ids, labels=ids)
    lo = ours(ids, labels=ids)
    assert "forward" not in ours.get_input_embeddings().__dict__
    _same_training(ref, ours, lr, lo, 1e-5, 1e-5)
    grad = ours.get_input_embeddings().weight.grad
    assert grad.layout == torch.strided
    assert len(handed) == int(tied)
    if tied:
        assert handed[0] == grad.data_ptr()  # adopted, not copied
    handed.clear()
    off = tw_hf.apply_tilewise(copy.deepcopy(ref), sparse_embedding_grad=False)
    off(ids, labels=ids).loss.backward()
    ours.eval()
    with torch.no_grad():
        ours(ids, labels=ids)
    assert handed == [] and "forward" not in ours.get_input_embeddings().__dict__


def test_tied_embedding_rows_keep_the_padding_row_out_and_work_without_the_fused_loss(cpu_attention, monkeypatch):
    """``_EmbeddingRows`` on its own: the padding row gets no gradient (as F.embedding), repeated tokens add
    up, the head's gradient from the slot is added into in place, and with none handed the gradient is the
    rows alone."""
    w = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[1, 2, 2, 0], [5, 0, 1, 1]])
    g = torch.randn(2, 4, 3, dtype=torch.float64)
    ref = torch.autograd.grad(torch.nn.functional.embedding(ids, w, 0), w, g)[0]
    for head in (None, torch.randn(7, 3, dtype=torch.float64)):
        slot = tw_hf._HeadGrad()
        slot.grad = None if head is None else head.clone()
        out = tw_hf._EmbeddingRows.apply(ids, w, 0, slot)
        (got,) = torch.autograd.grad(out, w, g)
        want = ref if head is None else ref + head
        assert torch.allclose(got, want) and got[0].abs().sum() == (0 if head is None else head[0].abs().sum())
        assert slot.grad is None


def test_patched_training_step_compiles_without_graph_breaks(monkeypatch):
    """torch._dynamo.explain over a training forward of the patched model (norm, rope, swiglu and the
    fused loss are custom ops; the loss's hidden-state hook is registered once): one graph, no break."""
    import torch._dynamo

    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    model = _model(_config(), "sdpa").train()
    tw_hf.apply_tilewise(model, attention=False)
    ids = _ids(2, 16)
    torch._dynamo.reset()
    e = torch._dynamo.explain(model)(input_ids=ids, labels=ids)
    assert e.graph_break_count == 0 and e.graph_count == 1, [str(b.reason)[:200] for b in e.break_reasons]


UNFUSED = dict(residual_norm=False, fuse_qkv=False, fuse_gate_up=False)  # apply_tilewise without the fusions


def test_no_handoff_into_a_sharded_module(cpu_attention, monkeypatch):
    """A next layer whose norm weight a sharding wrapper manages (FSDP's flattened views, DeepSpeed's
    partitions, a freed storage) gets no hand-off: the MLP's add stays an add, and the loss and grads are
    the unfused model's."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    calls = []
    real = tw_hf.add_rms_norm
    monkeypatch.setattr(tw_hf, "add_rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    ref = tw_hf.apply_tilewise(_model(_config(num_hidden_layers=3), "sdpa").train(), **UNFUSED)
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref), residual_norm=True, fuse_qkv=False)
    ours.model.layers[1].input_layernorm.weight._fsdp_flattened = True
    ours.model.layers[2].input_layernorm.weight.ds_id = 7
    ids = _ids(2, 9)
    lr, lo = ref(ids, labels=ids), ours(ids, labels=ids)
    assert len(calls) == 3 + 1  # each layer's attention add, and only the last layer's hand-off (final norm)
    _same_training(ref, ours, lr, lo, 1e-6, 1e-6)


def test_default_fusions(cpu_attention, monkeypatch):
    """apply_tilewise's defaults fuse q / k / v for Llama (a training forward with labels builds no KV
    cache, so the fused path runs, with no warning), the residual adds (two per layer: the attention's,
    and the MLP's into the next norm or the final one) and each MLP's gate / up GEMM with its activation
    recomputed in the backward (swiglu_mlp), and leave Qwen3's q / k / v alone (its q / k norms sit before
    RoPE) without raising."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    import tilewise.nn.layers as layers

    qkv, norms, packed = [], [], []
    real_qkv, real_norm, real_packed = tw_hf.apply_rotary_qkv, tw_hf.add_rms_norm, layers.swiglu_mlp
    monkeypatch.setattr(tw_hf, "apply_rotary_qkv", lambda *a, **k: qkv.append(1) or real_qkv(*a, **k))
    monkeypatch.setattr(tw_hf, "add_rms_norm", lambda *a, **k: norms.append(1) or real_norm(*a, **k))
    monkeypatch.setattr(layers, "swiglu_mlp", lambda *a, **k: packed.append(1) or real_packed(*a, **k))
    model = tw_hf.apply_tilewise(_model(_config(num_hidden_layers=2), "sdpa").train())
    ids = _ids(2, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        out = model(ids, labels=ids)
    assert (len(qkv), len(norms), len(packed)) == (2, 4, 2) and out.past_key_values is None
    qwen3 = tw_hf.apply_tilewise(_model(transformers.Qwen3Config(**_config().to_dict()), "sdpa"))
    assert not any("_tilewise_qkv" in m.__dict__ for m in qwen3.modules())


@pytest.mark.parametrize("family,checkpointing", [("llama", False), ("mistral", False), ("qwen2", False),
                                                   ("llama", True)])
def test_residual_norm_matches_the_unfused_model(cpu_attention, monkeypatch, family, checkpointing):
    """apply_tilewise(residual_norm=True) (add_rms_norm in Triton's interpreter): the loss, every
    gradient and every layer's hidden state equal those of apply_tilewise without it; parameters and
    state-dict keys unchanged; both adds of a layer fused (only the attention's under gradient
    checkpointing, where the hand-off would cross the checkpoint)."""
    modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    calls = []
    real = tw_hf.add_rms_norm
    monkeypatch.setattr(tw_hf, "add_rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    config = _config(family, num_hidden_layers=3)
    ref = tw_hf.apply_tilewise(_model(config, "sdpa").train(), **UNFUSED)
    ours = copy.deepcopy(ref)
    keys, params = list(ours.state_dict()), dict(ours.named_parameters())
    tw_hf.apply_tilewise(ours, residual_norm=True, fuse_qkv=False)
    assert list(ours.state_dict()) == keys and all(p is params[n] for n, p in ours.named_parameters())
    if checkpointing:
        for m in (ref, ours):
            m.gradient_checkpointing_enable()
    ids = _ids(2, 13)
    lr, lo = ref(ids, labels=ids), ours(ids, labels=ids)
    assert len(calls) == (3 if checkpointing else 6)
    _same_training(ref, ours, lr, lo, 1e-6, 1e-6)
    ours.eval()
    ref.eval()
    with torch.no_grad():
        hr = ref(ids, output_hidden_states=True).hidden_states
        ho = ours(ids, output_hidden_states=True).hidden_states
    assert len(ho) == len(hr) == 4
    for a, b in zip(ho, hr):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family,extra", [("llama", {}), ("mistral", {"sliding_window": 5}),
                                          ("qwen2", {"use_sliding_window": True, "sliding_window": 5,
                                                     "max_window_layers": 1}),
                                          ("llama", {"both": True})])
def test_fuse_qkv_matches_the_unfused_model(cpu_attention, monkeypatch, family, extra):
    """apply_tilewise(fuse_qkv=True) (apply_rotary_qkv in Triton's interpreter; Qwen2's q / k / v biases,
    Mistral's and Qwen2's sliding windows): loss and every gradient equal apply_tilewise's without it;
    parameters and state-dict keys unchanged; the fused forward ran in every layer; with residual_norm
    too ("both")."""
    modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    calls = []
    real = tw_hf.apply_rotary_qkv
    monkeypatch.setattr(tw_hf, "apply_rotary_qkv", lambda *a, **k: calls.append(1) or real(*a, **k))
    extra = dict(extra)
    both = extra.pop("both", False)
    ref = tw_hf.apply_tilewise(_model(_config(family, num_hidden_layers=3, **extra), "sdpa").train(), **UNFUSED)
    ours = copy.deepcopy(ref)
    keys, params = list(ours.state_dict()), dict(ours.named_parameters())
    tw_hf.apply_tilewise(ours, fuse_qkv=True, residual_norm=both)
    assert list(ours.state_dict()) == keys and all(p is params[n] for n, p in ours.named_parameters())
    ids = _ids(2, 13)
    lr, lo = ref(ids, labels=ids, use_cache=False), ours(ids, labels=ids, use_cache=False)
    assert len(calls) == 3
    _same_training(ref, ours, lr, lo, 1e-6, 1e-6)


def test_fuse_qkv_with_a_cache_runs_the_model_forward(cpu_attention, monkeypatch):
    """With a KV cache (generate; a training forward that leaves use_cache on) the original attention
    runs: the same tokens, the same loss; in training mode a warning says so, once a layer."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    ref = tw_hf.apply_tilewise(_model(_config(), "sdpa"), **UNFUSED)
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref), fuse_qkv=True)
    ids = _ids(1, 6)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, **kw), ref.generate(ids, **kw))
    ours.train()
    ref.train()
    with pytest.warns(UserWarning, match="use_cache = False"):
        lo = ours(ids, labels=ids, use_cache=True).loss
    torch.testing.assert_close(lo, ref(ids, labels=ids, use_cache=True).loss)
    with pytest.raises(ValueError, match="fuse_qkv=True does not apply to Qwen3"):
        tw_hf.apply_tilewise(_model(transformers.Qwen3Config(**_config().to_dict()), "sdpa"), fuse_qkv=True)


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
@pytest.mark.parametrize("family,extra", [("llama", {}), ("llama", {"mlp_bias": True}), ("qwen2", {})])
def test_fuse_gate_up_matches_the_unfused_model(cpu_attention, monkeypatch, family, extra, recompute):
    """apply_tilewise(fuse_gate_up=True) (swiglu_packed in Triton's interpreter; Llama's MLP biases), with
    the activation kept or recomputed in the backward (recompute_swiglu): loss and every gradient equal
    apply_tilewise's without it; parameters and state-dict keys those of the model; one packed
    activation (or one swiglu_mlp) a layer."""
    import tilewise.nn.layers as layers

    modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    calls = []
    name = "swiglu_mlp" if recompute else "swiglu_packed"
    real = getattr(layers, name)
    monkeypatch.setattr(layers, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    base = _model(_config(family, num_hidden_layers=3, **extra), "sdpa").train()
    keys = list(base.state_dict())
    ours = tw_hf.apply_tilewise(copy.deepcopy(base), **{**UNFUSED, "fuse_gate_up": True,
                                                         "recompute_swiglu": recompute})
    ref = tw_hf.apply_tilewise(base, **UNFUSED)
    assert list(ours.state_dict()) == keys
    ids = _ids(2, 13)
    lr, lo = ref(ids, labels=ids, use_cache=False), ours(ids, labels=ids, use_cache=False)
    assert len(calls) == 3
    _same_training(ref, ours, lr, lo, 1e-5, 1e-5)


def test_fuse_qkv_compiles_without_graph_breaks(monkeypatch):
    import torch._dynamo

    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    model = _model(_config(), "sdpa").train()
    tw_hf.apply_tilewise(model, attention=False, fuse_qkv=True, residual_norm=True)
    ids = _ids(2, 16)
    torch._dynamo.reset()
    e = torch._dynamo.explain(model)(input_ids=ids, labels=ids, use_cache=False)
    assert e.graph_break_count == 0 and e.graph_count == 1, [str(b.reason)[:200] for b in e.break_reasons]


def test_residual_norm_compiles_without_graph_breaks(monkeypatch):
    import torch._dynamo

    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    model = _model(_config(), "sdpa").train()
    tw_hf.apply_tilewise(model, attention=False, residual_norm=True)
    ids = _ids(2, 16)
    torch._dynamo.reset()
    e = torch._dynamo.explain(model)(input_ids=ids, labels=ids, use_cache=False)
    assert e.graph_break_count == 0 and e.graph_count == 1, [str(b.reason)[:200] for b in e.break_reasons]


class _Halved(torch.nn.Linear):
    """A Linear whose forward is not F.linear of its weight (as a LoRA or quantized layer's)."""

    def forward(self, x):
        return super().forward(x) * 0.5


def _halved(m):
    new = _Halved(m.in_features, m.out_features, bias=m.bias is not None)
    new.load_state_dict(m.state_dict())
    return new


@pytest.mark.parametrize("where", ["q_proj", "v_proj hook", "lm_head", "up_proj"])
def test_fused_paths_stand_aside_for_wrapped_layers(cpu_attention, monkeypatch, where):
    """fuse_qkv and the fused loss read the projections' weights in place of calling them; where a
    layer computes something else (here a Linear subclass, or a forward hook that changes the output,
    as PEFT's LoRA layers and quantized linears do) the layers run, and the loss and gradients equal
    the same model without apply_tilewise (before, the fused paths used the bare weights: with PEFT's LoRA on
    every projection, a training loss of 4.579 against the LoRA model's 4.622)."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    ref = _model(_config(tie_word_embeddings=False), "sdpa").train()
    attn = ref.model.layers[0].self_attn
    if where == "q_proj":
        attn.q_proj = _halved(attn.q_proj)
    elif where == "v_proj hook":
        attn.v_proj.register_forward_hook(lambda m, i, o: o * 0.5)
    elif where == "up_proj":  # fuse_gate_up's GEMM
        ref.model.layers[1].mlp.up_proj = _halved(ref.model.layers[1].mlp.up_proj)
    else:
        ref.lm_head = _halved(ref.lm_head)
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref))
    ids = _ids(2, 9)
    _same_training(ref, ours, ref(ids, labels=ids, use_cache=False), ours(ids, labels=ids, use_cache=False),
                   rtol=1e-4, atol=1e-5)


def test_fused_paths_with_peft_lora(cpu_attention, monkeypatch):
    """PEFT's LoRA on every projection and the lm head, added before or after apply_tilewise: the
    training loss and the adapters' gradients equal the LoRA model without apply_tilewise."""
    peft = pytest.importorskip("peft")
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]

    def lora(m):
        torch.manual_seed(3)  # init_lora_weights=False: random B, so the adapters change the output
        return peft.get_peft_model(m, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                      init_lora_weights=False))

    base = _model(_config(tie_word_embeddings=False), "sdpa")
    ids = _ids(2, 9)
    for before in (True, False):
        ref = lora(copy.deepcopy(base)).train()
        if before:
            ours = copy.deepcopy(ref)
            tw_hf.apply_tilewise(ours.base_model.model)
        else:
            ours = lora(tw_hf.apply_tilewise(copy.deepcopy(base))).train()
        lr, lo = ref(input_ids=ids, labels=ids), ours(input_ids=ids, labels=ids)
        torch.testing.assert_close(lo.loss, lr.loss, rtol=1e-4, atol=1e-5)
        lr.loss.backward()
        lo.loss.backward()
        grads = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad}
        for n, p in ours.named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(p.grad, grads[n], rtol=1e-3, atol=1e-5, msg=n)


def test_rotary_pos_emb_layouts():
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    cos, sin = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    from tilewise.ops.rope.api import reference

    rq, rk = reference(q, k, cos, sin)
    for got, want in zip(tw_hf.rotary_pos_emb(q, k, cos, sin), (rq, rk)):
        torch.testing.assert_close(got, want)
    got = tw_hf.rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)
    torch.testing.assert_close(got[0], rq.transpose(1, 2))
    torch.testing.assert_close(got[1], rk.transpose(1, 2))
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        tw_hf.rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)


# ---- GPU: the real kernels, bf16 -------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.quick
def test_gpu_llama_logits_and_grads_match_sdpa(monkeypatch):
    """A small bf16 Llama (head dim 64, GQA 8/2) on CUDA, padded batch: apply_tilewise's logits
    at real tokens and its parameter gradients against SDPA's, within bf16 noise (relative error of
    the whole tensor)."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    config = _config(hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=2,
                     num_hidden_layers=2, vocab_size=1000)
    ref = _model(config, "sdpa", "cuda", torch.bfloat16).train()
    ours = copy.deepcopy(ref)
    tw_hf.apply_tilewise(ours)
    ids = torch.randint(0, 1000, (3, 301), device="cuda")
    am = torch.ones_like(ids)
    am[1, 264:] = 0  # right padding: every query row keeps a key (SDPA's fully masked rows are its own matter)
    am[2, 1:] = 0
    for m in (ref, ours):
        m(ids, attention_mask=am, labels=ids.masked_fill(am == 0, -100)).loss.backward()
    with torch.no_grad():
        keep = am.bool()
        a, r = ours(ids, attention_mask=am).logits[keep].float(), ref(ids, attention_mask=am).logits[keep].float()
    assert (a - r).norm() / r.norm() < 2e-2
    _assert_grads_close(ours, ref, 5e-2)


@pytest.mark.gpu
@pytest.mark.quick
def test_gpu_packed_documents_match_sdpa(monkeypatch):
    """bf16 on CUDA, the default fusions: two rows of packed documents of odd lengths (position_ids that
    restart, no attention_mask) run as flash_attention_varlen sequences, one call a layer, with the loss
    and every gradient of transformers' own SDPA model (packing found from position_ids) within bf16
    noise."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    config = _config(hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=2,
                     num_hidden_layers=2, vocab_size=1000)
    ref = _model(config, "sdpa", "cuda", torch.bfloat16).train()
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref))
    calls = []
    real = tw_hf._attention_varlen
    monkeypatch.setattr(tw_hf, "_attention_varlen", lambda *a, **k: calls.append(a[3].tolist()) or real(*a, **k))
    lengths = ([77, 1, 190, 33], [129, 172])
    pos = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths]).cuda()
    ids = torch.randint(0, 1000, pos.shape, device="cuda")
    losses = [m(ids, position_ids=pos, labels=ids, use_cache=False).loss for m in (ref, ours)]
    for loss in losses:
        loss.backward()
    assert len(calls) == 2 and calls[0] == [0, 77, 78, 268, 301, 430, 602]
    assert abs(losses[1].item() - losses[0].item()) < 2e-2 * abs(losses[0].item())
    _assert_grads_close(ours, ref, 5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("fusions", [dict(residual_norm=True), dict(fuse_qkv=True), dict(fuse_gate_up=True),
                                     dict(residual_norm=True, fuse_qkv=True, fuse_gate_up=True)], ids=str)
@pytest.mark.quick
def test_gpu_fusions_match_the_unfused_model(monkeypatch, fusions):
    """bf16 on CUDA, 3 layers: apply_tilewise with residual_norm (add_rms_norm's kernels, the hand-off),
    fuse_qkv (apply_rotary_qkv), fuse_gate_up (swiglu_packed) or all three against apply_tilewise
    without them: loss and every gradient within bf16 noise."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    config = _config(hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=2,
                     num_hidden_layers=3, vocab_size=1000)
    base = _model(config, "sdpa", "cuda", torch.bfloat16).train()
    ours = tw_hf.apply_tilewise(copy.deepcopy(base), **{**UNFUSED, **fusions})
    ref = tw_hf.apply_tilewise(base, **UNFUSED)
    ids = torch.randint(0, 1000, (2, 333), device="cuda")
    lr, lo = ref(ids, labels=ids, use_cache=False).loss, ours(ids, labels=ids, use_cache=False).loss
    assert abs(lo.item() - lr.item()) < 1e-2 * abs(lr.item())
    lr.backward()
    lo.backward()
    _assert_grads_close(ours, ref, 3e-2)


@pytest.mark.gpu
@pytest.mark.quick
def test_gpu_tied_embedding_sparse_gradient_matches_the_dense_one(monkeypatch):
    """bf16 on CUDA, the embedding tied to the head (Llama-3.2-1B's layout): the fused loss's sparse embedding
    gradient added into the head's dense one on the GPU gives the loss and gradients of sparse_embedding_grad=False
    (dense bf16 + sparse bf16 in place: the parameter's .grad dense, within bf16 noise)."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    config = _config(hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=2,
                     num_hidden_layers=2, vocab_size=1000, tie_word_embeddings=True)
    base = _model(config, "sdpa", "cuda", torch.bfloat16).train()
    ours = tw_hf.apply_tilewise(copy.deepcopy(base))
    ref = tw_hf.apply_tilewise(base, sparse_embedding_grad=False)
    ids = torch.randint(0, 1000, (2, 333), device="cuda")
    lr, lo = ref(ids, labels=ids, use_cache=False).loss, ours(ids, labels=ids, use_cache=False).loss
    assert abs(lo.item() - lr.item()) < 1e-2 * abs(lr.item())
    lr.backward()
    lo.backward()
    assert ours.get_input_embeddings().weight.grad.layout == torch.strided
    _assert_grads_close(ours, ref, 3e-2)


@pytest.mark.gpu
@pytest.mark.quick
def test_gpu_auto_attention_matches_flash_attention(monkeypatch):
    """bf16 on CUDA, head dim 64, the default fusions (q / k / v from apply_rotary_qkv, sequence-major):
    attention="auto" (SDPA where the rules say, on the H200 every training call here) against
    attention=True (flash_attention at every call): loss and every gradient within bf16 noise, and the
    auto model's calls went where the rules say."""
    modeling = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)
    from tilewise.ops.attention.configs import prefer_sdpa

    config = _config(hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=2,
                     num_hidden_layers=2, vocab_size=1000)
    ref = tw_hf.apply_tilewise(_model(config, "sdpa", "cuda", torch.bfloat16).train(), attention=True)
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref))
    assert ours.config._attn_implementation == tw_hf.AUTO_NAME
    routed = []
    real = tw_hf._auto_route
    monkeypatch.setattr(tw_hf, "_auto_route", lambda *a: routed.append(real(*a)) or routed[-1])
    ids = torch.randint(0, 1000, (2, 1000), device="cuda")
    lr, lo = ref(ids, labels=ids, use_cache=False).loss, ours(ids, labels=ids, use_cache=False).loss
    want = "sdpa" if prefer_sdpa(torch.cuda.get_device_capability(), 64, 1000, True, True) else None
    assert routed == [want, want]
    assert abs(lo.item() - lr.item()) < 1e-2 * abs(lr.item())
    lr.backward()
    lo.backward()
    _assert_grads_close(ours, ref, 3e-2)


@pytest.mark.gpu
@pytest.mark.quick
def test_gpu_auto_attention_cudnn_backward_route(monkeypatch):
    """Where our forward is the faster one and cuDNN's backward is (configs.cudnn_backward_pays; on the
    H200 head dim 64 causal at S = 16384), "tilewise_auto" runs our forward with cuDNN's backward: loss and every
    gradient as attention=True's (flash_attention at every call) within bf16 noise."""
    from tilewise.ops.attention.configs import cudnn_backward_pays

    cap = torch.cuda.get_device_capability()
    S = next((s for s in (8192, 16384) if cudnn_backward_pays(cap, 64, s, True)), None)
    if S is None:
        pytest.skip("no measured rule sends this GPU's calls to cuDNN's backward")
    config = _config(hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=2,
                     num_hidden_layers=2, vocab_size=1000, max_position_embeddings=S)
    ref = tw_hf.apply_tilewise(_model(config, "sdpa", "cuda", torch.bfloat16).train(), attention=True)
    ours = tw_hf.apply_tilewise(copy.deepcopy(ref))
    routed = []
    real = tw_hf._auto_route
    monkeypatch.setattr(tw_hf, "_auto_route", lambda *a: routed.append(real(*a)) or routed[-1])
    ids = torch.randint(0, 1000, (1, S), device="cuda")
    lr, lo = ref(ids, labels=ids, use_cache=False).loss, ours(ids, labels=ids, use_cache=False).loss
    assert routed == ["cudnn_bwd", "cudnn_bwd"]
    assert abs(lo.item() - lr.item()) < 1e-2 * abs(lr.item())
    lr.backward()
    lo.backward()
    _assert_grads_close(ours, ref, 3e-2)


@pytest.mark.gpu
@pytest.mark.quick
def test_gpu_generation_matches_sdpa():
    config = _config(hidden_size=256, intermediate_size=688, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=1000)
    ref, ours = _pair(config, "cuda", torch.float32)
    ids = torch.randint(0, 1000, (2, 67), device="cuda")
    am = torch.ones_like(ids)
    am[0, :20] = 0
    kw = dict(attention_mask=am, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kw), ref.generate(ids, **kw))
