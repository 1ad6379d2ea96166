"""ops/rowwise/cluster.cu: softmax / log-softmax forward and backward and cross-entropy over
thread-block clusters (softmax's and cross_entropy's v5_cluster_cuda)."""

import pytest
import torch
import torch.nn.functional as F

from tilewise.bench.harness import peak_extra_bytes
from tilewise.ops.rowwise import cross_entropy as ce
from tilewise.ops.rowwise import cluster as rc
from tilewise.ops.rowwise import configs as cf
from tilewise.ops.rowwise import softmax as sm

from conftest import poison

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _rel(out, ref):
    o, r = out.double(), ref.double()
    assert not torch.isnan(o).any(), "NaN in output"
    return ((o - r).norm() / r.norm().clamp_min(1e-2)).item()


# ---------------------------------------------------------------- CPU


def test_pick_takes_the_smallest_config_that_holds_the_row():
    bf = torch.bfloat16
    assert cf.pick(bf, 16392) == (2, 256, 8)          # 2 x 256 x 8 x 8 = 32768
    assert cf.pick(bf, 32768) == (2, 256, 8)
    assert cf.pick(bf, 32776) == (4, 256, 8)
    assert cf.pick(bf, 131072) == (8, 256, 8)
    assert cf.pick(bf, 131080) == (8, 1024, 4)
    assert cf.max_row(bf) == 262144
    assert cf.pick(torch.float32, 131072) == (8, 512, 8)
    assert cf.max_row(torch.float32, "bwd") == 131072
    with pytest.raises(ValueError, match="exceed"):
        cf.pick(bf, 262152)
    for (kind, size), cfgs in cf.CONFIGS.items():
        caps = [cf.capacity(torch.float32 if size == 4 else bf, c) for c in cfgs]
        assert caps == sorted(caps) and len(set(caps)) == len(caps), (kind, size)


def test_every_config_is_instantiated_in_the_cu():
    import pathlib

    src = (pathlib.Path(rc.__file__).parent / "cluster.cu").read_text()
    listed = {n for line in src.splitlines() if "tilewise-instantiate:" in line
              for n in line.split(":", 1)[1].split()}
    for (kind, size), cfgs in cf.CONFIGS.items():
        for ty in (("__nv_bfloat16", "__half") if size == 2 else ("float",)):
            extra = cf.EXTRA_BF16[kind] if ty == "__nv_bfloat16" else cf.EXTRA_FP32[kind] if ty == "float" else ()
            for cl, nt, ch in tuple(cfgs) + tuple(extra):
                assert f"{rc._NAMES[kind]}<{ty},{cl},{nt},{ch}>" in listed
            if kind in cf.PIPE_KINDS:
                for cfg in cfgs:
                    name = f"{rc._NAMES[kind + '_pipe']}<{ty},{','.join(map(str, cfg))}>"
                    assert (name in listed) == (cfg in cf.pipe_configs(kind, size)), name
                    assert (cf.pipe_shmem(cfg) <= cf.SHMEM_LIMIT) == (name in listed), name


def test_unsupported_reason_on_cpu():
    assert "CUDA" in rc.unsupported_reason(torch.zeros(2, 16))


# ---------------------------------------------------------------- GPU

SHAPES = [(1, 16392), (33, 40000), (5, 65536), (7, 100008), (4, 131072), (3, 262144)]


def _x(M, N, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(M, N, generator=g, device="cuda") * 3).to(dtype)
    if M > 2:
        x[1] = float("-inf")               # a fully masked row
        x[2, : N // 3] = float("-inf")     # masked at the start (other CTAs of the cluster see it)
    return x


def _check_forward(fwd, x, log, dtype):
    """fwd(x, y, log) into a poisoned y against the float64 reference: -inf exactly where the
    reference has it (log-softmax of masked entries), the finite part within dtype's tolerance."""
    y = poison(torch.empty_like(x))
    fwd(x, y, log)
    ref = sm.reference(x.double(), log)
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(y), fin)
    assert _rel(torch.where(fin, y.double(), 0), torch.where(fin, ref, 0)) <= TOL[dtype]
    return y


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.quick(rotate="shape", per=2)
def test_gpu_softmax_forward_backward(shape, dtype, log):
    M, N = shape
    if N > cf.max_row(dtype, "fwd"):
        pytest.skip("row longer than the configurations hold")
    x = _x(M, N, dtype, seed=M + N)
    y = _check_forward(rc.softmax_fwd, x, log, dtype)
    if N > cf.max_row(dtype, "bwd"):
        return
    yb = y if not log else torch.where(torch.isfinite(y), y, torch.full_like(y, -1e4))
    dy = torch.randn(x.shape, device="cuda").to(dtype)
    dx = poison(torch.empty_like(x))
    rc.softmax_bwd(yb, dy, dx, log)
    assert _rel(dx, sm.reference_backward(yb.double(), dy.double(), log)) <= 2 * TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("config", [(8, 512, 4), (8, 256, 8), (8, 1024, 4)], ids=str)
def test_gpu_bf16_configs_of_a_131072_row(config):
    x = _x(6, 131072, torch.bfloat16, seed=7)
    y = poison(torch.empty_like(x))
    rc.softmax_fwd(x, y, False, config=config)
    assert _rel(y, sm.reference(x.double())) <= TOL[torch.bfloat16]
    dy = torch.randn_like(y)
    dx = poison(torch.empty_like(x))
    rc.softmax_bwd(y, dy, dx, False, config=config)
    assert _rel(dx, sm.reference_backward(y.double(), dy.double(), False)) <= 2 * TOL[torch.bfloat16]
    t = torch.randint(0, 131072, (6,), device="cuda")
    xs = torch.randn(6, 131072, device="cuda", dtype=torch.bfloat16)
    loss = poison(torch.empty(6, device="cuda"))
    g = poison(torch.empty_like(xs))
    rc.cross_entropy(xs, t, loss, g, -100, 0.0, 1.0, config=config)
    b = xs.double().requires_grad_()
    lb = F.cross_entropy(b, t, reduction="none")
    lb.sum().backward()
    assert _rel(loss, lb.detach()) <= 1e-4
    assert _rel(g, b.grad) <= TOL[torch.bfloat16]


def _every_built_config():
    """(kind, dtype, config, pipe) for each v5 / v6 kernel the module builds (TMA and one-exp
    builds have tests of their own)."""
    out = []
    for (kind, size), cfgs in cf.CONFIGS.items():
        for dtype in ((torch.bfloat16, torch.float16) if size == 2 else (torch.float32,)):
            extra = cf.EXTRA_BF16 if dtype == torch.bfloat16 else cf.EXTRA_FP32 if size == 4 else {}
            for cfg in tuple(cfgs) + tuple(extra.get(kind, ())):
                out.append((kind, dtype, cfg, False))
                if kind in cf.PIPE_KINDS and cfg in cf.pipe_configs(kind, size):
                    out.append((kind, dtype, cfg, True))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("kind,dtype,config,pipe", _every_built_config(), ids=str)
def test_gpu_every_built_config_on_a_short_row(kind, dtype, config, pipe):
    """Each built (kind, dtype, config) on rows far shorter than its capacity and not a multiple of
    its block's chunk (most CTAs of the cluster get an empty or partial slice)."""
    M, N = 5, 1992
    g = torch.Generator(device="cuda").manual_seed(N)
    x = (torch.randn(M, N, generator=g, device="cuda") * 3).to(dtype)
    if kind == "fwd":
        y = poison(torch.empty_like(x))
        rc.softmax_fwd(x, y, True, config=config, pipe=pipe, one_exp=False)
        assert _rel(y, sm.reference(x.double(), log=True)) <= TOL[dtype] * 4
    elif kind == "bwd":
        y = sm.reference(x.double()).to(dtype)
        dy = torch.randn(M, N, generator=g, device="cuda").to(dtype)
        dx = poison(torch.empty_like(x))
        rc.softmax_bwd(y, dy, dx, False, config=config)
        assert _rel(dx, sm.reference_backward(y.double(), dy.double(), False)) <= 2 * TOL[dtype]
    else:
        t = torch.randint(0, N, (M,), generator=g, device="cuda")
        t[1] = -100
        loss, dx = poison(torch.empty(M, device="cuda")), poison(torch.empty_like(x))
        rc.cross_entropy(x, t, loss, dx, -100, 0.1, 0.5, config=config, pipe=pipe, one_exp=False)
        b = x.double().requires_grad_()
        lb = F.cross_entropy(b, t, reduction="none", label_smoothing=0.1)
        (lb.sum() * 0.5).backward()
        assert _rel(loss, lb.detach()) <= TOL[dtype]
        assert _rel(dx, b.grad) <= 2 * TOL[dtype]


@pytest.mark.gpu
def test_gpu_softmax_default_and_autograd():
    x = torch.randn(8, 131072, device="cuda")
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    w = torch.randn_like(x)
    (sm.softmax(a) * w).sum().backward()
    (torch.softmax(b, -1) * w).sum().backward()
    assert _rel(a.grad, b.grad) < 1e-4
    # past MAX_FUSED the default forward is v7 for 2-byte rows up to 131072, v5 for fp32 or longer
    # rows, when the layout allows: same bits as naming it
    xb = x.to(torch.bfloat16)
    assert sm.default_variant(xb) == "v7_cluster_tma" and sm.default_variant(x) == "v5_cluster_cuda"
    assert sm.default_variant(xb, "bwd") == "v5_cluster_cuda"
    assert torch.equal(sm.softmax(xb), sm.softmax(xb, variant="v7_cluster_tma"))
    assert torch.equal(sm.softmax(x), sm.softmax(x, variant="v5_cluster_cuda"))
    xl = torch.randn(2, 131080, device="cuda", dtype=torch.bfloat16)
    assert sm.default_variant(xl) == "v5_cluster_cuda"
    assert torch.equal(sm.softmax(xl), sm.softmax(xl, variant="v5_cluster_cuda"))
    with pytest.raises(ValueError, match="16 bytes"):
        sm.softmax(torch.randn(2, 40001, device="cuda"), variant="v5_cluster_cuda")
    odd = torch.randn(2, 40001, device="cuda")  # the default falls back to v3_online
    assert _rel(sm.softmax(odd), torch.softmax(odd.double(), -1)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 16392), (33, 40000), (17, 131072), (3, 262144)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.quick(rotate="shape", per=2)
def test_gpu_cross_entropy_against_torch(shape, dtype, reduction):
    N, C = shape
    if C > cf.max_row(dtype, "ce"):
        pytest.skip("C larger than the configurations hold")
    g = torch.Generator(device="cuda").manual_seed(N + C)
    x = (torch.randn(N, C, generator=g, device="cuda") * 2).to(dtype)
    t = torch.randint(0, C, (N,), generator=g, device="cuda")
    if N > 3:
        t[3] = -100
    t[0] = C - 1  # the target in the last CTA's slice
    for ls in (0.0, 0.1):
        a = x.clone().requires_grad_()
        b = x.double().requires_grad_()
        la = ce.cross_entropy(a, t, reduction=reduction, label_smoothing=ls, variant="v5_cluster_cuda")
        lb = F.cross_entropy(b, t, reduction=reduction, label_smoothing=ls)
        w = torch.randn(la.shape, dtype=torch.float64, device="cuda")
        (la.double() * w).sum().backward()
        (lb * w).sum().backward()
        assert _rel(la.detach(), lb.detach()) <= TOL[dtype]
        assert _rel(a.grad, b.grad) <= 2 * TOL[dtype]
    with torch.no_grad():  # loss only: no gradient written
        assert _rel(ce.cross_entropy(x, t, reduction=reduction, variant="v5_cluster_cuda"),
                    F.cross_entropy(x.double(), t, reduction=reduction)) <= TOL[dtype]


@pytest.mark.gpu
def test_gpu_cross_entropy_default_is_v7_and_peak_memory():
    N, C = 1024, 131072
    x = torch.randn(N, C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, C, (N,), device="cuda")
    assert ce.default_variant(x) == "v7_cluster_tma"
    assert ce.default_variant(x.detach().float()) == "v5_cluster_cuda"
    la = ce.cross_entropy(x.detach(), t)
    assert torch.equal(la, ce.cross_entropy(x.detach(), t, variant="v7_cluster_tma"))
    assert _rel(la.float(), ce.cross_entropy(x.detach(), t, variant="v5_cluster_cuda").float()) < 1e-3
    extra = peak_extra_bytes(lambda: ce.cross_entropy(x, t).backward())
    assert extra <= N * C * 2 + (1 << 20), f"peak extra {extra} B vs gradient {N * C * 2} B"


@pytest.mark.gpu
@pytest.mark.sanitize
def test_sanitizer_cluster_kernels_small():
    """Small enough for compute-sanitizer (memcheck / racecheck): every kernel once."""
    x = _x(3, 16392, torch.bfloat16, seed=1)
    y = poison(torch.empty_like(x))
    rc.softmax_fwd(x, y, False)
    dx = poison(torch.empty_like(x))
    rc.softmax_bwd(y, y, dx, False)
    t = torch.tensor([0, 16391, -100], device="cuda")
    loss = poison(torch.empty(3, device="cuda"))
    rc.cross_entropy(x.nan_to_num(neginf=0.0), t, loss, dx, -100, 0.1, 1.0)
    torch.cuda.synchronize()
    assert not torch.isnan(dx).any() and not torch.isnan(loss).any()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 16392), (33, 40000), (300, 65536), (97, 131072)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_pipelined_forward_and_cross_entropy(shape, dtype):
    """v6: more rows than resident clusters (each cluster walks several, double-buffered), odd
    row counts, masked rows; outputs poisoned."""
    M, N = shape
    x = _x(M, N, dtype, seed=M * 7 + N)
    for log in (False, True):
        _check_forward(lambda a, b, lg: rc.softmax_fwd(a, b, lg, pipe=True), x, log, dtype)
    g = torch.Generator(device="cuda").manual_seed(N)
    xs = (torch.randn(M, N, generator=g, device="cuda") * 2).to(dtype)
    t = torch.randint(0, N, (M,), generator=g, device="cuda")
    t[0] = N - 1
    if M > 3:
        t[3] = -100
    for ls in (0.0, 0.1):
        a = xs.clone().requires_grad_()
        b = xs.double().requires_grad_()
        la = ce.cross_entropy(a, t, reduction="none", label_smoothing=ls, variant="v6_cluster_pipe")
        lb = F.cross_entropy(b, t, reduction="none", label_smoothing=ls)
        w = torch.randn(la.shape, dtype=torch.float64, device="cuda")
        (la.double() * w).sum().backward()
        (lb * w).sum().backward()
        assert _rel(la.detach(), lb.detach()) <= TOL[dtype]
        assert _rel(a.grad, b.grad) <= 2 * TOL[dtype]


def test_pipe_limits_on_cpu():
    assert cf.pipe_shmem((8, 256, 8)) == 65536
    assert cf.pipe_shmem((8, 1024, 8)) > cf.SHMEM_LIMIT   # fp32 rows past 131072: v5 only


def test_one_exp_names_are_instantiated():
    import pathlib

    src = (pathlib.Path(rc.__file__).parent / "cluster.cu").read_text()
    listed = {n for line in src.splitlines() if "tilewise-instantiate:" in line
              for n in line.split(":", 1)[1].split()}
    for (kind, size), cfgs in cf.ONE_EXP_CONFIGS.items():
        ty = "__nv_bfloat16" if size == 2 else "float"
        for cl, nt, ch in cfgs:
            assert f"{rc._NAMES[kind]}<{ty},{cl},{nt},{ch},true>" in listed


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gpu_one_exp_softmax_and_cross_entropy(dtype):
    """X1 (one exp an element): the same results within the dtype's tolerance, masked rows too."""
    cfg = cf.ONE_EXP_CONFIGS[("fwd", dtype.itemsize)][0]
    M, N = 37, cf.capacity(dtype, cfg) - 8 * (16 // dtype.itemsize)
    x = _x(M, N, dtype, seed=11)
    for log in (False, True):
        _check_forward(lambda a, b, lg: rc.softmax_fwd(a, b, lg, config=cfg, one_exp=True), x, log, dtype)
    xs = torch.randn(M, N, device="cuda", dtype=dtype) * 2
    t = torch.randint(0, N, (M,), device="cuda")
    t[3] = -100
    for ls in (0.0, 0.1):
        loss = poison(torch.empty(M, device="cuda"))
        g = poison(torch.empty_like(xs))
        rc.cross_entropy(xs, t, loss, g, -100, ls, 1.0, config=cfg, one_exp=True)
        b = xs.double().requires_grad_()
        lb = F.cross_entropy(b, t, reduction="none", label_smoothing=ls)
        lb.sum().backward()
        assert _rel(loss, lb.detach()) <= TOL[dtype]
        assert _rel(g, b.grad) <= 2 * TOL[dtype]
    small = x[:, :1024].contiguous()  # a row that (2, 256, 8) holds, a config one_exp is not built for
    with pytest.raises(ValueError, match="one_exp"):
        rc.softmax_fwd(small, torch.empty_like(small), False, config=(2, 256, 8), one_exp=True)


def test_kernel_params_keep_nullable_scale_and_take_strided_rows(monkeypatch):
    """_kernel rebuilds the tensor parameters as non-contiguous (the kernels take row strides);
    the cross-entropy's optional device scale must stay nullable through that (a None scale_dev
    is the common case)."""

    class FakeModule:
        def kernel(self, name, params):
            return params

    monkeypatch.setattr(rc, "_module", lambda device_index: FakeModule())
    params = rc._kernel.__wrapped__("ce", torch.bfloat16, (8, 256, 8), 0)
    by_name = {p.name: p for p in params}
    assert by_name["scale_dev"].nullable and not by_name["scale_dev"].contiguous
    assert not by_name["x"].nullable and not by_name["x"].contiguous


# ---------------------------------------------------------------- v7: TMA-pipelined forward


def test_tma_configs_are_instantiated_and_fit_shared_memory():
    import pathlib

    src = (pathlib.Path(rc.__file__).parent / "cluster.cu").read_text()
    listed = {n for line in src.splitlines() if "tilewise-instantiate:" in line
              for n in line.split(":", 1)[1].split()}
    for (kind, size), cfgs in cf.TMA_CONFIGS.items():
        assert cf.TMA_DEFAULT[(kind, size)] in cfgs
        for cl, nt, ch, st, mb in cfgs:
            assert f"{rc._NAMES[kind + '_tma']}<__nv_bfloat16,{cl},{nt},{ch},{st},{mb}>" in listed
            assert cf.tma_shmem((cl, nt, ch, st, mb)) <= cf.SHMEM_LIMIT
    assert cf.tma_shmem((8, 256, 8, 3, 2)) == 3 * 32768


@pytest.mark.gpu
@pytest.mark.parametrize("config", [(torch.bfloat16, c) for c in cf.TMA_CONFIGS[("fwd", 2)]]
                         + [(torch.float16, cf.TMA_DEFAULT[("fwd", 2)])], ids=str)
@pytest.mark.parametrize("shape", [(1, 8), (37, 1000), (300, 4104), (97, 131072), (5, 130008)], ids=str)
def test_gpu_tma_forward(config, shape):
    """v7: rows of any multiple of 8 up to the config's capacity (slices of unequal length, empty
    slices when N is short), more rows than resident clusters (the stages wrap around several
    times), fully and partly masked rows; outputs poisoned; softmax and log-softmax."""
    M, N = shape
    dtype, config = config
    x = _x(M, N, dtype, seed=M * 3 + N)
    for log in (False, True):
        y = _check_forward(lambda a, b, lg: rc.softmax_fwd_tma(a, b, lg, config=config), x, log, dtype)
        if M > 1 and not log:
            assert torch.all(y[1] == 0)  # every key masked: zeros, no NaN


@pytest.mark.gpu
def test_gpu_tma_forward_strided_rows_and_bad_input():
    x = _x(40, 2048, torch.bfloat16, seed=5)
    big = torch.randn(40, 4096, device="cuda").to(torch.bfloat16)
    big[:, :2048] = x
    out = poison(torch.empty(40, 3000, device="cuda", dtype=torch.bfloat16))
    rc.softmax_fwd_tma(big[:, :2048], out[:, 8:2056], False)
    ref = sm.reference(x.double())
    fin = torch.isfinite(ref)
    assert _rel(torch.where(fin, out[:, 8:2056].double(), 0), torch.where(fin, ref, 0)) <= TOL[torch.bfloat16]
    assert torch.isnan(out[:, :8].float()).all() and torch.isnan(out[:, 2056:].float()).all()  # untouched
    with pytest.raises(ValueError, match="bfloat16 / float16"):
        rc.softmax_fwd_tma(x.float(), x.float(), False)
    with pytest.raises(ValueError, match="not built"):
        rc.softmax_fwd_tma(x.half(), torch.empty_like(x.half()), False, config=(8, 512, 4, 1, 3))
    with pytest.raises(ValueError, match="16 bytes"):
        rc.softmax_fwd_tma(big[:, 1:2045], torch.empty(40, 2044, device="cuda", dtype=torch.bfloat16), False)
    with pytest.raises(ValueError, match="exceed|not built"):
        rc.softmax_fwd_tma(torch.randn(2, 131080, device="cuda").to(torch.bfloat16),
                           torch.empty(2, 131080, device="cuda", dtype=torch.bfloat16), False)


def test_policy_is_checked_frozen_and_packs_for_the_custom_ops():
    """The per-call Policy replaces the import-time TILEWISE_SOFTMAX_TMA_CONFIG: a configuration
    that is not built is refused when the policy is made; the policy survives the custom ops'
    list-of-ints round trip; the environment is not read."""
    import dataclasses
    import os
    import subprocess
    import sys

    assert cf.DEFAULT_POLICY.tma_fwd == cf.TMA_DEFAULT[("fwd", 2)] == (8, 128, 16, 1, 5)
    p = cf.Policy(tma_fwd=[8, 256, 8, 1, 4], bwd_reverse=False)
    assert p.tma_fwd == (8, 256, 8, 1, 4) and cf.Policy.unpack(p.pack()) == p
    assert cf.Policy.unpack([]) is cf.DEFAULT_POLICY and cf.Policy.unpack(cf.DEFAULT_POLICY.pack()) == cf.DEFAULT_POLICY
    with pytest.raises(ValueError, match="not built"):
        cf.Policy(tma_fwd=(8, 256, 8, 9, 9))
    with pytest.raises(ValueError, match="not built"):
        cf.Policy(tma_ce=(8, 512, 4, 1, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cuda_cluster = False
    code = ("from tilewise.ops.rowwise import cluster, configs as cf, softmax; "
            "print(cf.TMA_DEFAULT[('fwd', 2)], cf.DEFAULT_POLICY.tma_fwd)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TILEWISE_SOFTMAX_TMA_CONFIG": "8,256,8,1,4"})
    assert out.returncode == 0 and out.stdout.split() == ["(8,", "128,", "16,", "1,", "5)"] * 2, out.stderr[-500:]


def test_default_variant_rule():
    """configs.default_variant, the rule softmax and cross-entropy share, asks about the CUDA C
    kernels only past MAX_FUSED and only as far as the policy lets it."""
    asked = []

    def ok(name, answer):
        return lambda: asked.append(name) or answer

    rule = cf.default_variant
    assert rule(cf.MAX_FUSED, cf.DEFAULT_POLICY, ok("cuda", True), ok("tma", True)) == "v2_fused" and not asked
    assert rule(cf.MAX_FUSED + 8, cf.DEFAULT_POLICY, ok("cuda", True), ok("tma", True)) == "v7_cluster_tma"
    assert rule(cf.MAX_FUSED + 8, cf.DEFAULT_POLICY, ok("cuda", True), ok("tma", False)) == "v5_cluster_cuda"
    assert rule(cf.MAX_FUSED + 8, cf.DEFAULT_POLICY, ok("cuda", False), ok("tma", True)) == "v3_online"
    asked.clear()
    off = cf.DEFAULT_POLICY.replace(cuda_cluster=False)
    assert rule(cf.MAX_FUSED + 8, off, ok("cuda", True), ok("tma", True)) == "v3_online" and not asked
    triton = cf.DEFAULT_POLICY.replace(triton_cluster=True)
    assert rule(cf.MAX_CLUSTER, triton, ok("cuda", True), ok("tma", True)) == "v4_cluster"
    assert rule(cf.MAX_CLUSTER + 8, triton, ok("cuda", True), ok("tma", False)) == "v5_cluster_cuda"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 16392), (33, 40000), (300, 65536), (97, 131072), (5, 130008)], ids=str)
def test_gpu_tma_cross_entropy_against_torch(shape, dtype):
    """v7 cross-entropy: loss and gradient against F.cross_entropy in float64, every reduction,
    label smoothing, ignore_index, the first and last class as targets, more rows than resident
    clusters; the gradient poisoned by construction (a fresh torch.empty the kernel must fill)."""
    M, N = shape
    g = torch.Generator(device="cuda").manual_seed(M + N)
    xs = (torch.randn(M, N, generator=g, device="cuda") * 2).to(dtype)
    t = torch.randint(0, N, (M,), generator=g, device="cuda")
    t[0] = N - 1
    if M > 3:
        t[1], t[3] = 0, -100
    for reduction in ("mean", "sum", "none"):
        for ls in (0.0, 0.1):
            a = xs.clone().requires_grad_()
            b = xs.double().requires_grad_()
            la = ce.cross_entropy(a, t, reduction=reduction, label_smoothing=ls, variant="v7_cluster_tma")
            lb = F.cross_entropy(b, t, reduction=reduction, label_smoothing=ls)
            w = torch.randn(la.shape, dtype=torch.float64, device="cuda", generator=g)
            (la.double() * w).sum().backward()
            (lb * w).sum().backward()
            assert _rel(la.detach(), lb.detach()) <= TOL[dtype]
            assert _rel(a.grad, b.grad) <= 2 * TOL[dtype]
            if M > 3:
                assert torch.all(a.grad[3] == 0)  # ignore_index row: zero gradient
    loss = poison(torch.empty(M, device="cuda"))
    rc.cross_entropy_tma(xs, torch.where(t < 0, torch.full_like(t, -100), t), loss, None, -100, 0.0, 1.0)
    ref = F.cross_entropy(xs.double(), t, reduction="none")
    assert _rel(loss, ref) <= TOL[dtype]  # loss only, no gradient written
    if dtype == torch.bfloat16:  # each built config (fp16 has the default only), with its gradient
        b = xs.double().requires_grad_()
        F.cross_entropy(b, t, reduction="sum").backward()
        for cfg in cf.TMA_CONFIGS[("ce", 2)]:
            loss, dx = poison(torch.empty(M, device="cuda")), poison(torch.empty_like(xs))
            rc.cross_entropy_tma(xs, t, loss, dx, -100, 0.0, 1.0, config=cfg)
            assert _rel(loss, ref) <= TOL[dtype], cfg
            assert _rel(dx, b.grad) <= 2 * TOL[dtype], cfg
