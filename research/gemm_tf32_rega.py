"""tf32 GEMM with B row-major and no transposing copy (gemm_tf32_rega.cu.in): wgmma computes C's
transposed tile, B's block read from shared memory into registers as wgmma's A operand, A's rows
K-major through a descriptor as its B operand.

Why: gemm()'s tf32 with row-major B runs at 0.85x cuBLAS TF32 at 4096^3 (logs/gemm-tf32-layout-
9d27912, bench rows since): it transposes B first (~32 us of 460) and its Triton kernel on K-major
B runs 0.94-1.015x. cuBLAS itself takes row-major B with no copy.

Prediction, written before the first run: 4096^3 at 0.95-1.05x cuBLAS TF32 with BM = 256 (its
shared-memory traffic a K block, ~48 KB of copies + 64 KB of wgmma reads + 16 KB of fragment
loads, about what the bf16 kernel has at 128 x 256, which runs ~1.0x cuBLAS bf16); BM = 128
slower (its B block is read twice as often per FLOP).
Each variant: float64 reference check on a NaN-poisoned out (4096^3, odd sizes); timing in
interleaved graph-replayed rounds beside cuBLAS TF32 and gemm().
Run on the GPU: PYTHONPATH=src python3 research/gemm_tf32_rega.py [--check-only]
"""
import ctypes
import functools
import sys
from pathlib import Path

import torch
from _timing import warm_clocks
from gemm_sm90_rounds import checked_graph, graph_of, rounds_report

from tilewise.ops.gemm import sm90 as gs
from tilewise.ops.gemm import api as gt
from tilewise.runtime import cuda as rt

HERE = Path(__file__).resolve().parent
NS = (128, 192, 256)
CONFIGS = {256: 4, 192: 5, 128: 6}  # BM -> stages


def wrappers() -> str:
    out = []
    for n in NS:
        r = n // 2
        regs = ", ".join(f"%{i}" for i in range(r))
        outs = ", ".join(f'"+f"(d[{i}])' for i in range(r))
        out.append(f"""__device__ __forceinline__ void wgmma_tf32_ra_n{n}(float (&d)[{r}], unsigned a0, unsigned a1, unsigned a2,
                                                  unsigned a3, unsigned long long db) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 6}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {{{regs}}}, {{%{r}, %{r + 1}, %{r + 2}, %{r + 3}}}, %{r + 4}, p, 1, 1;\\n}}\\n"
      : {outs}
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "n"(0), "n"(1));
}}
""")
    disp = "\n".join(f"  {'if' if i == 0 else 'else if'} constexpr (N == {n}) wgmma_tf32_ra_n{n}(d, a0, a1, a2, a3, db);"
                     for i, n in enumerate(NS))
    out.append(f"""template <int N>
__device__ __forceinline__ void wgmma_tf32_ra(float (&d)[N / 2], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                              unsigned long long db) {{
{disp}
}}
""")
    return "\n".join(out)


def source() -> str:
    return (HERE / "gemm_tf32_rega.cu.in").read_text().replace("//@WRAPPERS@", wrappers())


def names():
    return [f"gemm_tf32_ra<{bm},{st}>" for bm, st in CONFIGS.items()]


def compile_cpu():
    """Compile for sm_90a here (no GPU needed): registers and spills of each instantiation."""
    m = rt.compile_source(source(), name=str(HERE / "gemm_tf32_rega.cu"), name_expressions=names(), arch="sm_90a",
                          options=("-std=c++17",), use_cache=False)
    for r in m.resources:
        print(r)
    return m


def shmem(bm, st):
    return st * (bm * 32 * 4 + 32 * 128 * 4) + 1024


@functools.cache
def _func(bm, st, dev):
    compiled = rt.compile_source(source(), name=str(HERE / "gemm_tf32_rega.cu"), name_expressions=names(),
                                 arch="sm_90a", options=("-std=c++17",))
    mod = rt.Module(compiled, dev)
    k = mod.kernel(f"gemm_tf32_ra<{bm},{st}>", [])
    k.set_max_dynamic_shared(shmem(bm, st))
    d = gs._driver()
    return gs._check_cu(d.cuKernelGetFunction(k.handle.handle), "cuKernelGetFunction")


def _map(t, box_inner, box_outer):
    d = gs._driver()
    rows, cols = t.shape
    return gs._check_cu(d.cuTensorMapEncodeTiled(
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32, d.cuuint32_t(2), t.data_ptr(),
        [d.cuuint64_t(cols), d.cuuint64_t(rows)], [d.cuuint64_t(t.stride(0) * 4)],
        [d.cuuint32_t(box_inner), d.cuuint32_t(box_outer)], [d.cuuint32_t(1), d.cuuint32_t(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")


_ARGS = (None, None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong)


def gemm_ra(a, b, out, bm=256):
    M, K = a.shape
    N = b.shape[1]
    assert K % 4 == 0 and N % 4 == 0 and a.is_contiguous() and b.is_contiguous() and out.is_contiguous()
    st = CONFIGS[bm]
    dev = a.get_device()
    func = _func(bm, st, dev)
    ma, mb = _map(a, 32, bm), _map(b, 32, 32)
    tiles = -(-M // bm) * -(-N // 128)
    grid = min(tiles, rt.sm_count(dev))
    d = gs._driver()
    args = ((ma, mb, out.data_ptr(), M, N, K, out.stride(0)), _ARGS)
    stream = torch.cuda.current_stream(dev).cuda_stream
    err = d.cuLaunchKernel(func, grid, 1, 1, 384, 1, 1, shmem(bm, st), d.CUstream(stream), args, 0)[0]
    gs._check_cu((err, None), "cuLaunchKernel")
    return out


def check(M, N, K, bm, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", generator=g)
    b = torch.randn(K, N, device="cuda", generator=g)
    out = torch.full((M, N), float("nan"), device="cuda")
    gemm_ra(a, b, out, bm)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    worst = ((out.double() - ref).abs() / (ref.abs() + 1)).max().item()
    ok = bool(out.isfinite().all()) and err < 2e-3
    print(f"check {M}x{N}x{K} BM={bm}: rel err {err:.2e}, worst {worst:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def main():
    if "--cpu" in sys.argv:
        compile_cpu()
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    ok = True
    for bm in CONFIGS:
        for M, N, K in ((256, 128, 32), (300, 200, 100), (1000, 1004, 516), (4096, 4096, 4096)):
            ok &= check(M, N, K, bm)
    if not ok or "--check-only" in sys.argv:
        return
    warm_clocks()
    for n in (4096, 8192):
        g = torch.Generator(device="cuda").manual_seed(n)
        a = torch.randn(n, n, device="cuda", generator=g)
        b = torch.randn(n, n, device="cuda", generator=g)
        out = torch.empty(n, n, device="cuda")
        ref = a.double() @ b.double()
        graphs = {"cublas": graph_of(lambda: torch.matmul(a, b, out=out)),
                  "gemm()": checked_graph(lambda: gt.gemm(a, b, out=out), out, ref, "gemm")}
        for bm in CONFIGS:
            graphs[f"rega BM={bm}"] = checked_graph(lambda bm=bm: gemm_ra(a, b, out, bm), out, ref, bm)
        rounds_report(graphs, 5, f"tf32 {n}^3", 16)
        flops = 2 * n ** 3
        del graphs


if __name__ == "__main__":
    main()
