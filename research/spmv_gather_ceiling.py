"""How fast can any kernel gather x[col] for the uniform SpMV matrix? (issue 4: >= 70 % of the bytes
floor on the uniform matrix, 2M x 2M with 32 random columns a row.)

The bytes floor counts x once (8 MB), but each of the 64M nonzeros reads a random 4-byte element of
x, and the memory system moves 32-byte sectors: x stays in L2 (50 MB), yet every gather is one L2
sector request. This script separates the two costs with three kernels over the same column-major
(32, M) index layout (a warp's index loads coalesce, as in ELL):
    stream   sum += col[k, r]            the index bytes alone, no gather
    gather   sum += x[col[k, r]]         the index bytes and the random gathers (no values)
    seq      sum += x[(r * 32 + k) % N]  as many gathers, but neighbouring threads hit one sector
and times tilewise's best SpMV kernels (ell, jds) and cuSPARSE on the same matrix in the same run.
If `gather` alone is far slower than the 70 % target's time, no kernel that reads x per nonzero
from L2 can reach it on this matrix.

Run on the GPU (< 30 s): PYTHONPATH=src python3 research/spmv_gather_ceiling.py
"""
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import median_event_ms  # noqa: E402
from tilewise.runtime import cuda as rt  # noqa: E402
from tilewise.ops.spmv import api as op  # noqa: E402

SRC = r"""
extern "C" __global__ void __launch_bounds__(256) stream_cols(const int* __restrict__ col, float* __restrict__ y,
                                                               int M, int K) {
  const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= M) return;
  float sum = 0.0f;
#pragma unroll 8
  for (int k = 0; k < K; ++k) sum += (float)__ldcs(col + (long long)k * M + r);
  y[r] = sum;
}
extern "C" __global__ void __launch_bounds__(256) gather(const int* __restrict__ col, const float* __restrict__ x,
                                                          float* __restrict__ y, int M, int K) {
  const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= M) return;
  float sum = 0.0f;
#pragma unroll 8
  for (int k = 0; k < K; ++k) sum += __ldg(x + __ldcs(col + (long long)k * M + r));
  y[r] = sum;
}
extern "C" __global__ void __launch_bounds__(256) seq(const int* __restrict__ col, const float* __restrict__ x,
                                                       float* __restrict__ y, int M, int K, int N) {
  const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= M) return;
  float sum = 0.0f;
#pragma unroll 8
  for (int k = 0; k < K; ++k) {
    const int c = __ldcs(col + (long long)k * M + r);  // read, as in gather, but not used as the address
    sum += __ldg(x + (int)(((long long)k * M + r) % N)) + (c == -1 ? 1.0f : 0.0f);
  }
  y[r] = sum;
}
"""


def bench(fn, reps=50):
    return median_event_ms(fn, reps=reps, warmup=5)


def main():
    from tilewise.bench.suites.spmv import make_matrix

    A = make_matrix("uniform", seed=0)
    M, N = A.shape
    K = A.stats.max
    nnz = A.nnz
    floor = nnz * 8 + (M + 1) * 4 + N * 4 + M * 4  # values, columns, row pointers, x once, y once
    print(f"uniform {M} x {N}, nnz {nnz}, {K} a row; bytes floor {floor / 1e6:.1f} MB")
    E = op.ELL.from_csr(A)
    J = op.JDS.from_csr(A)
    x = torch.randn(N, device="cuda")
    y = torch.empty(M, device="cuda")
    d = tempfile.mkdtemp()
    p = Path(d) / "gather_ceiling.cu"
    p.write_text(SRC)
    mod = rt.load(p)
    T, S = rt.Tensor, rt.Scalar
    ks = mod.kernel("stream_cols", [T("col", (torch.int32,)), T("y", (torch.float32,)), S("M", "i32"), S("K", "i32")])
    kg = mod.kernel("gather", [T("col", (torch.int32,)), T("x", (torch.float32,)), T("y", (torch.float32,)),
                               S("M", "i32"), S("K", "i32")])
    kq = mod.kernel("seq", [T("col", (torch.int32,)), T("x", (torch.float32,)), T("y", (torch.float32,)),
                            S("M", "i32"), S("K", "i32"), S("N", "i32")])
    grid = -(-M // 256)
    col = E.col  # (K, M) column-major, no padding on this matrix
    assert int(col.min()) >= 0
    # correctness of the gather kernel (the others are timing probes)
    kg(grid, 256, col, x, y, M, K)
    want = x[col.long()].sum(0)
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
    At = A.to_torch()
    copy_src = torch.randn(floor // 4, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    rows = [
        ("copy of the floor's bytes", bench(lambda: copy_dst.copy_(copy_src)) , 2 * copy_src.numel() * 4),
        ("stream: index bytes only", bench(lambda: ks(grid, 256, col, y, M, K)), nnz * 4 + M * 4),
        ("gather: indices + x[col]", bench(lambda: kg(grid, 256, col, x, y, M, K)), nnz * 4 + M * 4 + N * 4),
        ("seq: indices + sequential x", bench(lambda: kq(grid, 256, col, x, y, M, K, N)), nnz * 4 + M * 4 + N * 4),
        ("ell (tilewise)", bench(lambda: op.ell(E, x, y)), floor),
        ("jds (tilewise)", bench(lambda: op.jds(J, x, y)), floor),
        ("cuSPARSE (torch CSR @ x)", bench(lambda: At @ x), floor),
    ]
    copy_ms = rows[0][1]
    copy_gbs = rows[0][2] / copy_ms / 1e6
    target_ms = floor / (0.7 * copy_gbs * 1e6)
    print(f"copy {copy_gbs:.0f} GB/s; 70 % of the floor's bandwidth would be {target_ms * 1e3:.0f} us")
    for name, ms, b in rows:
        extra = ""
        if name.startswith(("gather", "seq", "ell", "jds", "cuSPARSE")):
            extra = (f"  {nnz / ms / 1e6:7.1f} G gathers/s, {nnz * 32 / ms / 1e9:6.2f} TB/s of 32-byte sectors"
                     f"  ({100 * floor / ms / 1e6 / copy_gbs:.1f} % of the floor's bandwidth)")
        print(f"  {name:32s} {ms * 1e3:8.1f} us  {b / ms / 1e6:7.0f} GB/s{extra}")
    g = rows[2][1]
    print(f"gather alone takes {g * 1e3:.0f} us = {g / target_ms:.2f}x the 70 % target's time; "
          f"random gathers minus their index bytes: {(g - rows[1][1]) * 1e3:.0f} us")


if __name__ == "__main__":
    main()
