// Shared device helpers for tilewise's CUDA C kernels.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace tw {

// Load/store through float so that fp16 and bf16 kernels compute in fp32.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// 16 bytes seen as an array of T, for vectorized loads and stores.
template <typename T>
union Vec16 {
  static constexpr int N = 16 / sizeof(T);
  uint4 raw;
  T v[N];
};

__device__ __forceinline__ long long global_thread_id() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_threads() {
  return static_cast<long long>(gridDim.x) * blockDim.x;
}

// Thread-block clusters (sm_90): this CTA's rank in its cluster, the cluster barrier's two halves
// (release / acquire), and a float read from a peer CTA's shared memory (distributed shared
// memory) at the address `p` has in ours.
__device__ __forceinline__ unsigned cta_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
// Without release semantics: orders none of this thread's memory operations before the arrival
// (no GPU-scope fence); for barriers whose only job is the cluster's shared-memory lifetime, or after
// fence.mbarrier_init.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The 32-bit shared-memory address of a generic pointer into this CTA's shared memory.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ float load_remote(const float* p, unsigned rank) {
  const unsigned local = smem_addr(p);
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// mbarriers in shared memory (sm_90), by their shared-memory address (smem_addr): init with an
// arrival count; one arrival that also expects `bytes` of asynchronous copies (TMA) to complete
// on it; wait until the phase of the given parity has completed. kSuspendHintNs != 0 lets the
// hardware suspend a waiting thread for up to that long between polls instead of spinning.
// (The two forms keep the asm text of the kernels that were measured with them, rowwise_cluster's
// and gemm_sm90's: the compiler's unrolling weighs inline asm by its lines, so the text is part of
// what was measured.)
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
template <unsigned kSuspendHintNs = 0>
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  if constexpr (kSuspendHintNs == 0) {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "WAIT_%=:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
        "@!p bra WAIT_%=;\n\t}" ::"r"(bar),
        "r"(parity)
        : "memory");
  } else {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity), "n"(kSuspendHintNs)
        : "memory");
  }
}

}  // namespace tw
