"""Which detail of vector_add v2 costs the last 10 % against torch.add? One kernel, three switches:
UNROLL (16-byte loads in flight per operand per thread), STREAM (ld.cs/st.cs vs plain),
GRID_STRIDE (one resident wave looping, vs one block per UNROLL*256 vectors).
Run on the GPU: PYTHONPATH=src python3 research/vector_add_variants.py"""

import torch
from triton.testing import do_bench

from tilewise.runtime import cuda as rt

SRC = r'''
#include "tilewise_common.cuh"
template <int UNROLL, bool STREAM, bool GRID_STRIDE>
__global__ void __launch_bounds__(256) add_exp(const float* __restrict__ a, const float* __restrict__ b,
                                               float* __restrict__ out, long long n) {
  const long long nvec = n / 4;
  const float4* a4 = reinterpret_cast<const float4*>(a);
  const float4* b4 = reinterpret_cast<const float4*>(b);
  float4* o4 = reinterpret_cast<float4*>(out);
  long long base, step;
  if (GRID_STRIDE) { base = tw::global_thread_id(); step = tw::grid_threads(); }
  else { base = (long long)blockIdx.x * blockDim.x * UNROLL + threadIdx.x; step = blockDim.x; }
  for (long long i = base; i < nvec; i += (GRID_STRIDE ? step * UNROLL : (long long)1 << 62)) {
    float4 x[UNROLL], y[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      long long j = i + u * step;
      if (j < nvec) {
        x[u] = STREAM ? __ldcs(a4 + j) : a4[j];
        y[u] = STREAM ? __ldcs(b4 + j) : b4[j];
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      long long j = i + u * step;
      if (j < nvec) {
        float4 r = make_float4(x[u].x + y[u].x, x[u].y + y[u].y, x[u].z + y[u].z, x[u].w + y[u].w);
        if (STREAM) __stcs(o4 + j, r); else o4[j] = r;
      }
    }
  }
}
'''

configs = [(u, s, g) for g in (True, False) for s in (True, False) for u in (1, 2, 4, 8)]
names = [f"add_exp<{u}, {'true' if s else 'false'}, {'true' if g else 'false'}>" for u, s, g in configs]
path = rt.cache_dir() / "add_exp.cu"
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(SRC)
mod = rt.load(path, names)
n = 1 << 28
a = torch.randn(n, device="cuda")
b = torch.randn(n, device="cuda")
out = torch.empty_like(a)
ref = a + b
nbytes = 12 * n
ms = do_bench(lambda: out.copy_(a), warmup=25, rep=200, return_mode="median")
print(f"copy_      {8 * n / ms / 1e6:7.0f} GB/s")
ms = do_bench(lambda: torch.add(a, b, out=out), warmup=25, rep=200, return_mode="median")
print(f"torch.add  {nbytes / ms / 1e6:7.0f} GB/s  {ms:.4f} ms")
params = (rt.Tensor("a"), rt.Tensor("b"), rt.Tensor("out"), rt.Scalar("n", "i64"))
for (u, s, g), name in zip(configs, names):
    k = mod.kernel(name, params)
    nvec = n // 4
    grids = [k.resident_grid(256) * m for m in (1, 2, 4)] if g else [-(-nvec // (256 * u))]
    for grid in grids:
        out.fill_(float("nan"))
        k(grid, 256, a, b, out, n)
        torch.cuda.synchronize()
        assert torch.equal(out, ref), name
        ms = do_bench(lambda: k(grid, 256, a, b, out, n), warmup=25, rep=200, return_mode="median")
        regs = k.handle.attributes.num_regs
        print(f"unroll={u} stream={int(s)} grid_stride={int(g)} grid={grid:8d} regs={regs:3d} "
              f"{nbytes / ms / 1e6:7.0f} GB/s  {ms:.4f} ms")
