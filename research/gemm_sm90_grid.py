"""gemm_sm90's clusters against the grid it launches: the occupancy API's count of resident
clusters for each config, and each config timed (graph-replayed) at that grid and at one cluster a
pair of SMs (sm_count / cluster size), 4096^3 and 1536^3 bf16, beside cuBLAS; then the cluster
configs again with the consumers' remote arrivals at cluster scope (-DTW_ARRIVE_CLUSTER_SCOPE, as
the first run had them) against the default (CTA scope). The first run of the
configs (logs/gemm-sm90-configs-1f7ff59.log) had the 2-CTA-cluster configs 2-2.5x slower than the
same tile without a cluster: is the grid the cause?
Run on the GPU: PYTHONPATH=src python3 research/gemm_sm90_grid.py
"""
import torch
from _timing import warm_clocks

from tilewise.bench.harness import time_ms_graph
from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import configs as gc
from tilewise.runtime import cuda as rt


def main():
    dev = torch.cuda.current_device()
    sms = rt.sm_count(dev)
    warm_clocks()
    for n in (4096, 1536):
        g = torch.Generator(device="cuda").manual_seed(n)
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        tc = time_ms_graph(lambda: torch.matmul(a, b, out=out))
        print(f"{n}^3 cublas {tc * 1e3:.1f} us", flush=True)
        ref = a.float() @ b.float()
        for opts in (("-std=c++17",), ("-std=c++17", "-DTW_ARRIVE_CLUSTER_SCOPE")):
            for name, cfg in sorted(gc.SM90_CONFIGS.items()):
                if len(opts) > 1 and cfg.cluster == 1:
                    continue
                ld = gs._loaded(cfg.name(torch.bfloat16), dev, cfg.cluster, cfg.threads, cfg.shmem, opts)
                for cl in sorted({ld.clusters, sms // cfg.cluster}):
                    out.fill_(float("nan"))
                    gs.gemm_sm90(a, b, out=out, config=name, clusters=cl, compile_options=opts)
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    t = time_ms_graph(lambda: gs.gemm_sm90(a, b, out=out, config=name, clusters=cl,
                                                           compile_options=opts))
                    print(f"{n}^3 {name:14s} {opts[-1]:26s} occupancy {ld.clusters:4d} clusters; launched {cl:4d}: "
                          f"{t * 1e3:8.1f} us {tc / t:.3f}x cublas  err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
