import math

import numpy as np
import pytest
import torch

from tilewise.ops.pointwise import configs, elementwise as ew, layout as lay

from conftest import compiles_for_sm90_without_spills, poison

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [1, 31, 33, 1000, 4097, 8192 * 3 + 5, (1 << 20) + 3]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}


# --------------------------------------------------------------------------- host layout (CPU)


def test_magic_division_is_exact():
    rng = np.random.default_rng(0)
    divisors = [2, 3, 5, 7, 10, 31, 33, 641, 1000, 4096, 4097, 65535, 65537, 999_999, 2**30 + 1, 2**31 - 1]
    divisors += list(rng.integers(2, 2**31 - 1, 200))
    xs = np.concatenate([rng.integers(0, 2**31, 5000), [0, 1, 2**31 - 1, 2**31 - 2]]).astype(np.uint64)
    for d in divisors:
        d = int(d)
        mul, shr = lay.magic(d)
        assert 0 < mul < 2**32
        q = ((xs * np.uint64(mul)) >> np.uint64(32)) >> np.uint64(shr)  # __umulhi then shift
        np.testing.assert_array_equal(q, xs // np.uint64(d), err_msg=f"divisor {d}")
    assert lay.magic(1) == (0, 0)


def _emulate_offsets(words, num_inputs):
    """What strided.cuh's broadcast_offsets computes, in Python, for every output index."""
    M = lay.MAX_DIMS
    ndim, n = words[0], words[1]
    shape = words[2:2 + M]
    muls, shrs = words[2 + M:2 + 2 * M], words[2 + 2 * M:2 + 3 * M]
    strides = [words[2 + 3 * M + M * k: 2 + 3 * M + M * (k + 1)] for k in range(num_inputs)]
    out = []
    for flat in range(n):
        off = [0] * num_inputs
        f = flat
        for d in range(ndim - 1, 0, -1):
            q = f if muls[d] == 0 else ((f * muls[d]) >> 32) >> shrs[d]
            r = f - q * shape[d]
            for k in range(num_inputs):
                off[k] += r * strides[k][d]
            f = q
        for k in range(num_inputs):
            off[k] += f * strides[k][0]
        out.append(off)
    return out


@pytest.mark.parametrize("case", ["transposed", "sliced", "bias_row", "column", "scalar", "3d_perm", "expand"])
def test_layout_words_read_the_right_elements(case):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(7, 9, 11, generator=g)
    if case == "transposed":
        a, b = base[0].t(), torch.randn(11, 9, generator=g)
    elif case == "sliced":
        a, b = base[:, 1:8:3, ::2], base[:, :3, 5:]
    elif case == "bias_row":
        a, b = base.reshape(63, 11), torch.randn(11, generator=g)
    elif case == "column":
        a, b = base[:, :, 0], torch.randn(7, 1, generator=g)
    elif case == "scalar":
        a, b = base, torch.randn((), generator=g)
    elif case == "3d_perm":
        a, b = base.permute(2, 0, 1), torch.randn(1, 7, 1, generator=g)
    else:
        a, b = torch.randn(5, 1, 3, generator=g), torch.randn(4, 1, generator=g)
    shape = lay.broadcast_shape(tuple(a.shape), tuple(b.shape))
    words = lay.layout_words(shape or (1,), [lay.expanded_strides(t, shape or (1,)) for t in (a, b)])
    offs = _emulate_offsets(words, 2)
    got_a = torch.stack([a.as_strided((a.untyped_storage().nbytes() // 4,), (1,), 0)[o[0] + a.storage_offset()]
                         for o in offs])
    got_b = torch.stack([b.as_strided((b.untyped_storage().nbytes() // 4,), (1,), 0)[o[1] + b.storage_offset()]
                         for o in offs])
    want_a, want_b = torch.broadcast_tensors(a, b)
    torch.testing.assert_close(got_a, want_a.reshape(-1), rtol=0, atol=0)
    torch.testing.assert_close(got_b, want_b.reshape(-1), rtol=0, atol=0)


def _emulate_tiled(a, b, op):
    """zip_v3_tiled's addressing in Python: each tile staged per input in its own orientation."""
    out = torch.empty(torch.broadcast_shapes(a.shape, b.shape))
    R, C, ((sar, sac), (sbr, sbc)) = lay.layout_2d((a, b), out)
    flat = out.view(-1)
    sa = a.as_strided((a.untyped_storage().nbytes() // 4,), (1,), 0)
    sb = b.as_strided((b.untyped_storage().nbytes() // 4,), (1,), 0)

    def load(store, base, r0, c0, sr, sc):
        tile = {}
        col_major = sr != 0 and (sc == 0 or sr < sc)
        for ty in range(8):
            for tx in range(32):
                for k in range(0, 32, 8):
                    i, j = (tx, ty + k) if col_major else (ty + k, tx)
                    if r0 + i < R and c0 + j < C:
                        tile[i, j] = store[base + (r0 + i) * sr + (c0 + j) * sc].item()
        return tile

    for r0 in range(0, R, 32):
        for c0 in range(0, C, 32):
            ta = load(sa, a.storage_offset(), r0, c0, sar, sac)
            tb = load(sb, b.storage_offset(), r0, c0, sbr, sbc)
            for (i, j), v in ta.items():
                flat[(r0 + i) * C + c0 + j] = op(v, tb[i, j])
    return out


@pytest.mark.parametrize("case", ["transposed", "bias_row", "bias_col_transposed"])
def test_tiled_addressing_emulated(case):
    g = torch.Generator().manual_seed(2)
    base = torch.randn(47, 40, generator=g)
    a, b = {"transposed": (base.t(), torch.randn(40, 47, generator=g)),
            "bias_row": (base[:, 3:], torch.randn(37, generator=g)),
            "bias_col_transposed": (base.t()[:, 1:], torch.randn(40, 1, generator=g))}[case]
    assert lay.transposed(lay.layout_2d((a, b), torch.empty(torch.broadcast_shapes(a.shape, b.shape)))[2]) \
        == (case != "bias_row")
    torch.testing.assert_close(_emulate_tiled(a, b, lambda x, y: x + y), a + b)


def _storage(t):
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)


def _emulate_rows(a, b, op):
    """zip_v5_rows in Python, thread by thread: the host's layout cut and grid, the kernel's
    (column block, row block) split, its loads (16-byte vectors or a scalar per row) and stores.
    Returns the output and how many times each output element was written."""
    shape = torch.broadcast_shapes(a.shape, b.shape)
    out = torch.full(shape, float("nan"), dtype=a.dtype)
    layout = lay.layout_2d((a, b), out)
    assert lay.rows_ok((a, b), out, layout)
    itemsize = a.element_size()
    vec = 16 // itemsize
    R, C, strides = lay.rows_layout(layout, itemsize)
    blocks, (tx, ty) = lay.rows_grid(R, C, itemsize)
    assert tx * ty == lay.ROWS_THREADS and C % vec == 0
    CV, ROWS = C // vec, lay.ROWS_PER_THREAD
    gx = -(-CV // tx)
    flat = out.view(-1)
    writes = torch.zeros(flat.numel(), dtype=torch.int64)
    ops = [(_storage(t), t.storage_offset(), sr, sc) for t, (sr, sc) in zip(((a, b)), strides)]
    for bid in range(blocks):
        bx, by = bid % gx, bid // gx
        for tyi in range(ty):
            for txi in range(tx):
                cv = bx * tx + txi
                if cv >= CV:
                    continue
                for u in range(ROWS):
                    r = by * ty * ROWS + tyi + u * ty
                    if r >= R:
                        continue
                    vals = []
                    for st, base, sr, sc in ops:
                        if sc:
                            assert (base + r * sr + cv * vec) % vec == 0  # a 16-byte aligned load
                            vals.append(st[base + r * sr + cv * vec: base + r * sr + cv * vec + vec])
                        else:
                            vals.append(st[base + r * sr].expand(vec))
                    flat[r * C + cv * vec: r * C + cv * vec + vec] = op(*vals)
                    writes[r * C + cv * vec: r * C + cv * vec + vec] += 1
    return out, writes


def _aligned_empty(*shape, dtype=torch.float32):
    t = torch.empty(math.prod(shape) + 16, dtype=dtype)
    skip = (-t.data_ptr() % 16) // t.element_size()
    return t[skip:skip + math.prod(shape)].view(shape)


def _rows_cases(dtype):
    g = torch.Generator().manual_seed(4)

    def rnd(*shape):
        t = _aligned_empty(*shape, dtype=dtype)
        return t.copy_(torch.randn(shape, generator=g).to(dtype))

    wide = rnd(37, 40)
    return {
        "bias_row": (rnd(37, 24), rnd(24)),
        "bias_row_first": (rnd(8), rnd(5, 3, 8)),
        "bias_col": (rnd(33, 16), rnd(33, 1)),
        "scalar": (rnd(3, 1032), rnd()),
        "padded_rows": (wide[:, :16], wide[:, 24:]),
        "one_row_long": (rnd(8 * 3 * 17), rnd(8 * 3 * 17)[None]),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ["bias_row", "bias_row_first", "bias_col", "scalar", "padded_rows", "one_row_long"])
def test_rows_addressing_emulated(case, dtype):
    a, b = _rows_cases(dtype)[case]
    out, writes = _emulate_rows(a, b, torch.add)
    assert (writes == 1).all()
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)


def test_rows_layout_cuts_one_long_row():
    # 1-D, 2^20 + 8 fp32 elements plus a scalar: rows of 8 x 4 (the largest vector count <= 1024
    # dividing 262146), the scalar keeps stride (0, 0).
    R, C, st = lay.rows_layout((1, (1 << 20) + 8, ((0, 1), (0, 0))), 4)
    assert (R, C) == (((1 << 20) + 8) // 8, 8) and st == ((8, 1), (0, 0))
    assert lay.rows_layout((1, 4096 * 3, ((0, 1), (0, 1))), 4) == (3, 4096, ((4096, 1), (4096, 1)))
    assert lay.rows_layout((5, 8, ((8, 1), (0, 1))), 4) == (5, 8, ((8, 1), (0, 1)))
    assert lay.rows_grid(65536, 4096, 4) == (4 * 8192, (256, 1))
    assert lay.rows_grid(1000, 8, 4) == (1, (2, 128))
    assert lay.rows_grid(1, 4, 4) == (1, (1, 256))


BLOCKED_CONFIGS = [ew.BlockedConfig(), ew.BlockedConfig(1, 128, 1), ew.BlockedConfig(4, 512, 2),
                   ew.BlockedConfig(16, 256, 1), ew.BlockedConfig(2, 64, 8)]


def test_blocked_grid_covers_every_element_once():
    """v4_blocked's host grid and kernel indexing: each 16-byte vector exactly once for every
    config (the scalar tail is the last block's, checked on the GPU at sizes with a tail)."""
    for cfg in BLOCKED_CONFIGS:
        for itemsize in (4, 2):
            vec = 16 // itemsize
            for n in (1, 7, 8, 31, 33, 4097, 8192 * 3, 8192 * 3 + 5, 16384 * 2 - 1, (1 << 20) + 3):
                grid = lay.blocked_grid(n, itemsize, cfg)
                nvec = n // vec
                seen = np.zeros(nvec, dtype=np.int64)
                for blk in range(grid):
                    base = blk * cfg.threads * cfg.unroll + np.arange(cfg.threads)
                    for u in range(cfg.unroll):
                        j = base + u * cfg.threads
                        np.add.at(seen, j[j < nvec], 1)
                assert (seen == 1).all(), (cfg, itemsize, n)
                assert (grid - 1) * cfg.threads * cfg.unroll <= nvec  # at most the tail block has no vectors


def test_blocked_config_names_and_validation():
    assert ew.blocked_name("map", "Relu", torch.float32, ew.BlockedConfig(4, 128, 2)) == \
        "map_v4_blocked<float,ew::Relu,4,128,2>"
    bf16 = configs.BLOCKED_DEFAULT[("zip", torch.bfloat16)]
    assert ew.blocked_name("zip", "Add", torch.bfloat16) == (
        f"zip_v4_blocked<__nv_bfloat16,ew::Add,{bf16.unroll},{bf16.threads},{bf16.minb}>")
    for d in DTYPES:
        for kind in ("map", "zip"):
            configs.BLOCKED_DEFAULT[(kind, d)].check()
            assert all(ew.blocked_name(kind, f, d) in ew.module_names(d)
                       for f, _, _ in (ew.MAP_OPS if kind == "map" else ew.ZIP_OPS).values())
    for bad in ((3, 256, 1), (8, 100, 1), (8, 2048, 1), (8, 256, 0), (8, 256, 9)):
        with pytest.raises(ValueError, match="not valid"):
            ew.BlockedConfig(*bad).check()


@pytest.mark.parametrize("cfg", BLOCKED_CONFIGS[1:], ids=str)
def test_blocked_configs_compile_for_sm90(cfg):
    names = [ew.blocked_name("map", "Gelu", torch.float32, cfg), ew.blocked_name("zip", "Add", torch.float32, cfg),
             ew.blocked_name("map", "Relu", torch.bfloat16, cfg), ew.blocked_name("zip", "Pow", torch.float16, cfg)]
    compiles_for_sm90_without_spills(ew._SRC, names)


def test_zip_dispatch_picks_rows_for_bias_layouts():
    x = _aligned_empty(64, 32)
    bias = _aligned_empty(32)
    out = _aligned_empty(64, 32)
    assert ew._zip_choice(x, x, out)[0] == "v4_blocked"
    assert ew._zip_choice(x, bias, out)[0] == "v5_rows"
    assert ew._zip_choice(bias, x, out)[0] == "v5_rows"
    assert ew._zip_choice(x, _aligned_empty(64, 1), out)[0] == "v5_rows"
    assert ew._zip_choice(x, torch.ones(()), out)[0] == "v5_rows"
    sq = _aligned_empty(32, 32)
    assert ew._zip_choice(sq.t(), sq, _aligned_empty(32, 32))[0] == "v3_tiled"
    # Rows that are not whole 16-byte vectors, a misaligned start, every other column: not v5.
    odd = _aligned_empty(64, 9)
    assert ew._zip_choice(odd, _aligned_empty(9), _aligned_empty(64, 9))[0] == "v1_strided"
    flat = _aligned_empty(64 * 32 + 1)
    assert ew._zip_choice(flat[1:].view(64, 32), bias, out)[0] == "v1_strided"
    assert ew._zip_choice(x, flat[1:33], out)[0] == "v1_strided"
    wide = _aligned_empty(64, 64)
    assert ew._zip_choice(wide[:, ::2], bias, out)[0] == "v1_strided"
    assert ew._zip_choice(wide[:, 4:36], bias, out)[0] == "v5_rows"  # row stride 64, start +16 B
    assert ew._zip_choice(wide[:, 2:34], bias, out)[0] == "v1_strided"  # start +8 B


def test_collapse_merges_contiguous_dims():
    x = torch.empty(4, 5, 6)
    assert lay.collapse((4, 5, 6), [x.stride()]) == ((120,), [(1,)])
    # A bias row over the last dim: two dims remain, the bias strides (0, 1).
    assert lay.collapse((4, 5, 6), [x.stride(), (0, 0, 1)]) == ((20, 6), [(6, 1), (0, 1)])
    assert lay.collapse((1, 1), [(0, 0)]) == ((1,), [(0,)])
    t = torch.empty(6, 5).t()
    assert lay.collapse((5, 6), [t.stride()]) == ((5, 6), [(1, 5)])


def test_broadcast_shape_and_errors():
    assert lay.broadcast_shape((3, 1, 5), (4, 1)) == (3, 4, 5)
    assert lay.broadcast_shape((), (2,)) == (2,)
    with pytest.raises(ValueError, match=r"cannot broadcast: 'a' \(3, 4\), 'b' \(5,\)"):
        lay.broadcast_shape((3, 4), (5,), names=("a", "b"))


def test_too_many_dims_is_rejected():
    shape = (2,) * 9
    strides = tuple(3 ** (9 - d) for d in range(9))  # 3^(k+1) != 2 * 3^k: no two dims merge
    with pytest.raises(ValueError, match="more than 8"):
        lay.layout_words(shape, [strides])
    assert lay.layout_words(shape[:8], [strides[:8]])[0] == 8


# --------------------------------------------------------------------------- reference, cost, errors (CPU)


def test_reference_matches_torch_and_cost():
    x = torch.randn(5, 7)
    y = torch.rand(5, 7) + 0.5
    torch.testing.assert_close(ew.reference("gelu", x), torch.nn.functional.gelu(x), rtol=0, atol=0)
    # +inf gives +inf, as the kernels do (PyTorch's float32 CPU gelu gives NaN there)
    assert ew.reference("gelu", torch.tensor([math.inf, 1.0])).tolist() == [math.inf, torch.nn.functional.gelu(
        torch.tensor(1.0)).item()]
    torch.testing.assert_close(ew.reference("max", x, y), torch.maximum(x, y), rtol=0, atol=0)
    torch.testing.assert_close(ew.reference("relu_backward", y, x), torch.where(x > 0, y, 0.0), rtol=0, atol=0)
    c = ew.cost("add", 1 << 28, (1 << 28, 1 << 28))
    assert c.bytes == 3 * 4 * (1 << 28) and c.flops == 1 << 28
    assert ew.cost("relu", 10, 10, torch.bfloat16).bytes == 40
    assert ew.cost("add", 100, (100, 10)).bytes == 4 * 210  # a bias of 10 is read once


def test_input_errors_name_the_argument():
    x = torch.randn(8)
    with pytest.raises(ValueError, match="'x' is on cpu"):
        ew.map("relu", x)
    with pytest.raises(ValueError, match="unknown op 'softplus'"):
        ew.map("softplus", x)
    with pytest.raises(ValueError, match="unknown op 'atan2'"):
        ew.zip("atan2", x, x)
    with pytest.raises(ValueError, match="unknown variant 'v9'"):
        ew.map("relu", x, variant="v9")
    with pytest.raises(ValueError, match="'b' has dtype torch.int64; a floating-point"):
        ew.zip("add", x, torch.arange(8))
    with pytest.raises(ValueError, match="'b' has dtype torch.float64 but 'a' has torch.float32"):
        ew.add(x, x.double())
    with pytest.raises(ValueError, match="cannot broadcast"):
        ew.add(torch.randn(3, 4), torch.randn(5))
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        ew.relu([1.0])
    with pytest.raises(ValueError, match="'a' or 'b' must be a torch.Tensor"):
        ew.add(1.0, 2.0)
    with pytest.raises(ValueError, match="a tensor or a Python number, got str"):
        ew.mul(x, "2")


def test_cpu_path_of_the_differentiable_ops_is_pytorch():
    x = torch.randn(4, 6)
    b = torch.randn(6)
    for op in ew.MAP_OPS:
        torch.testing.assert_close(getattr(ew, op)(x.abs() + 0.1 if op == "log" else x),
                                   ew.MAP_OPS[op][1](x.abs() + 0.1 if op == "log" else x))
    torch.testing.assert_close(ew.add(x, b), x + b)
    torch.testing.assert_close(ew.mul(x, 2.0), x * 2)
    torch.testing.assert_close(ew.sub(1.0, x), 1 - x)


@pytest.mark.parametrize("op", list(ew.MAP_OPS))
def test_gradcheck_unary_float64(op):
    x = torch.randn(3, 5, dtype=torch.float64)
    if op == "log":
        x = x.abs() + 0.5
    if op == "relu":
        x = x + 0.1 * x.sign()  # keep away from the kink
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(getattr(ew, op), (x,))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "pow"])
def test_gradcheck_binary_with_broadcast_float64(op):
    g = torch.Generator().manual_seed(3)
    a = torch.rand(4, 1, 5, dtype=torch.float64, generator=g) + 0.5
    b = torch.rand(3, 1, dtype=torch.float64, generator=g) + 0.5
    a.requires_grad_(True)
    b.requires_grad_(True)
    assert torch.autograd.gradcheck(getattr(ew, op), (a, b))


def test_relu_backward_gradient_matches_torch():
    x = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = ew.relu(ew.add(x, b))
    g = torch.randn_like(y)
    gx, gb = torch.autograd.grad(y, (x, b), g)
    x2, b2 = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    gx2, gb2 = torch.autograd.grad(torch.relu(x2 + b2), (x2, b2), g)
    torch.testing.assert_close(gx, gx2)
    torch.testing.assert_close(gb, gb2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_runtime_kernel_name_compiles_for_sm90(dtype):
    compiles_for_sm90_without_spills(ew._SRC, ew.module_names(dtype))


def test_divergence_inputs_and_reference():
    x = ew.divergence_inputs(128, "split", device="cpu")
    assert ((x[0::2] > 0) != (x[1::2] > 0)).all()
    u = ew.divergence_inputs(128, "uniform", device="cpu")
    assert all(len(set((u[i:i + 32] > 0).tolist())) == 1 for i in range(0, 128, 32))
    assert (u > 0).sum() == 64 and (x > 0).sum() == 64
    r = ew.divergence_reference(torch.tensor([1.0, -1.0]), 2)
    torch.testing.assert_close(r, torch.tensor([(1 * 0.999 + 0.5) * 0.999 + 0.5, (-0.998 - 0.25) * 0.998 - 0.25]))
    assert ew.divergence_cost(10, 64).flops == 1280
    with pytest.raises(ValueError, match="'pattern' must be"):
        ew.divergence_inputs(4, "random", device="cpu")
    with pytest.raises(ValueError, match="unknown variant"):
        ew.divergence(x, "v3")


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["split", "uniform"])
@pytest.mark.parametrize("variant", list(ew.DIVERGENCE_VARIANTS))
@pytest.mark.parametrize("n", [1, 33, 4097, (1 << 20) + 3])
def test_divergence_kernels(n, variant, pattern):
    x = ew.divergence_inputs(n, pattern)
    out = poison(torch.empty_like(x))
    ew.divergence(x, variant, 64, out)
    torch.testing.assert_close(out, ew.divergence_reference(x, 64), rtol=1e-5, atol=1e-5)


def _inputs(op, shape, dtype, g):
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    if op == "log":
        x = x.abs() + 0.1
    return x


def _check(out, ref):
    tol = TOL[ref.dtype]
    assert not torch.isnan(out).any() or torch.isnan(ref).any()
    torch.testing.assert_close(out.float(), ref.float(), **tol)


def _map_ref(op, x):
    return ew.MAP_OPS[op][1](x.double()).to(x.dtype)


def _zip_ref(op, a, b):
    return ew.ZIP_OPS[op][1](a.double(), b.double()).to(a.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("variant", list(ew.MAP_VARIANTS))
@pytest.mark.parametrize("op", list(ew.MAP_OPS))
@pytest.mark.quick(rotate="n")
def test_map_variants(op, variant, n, dtype):
    g = torch.Generator(device="cuda").manual_seed(n)
    x = _inputs(op, n, dtype, g)
    out = poison(torch.empty_like(x))
    assert ew.MAP_VARIANTS[variant](op, x, out) is out
    _check(out, _map_ref(op, x))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", BLOCKED_CONFIGS[:3], ids=str)  # each new config: one NVRTC run per kind
def test_v4_blocked_configs_at_odd_sizes(cfg, dtype):
    for n in (1, 31, 33, 4097, cfg.threads * cfg.unroll * 8 + 5, (1 << 20) + 3):
        g = torch.Generator(device="cuda").manual_seed(n)
        for op in ("relu", "gelu", "sigmoid"):
            x = _inputs(op, n, dtype, g)
            out = poison(torch.empty_like(x))
            assert ew.map_v4_blocked(op, x, out, config=cfg) is out
            _check(out, _map_ref(op, x))
        for op in ("add", "div"):
            a, b = _zip_operands(op, n, dtype, g)
            out = poison(torch.empty_like(a))
            assert ew.zip_v4_blocked(op, a, b, out, config=cfg) is out
            _check(out, ew.ZIP_OPS[op][1](a.double(), b.double()).to(a.dtype))
    with pytest.raises(ValueError, match="not valid"):
        ew.map_v4_blocked("relu", x, config=ew.BlockedConfig(3, 256, 1))
    with pytest.raises(ValueError, match="'config' must be a BlockedConfig"):
        ew.zip_v4_blocked("add", a, b, config=(4, 256, 1))


def _zip_operands(op, shape, dtype, g):
    a = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    if op == "pow":
        a = a.abs() + 0.1
    if op == "div":
        b = torch.where(b >= 0, b + 0.5, b - 0.5)  # |b| >= 0.5 (sign() would keep an exact 0)
    return a, b


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("variant", list(ew.ZIP_VARIANTS))
@pytest.mark.parametrize("op", list(ew.ZIP_OPS))
@pytest.mark.quick(rotate="n")
def test_zip_variants(op, variant, n, dtype):
    g = torch.Generator(device="cuda").manual_seed(n + 7)
    a, b = _zip_operands(op, n, dtype, g)
    out = poison(torch.empty_like(a))
    if variant == "v5_rows" and n % (16 // a.element_size()):
        with pytest.raises(ValueError, match="v5_rows"):
            ew.ZIP_VARIANTS[variant](op, a, b, out)
        return
    assert ew.ZIP_VARIANTS[variant](op, a, b, out) is out
    _check(out, _zip_ref(op, a, b))


def _strided_cases(dtype, g):
    base = torch.randn(33, 47, 9, device="cuda", dtype=dtype, generator=g)
    return {
        "transposed": (base[:, :, 0].t(), torch.randn(47, 33, device="cuda", dtype=dtype, generator=g)),
        "sliced": (base[1:, ::3, 2:], base[:-1, 1::3, :-2]),
        "bias_row": (base.reshape(-1, 9), torch.randn(9, device="cuda", dtype=dtype, generator=g)),
        "bias_col": (base[:, :, 4], torch.randn(33, 1, device="cuda", dtype=dtype, generator=g)),
        "outer": (torch.randn(1000, 1, device="cuda", dtype=dtype, generator=g),
                  torch.randn(1, 4097, device="cuda", dtype=dtype, generator=g)),
        "scalar": (base, torch.randn((), device="cuda", dtype=dtype, generator=g)),
        "permuted_4d": (torch.randn(3, 5, 7, 31, device="cuda", dtype=dtype, generator=g).permute(3, 1, 0, 2),
                        torch.randn(31, 1, 3, 1, device="cuda", dtype=dtype, generator=g)),
        "offset_view": (base.reshape(-1)[1:4098], base.reshape(-1)[3:4100]),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["transposed", "sliced", "bias_row", "bias_col", "outer", "scalar",
                                  "permuted_4d", "offset_view"])
@pytest.mark.parametrize("op", ["add", "mul", "max", "relu_backward", "sub"])
@pytest.mark.quick(rotate="case", per=2)
def test_zip_strided_and_broadcast(op, case, dtype):
    g = torch.Generator(device="cuda").manual_seed(11)
    a, b = _strided_cases(dtype, g)[case]
    ref = _zip_ref(op, a, b)
    out = poison(torch.empty(ref.shape, device="cuda", dtype=dtype))
    ew.zip(op, a, b, out=out)
    _check(out, ref)
    out2 = ew.zip_v1_strided(op, b, a)
    _check(out2, _zip_ref(op, b, a))
    out3 = poison(torch.empty(ref.shape, device="cuda", dtype=dtype))
    if lay.layout_2d((a, b), out3) is None:
        with pytest.raises(ValueError, match="does not collapse to 2 dims"):
            ew.zip_v3_tiled(op, a, b, out3)
    else:
        ew.zip_v3_tiled(op, a, b, out3)
        _check(out3, ref)


def _rows_gpu_cases(dtype, g):
    def rnd(*shape):
        return torch.randn(shape, device="cuda", dtype=dtype, generator=g)

    wide = rnd(1000, 48)
    return {
        "bias_row_1": (rnd(1, 8), rnd(8)),
        "bias_row": (rnd(4097, 24), rnd(24)),
        "bias_row_wide": (rnd(33, 4104), rnd(4104)),
        "bias_row_first": (rnd(1000), rnd(31, 1000)),
        "bias_row_3d": (rnd(7, 33, 40), rnd(40)),
        "bias_col": (rnd(1000, 16), rnd(1000, 1)),
        "bias_col_first": (rnd(4097, 1), rnd(4097, 8)),
        "scalar": (rnd(31, 1000), rnd()),
        "scalar_1d_long": (rnd(8 * 12345), rnd(1)),
        "padded_rows": (wide[:, :24], wide[:, 16:40]),
        "same_shape_1d": (rnd(8 * 4099), rnd(8 * 4099)),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["bias_row_1", "bias_row", "bias_row_wide", "bias_row_first", "bias_row_3d",
                                  "bias_col", "bias_col_first", "scalar", "scalar_1d_long", "padded_rows",
                                  "same_shape_1d"])
@pytest.mark.parametrize("op", list(ew.ZIP_OPS))
@pytest.mark.quick(rotate="case")
def test_zip_v5_rows_layouts(op, case, dtype):
    g = torch.Generator(device="cuda").manual_seed(13)
    a, b = _rows_gpu_cases(dtype, g)[case]
    if op == "pow":
        a = a.abs() + 0.1
    if op == "div":
        b = torch.where(b >= 0, b + 0.5, b - 0.5)
    ref = _zip_ref(op, a, b)
    out = poison(torch.empty(ref.shape, device="cuda", dtype=dtype))
    assert ew.zip_v5_rows(op, a, b, out) is out
    _check(out, ref)
    if case != "same_shape_1d":  # same-shape contiguous operands go to v4_blocked
        assert ew._zip_choice(a, b, out)[0] == "v5_rows"
    out2 = poison(torch.empty(ref.shape, device="cuda", dtype=dtype))
    ew.zip(op, a, b, out=out2)
    _check(out2, ref)


@pytest.mark.gpu
def test_zip_v5_rows_rejects_layouts_it_cannot_read():
    a = torch.randn(64, 9, device="cuda")
    with pytest.raises(ValueError, match="v5_rows"):
        ew.zip_v5_rows("add", a, torch.randn(9, device="cuda"))  # 36-byte rows
    t = torch.randn(32, 32, device="cuda")
    with pytest.raises(ValueError, match="v5_rows"):
        ew.zip_v5_rows("add", t.t(), t)  # transposed: v3_tiled's case
    with pytest.raises(ValueError, match="v5_rows"):
        ew.zip_v5_rows("add", torch.randn(64, 64, device="cuda")[:, ::2], torch.randn(32, device="cuda"))
    with pytest.raises(ValueError, match="v4_blocked"):
        ew.zip_v4_blocked("add", t, t[0])
    with pytest.raises(ValueError, match="v4_blocked"):
        ew.map_v4_blocked("relu", t.reshape(-1)[1:])
    assert ew.zip_v5_rows("add", torch.empty(0, 8, device="cuda"), torch.randn(8, device="cuda")).shape == (0, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["relu", "sigmoid", "gelu"])
def test_map_v4_blocked_views_and_in_place(op, dtype):
    g = torch.Generator(device="cuda").manual_seed(17)
    # An aligned view into a larger buffer (offset 16 bytes), and an in-place call (out is x).
    buf = torch.randn(8192 * 3 + 64, device="cuda", dtype=dtype, generator=g)
    x = buf[16 // buf.element_size():][:8192 * 3 + 5]
    out = poison(torch.empty_like(x))
    ew.map_v4_blocked(op, x, out)
    _check(out, _map_ref(op, x))
    y = x.clone()
    ref = _map_ref(op, y)
    ew.map_v4_blocked(op, y, y)
    _check(y, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["relu", "gelu", "exp", "sin"])
def test_map_strided_views(op, dtype):
    g = torch.Generator(device="cuda").manual_seed(5)
    base = torch.randn(65, 33, 17, device="cuda", dtype=dtype, generator=g)
    for x in (base.permute(2, 0, 1), base[:, ::2, 1:], base.reshape(-1)[1:], base[0, 0]):
        out = ew.map(op, x)
        assert out.is_contiguous() and out.shape == x.shape
        _check(out, _map_ref(op, x))


@pytest.mark.gpu
def test_nan_propagation_and_empty():
    x = torch.tensor([float("nan"), -1.0, 2.0], device="cuda")
    y = torch.tensor([0.0, float("nan"), 1.0], device="cuda")
    assert torch.equal(ew.map("relu", x).isnan(), torch.relu(x).isnan())
    assert torch.equal(ew.zip("max", x, y).isnan(), torch.maximum(x, y).isnan())
    assert ew.map("exp", x[:0]).numel() == 0
    assert ew.zip("add", torch.empty(0, 3, device="cuda"), torch.randn(3, device="cuda")).shape == (0, 3)


@pytest.mark.gpu
def test_gpu_input_errors():
    a = torch.randn(64, device="cuda")
    with pytest.raises(ValueError, match="'x' has dtype torch.int32"):
        ew.map("relu", a.int())
    with pytest.raises(ValueError, match="'b' is on cpu; tilewise kernels need CUDA tensors"):
        ew.zip("add", a, a.cpu())
    with pytest.raises(ValueError, match="'x' has dtype torch.float64; supported"):
        ew.map("relu", a.double())
    with pytest.raises(ValueError, match="'out' must be a tensor of shape"):
        ew.map("relu", a, out=torch.empty(65, device="cuda"))
    with pytest.raises(ValueError, match="'out' must be contiguous"):
        ew.map("relu", a.reshape(8, 8), out=torch.empty(8, 8, device="cuda").t())
    with pytest.raises(ValueError, match="16-byte boundaries"):
        ew.map_v2_contiguous("relu", a[1:])
    with pytest.raises(ValueError, match="no broadcasting"):
        ew.zip_v2_contiguous("add", a.reshape(8, 8), a[:8])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autograd_matches_pytorch_on_gpu(dtype):
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(33, 1000, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(1000, device="cuda", dtype=dtype, generator=g)
    gy = torch.randn(33, 1000, device="cuda", dtype=dtype, generator=g)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    bs = [b.clone().requires_grad_(), b.clone().requires_grad_()]
    y0 = ew.gelu(ew.mul(ew.relu(ew.add(xs[0], bs[0])), 2.0))
    y1 = torch.nn.functional.gelu(torch.relu(xs[1] + bs[1]) * 2.0)
    _check(y0, y1.detach())
    y0.backward(gy)
    y1.backward(gy)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2 * math.sqrt(33))
    torch.testing.assert_close(xs[0].grad.float(), xs[1].grad.float(), **tol)
    torch.testing.assert_close(bs[0].grad.float(), bs[1].grad.float(), **tol)


def test_custom_ops_opcheck_and_compile_cpu():
    x = torch.randn(4, 6, requires_grad=True)
    b = torch.randn(6, requires_grad=True)
    torch.library.opcheck(torch.ops.tilewise.map.default, ("relu", x))
    torch.library.opcheck(torch.ops.tilewise.zip.default, ("add", x, b))
    torch.library.opcheck(torch.ops.tilewise.zip.default, ("mul", x, b))

    def f(x, b):
        return ew.sigmoid(ew.relu(ew.add(x, b)) * 0.5).sum()

    ge = torch.autograd.grad(f(x, b), (x, b))
    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    gc = torch.autograd.grad(cf(x, b), (x, b))
    for u, v in zip(ge, gc):
        torch.testing.assert_close(u, v)


@pytest.mark.gpu
def test_torch_compile_runs_the_custom_ops_on_gpu():
    x = torch.randn(33, 1000, device="cuda", requires_grad=True)
    b = torch.randn(1000, device="cuda", requires_grad=True)

    def f(x, b):
        return ew.relu(ew.add(x, b))

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True)
    y = cf(x, b)
    torch.testing.assert_close(y, torch.relu(x + b))
    gy = torch.randn_like(y)
    gx, gb = torch.autograd.grad(y, (x, b), gy)
    x2, b2 = x.detach().requires_grad_(), b.detach().requires_grad_()
    want = torch.autograd.grad(torch.relu(x2 + b2), (x2, b2), gy)
    torch.testing.assert_close(gx, want[0])
    torch.testing.assert_close(gb, want[1], rtol=1e-4, atol=1e-4)


def test_meta_tensors_are_refused_naming_the_argument_and_device():
    # Issue 29: relu on a meta tensor used to hand back a meta "result" through the reference.
    meta = torch.randn(4, 6, device="meta")
    with pytest.raises(ValueError, match="'x' is on meta"):
        ew.relu(meta)
    with pytest.raises(ValueError, match="'b' is on meta"):
        ew.add(torch.randn(4, 6), meta)
    with pytest.raises(ValueError, match=r"'b' must be a tensor or a Python number, got list"):
        ew.add(torch.randn(4, 6), [1.0])
    with pytest.raises(ValueError, match=r"cannot broadcast: 'a' \(3, 4\), 'b' \(5,\)"):
        ew.add(torch.randn(3, 4), torch.randn(5))
