"""Which cluster split of a long row is fastest, and how far is it from the bytes floor?
rowwise_cluster.cu's kernels on bf16 4096 x 131072 (softmax forward, backward) and 8192 x 131072
(cross-entropy with its gradient), each configuration (CTAs a cluster, threads, 16-byte chunks a
thread) checked against PyTorch first, timed beside a copy of the same bytes, torch and v3_online
in the same run. Prints one line per configuration and the best per kernel.
Run on the GPU (< 1 minute on an H200): PYTHONPATH=src python3 research/rowwise_cluster_configs.py
"""

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from _timing import softmax_case
from tilewise.ops.rowwise import cross_entropy as ce
from tilewise.ops.rowwise import cluster as rc
from tilewise.ops.rowwise import softmax as sm

CONFIGS = [(8, 512, 4), (8, 256, 8)]
BWD_CONFIGS = [(8, 512, 4), (8, 256, 8)]
PIPE_CONFIGS = [(8, 256, 8)]  # the pipelined kernels are built for CONFIGS of rowwise_cluster only


def bench(fn):
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    bf = torch.bfloat16
    x, y, nbytes, copy = softmax_case(bench)
    M, N = x.shape
    gbs = lambda b, ms: b / ms / 1e6  # noqa: E731
    print(f"softmax fwd {M}x{N} bf16: copy {gbs(nbytes, copy):.0f} GB/s ({copy:.4f} ms); "
          f"torch.softmax {gbs(nbytes, bench(lambda: torch.softmax(x, -1))):.0f}; "
          f"v3_online {gbs(nbytes, bench(lambda: sm.VARIANTS['v3_online'](x, y))):.0f}")
    ref = torch.softmax(x.float(), -1)
    best = []
    for cfg in CONFIGS:
        y.fill_(float("nan"))
        rc.softmax_fwd(x, y, False, config=cfg, one_exp=False)
        err = rel(y, ref)
        ms = bench(lambda: rc.softmax_fwd(x, y, False, config=cfg, one_exp=False))
        best.append((ms, cfg))
        print(f"  fwd {cfg}: {gbs(nbytes, ms):.0f} GB/s = {100 * copy / ms:.1f}% of copy  err {err:.1e}")
    for cfg in rc.ONE_EXP_CONFIGS[("fwd", 2)]:
        y.fill_(float("nan"))
        rc.softmax_fwd(x, y, False, config=cfg, one_exp=True)
        err = rel(y, ref)
        ms = bench(lambda: rc.softmax_fwd(x, y, False, config=cfg, one_exp=True))
        best.append((ms, ("one_exp",) + cfg))
        print(f"  fwd one_exp {cfg}: {gbs(nbytes, ms):.0f} GB/s = {100 * copy / ms:.1f}% of copy  err {err:.1e}")
    for cfg in PIPE_CONFIGS:
        y.fill_(float("nan"))
        rc.softmax_fwd(x, y, False, config=cfg, pipe=True)
        err = rel(y, ref)
        ms = bench(lambda: rc.softmax_fwd(x, y, False, config=cfg, pipe=True))
        best.append((ms, ("pipe",) + cfg))
        print(f"  fwd pipe {cfg}: {gbs(nbytes, ms):.0f} GB/s = {100 * copy / ms:.1f}% of copy  err {err:.1e}")
    print("  best fwd:", min(best))
    dy = torch.randn_like(x)
    dx = torch.empty_like(x)
    b3 = 3 * x.numel() * 2
    yref = ref.to(bf)
    dref = torch._softmax_backward_data(dy.float(), yref.float(), -1, torch.float32)
    tb = bench(lambda: torch._softmax_backward_data(dy, yref, -1, bf))
    print(f"softmax bwd: floor at copy speed {b3 / nbytes * copy:.4f} ms; torch {gbs(b3, tb):.0f} GB/s; "
          f"v3_online {gbs(b3, bench(lambda: sm.BACKWARD_VARIANTS['v3_online'](yref, dy))):.0f}")
    best = []
    for cfg in BWD_CONFIGS:
        dx.fill_(float("nan"))
        rc.softmax_bwd(yref, dy, dx, False, config=cfg)
        err = rel(dx, dref)
        ms = bench(lambda: rc.softmax_bwd(yref, dy, dx, False, config=cfg))
        best.append((ms, cfg))
        print(f"  bwd {cfg}: {gbs(b3, ms):.0f} GB/s = {100 * (b3 / nbytes * copy) / ms:.1f}% of floor  err {err:.1e}")
    print("  best bwd:", min(best))
    del x, y, dy, dx, ref, yref, dref
    torch.cuda.empty_cache()

    Nr, C = 8192, 131072
    x = torch.randn(Nr, C, device="cuda", dtype=bf) * 2
    t = torch.randint(0, C, (Nr,), device="cuda")
    g = torch.empty_like(x)
    loss = torch.empty(Nr, device="cuda")
    floor_ms = copy * (2 * x.numel() * 2) / nbytes
    xr = x.float().requires_grad_()
    lr = F.cross_entropy(xr, t, reduction="none")
    lr.sum().backward()
    print(f"cross-entropy {Nr}x{C} bf16 loss+grad: floor at copy speed {floor_ms:.4f} ms; "
          f"v3_online kernel {bench(lambda: ce._launch(x, t, 'mean', -100, 0.0, True, 'v3_online')):.4f} ms")
    best = []
    for cfg in CONFIGS:
        g.fill_(float("nan"))
        rc.cross_entropy(x, t, loss, g, -100, 0.0, 1.0, config=cfg, one_exp=False)
        err = max(rel(loss, lr.detach()), rel(g, xr.grad))
        ms = bench(lambda: rc.cross_entropy(x, t, loss, g, -100, 0.0, 1.0, config=cfg, one_exp=False))
        best.append((ms, cfg))
        print(f"  ce {cfg}: {ms:.4f} ms = {100 * floor_ms / ms:.1f}% of floor  err {err:.1e}")
    for cfg in rc.ONE_EXP_CONFIGS[("ce", 2)]:
        g.fill_(float("nan"))
        rc.cross_entropy(x, t, loss, g, -100, 0.0, 1.0, config=cfg, one_exp=True)
        err = max(rel(loss, lr.detach()), rel(g, xr.grad))
        ms = bench(lambda: rc.cross_entropy(x, t, loss, g, -100, 0.0, 1.0, config=cfg, one_exp=True))
        best.append((ms, ("one_exp",) + cfg))
        print(f"  ce one_exp {cfg}: {ms:.4f} ms = {100 * floor_ms / ms:.1f}% of floor  err {err:.1e}")
    for cfg in PIPE_CONFIGS:
        g.fill_(float("nan"))
        rc.cross_entropy(x, t, loss, g, -100, 0.0, 1.0, config=cfg, pipe=True)
        err = max(rel(loss, lr.detach()), rel(g, xr.grad))
        ms = bench(lambda: rc.cross_entropy(x, t, loss, g, -100, 0.0, 1.0, config=cfg, pipe=True))
        best.append((ms, ("pipe",) + cfg))
        print(f"  ce pipe {cfg}: {ms:.4f} ms = {100 * floor_ms / ms:.1f}% of floor  err {err:.1e}")
    print("  best ce:", min(best))
    xg = x.detach().requires_grad_()

    def full():
        return torch.autograd.grad(ce.cross_entropy(xg, t), xg)[0]

    print(f"  ce fwd+bwd through autograd (default {ce.default_variant(xg)}): {bench(full):.4f} ms; "
          f"F.cross_entropy {bench(lambda: torch.autograd.grad(F.cross_entropy(xg, t), xg)[0]):.4f} ms")


if __name__ == "__main__":
    main()


def profile_ce():
    """Where the autograd fwd+bwd spends its time beyond the kernel (kernels and gaps)."""
    from torch.profiler import ProfilerActivity, profile

    x = (torch.randn(8192, 131072, device="cuda", dtype=torch.bfloat16) * 2).requires_grad_()
    t = torch.randint(0, 131072, (8192,), device="cuda")
    for _ in range(3):
        torch.autograd.grad(ce.cross_entropy(x, t), x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            torch.autograd.grad(ce.cross_entropy(x, t), x)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))


if __name__ == "__main__":
    profile_ce()
