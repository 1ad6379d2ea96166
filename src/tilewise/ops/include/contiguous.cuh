// The vectorized loop of the pointwise kernels over contiguous operands (vector_add.cu,
// elementwise.cu): one body for map (one input) and zip (two inputs).
#pragma once

#include "tilewise_common.cuh"

namespace tw {

// op over element e of one vector of each input, in fp32.
template <class Op, typename T>
__device__ __forceinline__ float op_at(const Op& op, const Vec16<T> (&x)[1], int e) {
  return op(to_float(x[0].v[e]));
}
template <class Op, typename T>
__device__ __forceinline__ float op_at(const Op& op, const Vec16<T> (&x)[2], int e) {
  return op(to_float(x[0].v[e]), to_float(x[1].v[e]));
}
// x[k] = vector v of input k.
template <typename T, int K, class... In>
__device__ __forceinline__ void load_vecs(Vec16<T> (&x)[K], long long v, const In* __restrict__... in) {
  int k = 0;
  ((x[k++].raw = reinterpret_cast<const uint4*>(in)[v]), ...);
}

// out[j] = op(in[j]...) for j < n, operands contiguous and 16-byte aligned, computing in fp32:
// 16-byte loads and stores in a grid-stride loop over the resident threads, UNROLL vectors an
// operand in flight a thread (all loads issued before the first op), the n % (16 / sizeof(T))
// tail element by element. The per-vector loops over e stay written out in both loops: behind a
// function of their own, the compiler stopped unrolling the single-vector loop (different SASS).
template <int UNROLL, typename T, class Op, class... In>
__device__ __forceinline__ void apply_contiguous(const Op& op, T* __restrict__ out, long long n,
                                                 const In* __restrict__... in) {
  using V = Vec16<T>;
  constexpr int K = sizeof...(In);
  const long long nvec = n / V::N;
  uint4* __restrict__ o4 = reinterpret_cast<uint4*>(out);
  const long long stride = grid_threads();
  long long i = global_thread_id();
  for (; i + (UNROLL - 1) * stride < nvec; i += UNROLL * stride) {
    V x[UNROLL][K];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) load_vecs(x[u], i + u * stride, in...);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      V r;
#pragma unroll
      for (int e = 0; e < V::N; ++e) r.v[e] = from_float<T>(op_at(op, x[u], e));
      o4[i + u * stride] = r.raw;
    }
  }
  for (; i < nvec; i += stride) {
    V x[K];
    load_vecs(x, i, in...);
    V r;
#pragma unroll
    for (int e = 0; e < V::N; ++e) r.v[e] = from_float<T>(op_at(op, x, e));
    o4[i] = r.raw;
  }
  for (long long j = nvec * V::N + global_thread_id(); j < n; j += stride)
    out[j] = from_float<T>(op(to_float(in[j])...));
}

}  // namespace tw
