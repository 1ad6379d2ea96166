import itertools

import pytest
import torch

from tilewise.ops.rowwise import cluster as rc
from tilewise.ops.rowwise import configs as cf
from tilewise.ops.rowwise import softmax as sm

from conftest import HAS_CUDA, poison

@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # the inputs made with the default generator repeat from run to run


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _rel(out, ref):
    o, r = out.double(), ref.double()
    assert torch.equal(torch.isinf(o), torch.isinf(r)), "inf pattern differs"
    assert not torch.isnan(o).any(), "NaN in output"
    f = torch.isfinite(r)
    return ((o[f] - r[f]).norm() / r[f].norm().clamp_min(1e-30)).item()


def _inputs(M, N, dtype, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(M, N, generator=g, device=device) * 3).to(dtype)
    if M > 1:
        x[1] = float("-inf")               # a fully masked row
    if M > 2 and N > 2:
        x[2, ::2] = float("-inf")          # a partly masked row
    return x


# ---------------------------------------------------------------- CPU: references and cost

def test_reference_matches_torch_on_finite_rows():
    x = torch.randn(6, 37, dtype=torch.float64)
    torch.testing.assert_close(sm.reference(x), torch.softmax(x, -1))
    torch.testing.assert_close(sm.reference(x, log=True), torch.log_softmax(x, -1))
    dy = torch.randn_like(x)
    for log, f in ((False, torch.softmax), (True, torch.log_softmax)):
        xr = x.clone().requires_grad_()
        y = f(xr, -1)
        y.backward(dy)
        torch.testing.assert_close(sm.reference_backward(y.detach(), dy, log), xr.grad)


def test_reference_masked_rows_are_defined():
    x = torch.full((2, 5), float("-inf"))
    x[1, 2] = 0.0
    y = sm.reference(x)
    assert torch.equal(y[0], torch.zeros(5)) and y[1, 2] == 1 and y.sum() == 1
    ly = sm.reference(x, log=True)
    assert torch.isneginf(ly[0]).all() and ly[1, 2] == 0
    assert sm.reference(torch.empty(0, 3)).shape == (0, 3)


def test_cost():
    c = sm.cost(32768, 4096, torch.bfloat16)
    assert c.bytes == 2 * 2 * 32768 * 4096 and c.flops == 5 * 32768 * 4096
    assert sm.cost(10, 7, torch.float32, backward=True).bytes == 3 * 4 * 70


def test_fused_config_fits_registers():
    for N in (1, 2, 3, 1000, 4096, 16384):
        rows, block, warps = cf.fused_config(N)
        assert block >= N and block & (block - 1) == 0 and rows & (rows - 1) == 0
        assert rows * block // (32 * warps) <= 32  # fp32 values per thread for one tensor


@pytest.mark.skipif(HAS_CUDA, reason="CPU-only checks")
def test_input_errors():
    with pytest.raises(ValueError, match="dtype torch.int64"):
        sm.softmax(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="unknown variant 'v9'"):
        sm.softmax(torch.ones(3, 4), variant="v9")
    with pytest.raises(ValueError, match="at least one dimension"):
        sm.softmax(torch.tensor(1.0))
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        sm.softmax([1.0, 2.0])
    with pytest.raises(ValueError, match="do not fit in registers"):
        sm.VARIANTS["v2_fused"](torch.ones(1, sm.MAX_FUSED + 1))
    with pytest.raises(ValueError, match="use v3_online"):
        sm.VARIANTS["v4_cluster"](torch.ones(1, sm.MAX_CLUSTER + 1))
    with pytest.raises(ValueError, match="must match y"):
        sm.softmax_backward(torch.ones(2, 3), torch.ones(2, 4))


def test_cpu_without_interpreter_runs_the_reference(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(2, 3)
    torch.testing.assert_close(sm.log_softmax(x), sm.reference(x, log=True))
    with pytest.raises(ValueError, match="'x' is on cpu"):  # a version is a kernel
        sm.VARIANTS["v2_fused"](x)


# ---------------------------------------------------------------- CPU: kernels in the interpreter

@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs on CPU tensors")
@pytest.mark.parametrize("N", [1, 2, 3, 37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", [v for v in sm.VARIANTS if v not in ("v5_cluster_cuda", "v6_cluster_pipe",
                                                                      "v7_cluster_tma")])
def test_interpreter_forward_backward(variant, dtype, N):
    x = _inputs(5, N, dtype, seed=N)
    for log in (False, True):
        ref = sm.reference(x, log)
        y = poison(torch.empty_like(x))
        (sm.LOG_VARIANTS if log else sm.VARIANTS)[variant](x, y)
        assert _rel(y, ref) <= TOL[dtype]
        dy = torch.randn(x.shape).to(dtype)
        dx = sm.BACKWARD_VARIANTS[variant](ref, dy, log)
        assert _rel(dx, sm.reference_backward(ref, dy, log)) <= 2 * TOL[dtype]


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs on CPU tensors")
def test_interpreter_policy_travels_with_the_call_to_its_backward(monkeypatch):
    """``softmax(x, policy=...)``: the forward and the autograd backward of that call run with its
    policy (v3's pass 2 directions here), a call without one with DEFAULT_POLICY; nothing is kept."""
    seen = []
    real = sm._launch

    def spy(kernel, grid, *args, **kw):
        if "REVERSE" in kw:
            seen.append(("fwd" if kernel is sm._softmax_fwd_kernel else "bwd", kw["REVERSE"]))
        return real(kernel, grid, *args, **kw)

    monkeypatch.setattr(sm, "_launch", spy)
    x = _inputs(3, 37, torch.float32).requires_grad_()
    dy = torch.randn(3, 37)
    flipped = cf.DEFAULT_POLICY.replace(fwd_reverse=True, bwd_reverse=False)
    for policy, want in ((flipped, [("fwd", True), ("bwd", False)]), (None, [("fwd", False), ("bwd", True)])):
        seen.clear()
        x.grad = None
        y = sm.softmax(x, variant="v3_online", policy=policy)
        y.backward(dy)
        assert seen == want, policy
        torch.testing.assert_close(y.detach(), sm.reference(x.detach()), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(x.grad, sm.reference_backward(y.detach(), dy), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs on CPU tensors")
@pytest.mark.parametrize("fwd_rev,bwd_rev", [(True, False), (False, True)])
def test_interpreter_online_pass2_either_direction(fwd_rev, bwd_rev):
    """v3_online's second pass forwards and backwards (the policy's fwd_reverse / bwd_reverse),
    rows of 1, 16, 37 and 48 elements: one, several and a partial last chunk of 16."""
    policy = cf.DEFAULT_POLICY.replace(fwd_reverse=fwd_rev, bwd_reverse=bwd_rev)
    for N in (1, 16, 37, 48):
        x = _inputs(3, N, torch.float32, seed=N)
        x[1, : N // 2] = float("-inf")  # a partly masked row; the max arrives in a later chunk
        x[2] = float("-inf")  # all masked: zeros, not NaN
        for log in (False, True):
            y = poison(torch.empty_like(x))
            (sm.LOG_VARIANTS if log else sm.VARIANTS)["v3_online"](x, y, policy=policy)
            ref = sm.reference(x, log)
            torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
            dy = torch.randn(x.shape)
            dx = sm.BACKWARD_VARIANTS["v3_online"](ref, dy, log, policy=policy)
            assert not torch.isnan(dx).any()
            torch.testing.assert_close(dx, sm.reference_backward(ref, dy, log), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs on CPU tensors")
def test_interpreter_autograd_nd_and_noncontiguous():
    x = torch.randn(2, 3, 40, dtype=torch.float64).float()
    for f, tf in ((sm.softmax, torch.softmax), (sm.log_softmax, torch.log_softmax)):
        for v in (None, "v1_unfused", "v3_online", "v4_cluster"):
            a = x.clone().requires_grad_()
            b = x.clone().requires_grad_()
            w = torch.randn_like(x)
            (f(a, variant=v) * w).sum().backward()
            (tf(b, -1) * w).sum().backward()
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    xt = torch.randn(9, 5).t()  # rows not contiguous: copied, not misread
    torch.testing.assert_close(sm.softmax(xt), torch.softmax(xt, -1), rtol=1e-5, atol=1e-6)
    assert sm.softmax(torch.empty(0, 7)).shape == (0, 7)
    assert sm.softmax(torch.empty(3, 0)).shape == (3, 0)


def test_fake_impl_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(4, 8, dtype=torch.bfloat16)
        y = torch.ops.tilewise.softmax_fwd(x, False, "", [])
        assert y.shape == (4, 8) and y.dtype == torch.bfloat16
        assert torch.ops.tilewise.softmax_bwd(y, y, True, "", []).shape == (4, 8)


# ---------------------------------------------------------------- GPU

GPU_SHAPES = [(1, 1), (31, 33), (33, 1000), (7, 4097), (3, 16384), (5, 16385), (9, 100003),
              (4, 131072), (2, 262147)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", list(sm.VARIANTS))
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.quick(rotate="shape")
def test_gpu_variants_forward_backward(variant, dtype, shape, log):
    M, N = shape
    if variant == "v2_fused" and N > sm.MAX_FUSED or variant == "v4_cluster" and N > sm.MAX_CLUSTER:
        pytest.skip("row longer than this version holds")
    if variant == "v4_cluster" and N > sm.CLUSTER_SLICE and sm.cluster_unsupported_reason():
        pytest.skip(sm.cluster_unsupported_reason())  # test_gpu_cluster_fails_cleanly checks the error
    if variant in ("v5_cluster_cuda", "v6_cluster_pipe", "v7_cluster_tma") and (
            N % (16 // dtype.itemsize) or N > rc.max_row(dtype, "bwd") or N > 131072):
        pytest.skip("rows not of whole 16-byte vectors (tests/test_rowwise_cluster.py checks the error)")
    if variant == "v7_cluster_tma" and dtype == torch.float32:
        pytest.skip("v7 is built for 2-byte types (tests/test_rowwise_cluster.py checks the error)")
    x = _inputs(M, N, dtype, "cuda", seed=M * N)
    ref = sm.reference(x.double(), log)
    y = poison(torch.empty_like(x))
    (sm.LOG_VARIANTS if log else sm.VARIANTS)[variant](x, y)
    assert _rel(y, ref) <= TOL[dtype]
    dy = torch.randn(x.shape, device="cuda").to(dtype)
    dx = sm.BACKWARD_VARIANTS[variant](y, dy, log)
    assert _rel(dx, sm.reference_backward(y.double(), dy.double(), log)) <= 2 * TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", list(sm.VARIANTS))
@pytest.mark.parametrize("log", [False, True])
def test_gpu_every_table_entry(variant, dtype, log):
    """Each entry of VARIANTS / LOG_VARIANTS and BACKWARD_VARIANTS through the table, at a row every
    version holds (33 x 1000: not a multiple of any block, whole 16-byte vectors)."""
    if variant == "v7_cluster_tma" and dtype == torch.float32:
        pytest.skip("v7 is built for 2-byte types (tests/test_rowwise_cluster.py checks the error)")
    x = _inputs(33, 1000, dtype, "cuda", seed=5)
    y = poison(torch.empty_like(x))
    (sm.LOG_VARIANTS if log else sm.VARIANTS)[variant](x, y)
    assert _rel(y, sm.reference(x.double(), log)) <= TOL[dtype]
    dy = torch.randn(x.shape, device="cuda").to(dtype)
    dx = sm.BACKWARD_VARIANTS[variant](y, dy, log)
    assert _rel(dx, sm.reference_backward(y.double(), dy.double(), log)) <= 2 * TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("N", [2, 4096, 131072])
def test_gpu_autograd_against_torch_fp32(N):
    x = torch.randn(64, N, device="cuda")
    cluster = N > sm.MAX_FUSED and not sm.cluster_unsupported_reason()
    variants = [None] + (["v4_cluster"] if cluster else [])
    for (f, tf), v in itertools.product(((sm.softmax, torch.softmax),
                                         (sm.log_softmax, torch.log_softmax)), variants):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        w = torch.randn_like(x)
        ya, yb = f(a, variant=v), tf(b, -1)
        (ya * w).sum().backward()
        (yb * w).sum().backward()
        assert _rel(ya.detach(), yb.detach()) < 1e-5, v
        assert _rel(a.grad, b.grad) < 1e-4, v


@pytest.mark.gpu
def test_gpu_cluster_fails_cleanly():
    """On a Triton that cannot build the multi-CTA kernel, v4_cluster raises NotImplementedError
    naming the Triton version (forward, backward, autograd); elsewhere it gives the right answer.
    Never a silently wrong result."""
    import triton

    x = _inputs(3, 2 * sm.CLUSTER_SLICE + 5, torch.bfloat16, "cuda", seed=5)
    why = sm.cluster_unsupported_reason()
    if why:
        assert triton.__version__ in why
        for call in (lambda: sm.VARIANTS["v4_cluster"](x),
                     lambda: sm.BACKWARD_VARIANTS["v4_cluster"](x, x),
                     lambda: sm.softmax(x, variant="v4_cluster")):
            with pytest.raises(NotImplementedError, match=f"Triton {triton.__version__}"):
                call()
        assert sm.cluster_unsupported_reason() == why  # found out once, then cached
    else:
        assert _rel(sm.VARIANTS["v4_cluster"](x), sm.reference(x.double())) <= TOL[torch.bfloat16]
    # one CTA (rows <= 16384) is the v2 kernel: always available
    xs = _inputs(3, 1000, torch.bfloat16, "cuda", seed=6)
    assert _rel(sm.VARIANTS["v4_cluster"](xs), sm.reference(xs.double())) <= TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_compile_traces_through():
    x = torch.randn(33, 1000, device="cuda", requires_grad=True)
    f = torch.compile(lambda t: sm.softmax(t).square().sum())
    f(x).backward()
    g = x.grad.clone()
    x.grad = None
    torch.softmax(x, -1).square().sum().backward()
    assert _rel(g, x.grad) < 1e-4


@pytest.mark.gpu
def test_gpu_large_rows_past_32bit_offsets():
    # 2**31 + a row's worth of elements: row offsets past int32 must not wrap.
    M, N = 16385, 131072
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    y = sm.softmax(x)
    for r in (0, M - 1):
        assert _rel(y[r:r + 1], sm.reference(x[r:r + 1].double())) <= 1e-2


# ---------------------------------------------------------------- CPU: compiled for the H200

_COMPILE_SCRIPT = r"""
import importlib, json, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
results = []
for module, name, signature, constexprs, num_warps, *ctas in json.loads(sys.stdin.read()):
    fn = getattr(importlib.import_module(module), name)
    opts = {"num_warps": num_warps, "num_ctas": ctas[0] if ctas else 1}
    k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.TemporaryDirectory() as d:
        with open(d + "/k.ptx", "w") as f:
            f.write(k.asm["ptx"])
        arch = re.search(r"\.target\s+(sm_\w+)", k.asm["ptx"]).group(1)
        out = subprocess.run([get_ptxas(90).path, "-arch=" + arch, "-v", d + "/k.ptx", "-o",
                              d + "/k.cubin"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    if out.returncode:
        raise SystemExit(text)
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    spills = sum(int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    results.append([name, regs, spills])
print(json.dumps(results))
"""


def compile_sm90(jobs: list) -> list:
    """Compile Triton kernels for sm_90 with no GPU, in a child process without the interpreter
    (under TRITON_INTERPRET the kernels are not compilable objects). jobs: (module, kernel name,
    signature, constexprs, num_warps[, num_ctas]). Returns [name, registers, spill bytes] from ptxas -v."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    out = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], input=json.dumps(jobs),
                         capture_output=True, text=True, env=env, timeout=300)
    if out.returncode and ("ModuleNotFoundError" in out.stderr or "ImportError" in out.stderr):
        pytest.skip(f"this Triton cannot compile for sm_90 here: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_FWD_SIG = {"X": "*bf16", "Y": "*bf16", "M": "i32", "N": "i32", "stride_xm": "i32", "stride_ym": "i32",
            "ROWS": "constexpr", "BLOCK": "constexpr", "LOG": "constexpr", "ONE_PASS": "constexpr",
            "REVERSE": "constexpr"}
_BWD_SIG = {"Yp": "*bf16", "DY": "*bf16", "DX": "*bf16", "M": "i32", "N": "i32", "stride_ym": "i32",
            "stride_dym": "i32", "stride_dxm": "i32", "ROWS": "constexpr", "BLOCK": "constexpr",
            "LOG": "constexpr", "ONE_PASS": "constexpr", "REVERSE": "constexpr"}


@pytest.mark.skipif(HAS_CUDA, reason="compile check for CI (the device runs the kernels)")
def test_kernels_compile_for_sm90_without_spills():
    """Every issue-7 kernel (softmax, cross_entropy, recompute) at its launch configs: ptxas for
    sm_90a, no spills, registers within the SM for the warps asked."""
    jobs = []
    for dtype, size in (("bf16", 2), ("fp32", 4)):
        # fp32 only where registers are tightest (the interpreter covers the rest's logic).
        for case in ("fused4096", "fused16384", "fused2", "online")[1 if size == 4 else 0:]:
            if size == 4 and case == "fused2":
                continue
            for name, sig, streams in (("_softmax_fwd_kernel", _FWD_SIG, 1),
                                       ("_softmax_bwd_kernel", _BWD_SIG, 2)):
                if case == "online":  # the launch config of a 131072-long row (_online_config)
                    rows, block, warps, one = 1, cf.ONLINE_CHUNK_BYTES // (streams * size), \
                        cf.ONLINE_WARPS, False
                else:
                    (rows, block, warps), one = cf.fused_config(int(case[5:])), True
                sig = {k: (f"*{dtype}" if v == "*bf16" else v) for k, v in sig.items()}
                for log in ((False, True) if case == "online" else (False,)):
                    pol = cf.DEFAULT_POLICY
                    rev = not one and (pol.fwd_reverse if streams == 1 else pol.bwd_reverse)
                    jobs.append(["tilewise.ops.rowwise.softmax", name, sig,
                                 {"ROWS": rows, "BLOCK": block, "LOG": log, "ONE_PASS": one,
                                  "REVERSE": rev}, warps])
        for block in (sm.MAX_CLUSTER,):  # v4_cluster: the row split over num_ctas CTAs
            for name, sig in (("_softmax_fwd_kernel", _FWD_SIG), ("_softmax_bwd_kernel", _BWD_SIG)):
                sig = {k: (f"*{dtype}" if v == "*bf16" else v) for k, v in sig.items()}
                jobs.append(["tilewise.ops.rowwise.softmax", name, sig,
                             {"ROWS": 1, "BLOCK": block, "LOG": False, "ONE_PASS": True,
                              "REVERSE": False}, 16,
                             block // sm.CLUSTER_SLICE])
    jobs.append(["tilewise.ops.rowwise.softmax", "_row_max_kernel",
                 {"X": "*bf16", "MX": "*fp32", "N": "i32", "stride_xm": "i32", "BLOCK": "constexpr"},
                 {"BLOCK": cf.UNFUSED_BLOCK}, 4])
    jobs += _cross_entropy_jobs() + _recompute_jobs()
    for (name, regs, spills), job in zip(compile_sm90(jobs), jobs):
        print(name, job[3], job[4], "warps:", regs, "registers,", spills, "B spilled")
        assert spills == 0, f"{name} {job[3]} spills {spills} B ({regs} registers)"
        assert regs * 32 * job[4] <= 65536


def _cross_entropy_jobs():
    from tilewise.ops.rowwise import cross_entropy as ce
    jobs = []
    for case in ("online_bf16", "online_fp32", "fused2", "fused16384"):
        p = "*fp32" if case.endswith("fp32") else "*bf16"
        if case.startswith("online"):
            rows, warps, one = 1, cf.ONLINE_WARPS, False
            block = cf.ONLINE_CHUNK_BYTES // (4 if p == "*fp32" else 2)
        else:
            C = int(case[5:])
            block = max(16, 1 << (C - 1).bit_length())
            rows = max(1, cf.FUSED_TILE // block)
            warps = 4 if rows * block <= 1024 else 8 if rows * block <= 4096 else 16
            one = True
        sig = {"X": p, "T": "*i64", "LOSS": "*fp32", "DX": p, "M": "i32", "N": "i32",
               "stride_xm": "i32", "stride_dxm": "i32", "ignore_index": "i32", "smoothing": "fp32",
               "grad_scale": "fp32", "ROWS": "constexpr", "BLOCK": "constexpr", "ONE_PASS": "constexpr",
               "HAS_GRAD": "constexpr", "SMOOTH": "constexpr"}
        for smooth in ((False, True) if case.startswith("online") else (True,)):
            jobs.append(["tilewise.ops.rowwise.cross_entropy", "_ce_kernel", sig,
                         {"ROWS": rows, "BLOCK": block, "ONE_PASS": one, "HAS_GRAD": True,
                          "SMOOTH": smooth}, warps])
            if case == "online_bf16":  # v4_cluster at C = 131072: 8 CTAs of 16384 classes
                jobs.append(["tilewise.ops.rowwise.cross_entropy", "_ce_kernel", sig,
                             {"ROWS": 1, "BLOCK": ce.MAX_CLUSTER, "ONE_PASS": True, "HAS_GRAD": True,
                              "SMOOTH": smooth}, 16, ce.MAX_CLUSTER // ce.CLUSTER_SLICE])
    # The backward's device-side scale (runs after every eager cross-entropy backward): a loop whose
    # trip count comes from a loaded value must build for sm_90.
    for p in ("*bf16", "*fp32"):
        jobs.append(["tilewise.ops.rowwise.cross_entropy", "_scale_unless_one_kernel",
                     {"G": p, "DLOSS": p, "total": "i64", "BLOCK": "constexpr", "ITERS": "constexpr"},
                     {"BLOCK": cf.SCALE_BLOCK, "ITERS": 4}, 4])
    return jobs


def _recompute_jobs():
    from tilewise.ops.pointwise.configs import RECOMPUTE_BLOCK
    p = "*bf16"
    return [
        ["tilewise.ops.pointwise.recompute", "_fwd_kernel", {"X": p, "A1": p, "A2": p, "Y": p, "n": "i64",
         "STORE": "constexpr", "BLOCK": "constexpr"}, {"STORE": True, "BLOCK": RECOMPUTE_BLOCK}, 8],
        ["tilewise.ops.pointwise.recompute", "_bwd_stored_kernel", {"A1": p, "A2": p, "DY": p, "DX": p,
         "n": "i64", "BLOCK": "constexpr"}, {"BLOCK": RECOMPUTE_BLOCK}, 8],
        ["tilewise.ops.pointwise.recompute", "_bwd_recompute_kernel", {"X": p, "DY": p, "DX": p, "n": "i64",
         "BLOCK": "constexpr"}, {"BLOCK": RECOMPUTE_BLOCK}, 8],
    ]
