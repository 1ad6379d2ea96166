"""gemm_sm90 at this commit against an older build of its .cu in the same run (interleaved
rounds, graph-replayed, bf16): is a change measured across sessions the code or the machine?
The older source is a file given on the command line (e.g. `git show 0ddc4c3:src/tilewise/ops/
gemm_sm90.cu > old.cu`; its kernel takes two tensor maps, not three); beside it this commit's
kernel with its defaults and with -DTW_LATE_LOCAL -DTW_TMA_STORE=0 (the older pipeline's choices).

Why: gemm_sm90's 192 x 96 tile measured 13.7-13.8 us at 1536^3 in the twelfth session and 14.6-15.2
this session on another machine (cuBLAS 11.7 and 11.7-12.0).
Also (--param): the older kernel with a third (unused) tensor-map parameter: whether the 128 bytes
more of parameters are what costs (no: logs/gemm-sm90-ab-old-eb24880.log, which also timed this
kernel without C's map through a -DTW_NO_C_MAP switch since removed).
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_ab_old.py OLD.cu [MID.cu] [--param]
(MID.cu: a build whose kernel takes C's map too; --param: the parameter-size variants.)
"""
import ctypes
from pathlib import Path
import sys

import torch
from _timing import warm_clocks
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report, square_operands

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc
from tilewise.runtime import cuda as rt

CASES = {1000: "64x128_c2x1", 1536: "192x96_c1x2", 3072: "128x192_c2x1"}
ROUNDS = 7
_OLD_ARGS = (None, None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong)


def old_launcher(path, cfg, dtype, extra_param=False, maps=2, options=("-std=c++17",), tail_args=False):
    """The older kernel; extra_param: with a third (unused) 128-byte tensor-map parameter, as this
    commit's kernel has (C's map), to time what the larger parameter block costs; tail_args: a
    build with the stream-K tail's three parameters (workspace, counters, splits), passed as none
    (maps=3 only)."""
    d = gs._driver()
    if extra_param:
        src = Path(path).read_text().replace(
            "const __grid_constant__ TmaDesc tma_b, T* __restrict__ c,",
            "const __grid_constant__ TmaDesc tma_b, const __grid_constant__ TmaDesc tma_x, T* __restrict__ c,")
        assert "tma_x" in src
        path = Path(path).with_name(Path(path).stem + "_xparam.cu")
        path.write_text(src)
    mod = rt.load(path, (cfg.name(dtype),), options=tuple(options), device_index=0)
    k = mod.kernel(cfg.name(dtype), [])
    k.set_max_dynamic_shared(cfg.shmem)
    func = gs._check_cu(d.cuKernelGetFunction(k.handle.handle), "cuKernelGetFunction")
    clusters = int(k.max_active_clusters(cfg.cluster, cfg.threads, cfg.shmem))

    def run(a, b, out):
        M, K = a.shape
        N = b.shape[1]
        map_a = gs.tensor_map(a, 64, cfg.bm // cfg.cn, 128)
        bch = 64 if cfg.bn % 64 == 0 else 32
        map_b = gs.tensor_map(b, bch, 64 // cfg.cm, 2 * bch)
        ct = cfg.cluster_tiles(M, N)
        grid = min(ct, clusters) * cfg.cluster
        stream = d.CUstream(torch.cuda.current_stream().cuda_stream)
        if maps == 3 and "-DTW_TMA_STORE=0" in options:  # C's map present, not read
            args = ((map_a, map_b, map_a, out.data_ptr(), M, N, K, out.stride(0)), (None,) + _OLD_ARGS)
        elif maps == 3:  # a build whose third map is C's (its bulk-store epilogue writes through it)
            epi_n = cfg.bn if cfg.bn <= 128 else cfg.bn // 2
            cw = 64 if epi_n % 64 == 0 else 32
            map_c = gs.tensor_map(out, cw, 64, 2 * cw)
            args = ((map_a, map_b, map_c, out.data_ptr(), M, N, K, out.stride(0)), (None,) + _OLD_ARGS)
        elif extra_param:
            args = ((map_a, map_b, map_a, out.data_ptr(), M, N, K, out.stride(0)), (None,) + _OLD_ARGS)
        else:
            args = ((map_a, map_b, out.data_ptr(), M, N, K, out.stride(0)), _OLD_ARGS)
        if tail_args:
            assert maps == 3, "the tail's parameters came after C's map"
            args = (args[0] + (0, 0, 1), gs._ARG_TYPES)
        gs._check_cu((d.cuLaunchKernel(func, grid, 1, 1, cfg.threads, 1, 1, cfg.shmem, stream, args, 0)[0], None),
                     "cuLaunchKernel")
        return out
    return run


def main():
    old_path = sys.argv[1]
    mid_path = next((x for x in sys.argv[2:] if not x.startswith("--")), None)  # a second build with C's map (three maps)
    warm_clocks()
    dtype = torch.bfloat16
    for n, name in CASES.items():
        cfg = gc.SM90_CONFIGS[name]
        a, b, out, ref = square_operands(n, dtype)
        old = old_launcher(old_path, cfg, dtype)
        fns = {"old": lambda: old(a, b, out)}

        def new(opts):
            options = gs.DEFAULT_COMPILE_OPTIONS + opts
            return lambda: gs.gemm_sm90(a, b, out=out, config=name, compile_options=options)

        runs = [("old", None)]
        if "--param" in sys.argv:
            oldx = old_launcher(old_path, cfg, dtype, extra_param=True)
            fns["old+param"] = lambda: oldx(a, b, out)
            runs.append(("old+param", None))
        if mid_path:
            mid = old_launcher(mid_path, cfg, dtype, maps=3)
            fns["mid"] = lambda: mid(a, b, out)
            runs.append(("mid", None))
        graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out))}
        for label, opts in runs + [("new", ()), ("new late+thread", ("-DTW_LATE_LOCAL", "-DTW_TMA_STORE=0"))]:
            graphs[label] = checked_graph(fns[label] if opts is None else new(opts), out, ref, label)
        rounds_report(graphs, ROUNDS, f"bf16 {n}^3 {name:13s}", 16)
        del graphs


if __name__ == "__main__":
    main()
