from dataclasses import replace

import pytest
import torch

from tilewise.ops.transpose import api as tp
from tilewise.ops.transpose import configs as cf

from conftest import poison

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# v4 configurations the GPU tests run besides the default: the first run's, and shapes the sweep
# in research/transpose_variants.py tries (other tiles, block sizes, orders, hints).
V4_EXTRA = {d: [cf.V4_TRIED[d], cf.V4Config(tm=128, tw=32, group=3, ldcs=False),
                cf.V4Config(tm=32, tw=64, threads=128, gl=32 // (16 // torch.empty((), dtype=d).element_size()),
                            group=10**6, minb=8),
                cf.V4Config(tm=64, tw=64, threads=128, gl=64 // (16 // torch.empty((), dtype=d).element_size()),
                            stcs=True)]
            for d in (torch.float32, torch.float16, torch.bfloat16)}
SHAPES = [(1, 1), (1, 33), (31, 1), (31, 33), (33, 31), (64, 128), (1000, 4097), (4097, 1000),
          (520, 1032), (3, 33, 1000), (2, 64, 64), (5, 8, 16)]


# --------------------------------------------------------------------------- CPU


def test_reference_and_cost():
    x = torch.randn(3, 5, 7)
    r = tp.reference(x)
    assert r.shape == (3, 7, 5) and r.is_contiguous()
    torch.testing.assert_close(r, x.permute(0, 2, 1), rtol=0, atol=0)
    assert tp.cost((16384, 16384), torch.float32) == tp.Cost(0, 2 * 4 * 16384 * 16384)
    assert tp.cost((2, 3, 5), torch.bfloat16).bytes == 2 * 2 * 30


def test_input_errors_on_cpu():
    x = torch.randn(8, 8)
    torch.testing.assert_close(tp.transpose(x), x.t())  # the one CPU rule
    with pytest.raises(ValueError, match="'x' is on cpu"):  # a version is a kernel
        tp.VARIANTS["v1_naive"](x)
    with pytest.raises(ValueError, match="unknown variant 'v9'"):
        tp.transpose(x, variant="v9")
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        tp.transpose([[1.0]])


def test_v4_tile_per_dtype():
    assert cf.v4_tile(torch.float32) == (64, 64)
    assert cf.v4_tile(torch.bfloat16) == (128, 128) and cf.v4_tile(torch.float16) == (128, 128)
    assert cf.v4_tile(torch.float32, cf.V4Config(tm=128, tw=32)) == (128, 32)
    assert cf.v4_tile(torch.bfloat16, cf.V4Config(tm=32, tw=32, gl=4)) == (32, 64)


@pytest.mark.parametrize("cfg,dtype", [
    (cf.V4Config(tm=48), torch.float32),                 # tile rows not 32/64/128
    (cf.V4Config(gl=16, tm=32), torch.float32),          # 16 lanes x 4 rows > 32 rows
    (cf.V4Config(gl=2), torch.float32),                  # fewer than 32 rows per store instruction
    (cf.V4Config(tm=32, tw=32, threads=256, gl=4), torch.bfloat16),  # 4 store pieces for 8 warps
    (cf.V4Config(group=-1), torch.float32),
])
def test_v4_config_check_rejects(cfg, dtype):
    with pytest.raises(ValueError, match="does not fit"):
        cfg.check(dtype)


def test_v4_built_configs_are_instantiated_in_the_cu():
    """The package module's v4 names (V4_BUILT, from V4_DEFAULT and V4_TRIED) are the ones the .cu
    lists for the compile check, so a default change cannot ship an unchecked kernel."""
    from tilewise.runtime import cuda as rt

    listed = set(rt.name_expressions_for(rt.OPS_DIR / "transpose" / "transpose.cu"))
    for dtype, cfgs in cf.V4_BUILT.items():
        assert replace(cf.V4_DEFAULT[dtype], group=0) in cfgs
        for cfg in cfgs:
            cfg.check(dtype)
            for vec in (True, False):
                assert tp.v4_name(dtype, cfg, vec) in listed


def _model_v4(M, N, E, cfg):
    """Replays transpose_v4_vec's index maps (block order, load phase, store phase, as in the .cu)
    in Python: every output element written once with the right value; each warp's shared-memory
    word accesses hit 32 distinct banks in the load phase and gl * V / 32 words per bank at most in
    the store phase (1: conflict-free; 2: the 2-way conflicts of 64-element store rows)."""
    TM, TW, NT, GL = cfg.tm, cfg.tw, cfg.threads, cfg.gl
    V, NW, P, TN, CV = 4 * E, NT // 32, TW + 1, TW * E, TW // 4
    WL, GCH = 32 // GL, TM // (V * GL)
    x = torch.arange(M * N).reshape(M, N)
    out = torch.full((N, M), -1, dtype=torch.long)
    tiles_m, tiles_n = -(-M // TM), -(-N // TN)
    seen = set()
    for blk in range(tiles_m * tiles_n):
        if cfg.group <= 0:
            tm, tn = divmod(blk, tiles_n)
        elif cfg.group >= tiles_m:
            tn, tm = divmod(blk, tiles_m)
        else:
            per = cfg.group * tiles_n
            gi = blk // per
            first = gi * cfg.group
            rows = min(cfg.group, tiles_m - first)
            r = blk - gi * per
            tm, tn = first + r % rows, r // rows
        assert (tm, tn) not in seen and tm < tiles_m and tn < tiles_n
        seen.add((tm, tn))
        m0, n0 = tm * TM, tn * TN
        tile = {}
        for warp in range(NW):
            for i in range((TM // 4) * (CV // 8) // NW):
                q = i * NW + warp
                banks = set()
                for lane in range(32):
                    r, c = (q // (CV // 8)) * 4 + (lane >> 3), (q % (CV // 8)) * 8 + (lane & 7)
                    banks.add((r * P + 4 * c) % 32)
                    for j in range(V):
                        if m0 + r < M and n0 + c * V + j < N:
                            tile[(r * P + 4 * c) * E + j] = int(x[m0 + r, n0 + c * V + j])
                assert len(banks) == 32
        for warp in range(NW):
            for i in range((TW // WL) * GCH // NW):
                q = i * NW + warp
                for k in range(V):
                    per_bank = {}
                    for lane in range(32):
                        w, g = (q // GCH) * WL + lane // GL, (q % GCH) * GL + lane % GL
                        word = (g * V + k) * P + w
                        per_bank.setdefault(word % 32, set()).add(word)
                        for e in range(E):
                            m, n = m0 + g * V + k, n0 + E * w + e
                            if m < M and n < N:
                                assert out[n, m] == -1
                                out[n, m] = tile[word * E + e]
                    assert max(len(v) for v in per_bank.values()) == max(1, GL * V // 32)
    assert len(seen) == tiles_m * tiles_n
    return x, out


_MODEL_CFGS = [cf.V4Config(), cf.V4Config(group=0), cf.V4Config(tm=128, tw=32, group=3),
               cf.V4Config(tm=32, tw=64, threads=128, group=100), cf.V4Config(tm=64, tw=32, threads=128, gl=16)]


@pytest.mark.parametrize("cfg", _MODEL_CFGS, ids=lambda c: f"{c.tm}x{c.tw}w-{c.threads}t-gl{c.gl}-g{c.group}")
@pytest.mark.parametrize("E", [1, 2], ids=["4-byte", "2-byte"])
@pytest.mark.parametrize("M,N", [(1, 1), (31, 33), (330, 129)])
def test_v4_index_model_covers_output(M, N, E, cfg):
    gl = cfg.gl if E == 1 else cfg.gl // 2  # the same bytes per store row in 2-byte elements
    cfg = replace(cfg, gl=gl)
    cfg.check(torch.float32 if E == 1 else torch.bfloat16)
    x, out = _model_v4(M, N, E, cfg)
    assert torch.equal(out, x.t())


def test_v4_default_models():
    for dtype in cf.V4_DEFAULT:
        for cfg in (cf.V4_DEFAULT[dtype], cf.V4_TRIED[dtype]):
            cfg.check(dtype)
            x, out = _model_v4(70, 200, 4 // torch.empty((), dtype=dtype).element_size(), cfg)
            assert torch.equal(out, x.t())


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("variant", list(tp.VARIANTS))
@pytest.mark.quick(rotate="shape", per=2)
def test_variants_match_reference(variant, shape, dtype):
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    out = poison(torch.empty(*shape[:-2], shape[-1], shape[-2], device="cuda", dtype=dtype))
    res = tp.VARIANTS[variant](x, out)
    assert res is out
    torch.testing.assert_close(out, tp.reference(x), rtol=0, atol=0)  # a copy: bit-exact
    if variant == "v4_vec":
        for cfg in V4_EXTRA[dtype]:
            poison(out)
            tp.v4_vec(x, out, config=cfg)
            torch.testing.assert_close(out, tp.reference(x), rtol=0, atol=0)
    new = tp.transpose(x, variant=variant)
    torch.testing.assert_close(new, tp.reference(x), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_v4_vector_and_element_paths(dtype):
    x = torch.randn(128, 256, device="cuda", dtype=dtype)
    out = torch.empty(256, 128, device="cuda", dtype=dtype)
    assert tp.v4_uses_vectors(x, out)
    base = torch.randn(128 * 256 + 1, device="cuda", dtype=dtype)
    xv = base[1:].view(128, 256)  # one element past a 16-byte boundary: the element path
    assert not tp.v4_uses_vectors(xv, out)
    poison(out)
    tp.v4_vec(xv, out)
    torch.testing.assert_close(out, tp.reference(xv), rtol=0, atol=0)


@pytest.mark.gpu
def test_empty_and_large_batch():
    x = torch.randn(0, 5, device="cuda")
    assert tp.transpose(x).shape == (5, 0)
    assert tp.transpose(torch.randn(3, 0, 7, device="cuda")).shape == (3, 7, 0)
    x = torch.randn(70000, 2, 3, device="cuda")  # batch past the grid's y limit
    for v in tp.VARIANTS:
        out = poison(torch.empty(70000, 3, 2, device="cuda"))
        tp.VARIANTS[v](x, out)
        torch.testing.assert_close(out, tp.reference(x), rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_input_errors():
    x = torch.randn(8, 16, device="cuda")
    with pytest.raises(ValueError, match="not contiguous"):
        tp.transpose(x.t())
    with pytest.raises(ValueError, match="dtype torch.int32"):
        tp.transpose(x.int())
    with pytest.raises(ValueError, match="2-D"):
        tp.transpose(x.view(2, 2, 2, 16))
    with pytest.raises(ValueError, match=r"'out' has shape \(8, 16\); expected \(16, 8\)"):
        tp.transpose(x, out=torch.empty(8, 16, device="cuda"))
    with pytest.raises(ValueError, match="'out' is torch.float16"):
        tp.transpose(x, out=torch.empty(16, 8, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="overlaps"):
        y = torch.randn(16, 16, device="cuda")
        tp.transpose(y, out=y)
    with pytest.raises(ValueError, match="overlaps"):  # out inside x's range, not at its start
        z = torch.randn(32, 16, device="cuda")
        tp.transpose(z[:16], out=z[8:24].view(16, 16))
    with pytest.raises(ValueError, match="'out' is not contiguous"):
        tp.transpose(x, out=torch.empty(8, 16, device="cuda").t())


@pytest.mark.gpu
@pytest.mark.sanitize
def test_sanitizer_small():
    """A short pass over every kernel at odd sizes, for
    ``compute-sanitizer --tool memcheck|racecheck python -m pytest -m gpu -k sanitizer tests/test_transpose.py``."""
    for dtype in DTYPES:
        for shape in [(31, 33), (33, 31), (3, 65, 130), (64, 128)]:
            x = torch.randn(shape, device="cuda", dtype=dtype)
            ref = tp.reference(x)
            runs = [lambda o, f=f: f(x, o) for f in tp.VARIANTS.values()]
            runs += [lambda o, c=c: tp.v4_vec(x, o, config=c) for c in V4_EXTRA[dtype]]
            for run in runs:
                out = poison(torch.empty_like(ref))
                run(out)
                torch.testing.assert_close(out, ref, rtol=0, atol=0)
