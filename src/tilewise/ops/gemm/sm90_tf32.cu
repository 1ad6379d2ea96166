// tilewise-arch: sm_90a
// tilewise-instantiate: gemm_sm90_tf32<256,4> gemm_sm90_tf32<192,5> gemm_sm90_tf32<128,6> gemm_sm90_tf32<64,8>
// tilewise-instantiate: gemm_sm90_tf32<256,4,2> gemm_sm90_tf32<192,5,2> gemm_sm90_tf32<128,6,2>
//
// tf32 C[M, N] = A[M, K] B[K, N], fp32 in and out, A and B row-major, on Hopper's tensor cores with
// no transposing copy of B (gemm_sm90.gemm_tf32; gemm() takes it for row-major fp32 B).
// wgmma takes tf32 operands from shared memory K-major only, and row-major B is N-major. So the
// kernel computes C's transposed tile: wgmma's M runs along N, its A operand is B's block read from
// shared memory into registers (a register fragment may come from any layout), and its B operand is
// A's rows, K-major, through a matrix descriptor.
// * A CTA: a producer warpgroup (one thread issues the TMA copies; registers given back with
//   setmaxnreg) and two consumer warpgroups, each 64 columns of C (wgmma M) by BM rows of C (wgmma
//   N): a tile of BM x 128, persistent over the tiles in a grouped order (8 tile rows a group).
// * A STAGES-deep ring of (A block [BM][32] fp32, 128-byte rows; B block of four [32 k][32 n]
//   chunks), both as TMA writes them with 128-byte swizzle; `full` / `empty` mbarriers a stage.
//   TMA fills out-of-range rows and columns with zeros (K need not be a multiple of 32).
// * Fragments (m64 x k8 tf32): thread (warp q, lane l) holds rows 16q + l / 4 (+ 8) and columns
//   l % 4 (+ 4) of its warpgroup's 64 x 8 slice: four 4-byte shared-memory loads a k8 step. In a
//   swizzled chunk, (n, k) is at k * 128 + (((n % 32) / 4) ^ (k % 8)) * 16 + (n % 4) * 4, and k % 8
//   is l % 4 (+ 4): each thread's four offsets are fixed for the whole loop.
// * Two fragment sets, alternating by K block: a block's wgmmas read their registers until the
//   wait_group of the next block, so the next block loads into the other set.
// * CN = 2: a cluster of two CTAs side by side along N (tiles n0 and n0 + 128 of the same rows)
//   shares A's block: each CTA copies half its rows and multicasts them to both; a stage's `empty`
//   barrier then takes the releases of both CTAs' consumers (4), since a peer's copy lands in it.
// * Epilogue: each thread stores its accumulators to C directly (a warp's store: four rows of 32
//   contiguous bytes), rows < M and columns < N; C needs unit-stride rows, nothing more.
// Against cuBLAS TF32 (row-major B): BM = 256 1.069x at 4096^3, where gemm() with its transposing
// copy ran 0.913x; the host's rules pick BM and the CTA pairs from measurements over 15 shapes
// (docs/tuning/gemm.md, "tf32 tile rule", "tf32 CTA pairs").
#include "tilewise_common.cuh"
#include "tilewise_sm90.cuh"
#include "tilewise_wgmma_tf32.cuh"

namespace {

using tw::cluster_tile, tw::fence_regs, tw::mbar_arrive_cluster, tw::smem_desc, tw::tma_load_2d, tw::TmaDesc;

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) { tw::mbar_wait<0>(bar, parity); }

__device__ __forceinline__ void keep_regs(const unsigned (&f)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) asm volatile("" ::"r"(f[i]) : "memory");
}

__device__ __forceinline__ unsigned lds32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

}  // namespace

template <int BM, int STAGES, int CN = 1>
__global__ void __cluster_dims__(CN, 1, 1) __launch_bounds__(384, 1)
    gemm_sm90_tf32(const __grid_constant__ TmaDesc tma_a, const __grid_constant__ TmaDesc tma_b, float* __restrict__ c,
                 int M, int N, int K, long long ldc) {
  constexpr int BK = 32, BNT = 128;
  constexpr unsigned A_BYTES = BM * BK * 4, B_BYTES = BK * BNT * 4, STAGE_BYTES = A_BYTES + B_BYTES;
  static_assert(A_BYTES % 1024 == 0 && (CN == 1 || CN == 2) && BM % (8 * CN) == 0, "stages stay 1024-byte aligned");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ __align__(8) unsigned long long full_bar[STAGES], empty_bar[STAGES];
  const unsigned base = (tw::smem_addr(smem_raw) + 1023u) & ~1023u;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  // cluster tiles: BM x (128 CN); CTA `rank` of a cluster takes the rank-th 128 columns
  const int tm_n = (M + BM - 1) / BM, tn_n = ((N + BNT - 1) / BNT + CN - 1) / CN, tiles = tm_n * tn_n;
  const unsigned rank = CN > 1 ? tw::cta_rank() : 0u;
  const int cid = blockIdx.x / CN, clusters = gridDim.x / CN;
  const int kt = (K + BK - 1) / BK;
  if (threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(&tma_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(&tma_b)) : "memory");
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      tw::mbar_init(tw::smem_addr(&full_bar[s]), 1);
      tw::mbar_init(tw::smem_addr(&empty_bar[s]), 2 * CN);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (CN > 1) {  // both CTAs' barriers exist before any copy or arrival can reach them
    tw::cluster_arrive_relaxed();
    tw::cluster_wait();
  } else {
    __syncthreads();
  }
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      int it = 0;
      for (int t = cid; t < tiles; t += clusters) {
        int tm, tn;
        cluster_tile(t, tm_n, tn_n, tm, tn);
        const int m0 = tm * BM, n0 = (tn * CN + (int)rank) * BNT;
        for (int kb = 0; kb < kt; ++kb, ++it) {
          const int s = it % STAGES;
          mbar_wait(tw::smem_addr(&empty_bar[s]), ((unsigned)(it / STAGES) & 1u) ^ 1u);
          const unsigned full = tw::smem_addr(&full_bar[s]);
          tw::mbar_expect_tx(full, STAGE_BYTES);
          const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
          if constexpr (CN > 1)
            tma_load_2d(sa + rank * (BM / CN) * 128, &tma_a, full, kb * BK, m0 + (int)rank * (BM / CN),
                           (unsigned short)((1u << CN) - 1));
          else
            tma_load_2d(sa, &tma_a, full, kb * BK, m0, 0);
#pragma unroll
          for (int ch = 0; ch < BNT / 32; ++ch) tma_load_2d(sb + ch * 4096, &tma_b, full, n0 + ch * 32, kb * BK, 0);
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int w = wg - 1, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, q = lane % 4;
    const int nl = 64 * w + 16 * warp + g;  // this thread's fragment rows nl and nl + 8 (one chunk)
    const unsigned u0 = (unsigned)(nl % 32) / 4, e0 = (unsigned)(nl % 4) * 4;
    const unsigned chunk = (unsigned)(nl / 32) * 4096;
    const unsigned off0 = chunk + q * 128 + ((u0 ^ q) << 4) + e0;
    const unsigned off1 = chunk + q * 128 + (((u0 + 2) ^ q) << 4) + e0;
    const unsigned off2 = chunk + (q + 4) * 128 + ((u0 ^ (q + 4)) << 4) + e0;
    const unsigned off3 = chunk + (q + 4) * 128 + (((u0 + 2) ^ (q + 4)) << 4) + e0;
    float acc[BM / 2];
    unsigned fa0[16], fa1[16];
    int it = 0;
    auto release = [&](int stage) {
      const unsigned e = tw::smem_addr(&empty_bar[stage]);
      if constexpr (CN > 1) {
#pragma unroll
        for (int r = 0; r < CN; ++r) mbar_arrive_cluster(e, (unsigned)r);
      } else {
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(e) : "memory");
      }
    };
    auto block = [&](unsigned(&f)[16], const unsigned(&fo)[16], const int kb) {
      const int s = it % STAGES;
      mbar_wait(tw::smem_addr(&full_bar[s]), (unsigned)(it / STAGES) & 1u);
      const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        f[4 * ks + 0] = lds32(sb + ks * 1024 + off0);
        f[4 * ks + 1] = lds32(sb + ks * 1024 + off1);
        f[4 * ks + 2] = lds32(sb + ks * 1024 + off2);
        f[4 * ks + 3] = lds32(sb + ks * 1024 + off3);
      }
      fence_regs(acc);
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        tw::wgmma_m64k8_tf32_ra<BM>(acc, f[4 * ks], f[4 * ks + 1], f[4 * ks + 2], f[4 * ks + 3],
                          smem_desc(sa + ks * 32, 16, 1024, 1));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      fence_regs(acc);
      if (kb >= 1) {
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        fence_regs(acc);
        keep_regs(fo);
        if (tid == 0) release((it - 1) % STAGES);
      }
      ++it;
    };
    for (int t = cid; t < tiles; t += clusters) {
      int tm, tn;
      cluster_tile(t, tm_n, tn_n, tm, tn);
      const int m0 = tm * BM, n0 = (tn * CN + (int)rank) * BNT;
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) acc[i] = 0.0f;
      for (int kb = 0; kb < kt; kb += 2) {
        block(fa0, fa1, kb);
        if (kb + 1 < kt) block(fa1, fa0, kb + 1);
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      fence_regs(acc);
      keep_regs(fa0);
      keep_regs(fa1);
      if (tid == 0) release((it - 1) % STAGES);
      // accumulator 4 j + e: C row m0 + 8 j + 2 q + (e & 1), column n0 + nl + 8 (e >> 1)
      const int n = n0 + nl;
#pragma unroll
      for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = m0 + 8 * j + 2 * q + (e & 1), col = n + 8 * (e >> 1);
          if (row < M && col < N) c[(long long)row * ldc + col] = acc[4 * j + e];
        }
      }
    }
  }
  if constexpr (CN > 1) {  // no CTA leaves while its peer may still copy into it or arrive on it
    __syncwarp();
    tw::cluster_arrive();
    tw::cluster_wait();
  }
}
