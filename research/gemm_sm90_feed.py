"""What feeds the 64 x 128 tile's K loop: ring depth and the size of B's copies.

Why: at M = N = 1000-1024 gemm_sm90's 64 x 128 tile (2 x 1 clusters, 8 stages) runs 0.24-0.26 us a
64-deep K block against cuBLAS's 0.19-0.20 with the same tile and cluster (nvjet
`tst_64x128_64x8_2x1`, bf16 1000^3). ncu's source-level samples (logs/*-ncu-sass-1024-b5cfac9)
show our consumer warps waiting on the stage's `full` barrier (data not there yet) where cuBLAS's
wait on their wgmma (tensor-bound). Two questions, each with a prediction written before the run:

* Ring depth (same code, STAGES 8 / 6 / 4): if a stage's round trip (release -> both CTAs' copies
  -> data in shared memory) is what bounds the loop, time a block ~ round trip / STAGES, so 6
  stages cost ~1.33x and 4 stages ~2x the 8-stage K-loop time at K = 16384; if it is not, they
  stay within a few per cent.
* B's share of the cluster by chunk (-DTW_B_BY_CHUNK): each CTA copies one whole 64 x 64 B chunk
  (a box of 64 rows, 8 KB) instead of half the K rows of both chunks (two boxes of 32 rows): two
  copies a block instead of three, boxes twice as large. If the copy engine's cost per box is part
  of the round trip: a few per cent off the K loop; else neutral.

Interleaved rounds, graph-replayed, each variant checked against float64 on NaN-poisoned outputs.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_feed.py
"""
import dataclasses
import tempfile
from pathlib import Path

import torch
from _timing import warm_clocks
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report, square_operands

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc
from tilewise.runtime import cuda as rt

BASE = gc.SM90_CONFIGS["64x128_c2x1"]
W2 = gc.SM90_EXTRA_CONFIGS["64x128w2_c2x1"]
# label -> (config, extra NVRTC options, B box of whole 64-row chunks)
VARIANTS = {
    "s8": (BASE, (), False),
    "s6": (dataclasses.replace(BASE, stages=6), (), False),
    "s4": (dataclasses.replace(BASE, stages=4), (), False),
    "s8 chunk": (BASE, ("-DTW_B_BY_CHUNK",), True),
    "w2 s8 chunk": (W2, ("-DTW_B_BY_CHUNK",), True),
}


def _source() -> Path:
    """gemm_sm90.cu in a directory of its own, every instantiation the variants need (the .cu's
    header lists the library's; the file is compiled from there like any .cu of ops/)."""
    d = Path(tempfile.mkdtemp(prefix="tw_feed_"))
    p = d / "gemm_sm90_feed.cu"
    p.write_text(gs.SRC.read_text())
    return p


def launcher(path, cfg, dtype, options, chunk):
    d = gs._driver()
    name = cfg.name(dtype)
    mod = rt.load(path, [name], options=("-std=c++17",) + tuple(options), device_index=0)
    k = mod.kernel(name, [])
    k.set_max_dynamic_shared(cfg.shmem)
    func = gs._check_cu(d.cuKernelGetFunction(k.handle.handle), "cuKernelGetFunction")
    clusters = int(k.max_active_clusters(cfg.cluster, cfg.threads, cfg.shmem))
    types = gs._ARG_TYPES  # (the stream-K tail's workspace, counters and splits last: off here)

    def run(a, b, out):
        M, K = a.shape
        N = b.shape[1]
        map_a = gs.tensor_map(a, 64, cfg.bm // cfg.cn, 128)
        bch = 64 if cfg.bn % 64 == 0 else 32
        map_b = gs.tensor_map(b, bch, 64 if chunk else 64 // cfg.cm, 2 * bch)
        ct = cfg.cluster_tiles(M, N)
        grid = min(ct, clusters) * cfg.cluster
        stream = d.CUstream(torch.cuda.current_stream().cuda_stream)
        # the library's store rule: bulk stores (C's map) with two or more consumer warpgroups
        if gs._bulk_store(cfg):
            cw = 64 if cfg.epi_n % 64 == 0 else 32
            map_c = gs.tensor_map(out, cw, 64, 2 * cw)
        else:
            map_c = map_a
        args = ((map_a, map_b, map_c, out.data_ptr(), M, N, K, out.stride(0), 0, 0, 1), types)
        gs._check_cu((d.cuLaunchKernel(func, grid, 1, 1, cfg.threads, 1, 1, cfg.shmem, stream, args, 0)[0], None),
                     "cuLaunchKernel")
        return out
    return run


def operands(m, n, k, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g)
    return a, b, torch.empty(m, n, device="cuda", dtype=dtype), a.double() @ b.double()


def compare(src, label, a, b, out, ref, variants, width):
    """cuBLAS and each variant (label -> (config, NVRTC options, B by chunk)) on a @ b into out,
    each checked against ref, then timed in interleaved rounds."""
    graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out))}
    for v, (cfg, opts, chunk) in variants.items():
        fn = launcher(src, cfg, a.dtype, opts, chunk)
        graphs[v] = checked_graph(lambda: fn(a, b, out), out, ref, v)
    rounds_report(graphs, 7, label, width)


def main():
    warm_clocks()
    src = _source()
    cases = [("bfloat16 1000^3", *square_operands(1000, torch.bfloat16)),
             ("float16 1000^3", *square_operands(1000, torch.float16)),
             ("bfloat16 1024^3", *square_operands(1024, torch.bfloat16)),
             ("bfloat16 1024x1024x16384", *operands(1024, 1024, 16384, torch.bfloat16, 3))]
    for label, a, b, out, ref in cases:
        compare(src, label, a, b, out, ref, VARIANTS, 12)


if __name__ == "__main__":
    main()
