// Helpers of the sm_90a GEMM kernels (gemm_sm90.cu, gemm_sm90_tf32.cu).
#pragma once

namespace tw {

// A CUtensorMap (cuda.h), opaque: 128 bytes, 64-byte aligned; passed by value as a __grid_constant__.
struct alignas(64) TmaDesc {
  unsigned long long opaque[16];
};

// Shared-memory matrix descriptor of wgmma: start address, leading / stride byte offsets, swizzle
// (1 = 128 B, 2 = 64 B).
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned lbo, unsigned sbo, unsigned swz) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32) | ((unsigned long long)swz << 62);
}

// An empty asm that reads and writes each accumulator: keeps the compiler from moving their uses
// across the wgmma fences and waits (the asynchronous MMA writes them behind its back).
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace tw
