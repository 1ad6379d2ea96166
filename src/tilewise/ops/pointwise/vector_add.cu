// vector_add: out = a + b over n contiguous elements (fp32 / fp16 / bf16; fp16 and bf16 add in fp32).
// tilewise-instantiate: vector_add_v1_naive<float> vector_add_v1_naive<__half> vector_add_v1_naive<__nv_bfloat16>
// tilewise-instantiate: vector_add_v2_vectorized<float> vector_add_v2_vectorized<__half> vector_add_v2_vectorized<__nv_bfloat16>
// tilewise-instantiate: vector_add_v3_blocked<float> vector_add_v3_blocked<__half> vector_add_v3_blocked<__nv_bfloat16>
#include "tilewise_common.cuh"
#include "contiguous.cuh"

// v1_naive: the lecture's kernel: one thread per element, ceil(n / threads) blocks.
template <typename T>
__global__ void vector_add_v1_naive(const T* __restrict__ a, const T* __restrict__ b,
                                    T* __restrict__ out, long long n) {
  long long i = tw::global_thread_id();
  if (i < n) out[i] = tw::from_float<T>(tw::to_float(a[i]) + tw::to_float(b[i]));
}

// v2_vectorized: 16-byte loads and stores, a grid-stride loop over the blocks that are resident at
// once, UNROLL independent 16-byte loads per operand in flight per thread; the n % (16 / sizeof(T))
// tail is done element by element. Plain loads: the evict-first hints (ld.cs / st.cs) cost 6 % on
// the H200 (docs/tuning/pointwise.md, "vector_add: one chunk per block, plain loads"). Needs a, b,
// out 16-byte aligned (the launcher checks). The loop is elementwise.cu's v2 (contiguous.cuh).
template <typename T>
__global__ void __launch_bounds__(256) vector_add_v2_vectorized(const T* __restrict__ a,
                                                                const T* __restrict__ b,
                                                                T* __restrict__ out, long long n) {
  tw::apply_contiguous<2>([](float x, float y) { return x + y; }, out, n, a, b);
}

// v3_blocked: v2's 16-byte accesses without the grid-stride loop: block k owns the contiguous
// chunk of 256 x UNROLL vectors starting at k x 256 x UNROLL, each thread UNROLL of them 256 apart
// (coalesced). Blocks that run together touch one contiguous window of memory; in the grid-stride
// loop the resident threads drift apart over the array, which costs 5 % (more DRAM pages open at
// once is the likely cause; docs/tuning/pointwise.md, "vector_add: one chunk per block, plain
// loads"). The last block also does the scalar tail.
template <typename T>
__global__ void __launch_bounds__(256) vector_add_v3_blocked(const T* __restrict__ a,
                                                             const T* __restrict__ b,
                                                             T* __restrict__ out, long long n) {
  using V = tw::Vec16<T>;
  constexpr int UNROLL = 8;
  const long long nvec = n / V::N;
  const uint4* __restrict__ a4 = reinterpret_cast<const uint4*>(a);
  const uint4* __restrict__ b4 = reinterpret_cast<const uint4*>(b);
  uint4* __restrict__ o4 = reinterpret_cast<uint4*>(out);
  const long long base = static_cast<long long>(blockIdx.x) * blockDim.x * UNROLL + threadIdx.x;
  V x[UNROLL], y[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const long long j = base + u * blockDim.x;
    if (j < nvec) {
      x[u].raw = a4[j];
      y[u].raw = b4[j];
    }
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const long long j = base + u * blockDim.x;
    if (j < nvec) {
#pragma unroll
      for (int k = 0; k < V::N; ++k)
        x[u].v[k] = tw::from_float<T>(tw::to_float(x[u].v[k]) + tw::to_float(y[u].v[k]));
      o4[j] = x[u].raw;
    }
  }
  if (blockIdx.x == gridDim.x - 1)
    for (long long j = nvec * V::N + threadIdx.x; j < n; j += blockDim.x)
      out[j] = tw::from_float<T>(tw::to_float(a[j]) + tw::to_float(b[j]));
}
