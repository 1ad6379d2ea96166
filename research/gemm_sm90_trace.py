"""Where a K block's time goes inside gemm_sm90's 64 x 128 tile: clock64 stamps of the producer and
the consumer around every ring step of the first tile (-DTW_TRACE; the .cu says which).

Why: the 64 x 128 tile runs 1000^3 fp16 in 8.5-8.9 us against cuBLAS's 7.1; its K loop is not
bound by the L2 bytes a CTA reads (logs/gemm-sm90-l2-7319c44), depends on ring depth (8 -> 6 stages
+11 %) and on the number of copies (B by chunk), and copies of cuBLAS's own structures run no faster
(logs/gemm-sm90-wn2-3a2d9ea, gemm-sm90-swap-5800bd3). The stamps say, per K block, how long the
consumer waits for data, how long a stage takes from its release to the producer's next copies
into it, and from those copies to the data being there.
Prediction, written before the run: the consumer waits for data on most blocks after the first
eight (the ring drained), and the copy-to-data time is the largest term (~1-1.5 us, above the
~1 us of MMA work the ring holds).
Measured (logs/gemm-sm90-trace-d6bfc5c): the consumer waits ~140 cycles a block for data in steady
state, not most of the block; a block takes ~670 cycles (256 of MMA at the tensor cores' peak), and
from its data to its release ~1,090, so the wgmma chain itself is the slow step. The first block's
data takes ~2,900 cycles from its copy (all eight stages' copies of 128 CTAs go out at once).
Second run (argument `split`, at df04c48): the same with -DTW_SPLIT_N (two independent m64 x n64
accumulator chains interleaved; gemm_sm90_split.py has the prediction and the result; the switch
is removed since).
Third run (argument `noload`): -DTW_NO_LOAD, the consumers' K loop on stale stages with no copies
in flight, beside the normal kernel, for the 64 x 128 tile and two larger ones (one tile a CTA).
Prediction, written before that run: if the wgmma loop itself is slow (~530 cycles for the 64 x
128 tile's 256 at peak), no loads changes it little; if the copies' traffic in shared memory or
the NoC slows it, the no-load loop runs near 256-300 cycles a block.
(At 2e2eaa9 / f152260 also `k2`: the K-split tile's stamps, a path since removed.)
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_trace.py [split | noload [--table]]
"""
import ctypes
import statistics
import sys

import torch
from _timing import warm_clocks
from gemm_sm90_feed import _source, operands
from gemm_sm90_rounds import square_operands

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc
from tilewise.runtime import cuda as rt

CFG = gc.SM90_CONFIGS["64x128_c2x1"]
TYPES = gs._ARG_TYPES + (ctypes.c_void_p,)  # the trace buffer after the stream-K tail's arguments


def traced(src, cfg, dtype, options=()):
    d = gs._driver()
    name = cfg.name(dtype)
    mod = rt.load(src, [name], options=("-std=c++17", "-DTW_TRACE") + tuple(options), device_index=0)
    k = mod.kernel(name, [])
    k.set_max_dynamic_shared(cfg.shmem)
    func = gs._check_cu(d.cuKernelGetFunction(k.handle.handle), "cuKernelGetFunction")
    clusters = int(k.max_active_clusters(cfg.cluster, cfg.threads, cfg.shmem))

    def run(a, b, out, trace):
        M, K = a.shape
        N = b.shape[1]
        map_a = gs.tensor_map(a, 64, cfg.bm // cfg.cn, 128)
        map_b = gs.tensor_map(b, 64, 64 // cfg.cm, 128)
        ct = cfg.cluster_tiles(M, N)
        grid = min(ct, clusters) * cfg.cluster
        stream = d.CUstream(torch.cuda.current_stream().cuda_stream)
        map_c = gs.tensor_map(out, 64, 64, 128) if gs._bulk_store(cfg) else map_a  # C's boxes (epi_n 128 / 64)
        args = ((map_a, map_b, map_c, out.data_ptr(), M, N, K, out.stride(0), 0, 0, 1, trace.data_ptr()), TYPES)
        gs._check_cu((d.cuLaunchKernel(func, grid, 1, 1, cfg.threads, 1, 1, cfg.shmem, stream, args, 0)[0], None),
                     "cuLaunchKernel")
        return grid
    return run


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def report(label, t, grid, kt):
    """t: (grid, 64, 8) int64 clock stamps."""
    print(f"== {label}: {grid} CTAs, {kt} K blocks; cycles, median over CTAs "
          "(SM clock; ~1.75-1.98 GHz)")
    print(f"{'kb':>3} {'prod wait+issue':>15} {'issue->data':>11} {'cons. wait':>10} {'data->release':>13} "
          f"{'release->next issue':>19}")
    rows = min(kt, 62)
    for kb in range(rows):
        e = t[:, kb, :]
        pw = [int(x) for x in (e[:, 1] - e[:, 0])]
        i2d = [int(x) for x in (e[:, 3] - e[:, 1])]
        cw = [int(x) for x in (e[:, 3] - e[:, 2])]
        d2r = [int(x) for x in (e[:, 4] - e[:, 3])] if kb < kt - 1 else []
        nxt = [int(x) for x in (t[:, kb + CFG.stages, 1] - e[:, 4])] if kb + CFG.stages < kt else []
        print(f"{kb:3d} {med(pw):15.0f} {med(i2d):11.0f} {med(cw):10.0f} {med(d2r):13.0f} {med(nxt):19.0f}")
    s = t[:, 63, :]
    start_to_loop = [int(x) for x in (s[:, 1] - s[:, 0])]
    first_data = [int(x) for x in (t[:, 0, 3] - s[:, 0])]
    loop = [int(x) for x in (s[:, 2] - s[:, 1])]
    epi = [int(x) for x in (s[:, 3] - s[:, 2])]
    wait_total = [int(x) for x in (t[:, :kt, 3] - t[:, :kt, 2]).sum(dim=1)]
    print(f"start -> consumer past the barrier {med(start_to_loop):.0f}, start -> first block's data "
          f"{med(first_data):.0f}, K loop {med(loop):.0f} (consumer waiting for data {med(wait_total):.0f}), "
          f"epilogue {med(epi):.0f}")
    span = [int(x) for x in (s[:, 3] - s[:, 0])]
    ns = [int(x) for x in (s[:, 5] - s[:, 4])]
    ghz = [c / n for c, n in zip(span, ns) if n > 0]
    print(f"CTA start -> epilogue end: median {med(span):.0f} cycles, max {max(span)}; {med(ns):.0f} ns by the "
          f"global timer (median; {med(ghz):.2f} cycles a ns); kernel span {int(s[:, 5].max() - s[:, 4].min())} ns")


def stamped(src, label, cfg, a, b, out, ref, options, check=True):
    fn = traced(src, cfg, a.dtype, options)
    trace = torch.zeros(200 * 64 * 8, dtype=torch.int64, device="cuda")
    for _ in range(20):  # warm: the timed call below is a steady-state one
        fn(a, b, out, trace)
    out.fill_(float("nan"))
    trace.zero_()
    for _ in range(5):  # back to back; the stamps are the last call's (each call overwrites them)
        grid = fn(a, b, out, trace)
    torch.cuda.synchronize()
    if check:
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert out.isfinite().all() and err < 1e-2, (label, err)
    kt = -(-a.shape[1] // 64)
    t = trace.view(200, 64, 8)[:grid].cpu()
    if "--table" in sys.argv or not options:
        report(label, t, grid, kt)
    else:
        s = t[:, 63, :]
        print(f"{label}: CTA span median {med([int(x) for x in (s[:, 3] - s[:, 0])]):.0f} cycles, "
              f"{med([int(x) for x in (s[:, 5] - s[:, 4])]):.0f} ns; kernel span {int(s[:, 5].max() - s[:, 4].min())} ns")
    s = t[:, 63, :]
    loop = [int(x) for x in (s[:, 2] - s[:, 1] - (t[:, 0, 3] - t[:, 0, 2]))]
    peak = cfg.bm * cfg.bn * 64 * 2 / 4096  # cycles a block at the tensor cores' dense peak (4,096 FLOP a clock an SM)
    print(f"{label:44s} K loop after the first block's data: {med(loop) / kt:6.0f} cycles a block "
          f"(peak {peak:.0f}; {kt} blocks, {grid} CTAs)", flush=True)


def main():
    warm_clocks()
    src = _source()
    if "noload" in sys.argv:
        # one tile a CTA (the switch's condition), 128 CTAs each, the routed 64 x 128 and two larger tiles
        for m, n, name in ((1024, 1024, "64x128_c2x1"), (2048, 1024, "128x128_c2x1"), (2048, 2048, "128x256_c2x1")):
            a, b, out, ref = operands(m, n, 3968, torch.bfloat16, 4)
            cfg = gc.SM90_CONFIGS[name]
            stamped(src, f"bf16 {m}x{n}x3968 {name}", cfg, a, b, out, ref, ())
            stamped(src, f"bf16 {m}x{n}x3968 {name} no loads", cfg, a, b, out, ref, ("-DTW_NO_LOAD",), check=False)
        return
    opts = ("-DTW_SPLIT_N",) if "split" in sys.argv else ()
    cases = [("float16 1000^3", *square_operands(1000, torch.float16)),
             ("bfloat16 1000^3", *square_operands(1000, torch.bfloat16)),
             ("bfloat16 1024x1024x3968", *operands(1024, 1024, 3968, torch.bfloat16, 4))]
    for label, a, b, out, ref in cases:
        stamped(src, label + (" split" if opts else ""), CFG, a, b, out, ref, opts)


if __name__ == "__main__":
    main()
