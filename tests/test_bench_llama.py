"""The llama bench suite's pieces that need no GPU: its FLOP count's parameter total, the undoing of
the patches between candidates, the chart."""

import pytest
import torch
from bench_fakes import FakeRunner

transformers = pytest.importorskip("transformers")

from tilewise.bench.suites import llama as S  # noqa: E402


def test_parameter_count_matches_the_model():
    config = transformers.LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                      tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config)
    assert sum(torch.Size(s).numel() for s in S._param_shapes(config)) == sum(p.numel() for p in model.parameters())


def test_snapshot_undoes_apply_tilewise():
    from transformers.models.llama import modeling_llama as ml

    from tilewise.integrations.transformers import apply_tilewise

    rope, fwd = ml.apply_rotary_pos_emb, ml.LlamaForCausalLM.forward
    snap = S._snapshot()
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    apply_tilewise(transformers.LlamaForCausalLM(config))
    ml.LlamaForCausalLM.forward = lambda self, *a, **k: None  # as Liger patches a class's forward
    assert ml.apply_rotary_pos_emb is not rope
    S._restore(snap)
    assert ml.apply_rotary_pos_emb is rope and ml.LlamaForCausalLM.forward is fwd


def test_chart(tmp_path):
    pytest.importorskip("matplotlib")
    shape = "layers=2,B=2,S=2048"
    results = {(shape, "hf_sdpa"): (1.0e5, 3 << 30), (shape, "hf_tilewise"): (1.2e5, 2 << 30)}
    png = S._plot(results, tmp_path / "x-llama.png")
    assert png.stat().st_size > 1000


def test_candidates_built_after_tilewise_keep_their_attention():
    """Each candidate gets its own copy of the config: apply_tilewise sets "tilewise" as the attention
    implementation on its model's config, which must not reach the models built after it (it did:
    the hf_liger rows ran tilewise's attention)."""
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="sdpa")
    state = S.transformers_state(config)
    snap = S._snapshot()
    try:
        ours = S._build("hf_tilewise", config, state, device="cpu")[0]
        after = S._build("hf_sdpa", config, state, device="cpu")[0]
        own = S._build("hf_tilewise_own_attn", config, state, device="cpu")[0]
        keep = S._build("hf_tilewise_keep_act", config, state, device="cpu")[0]
    finally:
        S._restore(snap)
    assert ours.config._attn_implementation == "tilewise_auto"
    assert after.config._attn_implementation == "sdpa" and config._attn_implementation == "sdpa"
    assert own.config._attn_implementation == "tilewise"
    assert any(type(m).__name__ == "RMSNorm" and type(m).__module__.startswith("tilewise") for m in own.modules())
    mlps = {n: [m.recompute for m in model.modules() if type(m).__name__ == "SwiGLU"] for n, model in
            (("ours", ours), ("keep", keep))}
    assert mlps == {"ours": [True], "keep": [False]}  # hf_tilewise_keep_act: the activation kept


def test_kernel_groups_of_the_step_profile():
    names = {
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0":
            "attention",
        "attn_bwd_dkdv_ws_kernel": "attention",
        "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN": "gemm",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float>": "gemm",
        "_ce_kernel": "cross_entropy",
        "liger_cross_entropy_kernel": "cross_entropy",
        "_rms_norm_bwd_kernel": "rms_norm",
        "_rope_kernel": "rope",
        "_swiglu_kernel": "swiglu",
        "void at::native::reduce_kernel<128, 4>": "elementwise/reduce",
        "Memset (Device)": "copy/fill",
        "some_new_kernel": "other",
    }
    assert {n: S.kernel_group(n) for n in names} == names
    t = S.group_times({"_rope_kernel": 1.5, "_rms_norm_fwd_kernel": 1.0, "_rms_norm_bwd_kernel": 2.0, "x": 0.25})
    assert t == {"rope": 1.5, "rms_norm": 3.0, "other": 0.25, "total": 4.75}
    lines = S.group_table({"hf_liger": {"rope": 1.0, "total": 1.0}, "hf_tilewise": t})
    assert lines[0].split() == ["device", "ms", "a", "step", "hf_liger", "hf_tilewise"]
    assert [ln.split()[0] for ln in lines[1:]] == ["other", "rms_norm", "rope", "total"]
    assert lines[-1].split()[1:] == ["1.00", "4.75"] and lines[1].split()[1:] == ["0.00", "0.25"]


def test_candidates_can_be_chosen_by_name(monkeypatch):
    monkeypatch.delenv("TILEWISE_BENCH_LLAMA_CANDIDATES", raising=False)
    assert S.candidates(False) == list(S.CANDIDATES)
    assert "hf_compile" not in S.candidates(True)
    monkeypatch.setenv("TILEWISE_BENCH_LLAMA_CANDIDATES", "hf_liger, hf_sdpa,hf_tilewise")
    assert S.candidates(False) == ["hf_sdpa", "hf_tilewise", "hf_liger"]  # the suite's order
    monkeypatch.setenv("TILEWISE_BENCH_LLAMA_CANDIDATES", "hf_sdpa,nope")
    with pytest.raises(ValueError, match="TILEWISE_BENCH_LLAMA_CANDIDATES.*nope"):
        S.candidates(False)


def test_packed_documents_batches_and_cost(monkeypatch):
    """TILEWISE_BENCH_LLAMA_PACKED=N: position_ids restart every N tokens (the row's last document shorter),
    transformers finds the documents (its packed-sequence ids), and the attention FLOPs count the
    documents' causal squares only; anything but a positive integer is an error naming the variable."""
    from transformers import masking_utils

    from tilewise import settings

    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1)
    plain, packed = S._batches(config, 2, 10, device="cpu"), S._batches(config, 2, 10, doc=4, device="cpu")
    assert set(plain[0]) == {"input_ids", "labels"} and torch.equal(plain[0]["input_ids"], packed[0]["input_ids"])
    pos = packed[0]["position_ids"]
    assert pos.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]] * 2
    assert masking_utils.find_packed_sequence_indices(pos).tolist() == [[0] * 4 + [1] * 4 + [2] * 2] * 2
    whole, docs = S._cost(config, 2, 10), S._cost(config, 2, 10, doc=4)
    attn = 12.0 * 2 * 2 * 32 / 2
    assert whole.flops - docs.flops == pytest.approx(attn * (100 - (16 + 16 + 4)))
    monkeypatch.delenv(settings.BENCH_LLAMA_PACKED, raising=False)
    assert settings.bench_llama_packed() is None
    monkeypatch.setenv(settings.BENCH_LLAMA_PACKED, "1024")
    assert settings.bench_llama_packed() == 1024
    for bad in ("0", "-5", "1k"):
        monkeypatch.setenv(settings.BENCH_LLAMA_PACKED, bad)
        with pytest.raises(ValueError, match="TILEWISE_BENCH_LLAMA_PACKED"):
            settings.bench_llama_packed()


def test_a_packed_step_runs_on_the_cpu():
    """_step takes a batch as the model's keywords: a packed batch's loss differs from the unpacked one's
    (attention stops at each document)."""
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    losses = []
    for doc in (None, 3):
        model.load_state_dict(state)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        losses.append(float(S._step(model, opt, S._batches(config, 1, 12, doc, device="cpu")[0])))
    assert losses[0] != losses[1]  # the same computation would give the same bits on the CPU


def test_passes_reverse_the_order_by_turns(monkeypatch):
    from tilewise import settings

    assert S.pass_orders(["a", "b", "c"], 1) == [["a", "b", "c"]]
    assert S.pass_orders(["a", "b", "c"], 3) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]
    monkeypatch.delenv("TILEWISE_BENCH_LLAMA_PASSES", raising=False)
    assert settings.bench_llama_passes(quick=False) == 2 and settings.bench_llama_passes(quick=True) == 1
    monkeypatch.setenv("TILEWISE_BENCH_LLAMA_PASSES", "3")
    assert settings.bench_llama_passes(quick=True) == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("TILEWISE_BENCH_LLAMA_PASSES", bad)
        with pytest.raises(ValueError, match="TILEWISE_BENCH_LLAMA_PASSES"):
            settings.bench_llama_passes(quick=False)


def test_run_times_every_candidate_in_each_pass_and_reports_the_mean(monkeypatch):
    """``run`` with the model work faked: each shape's candidates in A B then B A, each row's time the mean of
    its passes, the peak the passes' largest, ours against the fastest of the others, and every first loss
    checked against the first candidate's."""
    monkeypatch.setenv("TILEWISE_BENCH_LLAMA_CANDIDATES", "hf_tilewise,hf_liger")
    monkeypatch.delenv("TILEWISE_BENCH_LLAMA_PASSES", raising=False)
    monkeypatch.delenv("TILEWISE_BENCH_LLAMA_PROFILE", raising=False)
    monkeypatch.delenv("TILEWISE_BENCH_LLAMA_PACKED", raising=False)
    monkeypatch.delenv("TILEWISE_BENCH_LLAMA_TOKENS", raising=False)
    monkeypatch.setattr(S, "transformers_state", lambda config: {})
    monkeypatch.setattr(S, "_batches", lambda *a, **k: [])
    calls = []
    ms = {("hf_tilewise", 0): 100.0, ("hf_liger", 0): 110.0, ("hf_liger", 1): 108.0, ("hf_tilewise", 1): 104.0}

    def candidate(r, name, shape, config, state, batches, profile):
        k = sum(1 for n, s in calls if n == name and s == shape)
        calls.append((name, shape))
        return ms[(name, k)], (1 + k) << 30, 2.0, None

    monkeypatch.setattr(S, "_candidate", candidate)

    r = FakeRunner(quick=False, with_shape=True)
    S.run(r)
    shapes = ["layers=16,B=4,S=4096", "layers=16,B=1,S=16384"]
    assert calls == [(n, s) for s in shapes for n in ("hf_tilewise", "hf_liger", "hf_liger", "hf_tilewise")]
    assert r.rows == [row for s in shapes for row in (("hf_tilewise", s, 102.0, "hf_liger", 109.0),
                                                      ("hf_liger", s, 109.0, "", None))]
    assert any("hf_tilewise (pass 2 of 2): 104.0 ms" in line for line in r.lines)
    assert any("hf_liger: 109.0 ms a step over 2 passes (110.0 / 108.0)" in line for line in r.lines)


def test_zipf_token_ids(monkeypatch):
    """TILEWISE_BENCH_LLAMA_TOKENS=zipf: ids in range, seeded, far fewer distinct ids than a uniform draw and
    the most frequent rank near the law's share (1 / H_V of the draws); the rows' shapes name the draw;
    anything but uniform / zipf is an error naming the variable."""
    from tilewise import settings

    V, N = 5000, 20000
    a, b = (S.zipf_ids(V, (4, N // 4), torch.Generator().manual_seed(7), "cpu") for _ in range(2))
    assert a.shape == (4, N // 4) and a.dtype == torch.int64 and torch.equal(a, b)
    assert 0 <= int(a.min()) and int(a.max()) < V
    counts = torch.bincount(a.flatten(), minlength=V).sort(descending=True).values
    uniform = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(7)).unique().numel()
    assert counts.count_nonzero() < 0.75 * uniform
    share = 1.0 / sum(1.0 / r for r in range(1, V + 1))  # rank 1's probability, ZIPF_EXPONENT 1
    assert abs(float(counts[0]) / N - share) < 0.2 * share
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    z, u = S._batches(config, 2, 64, device="cpu", tokens="zipf"), S._batches(config, 2, 64, device="cpu")
    assert torch.equal(z[0]["input_ids"], z[0]["labels"]) and not torch.equal(z[0]["input_ids"], u[0]["input_ids"])

    monkeypatch.delenv(settings.BENCH_LLAMA_TOKENS, raising=False)
    assert settings.bench_llama_tokens() == "uniform"
    monkeypatch.setenv(settings.BENCH_LLAMA_TOKENS, "Zipf")
    assert settings.bench_llama_tokens() == "zipf"
    monkeypatch.setenv("TILEWISE_BENCH_LLAMA_CANDIDATES", "hf_tilewise")
    monkeypatch.setenv("TILEWISE_BENCH_LLAMA_PASSES", "1")
    monkeypatch.delenv("TILEWISE_BENCH_LLAMA_PACKED", raising=False)
    monkeypatch.delenv("TILEWISE_BENCH_LLAMA_PROFILE", raising=False)
    monkeypatch.setattr(S, "transformers_state", lambda config: {})
    drawn = []
    monkeypatch.setattr(S, "_batches", lambda *a, **k: drawn.append(k.get("tokens")) or [])
    monkeypatch.setattr(S, "_candidate", lambda r, name, shape, *a, **k: (100.0, 1 << 30, 2.0, None))
    r = FakeRunner(quick=True, with_shape=True)
    S.run(r)
    assert drawn == ["zipf"] and [row[1] for row in r.rows] == ["layers=2,B=2,S=2048,tokens=zipf"]
    monkeypatch.setenv(settings.BENCH_LLAMA_TOKENS, "text")
    with pytest.raises(ValueError, match="TILEWISE_BENCH_LLAMA_TOKENS"):
        settings.bench_llama_tokens()
