"""scripts/llama_convergence.py on the CPU: a tiny model, a few steps, RMSNorm / RoPE / SwiGLU and the
fused loss in Triton's interpreter (attention stays transformers' own: flash_attention needs CUDA)."""

import json
import math

import pytest
import torch
from conftest import load_script

pytest.importorskip("transformers")


def _script():
    return load_script("llama_convergence")


def test_tiny_run_writes_its_record(tmp_path, monkeypatch):
    from transformers.models.llama import modeling_llama as ml

    monkeypatch.setattr(ml, "apply_rotary_pos_emb", ml.apply_rotary_pos_emb)  # apply_tilewise patches it
    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"a short line of text number {i} \t{i % 2}\n" for i in range(60)))
    m = _script()
    rc = m.main(["--data", str(data), "--out", str(tmp_path), "--steps", "4", "--batch", "2", "--seq", "32",
                 "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--device", "cpu",
                 "--parts", "rms_norm,rope,swiglu,loss", "--tolerance", "50"])
    rec = json.loads((tmp_path / "llama-convergence.json").read_text())
    assert set(rec["losses"]) == {"hf_fp32", "hf_bf16", "tilewise_bf16"}
    assert all(len(v) == 4 and all(math.isfinite(x) for x in v) for v in rec["losses"].values())
    first = {n: v[0] for n, v in rec["losses"].items()}  # same weights, same batch: the first losses agree
    assert abs(first["tilewise_bf16"] - first["hf_fp32"]) < 0.05 * first["hf_fp32"]
    assert rec["tilewise_parts"] == ["loss", "rms_norm", "rope", "swiglu"]
    assert rc == (0 if rec["pass"] else 1)


def test_corpus_and_windows(tmp_path):
    m = _script()
    data = tmp_path / "t.tsv"
    data.write_text("sentence\tlabel\nab\t1\n\t0\nc\t0\n")
    s = m.read_corpus(data)
    assert s.tolist() == [m.BOS, 97, 98, m.EOS, m.BOS, 99, m.EOS]
    w = m.windows(torch.arange(100), 3, 10, 2, seed=0)
    assert len(w) == 2 and w[0].shape == (3, 10) and torch.equal(w[0], m.windows(torch.arange(100), 3, 10, 2, 0)[0])
    with pytest.raises(SystemExit, match="shorter than --seq"):
        m.windows(torch.arange(5), 1, 10, 1, 0)
