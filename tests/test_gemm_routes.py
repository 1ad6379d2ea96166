"""gemm()'s routing on the CPU: for a grid of shapes, dtypes, layouts, epilogues and given outputs
(tests/gemm_route_record.py), what gemm() launches on an H200-like target (132 SMs, the sm_90a
kernels available), with call plans on and off, and the routing rules' values over a grid, against
the record tests/gemm_routes.json: the routing the GPU runs measured. A difference is a routing
change (it needs a GPU A/B run before the record is rewritten with ``python
tests/test_gemm_routes.py --write``, in a process without TRITON_INTERPRET)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gemm_route_record as R
from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import route as gr

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "gemm_routes.json"


def _hooks(events):
    from tilewise.ops.gemm import api, sm90, triton_kernels as tk
    from tilewise.ops.transpose import api as tr

    # CPU tensors stand in for the GPU's: the kernel path, not the one CPU rule's reference
    return [(api, "runs_reference", lambda *a, **k: False),
            (tk, "_launch", R.kernel_hook(events)), (gr, "_bind", R.kernel_hook(events)),
            (sm90, "_launch", R.sm90_hook(events)),
            (sm90, "_tf32_launch", R.tf32_hook(events, gc.tf32_bm_for, gc.tf32_cluster_for)),
            (tr, "transpose", R.transpose_hook(events)), (tk, "num_sms", lambda device_index: R.SMS),
            (sm90, "available", lambda device_index=None: True)]


def _call(a, b, kw, plans):
    from tilewise.ops.gemm import api

    api.gemm(a, b, **kw, policy=gc.GemmPolicy(plans=plans))


def _rules() -> dict:
    return R.rules(dict(config_for=gc.sm90_config_for, route_for=gc.sm90_route_for, tma_tile_for=gc.tma_tile_for,
                        split_k_for=gc.split_k_for, tf32_bm_for=gc.tf32_bm_for, tf32_cluster_for=gc.tf32_cluster_for,
                        tail_splits=gc.sm90_tail_splits, split_k=gc.sm90_split_k,
                        padded_time_ratio=gc.padded_time_ratio))


def _table() -> dict:
    """The record of this tree (run without TRITON_INTERPRET: the GPU build's kernels)."""
    table = R.compact(R.record(_hooks, _call, gr.PLANS.clear))
    table["rules"] = _rules()
    return table


def test_routes_match_the_record():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    code = "import json, test_gemm_routes as t; print(json.dumps(t._table()))"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    want = json.loads(RECORD.read_text())
    assert got["rules"] == want["rules"], "a routing rule's values changed over the grid"
    assert set(got["cases"]) == set(want["cases"]), "the grid changed: rewrite the record (see the docstring)"

    def summaries(t, entry):
        return [t["summaries"][i] for i, _ in (entry if isinstance(entry[0], list) else [entry])]

    diff = [f"{c}: {summaries(want, want['cases'][c])} -> {summaries(got, got['cases'][c])}"
            for c in sorted(want["cases"]) if got["cases"][c] != want["cases"][c]]
    assert not diff, f"{len(diff)} calls launch differently:\n  " + "\n  ".join(diff[:40])


def _problem(shape, dtype=torch.bfloat16, b_kmajor=False, **kw):
    M, N, K = shape
    a = gc.Operand((M, K), (K, 1), dtype, True, True)
    b = gc.Operand((K, N), (1, K), dtype, True, False) if b_kmajor else gc.Operand((K, N), (N, 1), dtype, True, True)
    return gc.Problem(a, b, **kw)


def test_route_is_a_function_of_the_description():
    """configs.route reads only the Problem: the H200 target's routes for a few calls."""
    assert gc.route(_problem((1000, 1000, 1000))) == gc.Route("sm90", config="64x128_c2x1")
    assert gc.route(_problem((1000, 1000, 1000), b_kmajor=True)) == gc.Route("tma_64x128")
    assert gc.route(_problem((1536, 1536, 264), bias=True)) == gc.Route("tma_split")
    assert gc.route(_problem((512, 512, 512))) == gc.Route("small")
    assert gc.route(_problem((8192, 8192, 8192), b_kmajor=True)) == gc.Route("v1")
    assert gc.route(_problem((256, 50, 4096), torch.float32, b_kmajor=True)) == gc.Route("splitk")
    assert gc.route(_problem((4096, 4096, 4096), torch.float32)) == gc.Route("tf32_sm90")
    assert gc.route(_problem((4096, 4096, 4096), torch.float32, bias=True)) == gc.Route("tma", transpose_b=True)
    interp = gc.Target(sms=4, sm90=False, interpret=True)
    assert gc.route(_problem((4096, 4096, 4096), torch.float32, target=interp)) == gc.Route("tma")
    odd = gc.Problem(gc.Operand((2999, 2999), (2999, 1), torch.bfloat16, True, True),
                     gc.Operand((2999, 2999), (2999, 1), torch.bfloat16, True, True))
    assert gc.route(odd) == gc.Route("padded", pad=(True, True, True))
    assert gc.route(gc.Problem(None, None)) == gc.Route("v1")  # not 2-D tensors: the checked path


def test_route_of_tensors_reads_layout_and_target():
    a = torch.empty(1000, 1000, dtype=torch.bfloat16)
    b = torch.empty(1000, 1000, dtype=torch.bfloat16)
    gpu = gc.Target(sms=132, sm90=True, interpret=False)
    p = gr.problem_of(a, b, target=gpu)
    assert p.a == gc.Operand((1000, 1000), (1000, 1), torch.bfloat16, a.data_ptr() % 16 == 0, True)
    assert not p.cuda  # CPU tensors: the GPU-only routes stay off
    assert gr.route_of(a, b, target=gpu) == gc.Route("tma_64x128")
    assert gr.route_of(a, b, bias=torch.empty(1000), activation="relu", target=gpu) == gc.Route("tma_64x128")
    # arguments that are not 2-D tensors: the checked path, which names what is wrong
    assert gr.route_of([[1.0]], b) == gc.Route("v1")
    assert gr.route_of(a, b, out=torch.empty(2, 2, 2), target=gpu) == gc.Route("v1")


def test_policy_is_frozen_and_keys_the_plans():
    with pytest.raises(AttributeError):
        gc.DEFAULT_POLICY.plans = False
    a = torch.empty(64, 64, dtype=torch.bfloat16)
    k1 = gr.plan_key(a, a, None, None, None, "tf32", None)
    assert k1 == gr.plan_key(a, a, None, None, None, "tf32", None, gc.GemmPolicy())
    assert k1 != gr.plan_key(a, a, None, None, None, "tf32", None, gc.GemmPolicy(pdl=False))


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    RECORD.write_text(R.dump(_table()))
