"""gemm_sm90's fixed cost and L2 bytes at the sizes the issue's sweep still misses (1000^2: 0.81 /
0.86x cuBLAS for the 64 x 128 tile in 2 x 1 clusters, 8.9 us against 7.7; stores 0.8 us of it,
logs/gemm-sm90-intercept-1000-1dbb75e.log). Three changes, each against the default in one run,
graph-replayed, beside cuBLAS:

* -DTW_EARLY_LOCAL: the operand that lands in this CTA only (A in a CM x 1 cluster) is copied for
  the first STAGES blocks before the cluster barrier closes, not after.
* -DTW_TMA_STORE: the epilogue's staging buffer laid out as swizzled TMA boxes and written by bulk
  async stores (one thread), instead of 128 threads' 16-byte stores.
* 2 x 2 and 4 x 1 clusters of the 64 x 128 tile (and 2 x 2 of 192 x 96 / 128 x 192): A and B both
  multicast, each CTA's L2 -> SM bytes a K block 12 KB instead of 16 KB (2 x 1) if the L2 path is
  what the steady state waits on (0.33 us a K block against cuBLAS's 0.28; 2 MB a K step over 128
  CTAs is 6.3 TB/s).

Prediction (written before the run): EARLY_LOCAL 0.1-0.4 us off 1000^3, TMA_STORE 0.2-0.5 us;
2 x 2 / 4 x 1 clusters up to 1 us off if L2-bound, nothing or worse if the cluster's extra
arrivals or scheduling (32 resident 4-CTA clusters needed) cost more.
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_epilogue.py
"""
import torch
from _timing import warm_clocks

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc

EXTRA = {"64x128_c2x2": gc.Sm90Config(64, 128, 2, 2, 8), "64x128_c4x1": gc.Sm90Config(64, 128, 4, 1, 8),
         "192x96_c2x2": gc.Sm90Config(192, 96, 2, 2, 5), "128x192_c2x2": gc.Sm90Config(128, 192, 2, 2, 5)}
_base = gs._instantiated()
_names = frozenset(_base | {c.name(d) for c in EXTRA.values() for d in (torch.bfloat16, torch.float16)})
gs._instantiated = lambda: _names


def cfg(name):
    return EXTRA.get(name) or gc.SM90_CONFIGS.get(name) or gc.SM90_EXTRA_CONFIGS[name]


OPTIONS = {"default": (), "early": ("-DTW_EARLY_LOCAL",), "tma": ("-DTW_TMA_STORE",),
           "early+tma": ("-DTW_EARLY_LOCAL", "-DTW_TMA_STORE")}
CASES = [  # (n, dtype, configs, options)
    (1000, torch.bfloat16, ("64x128_c2x1", "64x128_c2x2", "64x128_c4x1"), tuple(OPTIONS)),
    (1000, torch.float16, ("64x128_c2x1", "64x128_c2x2", "64x128_c4x1"), tuple(OPTIONS)),
    (1536, torch.bfloat16, ("192x96_c1x2", "192x96_c2x2"), ("default", "tma", "early+tma")),
    (3072, torch.bfloat16, ("128x192_c2x1", "128x192_c2x2"), ("default", "early+tma")),
    (4096, torch.bfloat16, ("128x256_c2x1",), ("default", "early+tma")),
]


def check(name, dtype, options):
    """Odd sizes (edge tiles, K tail) into an out with a row stride whose padding must stay."""
    g = torch.Generator(device="cuda").manual_seed(7)
    for M, K, N in ((333, 136, 520), (1000, 1000, 1000), (129, 72, 64)):
        a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
        b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g)
        big = torch.full((M, N + 24), 7.0, device="cuda", dtype=dtype)
        out = big[:, :N]
        out.fill_(float("nan"))
        gs.gemm_sm90(a, b, out=out, config=cfg(name), compile_options=options)
        ref = a.double() @ b.double()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert out.isfinite().all() and err < 1e-2, (name, M, K, N, err)
        assert (big[:, N:] == 7.0).all(), (name, M, K, N, "padding written")


def main():
    warm_clocks()
    for n, dtype, names, opts in CASES:
        g = torch.Generator(device="cuda").manual_seed(n)
        a = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
        b = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
        out = torch.empty(n, n, device="cuda", dtype=dtype)
        tc = time_ms_graph(lambda: torch.matmul(a, b, out=out))
        print(f"{str(dtype)[6:]} {n}^3 cublas {tc * 1e3:.2f} us", flush=True)
        for label in opts:
            options = gs.DEFAULT_COMPILE_OPTIONS + OPTIONS[label]
            for name in names:
                c = cfg(name)
                check(name, dtype, options)
                ld = gs._loaded(c.name(dtype), 0, c.cluster, c.threads, c.shmem, options)
                t = time_ms_graph(lambda: gs.gemm_sm90(a, b, out=out, config=c, compile_options=options))
                print(f"{str(dtype)[6:]} {n}^3 {name:13s} {label:10s} {t * 1e3:6.2f} us {tc / t:.3f}x cublas"
                      f"  (resident clusters {ld.clusters})", flush=True)
        tc2 = time_ms_graph(lambda: torch.matmul(a, b, out=out))
        print(f"{str(dtype)[6:]} {n}^3 cublas again {tc2 * 1e3:.2f} us", flush=True)


if __name__ == "__main__":
    main()
