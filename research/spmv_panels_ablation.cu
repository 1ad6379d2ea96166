// Ablations of spmv_panels (tilewise/ops/spmv/spmv.cu) for research/spmv_panels_ablation.py:
// the same loop with one part changed, to see which part sets the time on the uniform matrix.
//   MODE 0: the library's loop (shared-memory float atomicAdd into the panel's y)
//   MODE 1: ys[row] += p without an atomic (racy, wrong answers: the cost of the CAS loop)
//   MODE 2: no shared memory: the products summed in a register (the loads and gathers alone)
//   MODE 3: no gather: p = val (the atomics and the stream alone)
//   MODE 4: atomicAdd into ys[threadIdx.x] (no bank conflicts, no contention: the atomics' own cost)
// tilewise-instantiate: panels_ab<1024,1,4,0> panels_ab<1024,1,4,1> panels_ab<1024,1,4,2> panels_ab<1024,1,4,3> panels_ab<1024,1,4,4>
// tilewise-instantiate: panels_ab<1024,1,8,0> panels_ab<1024,1,8,2> panels_ab<1024,2,8,0> panels_ab<1024,3,8,0> panels_ab<1024,3,8,1> panels_ab<1024,3,8,2> panels_ab<1024,3,8,3> panels_ab<1024,3,8,4>
// tilewise-instantiate: panels_ab<512,1,8,0> panels_ab<512,2,8,0> panels_ab<1024,2,8,2> panels_ab<1024,1,16,0>
#include "tilewise_common.cuh"

template <int NT, int CL, int U, int MODE>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT) panels_ab(
    const unsigned* __restrict__ key, const float* __restrict__ val, const int* __restrict__ chunk_col0,
    const int* __restrict__ panel_chunk, const float* __restrict__ x, float* __restrict__ y, int M, int R) {
  extern __shared__ float ys[];
  constexpr unsigned kPad = 0xFFFFu;
  constexpr int NW = NT / 32;
  const int p = blockIdx.x / CL;
  const unsigned rank = CL > 1 ? tw::cta_rank() : 0u;
  const int row0 = p * R;
  const int rows = min(R, M - row0);
  for (int i = threadIdx.x; i < rows; i += NT) ys[i] = 0.0f;
  __syncthreads();
  const int c0 = __ldg(panel_chunk + p);
  const long long n = __ldg(panel_chunk + p + 1) - c0;
  const int cb = c0 + (int)(n * rank / CL), ce = c0 + (int)(n * (rank + 1) / CL);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float acc = 0.0f;
  for (int c = cb + warp; c < ce; c += NW * U) {
    unsigned k[U];
    float v[U], xv[U];
    int base[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cc = c + u * NW;
      k[u] = kPad;
      v[u] = 0.0f;
      base[u] = 0;
      if (cc < ce) {
        const long long e = (long long)cc * 32 + lane;
        k[u] = __ldcs(key + e);
        v[u] = __ldcs(val + e);
        base[u] = __ldg(chunk_col0 + cc);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (MODE == 3) xv[u] = 1.0f;
      else xv[u] = (k[u] & kPad) != kPad ? __ldg(x + base[u] + (int)(k[u] >> 16)) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if ((k[u] & kPad) != kPad) {
        const float prod = v[u] * xv[u];
        if (MODE == 0 || MODE == 3) atomicAdd(ys + (k[u] & kPad), prod);
        else if (MODE == 1) ys[k[u] & kPad] += prod;
        else if (MODE == 2) acc += prod;
        else atomicAdd(ys + threadIdx.x % rows, prod);
      }
    }
  }
  if (MODE == 2 && acc != 0.0f) ys[threadIdx.x % rows] = acc;
  if (CL > 1) {
    tw::cluster_arrive();
    tw::cluster_wait();
  } else {
    __syncthreads();
  }
  const int r0 = (int)((long long)rows * rank / CL), r1 = (int)((long long)rows * (rank + 1) / CL);
  for (int i = r0 + threadIdx.x; i < r1; i += NT) {
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < CL; ++q) s += (unsigned)q == rank ? ys[i] : tw::load_remote(ys + i, q);
    y[row0 + i] = s;
  }
  if (CL > 1) {
    tw::cluster_arrive();
    tw::cluster_wait();
  }
}
