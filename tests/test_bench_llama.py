"""The llama bench suite's pieces that need no GPU: its FLOP count's parameter total, the undoing of
the patches between candidates, the chart."""

import pytest
import torch

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
        ours_sdpa = S._build("hf_tilewise_sdpa_attn", config, state, device="cpu")[0]
    finally:
        S._restore(snap)
    assert ours.config._attn_implementation == "tilewise"
    assert after.config._attn_implementation == "sdpa" and config._attn_implementation == "sdpa"
    assert ours_sdpa.config._attn_implementation == "sdpa"
    assert any(type(m).__name__ == "RMSNorm" and type(m).__module__.startswith("tilewise") for m in ours_sdpa.modules())


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
