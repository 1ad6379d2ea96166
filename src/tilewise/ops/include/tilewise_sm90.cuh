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

// Arrive on the barrier at this CTA's address `bar` in CTA `rank` of the cluster (itself included).
// The arrival orders after this thread's wgmma.wait_group (program order), which is all the
// producer needs: the peer's reads of the stage are complete. Default release semantics at CTA
// scope; -DTW_ARRIVE_CLUSTER_SCOPE asks for a cluster-scope release (an experiment's comparison).
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
#ifdef TW_ARRIVE_CLUSTER_SCOPE
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
#else
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
#endif
      "}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

// 2-D tile copy global -> shared; with mask != 0 multicast to every CTA of the cluster whose bit is
// set (same shared-memory offset, each CTA's own barrier at `bar`'s offset).
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaDesc* desc, unsigned bar, int c0, int c1,
                                            unsigned short mask) {
  const unsigned long long d = reinterpret_cast<unsigned long long>(desc);
  if (mask == 0) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
        "l"(d), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
        "l"(d), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
        : "memory");
  }
}

// Cluster tile t -> (cluster row, cluster column), grouped 8 cluster rows at a time.
__device__ __forceinline__ void cluster_tile(int t, int ctm, int ctn, int& cm, int& cn) {
  constexpr int G = 8;
  const int per = G * ctn;
  const int g = t / per;
  const int first = g * G;
  const int gs = min(ctm - first, G);
  const int r = t - g * per;
  cm = first + r % gs;
  cn = r / gs;
}

}  // namespace tw
