"""gemm_sm90 (CUDA C, wgmma + TMA multicast, sm_90a): CPU checks of the source, the generated wgmma
header, the config table and the rule; GPU runs of every instantiated config on odd sizes."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tilewise.ops.gemm import configs as gc
from tilewise.ops.gemm import sm90 as gs
from tilewise.runtime import cuda as rt

from conftest import HAS_CUDA, poison

ROOT = Path(__file__).resolve().parent.parent


def test_wgmma_header_is_generated():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_wgmma.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_configs_are_instantiated():
    names = set(rt.name_expressions_for(gs.SRC))
    for cfg in list(gc.SM90_CONFIGS.values()) + list(gc.SM90_EXTRA_CONFIGS.values()) + [gc.SM90_KMAJOR_CONFIG]:
        for dt in (torch.bfloat16, torch.float16):
            assert cfg.name(dt) in names, cfg.name(dt)
        assert cfg.shmem <= rt.SM90_SHARED_OPT_IN - 1024, cfg  # + the barriers' static block
        assert cfg.bm in (64, 128, 192) or (cfg.swap and cfg.bm % 8 == 0 and cfg.bn % 64 == 0), cfg
        assert cfg.bm % (8 * cfg.cn) == 0 and 64 % (8 * cfg.cm) == 0


def test_every_config_has_a_tail_kernel_outside_the_library_module():
    names, lib = set(gs._instantiated()), set(gs._library_names())
    for c in gc.SM90_CONFIGS.values():
        for dt in (torch.bfloat16, torch.float16):
            tail = gs._tail_name(c, dt)
            assert tail in names and tail not in lib, (c, tail)
            assert tail.endswith(",1>") and tail != c.name(dt)
    for c in list(gc.SM90_EXTRA_CONFIGS.values()) + [gc.SM90_KMAJOR_CONFIG]:
        assert gs._tail_name(c, torch.bfloat16) is None  # the launch keeps sk = 1 for them


def test_library_module_leaves_out_the_experiment_configs():
    lib = set(gs._library_names())
    for dt in (torch.bfloat16, torch.float16):
        assert all(c.name(dt) in lib for c in gc.SM90_CONFIGS.values())
        assert gc.SM90_KMAJOR_CONFIG.name(torch.bfloat16) in lib
        assert not any(c.name(dt) in lib for c in gc.SM90_EXTRA_CONFIGS.values())
    assert lib | {c.name(d) for c in gc.SM90_EXTRA_CONFIGS.values() for d in (torch.bfloat16, torch.float16)} \
        | {gs._tail_name(c, d) for c in gc.SM90_CONFIGS.values() for d in (torch.bfloat16, torch.float16)} \
        == set(gs._instantiated())


def test_config_with_warpgroups_along_n():
    c = gc.SM90_EXTRA_CONFIGS["64x128w2_c2x1"]
    assert (c.consumers, c.threads, c.epi_n) == (2, 384, 64)
    assert c.name(torch.bfloat16) == "gemm_sm90<__nv_bfloat16,64,128,2,1,8,1,2>"
    assert gc.SM90_CONFIGS["128x256_c2x1"].name(torch.float16) == "gemm_sm90<__half,128,256,2,1,4,1>"
    assert (gc.SM90_CONFIGS["128x256_c2x1"].consumers, gc.SM90_CONFIGS["128x256_c2x1"].epi_n) == (2, 128)


def test_config_of_the_transposed_tile():
    c = gc.SM90_EXTRA_CONFIGS["72x128t_c2x1"]
    # one consumer warpgroup a 64-column B chunk, each staging its 72 x 64 share of C
    assert (c.consumers, c.threads) == (2, 384)
    assert c.name(torch.float16) == "gemm_sm90<__half,72,128,2,1,8,1,1,1>"
    assert c.shmem == 8 * (72 + 128) * 128 + 2 * 72 * 64 * 2 + 1024
    assert not gs._bulk_store(c)


def test_compiles_for_sm90a_without_spills():
    mod = rt.compile_file(gs.SRC, arch="sm_90", name_expressions=rt.name_expressions_for(gs.SRC))
    assert mod.arch == "sm_90a"
    assert mod.resources and all(not r.spills for r in mod.resources), mod.resources
    # <= 168 registers a thread at launch: a CTA of 384 threads fits the register file (setmaxnreg
    # moves them to the consumers later); 512-thread CTAs get 128 and 256-thread ones their own
    assert all(r.registers <= 168 for r in mod.resources)


def test_arch_marker():
    src = "// tilewise-arch: sm_90a\n__global__ void k() {}\n"
    assert rt.source_arch(src, "sm_90") == "sm_90a"
    assert rt.source_arch(src, "sm_90a") == "sm_90a"
    assert rt.source_arch("__global__ void k() {}", "sm_80") == "sm_80"
    with pytest.raises(rt.CompileError, match="needs sm_90a; this device is sm_100"):
        rt.source_arch(src, "sm_100")
    # clusters: sm_90 and later, each compiled for its own architecture
    newer = "// tilewise-min-arch: sm_90\n__global__ void k() {}\n"
    assert rt.source_arch(newer, "sm_90") == "sm_90" and rt.source_arch(newer, "sm_100") == "sm_100"
    with pytest.raises(rt.CompileError, match="needs sm_90 or later; this device is sm_80"):
        rt.source_arch(newer, "sm_80")


@pytest.mark.parametrize("M,N,K,want", [
    (1536, 1536, 1536, "192x96_c1x2"), (1000, 1000, 1000, "64x128_c2x1"),  # one wave filled
    (2304, 2304, 2304, "128x192_c2x1"), (3072, 3072, 3072, "128x192_c2x1"),  # 128 x 256 leaves a wave part-empty
    (2560, 2560, 2560, "128x256_c2x1"), (4096, 4096, 4096, "128x256_c2x1"), (6144, 6144, 6144, "128x256_c2x1"),
    (5000, 5000, 5000, "128x256_c2x1"),  # a near tie with 128 x 128, which measured 0.60x against 0.78x
    (65536, 128, 4096, "128x128_c2x1")])  # half of a 128 x 256 tile would be empty
def test_config_rule_takes_the_least_wave_time(M, N, K, want):
    assert gc.sm90_config_for(M, N, K, 132) == want


def test_cluster_tiles():
    # 5000^2 in 128 x 256 tiles: 40 x 20 tiles, paired along M by 2 x 1 clusters
    assert gc.SM90_CONFIGS["128x256_c2x1"].cluster_tiles(5000, 5000) == 400
    assert gc.SM90_CONFIGS["192x96_c1x2"].cluster_tiles(1536, 1536) == 8 * 8  # 8 x 16 tiles, paired along N
    assert gc.SM90_CONFIGS["128x128_c1x1"].cluster_tiles(129, 1) == 2


def test_split_k_rule_and_route():
    """Split-K only for long K over at most half a wave of tiles, as many ranges as the resident
    clusters take with at least 32 K blocks each; gemm()'s route sends such products to 128 x 128."""
    assert gc.sm90_split_k(32, 66, 256) == 2     # 1024 x 1024 x 16384 in 128 x 128 c2x1
    assert gc.sm90_split_k(18, 66, 128) == 3     # 768 x 768 x 8192
    assert gc.sm90_split_k(32, 66, 16) == 1      # 1000^3: every split measured slower
    assert gc.sm90_split_k(40, 66, 512) == 1     # more than half a wave already
    assert gc.sm90_split_k(1, 66, 128) == 4      # one tile: capped by 32 blocks a range
    assert gc.sm90_split_k(1, 66, 4096) == 66    # ... and by the resident clusters
    assert gc.sm90_route_for(1024, 1024, 16384) == "128x128_c2x1"
    assert gc.sm90_route_for(768, 768, 8192) == "128x128_c2x1"
    assert gc.sm90_route_for(1024, 1024, 8128) != "128x128_c2x1"   # 127 blocks
    assert gc.sm90_route_for(2048, 2048, 16384) != "128x128_c2x1"  # a whole wave of tiles: no split
    assert gc.sm90_route_for(1000, 1000, 1000) == "64x128_c2x1"


def test_tail_split_rule():
    assert gc.sm90_tail_splits(400, 66, 79) == 6   # 5000^3 in 128 x 256: four tiles in the seventh wave
    assert gc.sm90_tail_splits(256, 66, 64) == 1   # 4096^3: the last wave 58 of 66, nothing to gain
    assert gc.sm90_tail_splits(64, 66, 16) == 1    # one partial wave: no whole wave to follow
    assert gc.sm90_tail_splits(396, 66, 79) == 1   # whole waves
    assert gc.sm90_tail_splits(400, 66, 79, swap=True) == 1
    assert gc.sm90_tail_splits(400, 66, 4) == 1    # short K: the partials' round trip costs more than it saves
    for nct, clusters, kt in [(400, 66, 79), (133, 66, 200), (70, 33, 1000)]:
        s = gc.sm90_tail_splits(nct, clusters, kt)
        assert s == 1 or (nct % clusters) * s <= clusters  # one unit a resident cluster at most


def test_wave_time_model():
    # waves x area / rate: 2560^2 in 128 x 256 is 200 tiles, two waves on 132 SMs
    assert gc.sm90_tile_time("128x256_c2x1", 2560, 2560, 132) == 2 * 128 * 256
    assert gc.sm90_tile_time("128x192_c2x1", 2560, 2560, 132) == pytest.approx(3 * 128 * 192 / 0.96)
    # a partial tile costs a whole one: N = 129 needs two 128-wide columns of tiles
    t = gc.sm90_tile_time
    assert t("128x128_c2x1", 128 * 132, 129, 132) == 2 * t("128x128_c2x1", 128 * 132, 128, 132)
    assert set(gc.SM90_TILE_RATE) == set(gc.SM90_CONFIGS)


def test_out_problem_names_what_is_wrong():
    bf = torch.bfloat16
    good = torch.empty(8, 16, dtype=bf)
    assert gs.out_problem(good, bf, good.device, 8, 16) is None
    assert "out must be (8, 24)" in gs.out_problem(good, bf, good.device, 8, 24)
    assert "out must be" in gs.out_problem(good, torch.float16, good.device, 8, 16)
    assert "multiple of 8" in gs.out_problem(torch.empty(8, 20, dtype=bf)[:, :16], bf, good.device, 8, 16)
    assert "16-byte" in gs.out_problem(torch.empty(8, 24, dtype=bf)[:, 1:17], bf, good.device, 8, 16)


def test_errors_on_cpu_tensors():
    a = torch.randn(8, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        gs.gemm_sm90(a, a)
    with pytest.raises(ValueError, match="inner"):
        gs.gemm_sm90(a, torch.randn(9, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        gs.gemm_sm90(a.float(), a.float())
    assert not gs.applies(a, a)


# --------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu
needs_sm90 = pytest.mark.skipif(not (HAS_CUDA and gs.available()), reason="needs an sm_90 GPU and cuda-bindings")


def _check(M, N, K, dtype, config, b_kmajor=False, seed=0, out=None, **kw):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    if b_kmajor:
        b = torch.randn(N, K, device="cuda", dtype=dtype, generator=g).t()
    else:
        b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g)
    if out is None:
        out = poison(torch.empty(M, N, device="cuda", dtype=dtype))
    c = gs.gemm_sm90(a, b, out=out, config=config, **kw)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    err = ((c.double() - ref).norm() / ref.norm()).item()
    assert c.isfinite().all(), "an element was not written"
    tol = 2e-3 if dtype is torch.float16 else 1e-2
    assert err < tol, (M, N, K, dtype, config, err)
    return c


@gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("config", sorted(gc.SM90_CONFIGS) + sorted(gc.SM90_EXTRA_CONFIGS))
@pytest.mark.parametrize("M,N,K", [(333, 520, 136), (1000, 1000, 1000), (129, 72, 64), (1, 8, 8), (515, 1208, 1000)])
@pytest.mark.quick(rotate=("M", "N", "K"), per=2)
def test_gemm_sm90_odd_sizes(M, N, K, dtype, config):
    _check(M, N, K, dtype, config)


@gpu
@needs_sm90
@pytest.mark.parametrize("config", sorted(gc.SM90_CONFIGS) + sorted(gc.SM90_EXTRA_CONFIGS))
def test_gemm_sm90_several_tiles_a_cta(config):
    # more cluster tiles than resident clusters: the persistent loop and the ring's phases wrap
    _check(2304, 2056, 520, torch.bfloat16, config, seed=3)


def _clusters_for_a_tail(M, N, cfg):
    """A cluster count (as the ``clusters`` argument) that leaves a last wave at most half full
    after at least one whole wave: the stream-K tail applies."""
    nct = cfg.cluster_tiles(M, N)
    for c in range(nct // 2, 1, -1):
        if 1 <= nct % c <= c // 2:
            return c
    raise AssertionError(f"no cluster count gives a partial last wave for {nct} cluster tiles")


@gpu
@needs_sm90
@pytest.mark.parametrize("splits", [2, 3, 16])
@pytest.mark.parametrize("config", sorted(gc.SM90_CONFIGS))  # each has a tail kernel per dtype
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.quick(rotate="splits")
def test_gemm_sm90_stream_k_tail(config, splits, dtype):
    """The stream-K tail, forced, with few clusters so that whole waves and a partial one run:
    right answers on odd sizes into NaN-poisoned outputs (every tail tile's epilogue ran), the
    same bits on a second run (the last unit adds the partials in range order whoever it is),
    a K of one block (no split possible), and a replayed CUDA graph (the workspace from its pool)."""
    cfg = gc.SM90_CONFIGS.get(config) or gc.SM90_EXTRA_CONFIGS[config]
    M, N, K = 1000, 1032, 1000
    clusters = _clusters_for_a_tail(M, N, cfg)
    g = torch.Generator(device="cuda").manual_seed(11)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g)
    ref = a.double() @ b.double()
    runs = []
    for _ in range(2):
        c = gs.gemm_sm90(a, b, out=poison(torch.empty(M, N, device="cuda", dtype=dtype)), config=config,
                         clusters=clusters, tail_splits=splits)
        torch.cuda.synchronize()
        assert c.isfinite().all(), "a tail tile was not written"
        assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2
        runs.append(c)
    assert torch.equal(runs[0], runs[1]), "the tail's sum depends on the order the units arrived in"
    plain = gs.gemm_sm90(a, b, config=config, clusters=clusters, tail_splits=1)
    assert ((plain.double() - ref).norm() / ref.norm()).item() < 1e-2
    short = gs.gemm_sm90(a[:, :64].contiguous(), b[:64].contiguous(), config=config, clusters=clusters,
                         tail_splits=splits)
    ref64 = a[:, :64].double() @ b[:64].double()
    assert ((short.double() - ref64).norm() / ref64.norm()).item() < 1e-2
    if splits != 3:
        return
    out = torch.empty(M, N, device="cuda", dtype=dtype)
    gs.gemm_sm90(a, b, out=out, config=config, clusters=clusters, tail_splits=splits)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        gs.gemm_sm90(a, b, out=out, config=config, clusters=clusters, tail_splits=splits)
    for i in range(2):
        poison(out)
        a.copy_(torch.randn(M, K, device="cuda", dtype=dtype, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        ref = a.double() @ b.double()
        assert out.isfinite().all() and ((out.double() - ref).norm() / ref.norm()).item() < 1e-2, i


@gpu
@needs_sm90
@pytest.mark.parametrize("splits", [2, 5, 40])
@pytest.mark.parametrize("config", ["128x256_c2x1", "128x192_c1x2", "128x128_c2x1", "128x128_c1x1", "64x128_c2x1"])
@pytest.mark.quick(rotate="splits")
def test_gemm_sm90_split_k_one_wave(config, splits):
    """Split-K through the tail kernel: fewer cluster tiles than resident clusters, every tile cut
    into K ranges (cluster_tiles x splits clusters launched, capped at the resident count): right
    answers on odd sizes into NaN-poisoned outputs, the same bits twice, K shorter than the splits
    (ranges of one block, or empty ones capped away), and N-major / odd M edges."""
    cfg = gc.SM90_CONFIGS[config]
    for M, N, K in ((333, 520, 1000), (200, 136, 4008), (130, 264, 192)):
        assert cfg.cluster_tiles(M, N) < 66
        runs = [_check(M, N, K, torch.float16, config, seed=17, tail_splits=splits) for _ in range(2)]
        assert torch.equal(runs[0], runs[1]), (M, N, K, "the split sum depends on the arrival order")


@gpu
@needs_sm90
@pytest.mark.parametrize("config", ["64x128_c2x1", "128x256_c2x1", "192x96_c1x2"])
def test_gemm_sm90_dependent_launch_keeps_stream_order(config):
    """Programmatic dependent launch: each call starts before the previous kernel has finished and
    waits in the kernel for it. A chain where every product reads the one before it (and a PyTorch
    kernel rewrites an operand in between), eager and graph-replayed, must match the same chain in
    float64; a call that read its input too early would carry stale or NaN-poisoned values."""
    assert gc.DEFAULT_POLICY.pdl  # gemm()'s default launch
    M, K = 520, 264
    g = torch.Generator(device="cuda").manual_seed(23)
    w = (torch.randn(K, K, device="cuda", generator=g) / K ** 0.5).half()
    x0 = torch.randn(M, K, device="cuda", generator=g).half()
    xs = [poison(torch.empty(M, K, device="cuda", dtype=torch.float16)) for _ in range(6)]

    def chain():
        xs[0].copy_(x0)
        for i in range(1, 6):
            gs.gemm_sm90(xs[i - 1], w, out=xs[i], config=config)
            if i == 3:
                xs[i].mul_(-0.5)

    def reference():
        r = x0.double()
        for i in range(1, 6):
            r = r @ w.double()
            if i == 3:
                r = r * -0.5
        return r

    chain()
    torch.cuda.synchronize()
    ref = reference()
    assert ((xs[5].double() - ref).norm() / ref.norm()).item() < 2e-2
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        chain()
    for _ in range(2):
        for x in xs:
            poison(x)
        x0.copy_(torch.randn(M, K, device="cuda", generator=g).half())
        graph.replay()
        torch.cuda.synchronize()
        ref = reference()
        assert xs[5].isfinite().all() and ((xs[5].double() - ref).norm() / ref.norm()).item() < 2e-2


@gpu
@needs_sm90
@pytest.mark.parametrize("M,N,K", [(333, 520, 1000), (200, 136, 16384)])
def test_gemm_sm90_plain_launch(M, N, K):
    """PDL off (pdl=False; gemm()'s GemmPolicy(pdl=False)): cuLaunchKernel, the kernel's griddepcontrol
    instructions then no-ops; right answers on odd sizes, split-K (long K) included, the same bits
    as the PDL launch."""
    outs = []
    for pdl in (False, True):
        outs.append(_check(M, N, K, torch.bfloat16, None, seed=29, pdl=pdl))
    assert torch.equal(outs[0], outs[1])


@gpu
@needs_sm90
def test_gemm_routes_5000_with_a_tail():
    """gemm() at 5000 x 5000 x 4096 (the route's 128 x 256 tile: 400 cluster tiles, the last wave
    four of them) takes the tail split by the rule, and its result is right."""
    from tilewise.ops.gemm import api as gt

    M = N = 5000
    K = 4096
    assert gc.sm90_route_for(M, N, K) == "128x256_c2x1"
    assert gc.sm90_tail_splits(400, 66, K // 64) > 1
    g = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g)
    for _ in range(2):  # checked, then planned
        c = gt.gemm(a, b, out=poison(torch.empty(M, N, device="cuda", dtype=torch.float16)))
        torch.cuda.synchronize()
        ref = a.double() @ b.double()
        assert c.isfinite().all() and ((c.double() - ref).norm() / ref.norm()).item() < 2e-3


@gpu
@needs_sm90
def test_transposed_tile_refuses_kmajor_b():
    a = torch.randn(72, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="not instantiated"):
        gs.gemm_sm90(a, w.t(), config="72x128t_c2x1")


@gpu
@needs_sm90
@pytest.mark.parametrize("dtype,config", [(torch.bfloat16, None), (torch.float16, None),
                                          (torch.bfloat16, "192x96_c1x2"), (torch.bfloat16, "128x128_c1x1")],
                         ids=str)  # the K-major builds (the last two for experiments)
def test_gemm_sm90_kmajor_b(dtype, config):
    _check(333, 520, 136, dtype, config, b_kmajor=True)
    _check(1000, 1000, 1000, dtype, config, b_kmajor=True, seed=1)


@gpu
@needs_sm90
@pytest.mark.parametrize("config", ["128x128_c2x1", "192x96_c1x2", "128x256_c2x1", "64x128_c2x1", "64x128w2_c2x1"])
def test_gemm_sm90_out_with_row_stride_and_graph(config):
    # bulk TMA stores (boxes of 64 or 32 columns, one or two halves of the tile) and per-thread
    # stores (one consumer warpgroup): nothing written outside out's rows and columns
    M, N, K = 300, 264, 200
    big = poison(torch.empty(M + 24, N + 40, device="cuda", dtype=torch.bfloat16))
    out = big[:M, 8:8 + N]
    _check(M, N, K, torch.bfloat16, config, out=out)
    assert big[:, :8].isnan().all() and big[:, 8 + N:].isnan().all() and big[M:].isnan().all(), "wrote outside out"
    if config != "128x128_c2x1":
        return
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    gs.gemm_sm90(a, b, out=c)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        gs.gemm_sm90(a, b, out=c)
    poison(c)
    a.copy_(torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g))
    graph.replay()
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    assert ((c.float() - ref).norm() / ref.norm()).item() < 1e-2


@gpu
@needs_sm90
def test_gemm_sm90_rejects_bad_layouts():
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unit-stride rows"):
        gs.gemm_sm90(a[:, 1:], torch.randn(63, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out must be"):
        gs.gemm_sm90(a, a, out=torch.empty(64, 63, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="unknown config"):
        gs.gemm_sm90(a, a, config="nope")
    with pytest.raises(ValueError, match="multiple of 8"):
        gs.gemm_sm90(a, torch.randn(20, 64, device="cuda", dtype=torch.bfloat16).t())
    big = torch.empty(64, 70, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 8"):
        gs.gemm_sm90(a, a, out=big[:, :64])


@pytest.mark.parametrize("n,want", [(1536, "192x96_c1x2"), (3072, "128x192_c2x1"), (2560, "128x256_c2x1"),
                                    (4096, "128x256_c2x1"), (2048, "128x256_c2x1"), (2304, "128x192_c2x1"),
                                    (1000, "64x128_c2x1"), (936, "64x128_c2x1"), (960, None), (1024, None),
                                    (1100, None), (8192, "128x256_c2x1"), (256, None), (40, None)])
def test_route_rule(n, want):
    assert gc.sm90_route_for(n, n, n, 132) == want


def test_route_rule_large_problems_need_both_sides_and_k():
    assert gc.sm90_route_for(4096, 4096, 1024, 132) == "128x256_c2x1"
    assert gc.sm90_route_for(4096, 4096, 1016, 132) is None  # short K: not measured, Triton keeps it
    assert gc.sm90_route_for(8192, 2040, 4096, 132) is None  # a side under 2048
    assert gc.sm90_route_for(2048, 8192, 2048, 132) == "128x256_c2x1"


def test_route_rule_reads_b_row_stride():
    # the 64 x 128 route is for B rows that are not whole 128-byte lines, whatever N is
    assert gc.sm90_route_for(1000, 1000, 1000, 132, ldb=1024) is None
    assert gc.sm90_route_for(1024, 1024, 1024, 132, ldb=1000) == "64x128_c2x1"
    assert gc.sm90_route_for(1000, 1000, 4000, 132) == "64x128_c2x1"
    # the 192 x 96 rule still sees its own candidates (64 x 128 fills 2056 x 1024's waves better)
    assert gc.sm90_route_for(2056, 1024, 2056, 132) == "192x96_c1x2"


@gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemm_routes_to_sm90_where_it_wins(monkeypatch, dtype):
    from tilewise.ops.gemm import api as gt
    from tilewise.ops.gemm import route as gr

    gr.PLANS.clear()
    calls = []
    real = gs._launch
    names = {cfg: name for name, cfg in gc.SM90_CONFIGS.items()}

    def spy(a, b, out, cfg, *rest, **kw):  # every launch, checked (gemm_sm90) or planned, comes here
        calls.append(names.get(cfg, cfg))
        return real(a, b, out, cfg, *rest, **kw)

    monkeypatch.setattr(gs, "_launch", spy)
    g = torch.Generator(device="cuda").manual_seed(7)
    n = 1536
    a = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
    ref = a.double() @ b.double()
    for given in (None, poison(torch.empty(n, n, device="cuda", dtype=dtype)), None):
        c = gt.gemm(a, b, out=given)
        torch.cuda.synchronize()
        assert c.isfinite().all() and ((c.double() - ref).norm() / ref.norm()).item() < 1e-2
        if given is not None:
            assert c.data_ptr() == given.data_ptr()
    assert calls == ["192x96_c1x2"] * 3  # first call checked, later ones through the plan
    with pytest.raises(ValueError, match="overlap|share"):
        gt.gemm(a, b, out=a)  # the plan refuses it, the checked path raises
    calls.clear()
    a1, b1 = a[:1000, :1000].contiguous(), b[:1000, :1000].contiguous()
    c = gt.gemm(a1, b1)  # 1000^3 (B's rows 2,000 bytes): the 64 x 128 tile
    ref = a1.double() @ b1.double()
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2
    assert calls == ["64x128_c2x1"]
    calls.clear()
    gt.gemm(a[:1024, :1024].contiguous(), b[:1024, :1024].contiguous())  # 1024^3: stays on Triton
    gt.gemm(a, b, bias=torch.randn(n, device="cuda"))  # an epilogue: stays on Triton
    gt.gemm(a, b.t().contiguous().t())  # B as w.T: the rule was measured on row-major B only
    with pytest.raises(ValueError):  # a scale on 16-bit inputs is refused, never dropped on the way
        gt.gemm(a, b, scale_b=torch.ones(1, device="cuda"))
    assert calls == []
    gr.PLANS.clear()


# --------------------------------------------------------------------------- tf32, row-major B


def test_tf32_tile_rule():
    assert gc.tf32_bm_for(4096, 4096) == 256 and gc.tf32_bm_for(8192, 8192) == 256
    assert gc.tf32_bm_for(1024, 1024) == 64  # 128 tiles of 64 rows: a wave, not half of one
    assert gc.tf32_bm_for(3000, 5000) == 192  # 5 waves of 192 rows (1011) against 4 of 256 (1024)
    # the best BM of each shape in the sweep logs/gemm-tf32-sweep2-6be142a
    sweep = {(512, 512): 64, (1024, 1024): 64, (1536, 1536): 192, (2048, 2048): 256, (3000, 3000): 192,
             (5000, 5000): 256, (6144, 6144): 256, (8192, 1024): 256, (256, 4096): 64, (4096, 256): 64}
    assert {mn: gc.tf32_bm_for(*mn) for mn in sweep} == sweep
    # CTA pairs where they led in that sweep, not where they trailed
    assert [gc.tf32_cluster_for(n, n, gc.tf32_bm_for(n, n)) for n in (3000, 5000, 8192)] == [2, 2, 2]
    assert [gc.tf32_cluster_for(m, n, gc.tf32_bm_for(m, n)) for m, n in ((2048, 2048), (1536, 1536), (1024, 8192),
                                                                        (8192, 1024), (512, 512))] == [1] * 5
    assert gc.tf32_cluster_for(4096, 4096, 64) == 1  # no pair kernel for BM = 64
    for M, N in [(1, 4), (777, 333), (20000, 128)]:
        assert gc.tf32_bm_for(M, N) in gc.TF32_CONFIGS
    for bm, st in gc.TF32_CONFIGS.items():
        assert gs._tf32_shmem(bm) <= rt.SM90_SHARED_OPT_IN - 1024
        assert f"gemm_sm90_tf32<{bm},{st}>" in rt.name_expressions_for(gs.SRC_TF32)


def test_tf32_compiles_without_spills():
    mod = rt.compile_file(gs.SRC_TF32, arch="sm_90", name_expressions=rt.name_expressions_for(gs.SRC_TF32))
    assert mod.arch == "sm_90a" and len(mod.resources) == len(rt.name_expressions_for(gs.SRC_TF32))
    assert all(not r.spills and r.registers <= 168 for r in mod.resources), mod.resources


def test_tf32_errors_on_cpu_tensors():
    a = torch.randn(8, 8)
    with pytest.raises(ValueError, match="CUDA"):
        gs.gemm_tf32(a, a)
    with pytest.raises(ValueError, match="inner"):
        gs.gemm_tf32(a, torch.randn(9, 8))
    with pytest.raises(ValueError, match="float32"):
        gs.gemm_tf32(a.bfloat16(), a.bfloat16())
    with pytest.raises(ValueError, match="2-D"):
        gs.gemm_tf32(a[0], a)
    assert not gs.tf32_applies(a, a)


def _check_tf32(M, N, K, bm=None, seed=0, out=None, cluster=1):
    """gemm_tf32 into a NaN-poisoned out against float64: each element within tf32's bound (two
    operands read to 10 mantissa bits: |error| <= 2^-9 (|a| @ |b|), with room for the fp32 sums)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", generator=g)
    b = torch.randn(K, N, device="cuda", generator=g)
    if out is None:
        out = poison(torch.empty(M, N, device="cuda"))
    c = gs.gemm_tf32(a, b, out=out, bm=bm, cluster=cluster)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    bound = 2.0 ** -8 * (a.double().abs() @ b.double().abs()) + 1e-6
    assert c.isfinite().all(), "an element was not written"
    worst = ((c.double() - ref).abs() / bound).max().item()
    err = ((c.double() - ref).norm() / ref.norm()).item()  # tf32 gives ~8e-4; a lost K block ~0.1
    assert worst <= 1.0 and err < 2e-3, (M, N, K, bm, worst, err)
    return a, b, c


@gpu
@needs_sm90
@pytest.mark.parametrize("bm", [256, 192, 128, 64])
@pytest.mark.parametrize("M,N,K", [(1, 4, 4), (37, 132, 68), (300, 200, 100), (257, 129 * 4, 132), (1000, 1004, 516),
                                   (513, 260, 2052)])
@pytest.mark.quick(rotate=("M", "N", "K"), per=2)
def test_gpu_tf32_odd_sizes(M, N, K, bm):
    """Sizes that are not multiples of the tile (BM x 128) or of the K block (32): TMA's zero fill
    and the epilogue's bounds."""
    _check_tf32(M, N, K, bm)


@gpu
@needs_sm90
@pytest.mark.parametrize("bm", [256, 192, 128])
@pytest.mark.parametrize("M,N,K", [(37, 132, 68), (300, 200, 100), (1000, 1004, 516), (513, 260, 2052),
                                   (3000, 1500, 260)])
def test_gpu_tf32_cta_pairs(M, N, K, bm):
    """cluster = 2: CTA pairs along N sharing A's blocks by multicast, an odd count of 128-column
    tiles (the last pair's second CTA past N: copies zero-filled, stores masked), several pair tiles
    a pair."""
    _check_tf32(M, N, K, bm, seed=5, cluster=2)


@gpu
@needs_sm90
@pytest.mark.parametrize("bm", [256, 128])
def test_gpu_tf32_several_tiles_a_cta_and_row_stride(bm):
    """More tiles than SMs (each CTA loops; the ring's phases carry over tiles), an out with a row
    stride above N: the padding columns stay as they were (NaN)."""
    M, N, K = 3000, 1500, 260
    store = poison(torch.empty(M, N + 12, device="cuda"))
    _check_tf32(M, N, K, bm, seed=3, out=store[:, :N])
    assert store[:, N:].isnan().all(), "a store outside the (M, N) view"


@gpu
@needs_sm90
def test_gpu_tf32_rejects_layouts_and_overlap():
    a = torch.randn(64, 64, device="cuda")
    with pytest.raises(ValueError, match="unit-stride rows"):
        gs.gemm_tf32(a, a.t())
    with pytest.raises(ValueError, match="16-byte"):
        gs.gemm_tf32(torch.randn(64, 66, device="cuda")[:, :63], torch.randn(63, 64, device="cuda"))
    with pytest.raises(ValueError, match="shares memory"):
        gs.gemm_tf32(a, a, out=a)
    with pytest.raises(ValueError, match="bm"):
        gs.gemm_tf32(a, a, bm=96)
    with pytest.raises(ValueError, match="cluster"):
        gs.gemm_tf32(a, a, bm=64, cluster=2)
    with pytest.raises(ValueError, match="float32"):
        gs.gemm_tf32(a, a, out=torch.empty(64, 64, device="cuda", dtype=torch.bfloat16))
    assert not gs.tf32_applies(a, a.t()) and gs.tf32_applies(a, a)


@gpu
@needs_sm90
def test_gpu_tf32_graph_replay_and_repeat_bits():
    """Captured in a CUDA graph and replayed on new inputs; two runs give the same bits (no
    atomics, one order of summation)."""
    M, N, K = 700, 900, 400
    a, b, c = _check_tf32(M, N, K)
    again = gs.gemm_tf32(a, b)
    assert torch.equal(c, again)
    out = poison(torch.empty(M, N, device="cuda"))
    gs.gemm_tf32(a, b, out=out)  # warm-up outside the capture (compile, descriptors)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gs.gemm_tf32(a, b, out=out)
    a.copy_(torch.randn_like(a))
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, gs.gemm_tf32(a, b))
