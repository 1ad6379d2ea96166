"""The attention bench suite's guard around a version that may not run here (bench/suites/attention.py)."""

import pytest
import torch
from bench_fakes import FakeRunner

from tilewise.bench.harness import CheckError
from tilewise.bench.suites import attention as S


def test_measured_returns_logs_or_raises():
    r = FakeRunner()
    assert S._measured(r, "v", "1x1", lambda: 1.5) == 1.5 and not r.lines

    def broken():
        raise RuntimeError("out of shared memory")

    assert S._measured(r, "v", "1x1", broken) is None
    assert r.lines == ["  v failed on 1x1: RuntimeError: out of shared memory"]

    def wrong():
        raise CheckError("v: relative error 1 > 0.01")

    with pytest.raises(CheckError):  # a wrong answer is never a missing row
        S._measured(r, "v", "1x1", wrong)


def test_rows_against_flex():
    r, times = FakeRunner(), {}
    S._row_against_flex(r, times, "op", "flex_attention", "s", "bf16", None, 2.0)
    S._row_against_flex(r, times, "op", "flash_attention", "s", "bf16", None, 1.0)
    S._row_against_flex(r, times, "op", "missing", "s", "bf16", None, None)
    assert r.rows == [("flex_attention", 2.0, "", None), ("flash_attention", 1.0, "flex_attention", 2.0)]
    assert times == {"flex_attention": 2.0, "flash_attention": 1.0}


def test_ours_is_compared_with_the_fastest_baseline():
    assert S.best_baseline({"sdpa_flash": 1.3, "sdpa_cudnn": 0.9, "sdpa_efficient": 2.0}) == "sdpa_cudnn"
    assert S.best_baseline({"sdpa_efficient": 2.0}) == "sdpa_efficient"
    assert S.best_baseline({}) == ""



def test_shape_table_parses_grouped_query_items():
    assert S.parse_shapes("4096x64, 8192x128x32x8", 16384) == [(4096, 64, 16, 16), (8192, 128, 32, 8)]
    for bad in ("3000x64", "4096x64x32x5", "4096", ",", "4096x64x32"):
        with pytest.raises(ValueError, match="TILEWISE_BENCH_ATTENTION_SHAPES"):
            S.parse_shapes(bad, 16384)


def test_shape_table_none_leaves_the_fixed_rows_alone():
    """"none": no grid shape, so a full run times only the window, packed and host rows (a device session's
    way to the packed rows without the grid's minutes)."""
    assert S.parse_shapes("none", 16384) == [] and S.parse_shapes(" None ", 16384) == []
    with pytest.raises(ValueError, match="TILEWISE_BENCH_ATTENTION_SHAPES"):
        S.parse_shapes("none,4096x64", 16384)


def test_dtype_list_parses_names_and_rejects_others():
    assert S.parse_dtypes("bfloat16") == [torch.bfloat16]
    assert S.parse_dtypes(" fp16, bfloat16 ,float16") == [torch.float16, torch.bfloat16]
    for bad in ("", ",", "float32", "bf16,half"):
        with pytest.raises(ValueError, match="TILEWISE_BENCH_ATTENTION_DTYPES"):
            S.parse_dtypes(bad)


def test_lean_runs_the_grid_rows_only(monkeypatch):
    from tilewise import settings

    monkeypatch.delenv(settings.BENCH_ATTENTION_LEAN, raising=False)
    assert not settings.bench_attention_lean()
    assert [m[0] for m in S.grid_modes(False)] == ["attention_fwd", "attention_fwd_bwd", "attention_bias_fwd",
                                                    "attention_bias_fwd_bwd"]
    assert S.sdpa_baselines(False) == ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
    monkeypatch.setenv(settings.BENCH_ATTENTION_LEAN, "1")
    assert settings.bench_attention_lean()
    assert S.grid_modes(True) == [("attention_fwd", False, False), ("attention_fwd_bwd", True, False)]
    assert S.sdpa_baselines(True) == ("sdpa_cudnn",)


def test_check_heads_take_a_whole_query_group():
    assert S.check_heads(16, 16) == (2, 2)
    assert S.check_heads(32, 8) == (4, 1)
    assert S.check_heads(6, 3) == (2, 1)


def _gqa_inputs(B=2, H=8, Hkv=2, S_=37, D=16, seed=3):
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S_, D, generator=g)
    k, v = (torch.randn(B, Hkv, S_, D, generator=g) for _ in range(2))
    return q, k, v, torch.randn(B, H, S_, D, generator=g)


@pytest.mark.parametrize("causal", [False, True])
def test_version_check_with_grouped_kv_heads(causal):
    """The check's reference on a grouped-query shape: a right version (SDPA's math backend with
    enable_gqa, as the bench calls it) passes forward and backward; one that pairs query head h with
    K/V head h % Hkv instead of h // (H / Hkv) fails."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    q, k, v, go = _gqa_inputs()
    S._check_version("sdpa", S._sdpa(SDPBackend.MATH), q, k, v, None, causal, go, True)

    def wrong(q, k, v, causal, bias):
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1), is_causal=causal)

    with pytest.raises(CheckError):
        S._check_version("wrong", wrong, q, k, v, None, causal, go, False)


def test_varlen_rows_time_flex_first():
    """``_row_against_flex`` names Flex as a row's baseline only once Flex's time is in, so the varlen rows'
    cases must put Flex first (they did not: flash_attention_varlen's rows named no baseline, and the README
    could not show them)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(S._varlen_packing)))
    cases = [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "cases" for t in n.targets)]
    assert len(cases) == 1 and isinstance(cases[0], ast.Dict)
    assert [k.value for k in cases[0].keys][:2] == ["flex_attention", "flash_attention_varlen"]


def test_autograd_floor_allocates_what_attention_returns():
    """The host row's floor (``_AllocOnly``) gives an output and gradients of attention's shapes and launches
    nothing: what any Python autograd attention must at least do."""
    q, k, v = (torch.randn(1, h, 5, 8, requires_grad=True) for h in (4, 2, 2))
    out = S._AllocOnly.apply(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_balanced_orders_put_every_version_after_every_other_equally():
    from collections import Counter

    from tilewise.bench.harness import balanced_orders

    assert balanced_orders(["a"]) == [("a",)]
    assert balanced_orders(["a", "b"]) == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]
    for names in (["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"], ["a", "b", "c", "d", "e"]):
        orders = balanced_orders(names)
        assert all(sorted(o) == names for o in orders)
        position = Counter((i, x) for o in orders for i, x in enumerate(o))
        assert len(position) == len(names) ** 2 and len(set(position.values())) == 1
        within = Counter((o[i - 1], o[i]) for o in orders for i in range(1, len(o)))
        assert len(within) == len(names) * (len(names) - 1) and len(set(within.values())) == 1
        flat = [x for o in orders for x in o]
        across = Counter((a, b) for a, b in zip(flat, flat[1:]) if a != b)
        if len(names) <= 3:  # chained rounds: the boundaries repeat a version, so successions stay balanced
            assert len(set(across.values())) == 1


def test_time_ms_rounds_takes_each_versions_median_over_its_turns(monkeypatch):
    """The harness times each version once a round in ``balanced_orders``; a version's time is the median of its
    rounds, so one slow turn (as right after a hot version) does not set it."""
    from tilewise.bench import harness as H

    seen = []
    slow_after = {"flex": 1.3}

    def fake(fn, warmup_ms=25, rep_ms=100):
        name = fn()
        prev = seen[-1][0] if seen else None
        seen.append((name, warmup_ms, rep_ms))
        return {"cudnn": 1.0, "flex": 2.0, "ours": 0.95}[name] * slow_after.get(prev, 1.0)

    monkeypatch.setattr(H, "time_ms", fake)
    got = H.time_ms_rounds({n: (lambda n=n: n) for n in ("cudnn", "flex", "ours")}, rep_ms=60)
    assert len(seen) == 18 and {w for _, w, _ in seen[:3]} == {25} and {w for _, w, _ in seen[3:]} == {5}
    assert {r for _, _, r in seen} == {10.0}  # 60 ms over six rounds, at least 10
    # each version ran after Flex in 2 of its 6 rounds: the median is its own time
    assert got == {"cudnn": 1.0, "flex": 2.0, "ours": 0.95}


def test_lean_rows_check_then_time_by_turns_and_compare_with_the_fastest_baseline(monkeypatch):
    checked, timed = [], []

    def check(name, fn, *a):
        checked.append(name)
        if name == "broken":
            raise RuntimeError("no kernel for this case")

    monkeypatch.setattr(S, "_check_version", check)
    monkeypatch.setattr(S, "time_ms_rounds", lambda calls: timed.append(sorted(calls)) or
                        {n: {"sdpa_cudnn": 1.0, "flex_attention": 1.5, "flash_attention": 0.9}[n] for n in calls})
    r = FakeRunner()
    q = torch.zeros(1, 1, 2, 8)
    S._lean_rows(r, {"sdpa_cudnn": None, "broken": None, "flex_attention": None}, q, q, q, False, q, False,
                 opname="attention_fwd", shape="s", dtype=torch.bfloat16, cost=None)
    assert checked == ["sdpa_cudnn", "broken", "flex_attention", "flash_attention"]
    assert timed == [["flash_attention", "flex_attention", "sdpa_cudnn"]]
    assert r.rows == [("sdpa_cudnn", 1.0, "", None), ("flex_attention", 1.5, "", None),
                      ("flash_attention", 0.9, "sdpa_cudnn", 1.0)]
    assert r.lines == ["  broken skipped on s: RuntimeError: no kernel for this case"]
