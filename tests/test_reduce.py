import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from tilewise.ops.pointwise import layout as lay, reduce as rd

from conftest import compiles_for_sm90_without_spills, poison

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# --------------------------------------------------------------------------- CPU


def test_reference_and_cost():
    x = torch.randn(4, 6, 5)
    torch.testing.assert_close(rd.reference(x, 1, "max"), x.amax(1), rtol=0, atol=0)
    torch.testing.assert_close(rd.reference(x, -1, "mean", keepdim=True), x.mean(-1, keepdim=True))
    c = rd.cost((32768, 4096), 1)
    assert c.bytes == 4 * (32768 * 4096 + 32768) and c.flops == 32768 * 4096
    assert rd.cost((32768, 4096), 0, torch.bfloat16).bytes == 2 * (32768 * 4096 + 4096)
    assert rd.cost((3, 0), 1).bytes == 0


def test_masked_mean_reference_never_reads_the_padding():
    """NaN or inf past a row's length does not reach its mean (the kernels never load the padding)."""
    x = torch.randn(3, 6, 4)
    lengths = torch.tensor([2, 0, 6])
    spoiled = x.clone()
    spoiled[0, 2:] = math.nan
    spoiled[1, :] = math.inf
    got = rd.masked_mean_reference(spoiled, lengths)
    torch.testing.assert_close(got, rd.masked_mean_reference(x, lengths), rtol=0, atol=0)
    assert torch.isfinite(got).all() and (got[1] == 0).all()


def test_masked_mean_reference_against_a_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 5, generator=g)
    lengths = torch.tensor([7, 1, 0, 9])  # 0 gives zeros; 9 > T reads as 7
    got = rd.masked_mean_reference(x, lengths)
    for b, n in enumerate([7, 1, 0, 7]):
        want = x[b, :n].mean(0) if n else torch.zeros(5)
        torch.testing.assert_close(got[b], want)


def test_masked_mean_gradcheck_float64():
    x = torch.randn(3, 6, 4, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([2, 6, 0], dtype=torch.int32)
    assert torch.autograd.gradcheck(lambda x: rd.masked_mean(x, lengths), (x,))
    # Strided input (a transposed view) on the reference path too.
    xt = torch.randn(6, 3, 4, dtype=torch.float64).transpose(0, 1).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: rd.masked_mean(x, lengths), (xt,))


@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), (-1, False)])
def test_reduce_gradcheck_float64(op, dim, keepdim):
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    f = getattr(rd, op)
    assert torch.autograd.gradcheck(lambda x: f(x, dim, keepdim), (x,))
    torch.testing.assert_close(f(x, dim, keepdim),
                               {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}[op](x, dim, keepdim=keepdim))


def test_input_errors_name_the_argument():
    x = torch.randn(4, 5)
    torch.testing.assert_close(rd.reduce(x, 0, "mean"), x.mean(0))  # the one CPU rule
    with pytest.raises(ValueError, match="'x' is on cpu"):  # a version is a kernel
        rd.VARIANTS["v3_warp"](x, 0)
    with pytest.raises(ValueError, match="unknown op 'prod'"):
        rd.reduce(x, 0, "prod")
    with pytest.raises(ValueError, match="unknown variant"):
        rd.reduce(x, 0, variant="v0")
    with pytest.raises(ValueError, match="'dim' = 2 is out of range"):
        rd.sum(x, 2)
    with pytest.raises(ValueError, match="'x' has dtype torch.int64"):
        rd.sum(torch.arange(5), 0)
    with pytest.raises(ValueError, match=r"'x' must be \(B, T, E\)"):
        rd.masked_mean(x, torch.tensor([1, 2, 3, 4]))
    with pytest.raises(ValueError, match="'lengths' must be an int32 or int64"):
        rd.masked_mean(x[None], torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"'lengths' has shape \(2,\); 'x' of shape \(1, 4, 5\) needs \(1,\)"):
        rd.masked_mean(x[None], torch.tensor([1, 2]))
    # Issue 29: the CPU path read x.is_cuda before checking x, and ran the reference on meta lengths.
    with pytest.raises(ValueError, match="'x' must be a torch.Tensor, got list"):
        rd.masked_mean([[[1.0]]], torch.tensor([1]))
    with pytest.raises(ValueError, match="'lengths' is on meta"):
        rd.masked_mean(x[None], torch.tensor([1], device="meta"))
    with pytest.raises(ValueError, match="'keepdim' must be a bool"):
        rd.reduce(x, 0, keepdim="yes")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_runtime_kernel_name_compiles_for_sm90(dtype):
    compiles_for_sm90_without_spills(rd._SRC, rd.module_names(dtype))


@pytest.mark.parametrize("case", ["last", "first", "middle_permuted", "sliced", "vector", "keepdim"])
def test_host_layout_walks_the_right_rows(case):
    """Emulate what the kernels compute from _prepare's (R, rs) and the layout array: the base
    offset of each output row (strided.cuh's walk) plus r * rs, summed, on CPU."""
    from test_elementwise import _emulate_offsets

    base = torch.randn(6, 7, 9)
    x, dim, keepdim = {
        "last": (base, -1, False), "first": (base, 0, False), "middle_permuted": (base.permute(2, 0, 1), 1, False),
        "sliced": (base[1:, ::2, 3:], 2, False), "vector": (base[2, 3], 0, False),
        "keepdim": (base.transpose(0, 1), 1, True),
    }[case]
    dim, R, rs, other, ost, out = rd._prepare("t", x, dim, "sum", keepdim, None, cuda=False)
    words = lay.layout_words(other or (1,), [ost or (0,)])
    storage = x.as_strided((x.untyped_storage().nbytes() // 4,), (1,), 0)
    sums = [sum(storage[x.storage_offset() + o[0] + r * rs].item() for r in range(R))
            for o in _emulate_offsets(words, 1)]
    want = x.sum(dim, keepdim=keepdim)
    assert out.shape == want.shape
    torch.testing.assert_close(torch.tensor(sums).reshape(want.shape), want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- GPU


SHAPES = [(1, 1), (31, 33), (33, 1000), (1000, 31), (7, 4097), (4097, 7), (3, 5, 1000), (2, 70000)]


def _ref(x, dim, op, keepdim=False):
    return rd.reference(x.double(), dim, op, keepdim)


def _check(out, ref, R, dtype, op="sum"):
    """fp32 accumulation of R terms of size ~1 errs by ~eps * R / sqrt(2) at worst-typical (serial
    v1); atol scales with sqrt(R) (and 1 / R for a mean), rtol is the dtype's rounding."""
    assert not torch.isnan(out).any()
    scale = 1.0 / max(R, 1) if op == "mean" else 1.0
    atol = 3e-5 * max(R, 1) ** 0.5 * scale
    rtol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    if dtype != torch.float32:
        atol = max(atol, 1e-3 * scale ** 0.5)
    torch.testing.assert_close(out.double(), ref.to(out.dtype).double(), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", list(rd.OPS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("variant", list(rd.VARIANTS))
@pytest.mark.quick(rotate="shape")
def test_variants_every_dim(variant, shape, op, dtype):
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    for dim in range(len(shape)):
        for keepdim in (False, True):
            ref = _ref(x, dim, op, keepdim)
            out = poison(torch.empty(ref.shape, device="cuda", dtype=dtype))
            assert rd.VARIANTS[variant](x, dim, op, keepdim, out) is out
            _check(out, ref, shape[dim], dtype, op)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", [None, *rd.VARIANTS])
def test_strided_inputs(variant, dtype):
    g = torch.Generator(device="cuda").manual_seed(4)
    base = torch.randn(65, 33, 47, device="cuda", dtype=dtype, generator=g)
    views = [base.permute(2, 0, 1), base[:, ::2, 3:], base[1:, 5], base.transpose(0, 2)[:, 1:, ::3],
             base.reshape(-1)[1:1 + 33 * 47].view(33, 47)]
    for x in views:
        for dim in range(x.dim()):
            for op in rd.OPS:
                out = rd.reduce(x, dim, op, variant=variant)
                _check(out, _ref(x, dim, op), x.shape[dim], dtype, op)


@pytest.mark.gpu
def test_large_first_and_last_dim_use_splits():
    x = torch.randn(32768, 513, device="cuda")
    for dim in (0, 1):
        torch.testing.assert_close(rd.reduce(x, dim).double(), x.double().sum(dim), rtol=1e-4, atol=2e-3)
        torch.testing.assert_close(rd.reduce(x, dim, "max"), x.amax(dim), rtol=0, atol=0)


@pytest.mark.gpu
def test_empty_nan_and_scalar():
    x = torch.randn(0, 5, device="cuda")
    torch.testing.assert_close(rd.reduce(x, 0), torch.zeros(5, device="cuda"))
    assert rd.reduce(x, 0, "mean").isnan().all()
    assert rd.reduce(x, 1).shape == (0,)
    with pytest.raises(ValueError, match="no identity"):
        rd.reduce(x, 0, "max")
    y = torch.tensor([[1.0, float("nan")], [2.0, 3.0]], device="cuda")
    assert torch.equal(rd.reduce(y, 1, "max").isnan(), y.amax(1).isnan())
    s = torch.tensor(3.0, device="cuda")
    assert rd.reduce(s, 0).item() == 3.0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autograd_reductions_match_pytorch(dtype):
    x = torch.randn(33, 1000, device="cuda", dtype=dtype)
    for name, tf in (("sum", torch.sum), ("mean", torch.mean), ("amax", torch.amax)):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = getattr(rd, name)(a, 1), tf(b, 1)
        g = torch.randn_like(ya)
        ya.backward(g)
        yb.backward(g)
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ltype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("B,T,E", [(1, 1, 1), (3, 31, 33), (5, 33, 1000), (2, 7, 4097)])
def test_masked_mean_forward_backward(B, T, E, ltype, dtype):
    g = torch.Generator(device="cuda").manual_seed(B * T)
    x = torch.randn(B, T, E, device="cuda", dtype=dtype, generator=g)
    lengths = torch.randint(0, T + 2, (B,), device="cuda", generator=g).to(ltype)
    lengths[0] = T
    if B > 1:
        lengths[1] = 0
    for xin in (x, x.transpose(1, 2).contiguous().transpose(1, 2)):  # contiguous, then strided
        a = xin.clone().requires_grad_() if xin.is_contiguous() else xin.detach().requires_grad_()
        b = xin.detach().double().requires_grad_()
        ya = rd.masked_mean(a, lengths)
        yb = rd.masked_mean_reference(b, lengths)
        _check(ya, yb, T, dtype, "mean")
        gy = torch.randn(B, E, device="cuda", dtype=dtype, generator=g)
        ya.backward(gy)
        yb.backward(gy.double())
        _check(a.grad, b.grad, 1, dtype)


@pytest.mark.gpu
def test_masked_mean_backward_first_on_the_autograd_thread():
    """A fresh process whose backward starts with our kernel: the autograd device thread has made
    no CUDA call, so the occupancy query of the backward launch found no current context."""
    code = """
import torch
from tilewise.ops.pointwise import reduce as rd
x = torch.randn(3, 17, 33, device="cuda", requires_grad=True)
lengths = torch.tensor([17, 0, 5], device="cuda")
y = rd.masked_mean(x, lengths)
gy = torch.randn_like(y)
torch.autograd.backward(y, gy)
x2 = x.detach().double().requires_grad_()
torch.autograd.backward(rd.masked_mean_reference(x2, lengths), gy.double())
torch.testing.assert_close(x.grad.double(), x2.grad)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.gpu
def test_masked_mean_gpu_errors():
    x = torch.randn(2, 3, 4, device="cuda")
    with pytest.raises(ValueError, match="'lengths' is on cpu but 'x' is on cuda"):
        rd.masked_mean(x, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="'x' has dtype torch.int32"):
        rd.masked_mean(x.int(), torch.tensor([1, 2], device="cuda"))


def test_masked_mean_custom_op_and_compile_cpu():
    x = torch.randn(3, 6, 4, requires_grad=True)
    lengths = torch.tensor([2, 6, 0])
    torch.library.opcheck(torch.ops.tilewise.masked_mean.default, (x, lengths))
    torch.library.opcheck(torch.ops.tilewise.masked_mean_backward.default, (torch.randn(3, 4), lengths, 6))

    def f(x):
        return (rd.masked_mean(x, lengths) * 2).sum()

    g_eager = torch.autograd.grad(f(x), x)[0]
    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)  # fullgraph: no break at a launch
    g_comp = torch.autograd.grad(cf(x), x)[0]
    torch.testing.assert_close(g_comp, g_eager)


@pytest.mark.gpu
def test_masked_mean_under_torch_compile_on_gpu():
    x = torch.randn(5, 33, 1000, device="cuda", requires_grad=True)
    lengths = torch.tensor([33, 0, 7, 40, 1], device="cuda")
    torch._dynamo.reset()
    cf = torch.compile(lambda x: rd.masked_mean(x, lengths), fullgraph=True)
    y = cf(x)
    want = rd.masked_mean_reference(x.detach(), lengths)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    gy = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, (x,), gy)
    x2 = x.detach().requires_grad_()
    (want_gx,) = torch.autograd.grad(rd.masked_mean_reference(x2, lengths), (x2,), gy)
    torch.testing.assert_close(gx, want_gx)


def test_masked_mean_cost_counts_only_the_valid_rows():
    B, T, E = 3, 10, 4
    full = rd.masked_mean_cost(B, T, E, torch.float32)
    assert full.bytes == (B * T * E + B * E) * 4 + B * 8
    lengths = torch.tensor([2, 0, 15], dtype=torch.int32)  # 15 is clamped to T
    c = rd.masked_mean_cost(B, T, E, torch.float32, lengths)
    assert c.bytes == ((2 + 0 + 10) * E + B * E) * 4 + B * 4
    assert c.flops == (2 + 0 + 10) * E


# --------------------------------------------------------------------------- v5_columns (CPU)


def _aligned(*shape, dtype=torch.float32):
    n = math.prod(shape)
    t = torch.empty(n + 16, dtype=dtype)
    skip = (-t.data_ptr() % 16) // t.element_size()
    return t[skip:skip + n].view(shape)


def _choice(x, dim):
    _, R, rs, other, ost, _ = rd._prepare("t", x, dim, "sum", False, None, cuda=False)
    return rd.choose(x, R, rs, other, ost)


def test_reduce_picks_v5_columns_where_16_byte_loads_fit():
    x = _aligned(64, 32)
    assert _choice(x, 0) == ("v5_columns", (1, 32, 0))
    assert _choice(x, 1) == ("v3_warp", None)
    y = _aligned(3, 64, 32)
    assert _choice(y, 1) == ("v5_columns", (3, 32, 64 * 32))
    assert _choice(y, 0) == ("v5_columns", (1, 64 * 32, 0))  # kept dims (64, 32) merge into one
    assert _choice(_aligned(64, 32, dtype=torch.bfloat16), 0) == ("v5_columns", (1, 32, 0))
    # Columns that are not whole 16-byte vectors, a misaligned start, odd strides: v4.
    assert _choice(_aligned(64, 9), 0) == ("v4_columns", None)
    assert _choice(_aligned(64 * 32 + 1)[1:].view(64, 32), 0) == ("v4_columns", None)
    assert _choice(_aligned(64, 34)[:, :32], 0) == ("v4_columns", None)  # row stride 34
    assert _choice(_aligned(64, 36)[:, 4:36], 0) == ("v5_columns", (1, 32, 0))  # stride 36, start +16 B
    assert _choice(_aligned(64, 16, dtype=torch.bfloat16)[:, :8], 0) == ("v5_columns", (1, 8, 0))
    assert _choice(_aligned(64, 16, dtype=torch.bfloat16)[:, :4], 0) == ("v4_columns", None)
    # Kept dims that do not collapse to (B, C) with C contiguous: v4; a transposed x: v3 (rows scatter).
    assert _choice(_aligned(4, 64, 8).permute(1, 0, 2)[:, :, :4], 0) == ("v5_columns", (4, 4, 512))
    assert _choice(_aligned(2, 64, 3, 8)[:, :, :, :4], 1) == ("v4_columns", None)  # kept (2, 3, 4) do not merge
    assert _choice(_aligned(32, 64).t(), 0) == ("v3_warp", None)


def test_columns_grid_reads_every_element_once():
    """v5_columns' host grid and the kernel's index arithmetic, emulated: every (b, r, c) of the
    (B, R, C) view is read by exactly one (block, thread, step) and every output column is written
    by exactly one split of one block."""
    cfgs = [rd.ColumnsConfig(), rd.ColumnsConfig(tx=8, ty=4, unroll=2, waves=1, min_rows=3),
            rd.ColumnsConfig(tx=16, ty=16, unroll=8, waves=4, min_rows=1)]
    for cfg in cfgs:
        for itemsize in (4, 2):
            N = 16 // itemsize
            for B, R, C in ((1, 1, N), (1, 37, 3 * N), (2, 1000, 5 * N), (3, 33, 40 * N), (1, 4099, N)):
                col_blocks, splits, chunk, gx = rd.columns_grid(B, R, C, itemsize, cfg, resident=24)
                assert 1 <= splits <= 65535 and (splits - 1) * chunk < R <= splits * chunk
                reads = np.zeros((B, R, C), dtype=np.int64)
                writes = np.zeros((splits, B, C), dtype=np.int64)
                for bx in range(gx):
                    bc, b = bx % col_blocks, bx // col_blocks
                    for by in range(splits):
                        r0, r1 = by * chunk, min(R, by * chunk + chunk)
                        for tx in range(cfg.tx):
                            c0 = (bc * cfg.tx + tx) * N
                            if c0 >= C:
                                continue
                            for ty in range(cfg.ty):
                                rows = list(range(r0 + ty, r1, cfg.ty))
                                reads[b, rows, c0:c0 + N] += 1
                        for o in range(cfg.tx * N):
                            c = bc * cfg.tx * N + o
                            if c < C:
                                writes[by, b, c] += 1
                assert (reads == 1).all(), (cfg, itemsize, B, R, C)
                assert (writes == 1).all(), (cfg, itemsize, B, R, C)


def test_columns_config_validation():
    for d in DTYPES:
        rd.COLUMNS_DEFAULT[d].check(d)
    for bad in (dict(tx=12), dict(ty=3), dict(tx=128, ty=16), dict(unroll=3), dict(minb=0), dict(minb=9),
                dict(waves=0), dict(min_rows=0), dict(fold="atomic")):
        with pytest.raises(ValueError, match="config"):
            rd.ColumnsConfig(**bad).check(torch.float32)
    rd.ColumnsConfig(tx=128, ty=8).check(torch.bfloat16)  # 1024 threads, 32 KiB of smem: valid


# --------------------------------------------------------------------------- v5_columns (GPU)

COLUMNS_CONFIGS = [rd.ColumnsConfig(), rd.ColumnsConfig(tx=8, ty=4, unroll=2, waves=1, min_rows=3),
                   rd.ColumnsConfig(tx=16, ty=16, unroll=8, minb=2, waves=4, min_rows=1),
                   rd.ColumnsConfig(tx=32, ty=8, unroll=4, minb=6, waves=3, min_rows=5, fold="last"),
                   rd.ColumnsConfig(tx=64, ty=8, unroll=4, waves=1, min_rows=100000)]  # one split


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", COLUMNS_CONFIGS, ids=str)
def test_v5_columns_odd_sizes(cfg, dtype):
    g = torch.Generator(device="cuda").manual_seed(11)
    N = 16 // torch.empty((), dtype=dtype).element_size()
    base = torch.randn(2, 4099, 40 * N + N, device="cuda", dtype=dtype, generator=g)
    xs = [torch.randn(1, N, device="cuda", dtype=dtype, generator=g),
          torch.randn(33, 3 * N, device="cuda", dtype=dtype, generator=g),
          torch.randn(4097, 5 * N, device="cuda", dtype=dtype, generator=g),
          torch.randn(3, 1000, 7 * N, device="cuda", dtype=dtype, generator=g),
          base[:, :, N:]]  # padded rows, 16-byte aligned start
    for x in xs:
        for op in rd.OPS:
            for keepdim in (False, True):
                dim = x.dim() - 2
                _, R, rs, other, ost, _ = rd._prepare("t", x, dim, op, keepdim, None)
                assert R == 1 or rd.choose(x, R, rs, other, ost)[0] == "v5_columns"
                ref = _ref(x, dim, op, keepdim)
                out = poison(torch.empty(ref.shape, device="cuda", dtype=dtype))
                assert rd.v5_columns(x, dim, op, keepdim, out, config=cfg) is out
                _check(out, ref, x.shape[dim], dtype, op)


@pytest.mark.gpu
def test_v5_columns_is_deterministic_and_falls_back():
    x = torch.randn(32768, 520, device="cuda")
    a, b = rd.reduce(x, 0), rd.reduce(x, 0)
    assert torch.equal(a, b)  # fixed-order fold of the splits
    last = replace(rd.COLUMNS_DEFAULT[torch.float32], fold="last")  # the same splits as reduce()
    for _ in range(3):  # the counters are left at zero for the next launch
        c = rd.v5_columns(x, 0, config=last)
        assert torch.equal(c, a)  # the same fold order as the second kernel: bit-identical
    torch.cuda.synchronize()
    assert all(int(t.abs().sum()) == 0 for t in rd._counters.values())
    y = torch.randn(1000, 33, device="cuda")  # columns not whole vectors: v4_columns inside v5
    _check(rd.v5_columns(y, 0), _ref(y, 0, "sum"), 1000, torch.float32)
    with pytest.raises(ValueError, match="'config' must be a ColumnsConfig"):
        rd.v5_columns(x, 0, config="fast")
