// vector_add: out = a + b over n contiguous elements (fp32 / fp16 / bf16; fp16 and bf16 add in fp32).
// tilewise-instantiate: vector_add_v1_naive<float> vector_add_v1_naive<__half> vector_add_v1_naive<__nv_bfloat16>
// tilewise-instantiate: vector_add_v2_vectorized<float> vector_add_v2_vectorized<__half> vector_add_v2_vectorized<__nv_bfloat16>
#include "tilewise_common.cuh"

// v1_naive: the lecture's kernel: one thread per element, ceil(n / threads) blocks.
template <typename T>
__global__ void vector_add_v1_naive(const T* __restrict__ a, const T* __restrict__ b,
                                    T* __restrict__ out, long long n) {
  long long i = tw::global_thread_id();
  if (i < n) out[i] = tw::from_float<T>(tw::to_float(a[i]) + tw::to_float(b[i]));
}

// v2_vectorized: 16-byte loads and stores, a grid-stride loop over a grid sized to fill the GPU
// once, UNROLL independent 16-byte loads per operand in flight per thread; the n % (16 / sizeof(T))
// tail is done element by element. Needs a, b, out 16-byte aligned (the launcher checks).
template <typename T>
__global__ void __launch_bounds__(256) vector_add_v2_vectorized(const T* __restrict__ a,
                                                                const T* __restrict__ b,
                                                                T* __restrict__ out, long long n) {
  using V = tw::Vec16<T>;
  constexpr int UNROLL = 4;
  const long long nvec = n / V::N;
  const uint4* __restrict__ a4 = reinterpret_cast<const uint4*>(a);
  const uint4* __restrict__ b4 = reinterpret_cast<const uint4*>(b);
  uint4* __restrict__ o4 = reinterpret_cast<uint4*>(out);
  const long long stride = tw::grid_threads();
  long long i = tw::global_thread_id();
  // Main loop: UNROLL vectors per thread per step, all loads issued before the first add.
  for (; i + (UNROLL - 1) * stride < nvec; i += UNROLL * stride) {
    V x[UNROLL], y[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      x[u].raw = __ldcs(a4 + i + u * stride);  // streamed once: evict-first
      y[u].raw = __ldcs(b4 + i + u * stride);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int k = 0; k < V::N; ++k)
        x[u].v[k] = tw::from_float<T>(tw::to_float(x[u].v[k]) + tw::to_float(y[u].v[k]));
      __stcs(o4 + i + u * stride, x[u].raw);
    }
  }
  for (; i < nvec; i += stride) {
    V x, y;
    x.raw = __ldcs(a4 + i);
    y.raw = __ldcs(b4 + i);
#pragma unroll
    for (int k = 0; k < V::N; ++k) x.v[k] = tw::from_float<T>(tw::to_float(x.v[k]) + tw::to_float(y.v[k]));
    __stcs(o4 + i, x.raw);
  }
  for (long long j = nvec * V::N + tw::global_thread_id(); j < n; j += stride)
    out[j] = tw::from_float<T>(tw::to_float(a[j]) + tw::to_float(b[j]));
}
