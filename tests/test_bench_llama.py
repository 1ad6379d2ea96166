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
