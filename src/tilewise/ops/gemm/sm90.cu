// tilewise-arch: sm_90a
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,64,1,2,8,1> gemm_sm90<__half,128,64,1,2,8,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,128,2,1,6,1> gemm_sm90<__half,128,128,2,1,6,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,192,2,1,5,1> gemm_sm90<__half,128,192,2,1,5,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,192,1,2,5,1> gemm_sm90<__half,128,192,1,2,5,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,256,2,1,4,1> gemm_sm90<__half,128,256,2,1,4,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,192,96,1,2,5,1> gemm_sm90<__half,192,96,1,2,5,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,128,1,1,6,1> gemm_sm90<__half,128,128,1,1,6,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,128,2,1,6,0> gemm_sm90<__half,128,128,2,1,6,0>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,192,96,1,2,5,0> gemm_sm90<__nv_bfloat16,128,128,1,1,6,0>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,64,128,2,1,8,1> gemm_sm90<__half,64,128,2,1,8,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,64,128,2,1,8,1,2> gemm_sm90<__half,64,128,2,1,8,1,2>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,72,128,2,1,8,1,1,1> gemm_sm90<__half,72,128,2,1,8,1,1,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,64,1,2,8,1,1,0,1> gemm_sm90<__half,128,64,1,2,8,1,1,0,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,128,2,1,6,1,1,0,1> gemm_sm90<__half,128,128,2,1,6,1,1,0,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,192,2,1,5,1,1,0,1> gemm_sm90<__half,128,192,2,1,5,1,1,0,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,192,1,2,5,1,1,0,1> gemm_sm90<__half,128,192,1,2,5,1,1,0,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,256,2,1,4,1,1,0,1> gemm_sm90<__half,128,256,2,1,4,1,1,0,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,192,96,1,2,5,1,1,0,1> gemm_sm90<__half,192,96,1,2,5,1,1,0,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,128,128,1,1,6,1,1,0,1> gemm_sm90<__half,128,128,1,1,6,1,1,0,1>
// tilewise-instantiate: gemm_sm90<__nv_bfloat16,64,128,2,1,8,1,1,0,1> gemm_sm90<__half,64,128,2,1,8,1,1,0,1>
//
// C[M, N] = A[M, K] B[K, N] on Hopper's tensor cores (sm_90a), the way the vendor libraries do it
// and Triton 3.6 cannot: warpgroup MMA (wgmma) from shared memory, tiles brought in by the tensor
// memory accelerator (TMA) and shared across a thread-block cluster by multicast.
//
// * A CTA computes BM x BN tiles of C, persistent: a cluster of CM x CN CTAs takes the cluster
//   tiles (CM x CN neighbouring tiles) cluster_id, cluster_id + clusters, ... in a grouped order
//   (8 cluster rows a group, so consecutive cluster tiles share B panels in L2).
// * Warp specialization: warpgroup 0 is the producer (one thread issues the TMA copies; its
//   registers are given back with setmaxnreg), warpgroups 1..BM/64 x WN are consumers, each 64 rows
//   and BN / WN columns of the tile: four m64 x (BN / WN) x k16 wgmma a 64-wide K block, one
//   block's MMAs in flight while the next block's wait for their data.
// * A STAGES-deep ring of (A, B) blocks in shared memory, two mbarriers a stage: `full` (the
//   producer's expected byte count, completed by the TMA units) and `empty` (one arrival per
//   consumer warpgroup of every CTA of the cluster, since this CTA's copies land in its peers too).
// * Multicast: the CN CTAs of a cluster row compute tiles of the same rows of C, so they need the
//   same A block; each loads BM / CN of its rows and multicasts them to the row's CTAs. Likewise the
//   CM CTAs of a cluster column share B: each loads 64 / CM of the block's K rows (kTransB = 1) or
//   BN / CM of its N rows (kTransB = 0). A tile's L2 -> SM bytes fall by CN for A and CM for B.
// * Shared-memory layouts are the ones TMA writes with 128-byte swizzle (64-byte for a B block of
//   32-column chunks when BN is not a multiple of 64) and wgmma reads through matrix descriptors:
//   A K-major ([BM][64], rows of 128 B); B N-major (kTransB = 1: BN / BCH chunks of [64 k][BCH n])
//   or K-major (kTransB = 0: [BN][64]).
// * Edges: TMA fills out-of-range rows / columns of A and B with zeros (K need not be a multiple of
//   64); the epilogue stages C through shared memory (a buffer a consumer warpgroup, up to 128
//   columns at a time) and writes rows < M, columns < N with TMA bulk stores from swizzled boxes
//   (two or more consumer warpgroups; C's tensor map clips the edges) or as 16-byte chunks by
//   every thread (one warpgroup); the host guarantees N and ldc multiples of 8 and C 16-byte
//   aligned.
// * Prologue: with one consumer warpgroup, the copies that land only in this CTA (A in a CM x 1
//   cluster, B in 1 x CN) start before the cluster barrier that guards the multicast ones; that
//   barrier arrives relaxed (fence.mbarrier_init orders the barriers' creation).
// * End: no cluster barrier for the plain tiles. A CTA's remote operations are copies its peers
//   wait for and releases their producers wait for; the releases no producer waits for are skipped.
// * SWAP = 1 (an experiment's config): C's transposed tile, wgmma's M along N (B's 64-column chunks
//   in the A slot, M-major), its N the tile's BM rows of A (any multiple of 8); BN / 64 consumer
//   warpgroups; staged transposed; it keeps the final cluster barrier.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tilewise_common.cuh"
#include "tilewise_sm90.cuh"
#include "tilewise_wgmma.cuh"

// K blocks whose wgmma groups a consumer keeps in flight before it waits (1: the block before the
// one just issued must be done; 2: the one before that). -DTW_INFLIGHT=2 for experiments.
#ifndef TW_INFLIGHT
#define TW_INFLIGHT 1
#endif
constexpr int kInflight = TW_INFLIGHT;

// The epilogue's stores: 1 = bulk asynchronous TMA stores from the staging buffer (one thread),
// 0 = 16-byte stores by the warpgroup's 128 threads. Default: bulk with two or more consumer
// warpgroups (2-3 % faster at 1536 and 3072), per-thread with one (1-2 % faster at 1000 / 1024,
// where each CTA has one tile and the bulk store's final wait is not hidden); docs/tuning/gemm.md,
// "sm90 epilogue stores".
// -DTW_TMA_STORE=0 / 1 forces one for experiments.
#ifdef TW_TMA_STORE
constexpr int kTmaStoreForced = TW_TMA_STORE;
#else
constexpr int kTmaStoreForced = -1;
#endif

// -DTW_TRACE (an experiment's instrument; docs/tuning/gemm.md, "sm90 experiment switches"): the
// kernel takes a 9th parameter, an array of 64 x 8 clock64 stamps a CTA, and records for the first
// tile's K blocks kb < 63 (slot kb): 0 the producer before its wait for the stage, 1 after its
// copies are issued, 2 the first consumer warpgroup (thread 0) before its wait for the data, 3
// after it, 4 after it released the block's stage; slot 63: 0 the CTA's start, 1 the consumer past
// the cluster barrier, 2 the epilogue's start, 3 its end, and 4 / 5 the global timer (ns) at 0 / 3.
#ifdef TW_TRACE
#define TW_STAMP(kb, e)                                                                        \
  do {                                                                                         \
    if ((kb) < 64) trace[((long long)blockIdx.x * 64 + (kb)) * 8 + (e)] = clock64();           \
  } while (0)
#else
#define TW_STAMP(kb, e) \
  do {                  \
  } while (0)
#endif

// -DTW_NO_LOAD (an experiment's instrument, with one tile a CTA only): the producer copies the first
// STAGES K blocks and no more, the consumers wait for those and then run the rest of the K loop on
// the stale stages without waiting or releasing: the MMA loop's own rate, with no copies in flight.
#ifdef TW_NO_LOAD
constexpr bool kNoLoad = true;
#else
constexpr bool kNoLoad = false;
#endif

// B's share of a cluster column (B N-major, CM > 1): each CTA copies 64 / CM of a block's K rows of
// every B chunk (boxes of 64 / CM rows); -DTW_B_BY_CHUNK: whole chunks instead, chunk ch by the
// CTA of rank ch % CM (boxes of 64 rows, fewer copies; unequal shares when CM does not divide the
// chunks; the host's map box must then be 64 rows). An experiment's switch (docs/tuning/gemm.md,
// "sm90 experiment switches").
#ifdef TW_B_BY_CHUNK
constexpr bool kBChunkForced = true;
#else
constexpr bool kBChunkForced = false;
#endif

// The first copies of the CTA-local operand before the cluster barrier (see the prologue): by
// default with one consumer warpgroup; -DTW_EARLY_LOCAL=0 / 1 (or -DTW_LATE_LOCAL: 0) forces.
#if defined(TW_LATE_LOCAL)
constexpr int kEarlyForced = 0;
#elif defined(TW_EARLY_LOCAL)
constexpr int kEarlyForced = TW_EARLY_LOCAL;
#else
constexpr int kEarlyForced = -1;
#endif

namespace {

using tw::cluster_tile, tw::fence_regs, tw::mbar_arrive_cluster, tw::smem_desc, tw::tma_load_2d, tw::TmaDesc;
using tw::mbar_expect_tx, tw::mbar_init, tw::smem_addr;
// The ring's waits may suspend up to 1 ms between polls; -DTW_WAIT_SPIN polls (an experiment's
// comparison: no difference measured).
#ifdef TW_WAIT_SPIN
constexpr unsigned kWaitHintNs = 0;
#else
constexpr unsigned kWaitHintNs = 1000000;
#endif
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) { tw::mbar_wait<kWaitHintNs>(bar, parity); }

__device__ __forceinline__ void mbar_arrive_local(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// 2-D tile copy shared -> global (bulk async, committed as a group by the caller); the tensor map
// clips the box at the matrix's edges.
__device__ __forceinline__ void tma_store_2d(const TmaDesc* desc, unsigned src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<unsigned long long>(desc)),
               "r"(src), "r"(c0), "r"(c1)
               : "memory");
}

__device__ __forceinline__ void store_pair(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store_pair(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

template <typename T>
struct IsHalf {
  static constexpr bool value = false;
};
template <>
struct IsHalf<__half> {
  static constexpr bool value = true;
};

}  // namespace

// Consumer warpgroups: BM / 64 along M times WN along N; with SWAP, BN / 64 along N (each the
// whole BM rows).
template <int BM, int BN, int WN, int SWAP>
__host__ __device__ constexpr int consumer_wgs() {
  return SWAP ? BN / 64 : BM / 64 * WN;
}

template <typename T, int BM, int BN, int CM, int CN, int STAGES, int kTransB, int WN = 1, int SWAP = 0, int TAIL = 0>
__global__ void __cluster_dims__(CM * CN, 1, 1) __launch_bounds__(128 * (consumer_wgs<BM, BN, WN, SWAP>() + 1), 1)
    gemm_sm90(const __grid_constant__ TmaDesc tma_a, const __grid_constant__ TmaDesc tma_b,
              const __grid_constant__ TmaDesc tma_c, T* __restrict__ c, int M, int N, int K, long long ldc,
              float* __restrict__ sk_ws, int* __restrict__ sk_flags, int sk
#ifdef TW_TRACE
              , long long* __restrict__ trace
#endif
    ) {
  constexpr int NWG = consumer_wgs<BM, BN, WN, SWAP>();
  constexpr int BNW = BN / WN;       // a consumer warpgroup's columns
  constexpr int CS = CM * CN;
  constexpr int BK = 64;
  constexpr int BCH = kTransB ? (BN % 64 == 0 ? 64 : 32) : 64;  // B chunk width (elements)
  constexpr int NCH = BN / BCH;
  constexpr bool kBChunk = kBChunkForced && kTransB && CM > 1;
  constexpr unsigned A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
  constexpr bool kTmaStore = !SWAP && (kTmaStoreForced < 0 ? NWG > 1 : kTmaStoreForced == 1);
  constexpr int CONSUMER_REGS = NWG == 2 ? 232 : (NWG == 3 ? 152 : 240);
  constexpr int EPI_N = BNW <= 128 ? BNW : BNW / 2;  // C columns staged at a time
  constexpr int NCHK = EPI_N / 8;                    // 16-byte chunks a staged row
  static_assert(BNW % EPI_N == 0 && EPI_N % 8 == 0 && (64 * NCHK) % 128 == 0, "epilogue chunks");
  static_assert(BN % WN == 0 && BNW % 16 == 0 && (!kTransB || BNW % BCH == 0), "a warpgroup's columns");
  static_assert(NWG >= 1 && NWG <= 3, "one to three consumer warpgroups");
  static_assert((!kTransB || BN % BCH == 0) && BN % 16 == 0, "BN");
  static_assert(SWAP ? (kTransB && WN == 1 && BN % 64 == 0 && BM % 8 == 0 && BM <= 256)
                     : BM % 64 == 0, "tile: SWAP takes B N-major in 64-column chunks and any BM multiple of 8");
  static_assert(BM % (8 * CN) == 0 && BK % (8 * CM) == 0 && (kTransB || BN % (8 * CM) == 0), "cluster split");
  static_assert(A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0, "stages stay 1024-byte aligned");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ __align__(8) unsigned long long full_bar[STAGES], empty_bar[STAGES];
  __shared__ int sk_last[NWG];  // a consumer warpgroup's tail unit arrived last (stream-K tail)
  // Dynamic shared memory: the ring (aligned up to 1024 bytes for the 128-byte swizzle; the host
  // asks for 1 KiB more), then the consumers' C staging buffers (NWG x 64 x EPI_N elements; with
  // SWAP NWG x BM x 64).
  const unsigned base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const unsigned epi_base = base + STAGES * STAGE_BYTES;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) TW_STAMP(63, 0);
#ifdef TW_TRACE
  if (threadIdx.x == 0) {
    long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    trace[((long long)blockIdx.x * 64 + 63) * 8 + 4] = ns;
  }
#endif
  const unsigned rank = CS > 1 ? tw::cta_rank() : 0u;
  const int rm = (int)rank % CM, rn = (int)rank / CM;

  // The operand that lands in this CTA only (A when CN == 1, B when CM == 1) may be copied for the
  // first tile's first STAGES blocks while the cluster barrier below is still open: those copies
  // reach nothing but this CTA's own barriers, initialized (and fenced) just before. Taken with one
  // consumer warpgroup (64 x 128 at 1000^3: 9.16 -> 8.71 us), not with more (192 x 96 at 1536^3:
  // 13.60 -> 14.12 us); docs/tuning/gemm.md, "sm90 early local copies".
  constexpr bool kEarly = kEarlyForced < 0 ? NWG == 1 : kEarlyForced == 1;
  constexpr bool kEarlyA = kEarly && CS > 1 && CN == 1, kEarlyB = kEarly && CS > 1 && CM == 1;
  int early = 0;  // K blocks of the first tile whose local copies are issued (producer thread only)

  if (threadIdx.x == 0) {
    // The TMA unit's first copy needs the descriptors: start fetching them before anything else.
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(&tma_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(&tma_b)) : "memory");
    if (kTmaStore)
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(&tma_c)) : "memory");
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(smem_addr(&full_bar[s]), 1);
      mbar_init(smem_addr(&empty_bar[s]), NWG * CS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // Programmatic dependent launch (the host launches with programmatic stream serialization): the
  // next kernel in the stream may be launched as soon as every CTA of this one has started (a
  // persistent grid is all resident by then), so its CTAs are placed and run their set-up while
  // this one finishes; and this one waits here, after its own set-up (barriers, descriptor
  // prefetch) and before its first global memory access, until the kernel before it has completed
  // and its writes are visible. Without the launch attribute both are no-ops.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // Every CTA's barriers exist before any peer's copy or arrival can reach them.
  if (CS > 1) {
    // Relaxed: fence.mbarrier_init above is all the ordering the peers need, and a release arrival
    // is a GPU-scope fence in every thread (1000^3: 8.76 -> 8.63 us bf16; docs/tuning/gemm.md,
    // "sm90 cluster barriers").
    tw::cluster_arrive_relaxed();
    if ((kEarlyA || kEarlyB) && threadIdx.x == 0) {
      const int ctm = ((M + BM - 1) / BM + CM - 1) / CM, ctn = ((N + BN - 1) / BN + CN - 1) / CN;
      const int cid = blockIdx.x / CS;
      // A cluster's first tile is tile cid, whole, unless cid runs only a stream-K unit (TAIL with
      // sk > 1: the units start after the whole waves' tiles, at their own K ranges).
      const int nct0 = ctm * ctn, first_whole = (TAIL && sk > 1) ? nct0 - nct0 % (int)(gridDim.x / CS) : nct0;
      if (cid < first_whole) {
        int cm, cn;
        cluster_tile(cid, ctm, ctn, cm, cn);
        const int m0 = (cm * CM + rm) * BM, n0 = (cn * CN + rn) * BN;
        early = min((K + BK - 1) / BK, STAGES);
        for (int kb = 0; kb < early; ++kb) {
          const unsigned full = smem_addr(&full_bar[kb]);
          mbar_expect_tx(full, STAGE_BYTES);
          const unsigned sa = base + kb * STAGE_BYTES, sb = sa + A_BYTES;
          if (kEarlyA) tma_load_2d(sa, &tma_a, full, kb * BK, m0, 0);  // CN == 1: the whole block
          if (kEarlyB) {  // CM == 1: the whole block
            if (kTransB) {
#pragma unroll
              for (int ch = 0; ch < NCH; ++ch) tma_load_2d(sb + ch * (BK * BCH * 2), &tma_b, full, n0 + ch * BCH, kb * BK, 0);
            } else {
              tma_load_2d(sb, &tma_b, full, kb * BK, n0, 0);
            }
          }
        }
      }
    }
    tw::cluster_wait();
  } else {
    __syncthreads();
  }

  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  const int ctm = (tiles_m + CM - 1) / CM, ctn = (tiles_n + CN - 1) / CN;
  const int nct = ctm * ctn;
  const int cluster_id = blockIdx.x / CS, clusters = gridDim.x / CS;
  const int kt = (K + BK - 1) / BK;
  // Stream-K tail (TAIL instantiations, sk > 1; plain tiles only, the host passes 1 for SWAP; with
  // TAIL = 0 all of it compiles away): the cluster tiles [0, full) run whole, in waves, as always;
  // the last, partial wave's tiles [full, nct) are each cut into sk ranges of K blocks, one range a
  // cluster (cluster u takes tile full + u / sk, range u % sk). With fewer tiles than clusters the
  // host launches nct x sk clusters, full is 0 and every tile is split (split-K). Each range's products go to the workspace
  // as fp32; the unit that arrives last on the tile's counter adds the sk partials in range order
  // (the same sum whoever is last: the result does not depend on timing) and runs the epilogue.
  // Nobody waits for anybody, so residency cannot deadlock it.
  const int sks = (TAIL && !SWAP && sk > 1) ? sk : 1;
  const int full = sks > 1 ? nct - nct % clusters : nct;
  const int n_full = full > cluster_id ? (full - cluster_id + clusters - 1) / clusters : 0;
  const bool sk_unit = sks > 1 && cluster_id < (nct - full) * sks;
  const int sk_split = sk_unit ? cluster_id % sks : 0;
  const int sk_kb0 = sk_split * kt / sks, sk_kb1 = (sk_split + 1) * kt / sks;
  // No final cluster barrier for the plain tiles (not SWAP): consumers skip the releases no
  // producer waits for (a stage's last use in the cluster's block sequence), so the only remote
  // operations a CTA makes are copies its peers wait for on `full` barriers and releases their
  // producers wait for, and it may leave without waiting for its peers or for its stores to be
  // acknowledged (the barrier's release semantics): 1000^3 8.53 -> 8.30 us fp16, 1536^3 13.59 ->
  // 12.92 (docs/tuning/gemm.md, "sm90 cluster barriers").
  constexpr bool kPrune = !SWAP && CS > 1;
  // The K blocks this cluster's CTAs run in all (their tiles times kt); block h's stage is waited for
  // again only if h + STAGES < that.
  const long long blocks_all = TAIL ? (long long)n_full * kt + (sk_unit ? sk_kb1 - sk_kb0 : 0)
                                    : (long long)((nct - cluster_id + clusters - 1) / clusters) * kt;

  if (wg == 0) {
    // With one consumer warpgroup (256 threads) every thread may keep 255 registers: no rebalancing.
    if constexpr (NWG > 1) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      unsigned short mask_a = 0, mask_b = 0;
      if (CN > 1)
        for (int j = 0; j < CN; ++j) mask_a |= (unsigned short)(1u << (rm + CM * j));
      if (CM > 1)
        for (int i = 0; i < CM; ++i) mask_b |= (unsigned short)(1u << (i + CM * rn));
      if (kEarlyA || kEarlyB) {
        // The first tile's first `early` blocks: their local copies went out before the barrier;
        // the multicast operand's follow here (this CTA's share, into every CTA of the cluster).
        if (early > 0) {
          int cm, cn;
          cluster_tile(cluster_id, ctm, ctn, cm, cn);
          const int m0 = (cm * CM + rm) * BM, n0 = (cn * CN + rn) * BN;
          for (int kb = 0; kb < early; ++kb) {
            const unsigned full = smem_addr(&full_bar[kb]);
            const unsigned sa = base + kb * STAGE_BYTES, sb = sa + A_BYTES;
            TW_STAMP(kb, 0);
            if (!kEarlyA) tma_load_2d(sa + rn * (BM / CN) * 128, &tma_a, full, kb * BK, m0 + rn * (BM / CN), mask_a);
            if (!kEarlyB) {
              if (kBChunk) {
#pragma unroll
                for (int ch = rm; ch < NCH; ch += CM)
                  tma_load_2d(sb + ch * (BK * BCH * 2), &tma_b, full, n0 + ch * BCH, kb * BK, mask_b);
              } else if (kTransB) {
#pragma unroll
                for (int ch = 0; ch < NCH; ++ch)
                  tma_load_2d(sb + ch * (BK * BCH * 2) + rm * (BK / CM) * BCH * 2, &tma_b, full, n0 + ch * BCH,
                              kb * BK + rm * (BK / CM), mask_b);
              } else {
                tma_load_2d(sb + rm * (BN / CM) * 128, &tma_b, full, kb * BK, n0 + rm * (BN / CM), mask_b);
              }
            }
            TW_STAMP(kb, 1);
          }
        }
      }
      // The rest as a plain ring: the loop below is the same whether or not copies went out early.
      int it = early;
      auto produce = [&](const int t, const int kb_first, const int kb_end) {
        int cm, cn;
        cluster_tile(t, ctm, ctn, cm, cn);
        const int m0 = (cm * CM + rm) * BM, n0 = (cn * CN + rn) * BN;
        for (int kb = kb_first; kb < kb_end; ++kb, ++it) {
          const int s = it % STAGES;
          const unsigned ph = (unsigned)(it / STAGES) & 1u;
          if (kNoLoad && kb >= STAGES) continue;
          if (t == cluster_id) TW_STAMP(kb, 0);
          mbar_wait(smem_addr(&empty_bar[s]), ph ^ 1u);
          const unsigned full = smem_addr(&full_bar[s]);
          mbar_expect_tx(full, STAGE_BYTES);
          const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
          const int k0 = kb * BK;
          tma_load_2d(sa + rn * (BM / CN) * 128, &tma_a, full, k0, m0 + rn * (BM / CN), mask_a);
          if (kBChunk) {
#pragma unroll
            for (int ch = rm; ch < NCH; ch += CM) tma_load_2d(sb + ch * (BK * BCH * 2), &tma_b, full, n0 + ch * BCH, k0, mask_b);
          } else if (kTransB) {
#pragma unroll
            for (int ch = 0; ch < NCH; ++ch)
              tma_load_2d(sb + ch * (BK * BCH * 2) + rm * (BK / CM) * BCH * 2, &tma_b, full, n0 + ch * BCH,
                          k0 + rm * (BK / CM), mask_b);
          } else {
            tma_load_2d(sb + rm * (BN / CM) * 128, &tma_b, full, k0, n0 + rm * (BN / CM), mask_b);
          }
          if (t == cluster_id) TW_STAMP(kb, 1);
        }
      };
      for (int t = cluster_id; t < full; t += clusters) produce(t, t == cluster_id ? early : 0, kt);
      if (sk_unit) produce(full + cluster_id / sks, sk_kb0, sk_kb1);
    }
  } else {
    if constexpr (NWG > 1) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
    const int w = wg - 1;
    const int wm = w / WN, wn = w % WN;  // this warpgroup's 64-row block and BNW-column block
    constexpr bool kF16 = IsHalf<T>::value;
    float acc[BNW / 2];
    int it = 0;
    const int warp = tid / 32, lane = tid % 32;
    // One arrival on the stage's `empty` barrier in every CTA of the cluster (their copies of the
    // next block land in this CTA's stage too, and this CTA's in theirs).
    auto release = [&](int stage) {
      const unsigned e = smem_addr(&empty_bar[stage]);
      if (CS > 1) {
#pragma unroll
        for (int r = 0; r < CS; ++r) mbar_arrive_cluster(e, (unsigned)r);
      } else {
        mbar_arrive_local(e);
      }
    };
    if constexpr (SWAP) {
      // C's transposed tile: wgmma's M is this warpgroup's 64 columns of C (B's chunk w, N-major, in
      // the A slot), its N the tile's BM rows (A's block, K-major, in the B slot: any multiple of 8).
      float acc_t[BM / 2];
      T* const stage_c = reinterpret_cast<T*>(smem_raw + (epi_base - smem_addr(smem_raw))) + w * BM * 64;
      for (int t = cluster_id; t < nct; t += clusters) {
        int cm, cn;
        cluster_tile(t, ctm, ctn, cm, cn);
        const int m0 = (cm * CM + rm) * BM, n0 = (cn * CN + rn) * BN;
#pragma unroll
        for (int i = 0; i < BM / 2; ++i) acc_t[i] = 0.0f;
        for (int kb = 0; kb < kt; ++kb, ++it) {
          const int s = it % STAGES;
          mbar_wait(smem_addr(&full_bar[s]), (unsigned)(it / STAGES) & 1u);
          const unsigned sa = base + s * STAGE_BYTES;
          const unsigned sb = sa + A_BYTES + w * (BK * 64 * 2);
          fence_regs(acc_t);
          asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
          for (int kk = 0; kk < BK / 16; ++kk) {
            const unsigned long long da = smem_desc(sb + kk * 16 * 128, BK * 64 * 2, 8 * 128, 1);
            const unsigned long long db = smem_desc(sa + kk * 32, 16, 1024, 1);
            tw::wgmma_m64k16<BM, kF16, 0, 1>(acc_t, da, db, 1);
          }
          asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
          fence_regs(acc_t);
          if (kb >= kInflight) {
            asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kInflight) : "memory");
            fence_regs(acc_t);
            if (tid == 0) release((it - kInflight) % STAGES);
          }
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        fence_regs(acc_t);
        if (tid == 0)
          for (int j = min(kt, kInflight); j >= 1; --j) release((it - j) % STAGES);
        // Fragment layout (m64 x BM): warp q holds C columns 16q + lane / 4 and + 8 of this
        // warpgroup's 64, at C rows 8j + 2 (lane % 4) and the next. Staged as BM rows of 64 columns,
        // the 16-byte chunk ch of row r at (ch + r) % 8 (a warp's 32 stores hit 16 words in 16
        // banks), then written as whole 16-byte chunks of a row.
        const int n_lo = warp * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = 8 * j + 2 * (lane % 4) + (e & 1), n = n_lo + 8 * (e >> 1);
            stage_c[r * 64 + ((n / 8 + r) % 8) * 8 + n % 8] = static_cast<T>(acc_t[4 * j + e]);
          }
        }
        asm volatile("bar.sync %0, 128;" ::"r"(1 + w) : "memory");
        for (int idx = tid; idx < BM * 8; idx += 128) {
          const int r = idx / 8, ch = idx % 8;
          const int row = m0 + r, col = n0 + w * 64 + ch * 8;
          const uint4 v = *reinterpret_cast<const uint4*>(stage_c + r * 64 + ((ch + r) % 8) * 8);
          if (row < M && col < N) *reinterpret_cast<uint4*>(c + (long long)row * ldc + col) = v;
        }
        asm volatile("bar.sync %0, 128;" ::"r"(1 + w) : "memory");
      }
    } else {
    // One tile's products and epilogue (nb K blocks; tail: this cluster's stream-K unit, see
    // above). Called with constants below, so the whole tiles' loop compiles without the tail's code
    // (with it in the loop, a runtime branch on the shared flag cost 4-18 % at 1000-3072: a
    // WARPSYNC in the K loop and a longer epilogue path; docs/tuning/gemm.md, "sm90 stream-K tail").
    auto tile = [&](const int t, const int nb, const bool tail) {
      int cm, cn;
      cluster_tile(t, ctm, ctn, cm, cn);
      const int m0 = (cm * CM + rm) * BM, n0 = (cn * CN + rn) * BN;
#pragma unroll
      for (int i = 0; i < BNW / 2; ++i) acc[i] = 0.0f;
      const bool stamp = t == cluster_id && w == 0 && tid == 0;
      if (stamp) TW_STAMP(63, 1);
      for (int kb = 0; kb < nb; ++kb, ++it) {
        const int s = it % STAGES;
        if (stamp) TW_STAMP(kb, 2);
        if (!kNoLoad || kb < STAGES) mbar_wait(smem_addr(&full_bar[s]), (unsigned)(it / STAGES) & 1u);
        if (stamp) TW_STAMP(kb, 3);
        const unsigned sa = base + s * STAGE_BYTES + wm * 64 * 128;
        const unsigned sb = base + s * STAGE_BYTES + A_BYTES + (kTransB ? wn * (BNW / BCH) * (BK * BCH * 2) : wn * BNW * 128);
        fence_regs(acc);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          const unsigned long long da = smem_desc(sa + kk * 32, 16, 1024, 1);
          unsigned long long db;
          if (kTransB)
            db = smem_desc(sb + kk * 16 * BCH * 2, BK * BCH * 2, 8 * BCH * 2, BCH == 64 ? 1 : 2);
          else
            db = smem_desc(sb + kk * 32, 16, 1024, 1);
          tw::wgmma_m64k16<BNW, kF16, kTransB>(acc, da, db, 1);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        fence_regs(acc);
        if (kb >= kInflight) {
          // K block kb - kInflight's products are done: its stage may be refilled.
          asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kInflight) : "memory");
          fence_regs(acc);
          if (tid == 0 && !kNoLoad && (!kPrune || it - kInflight + STAGES < blocks_all)) release((it - kInflight) % STAGES);
          if (stamp) TW_STAMP(kb - kInflight, 4);
        }
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      fence_regs(acc);
      if (tid == 0 && !kNoLoad)
        for (int j = min(nb, kInflight); j >= 1; --j)
          if (!kPrune || it - j + STAGES < blocks_all) release((it - j) % STAGES);
      if (stamp) TW_STAMP(63, 2);
      if (tail) {
        // A tail unit: this warpgroup's partial to the workspace (element i of thread tid at
        // i * 128 + tid: coalesced), fenced by every thread; one arrival a warpgroup on the tile's
        // counter. The last arriver adds all sks partials in range order (L2 loads: the other units'
        // stores are not in this SM's L1) and goes on to the epilogue; the others are done.
        const long long slot = (long long)((t - full) * CS + (int)rank) * NWG + w;
        float* const mine = sk_ws + (slot * sks + sk_split) * (BNW / 2) * 128 + tid;
#pragma unroll
        for (int i = 0; i < BNW / 2; ++i) mine[i * 128] = acc[i];
        __threadfence();
        asm volatile("bar.sync %0, 128;" ::"r"(1 + w) : "memory");
        if (tid == 0) {
          const int before = atomicAdd(sk_flags + slot, 1);
          __threadfence();
          sk_last[w] = before == sks - 1;
        }
        asm volatile("bar.sync %0, 128;" ::"r"(1 + w) : "memory");
        if (!sk_last[w]) return;
        const float* const parts = sk_ws + slot * sks * (BNW / 2) * 128 + tid;
#pragma unroll
        for (int i = 0; i < BNW / 2; ++i) acc[i] = 0.0f;
        for (int q = 0; q < sks; ++q) {
#pragma unroll
          for (int i = 0; i < BNW / 2; ++i) acc[i] += __ldcg(parts + ((long long)q * (BNW / 2) + i) * 128);
        }
      }
#ifdef TW_NO_STORE
      // An experiment's switch: the products without the epilogue's stores (C stays unwritten).
      if (M > 0) return;
#endif
      // Accumulator layout of m64 x BNW: warp q of the warpgroup holds rows 16q .. 16q + 15; lane l
      // rows l / 4 and l / 4 + 8, columns 8j + 2 (l % 4) and the next, j = 0 .. BNW / 8 - 1.
      const int r_lo = warp * 16 + lane / 4;
#ifdef TW_DIRECT_STORE
      // The first epilogue (an experiment's comparison): pairs straight from the registers, each
      // warp store 16 bytes a row, so every 32-byte sector of C is written in two halves.
      const int row = m0 + wm * 64 + r_lo;
      const int col0 = n0 + wn * BNW + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < BNW / 8; ++j) {
        const int col = col0 + 8 * j;
        if (col < N) {
          if (row < M) store_pair(c + (long long)row * ldc + col, acc[4 * j], acc[4 * j + 1]);
          if (row + 8 < M) store_pair(c + (long long)(row + 8) * ldc + col, acc[4 * j + 2], acc[4 * j + 3]);
        }
      }
#else
      if constexpr (kTmaStore) {
        // Through this warpgroup's staging buffer, EPI_N columns at a time, laid out as TMA boxes of
        // 64 rows x CW columns with the box's swizzle (16-byte chunk c of row r at c ^ (r % 8) for
        // 128-byte rows, c ^ ((r / 2) % 4) for 64-byte rows: a warp's 8 rows of pairs fall in 32
        // different banks); one thread then hands the boxes to the TMA unit (bulk async stores, the
        // tensor map clips rows >= M and columns >= N) and the warpgroup goes on; the buffer is
        // reused only after those stores have read it.
        constexpr int CW = EPI_N % 64 == 0 ? 64 : 32;
        constexpr int CCH = CW / 8;
        const unsigned stage_c = epi_base + w * 64 * EPI_N * 2;
        unsigned char* const stage_p = smem_raw + (stage_c - smem_addr(smem_raw));
#pragma unroll
        for (int h = 0; h < BNW / EPI_N; ++h) {
          if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
          asm volatile("bar.sync %0, 128;" ::"r"(1 + w) : "memory");
#pragma unroll
          for (int jj = 0; jj < EPI_N / 8; ++jj) {
            const int j = h * (EPI_N / 8) + jj;
            const int box = jj / CCH, ch = jj % CCH;
            const int sw_lo = CW == 64 ? (r_lo & 7) : ((r_lo >> 1) & 3);
            const int sw_hi = CW == 64 ? ((r_lo + 8) & 7) : (((r_lo + 8) >> 1) & 3);
            unsigned char* const bp = stage_p + box * 64 * CW * 2 + 4 * (lane % 4);
            store_pair(reinterpret_cast<T*>(bp + r_lo * CW * 2 + (ch ^ sw_lo) * 16), acc[4 * j], acc[4 * j + 1]);
            store_pair(reinterpret_cast<T*>(bp + (r_lo + 8) * CW * 2 + (ch ^ sw_hi) * 16), acc[4 * j + 2],
                       acc[4 * j + 3]);
          }
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          asm volatile("bar.sync %0, 128;" ::"r"(1 + w) : "memory");
          if (tid == 0) {
#pragma unroll
            for (int box = 0; box < EPI_N / CW; ++box)
              tma_store_2d(&tma_c, stage_c + box * 64 * CW * 2, n0 + wn * BNW + h * EPI_N + box * CW, m0 + wm * 64);
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
          }
        }
      } else {
        // Through this warpgroup's staging buffer in shared memory, EPI_N columns at a time: the
        // fragments go in as pairs (16-byte chunks of a row rotated by the row, so the 8 rows a warp
        // writes at once fall in different banks), then leave as whole 16-byte chunks, consecutive
        // threads along a row: full sectors, coalesced. Named barrier 1 + w syncs the warpgroup.
        T* const stage_c = reinterpret_cast<T*>(smem_raw + (epi_base - smem_addr(smem_raw))) + w * 64 * EPI_N;
#pragma unroll
        for (int h = 0; h < BNW / EPI_N; ++h) {
#pragma unroll
          for (int jj = 0; jj < NCHK; ++jj) {
            const int j = h * NCHK + jj;
            const int e_lo = r_lo * EPI_N + ((jj + r_lo) % NCHK) * 8 + 2 * (lane % 4);
            const int e_hi = (r_lo + 8) * EPI_N + ((jj + r_lo + 8) % NCHK) * 8 + 2 * (lane % 4);
            store_pair(stage_c + e_lo, acc[4 * j], acc[4 * j + 1]);
            store_pair(stage_c + e_hi, acc[4 * j + 2], acc[4 * j + 3]);
          }
          asm volatile("bar.sync %0, 128;" ::"r"(1 + w) : "memory");
#pragma unroll
          for (int i = 0; i < 64 * NCHK / 128; ++i) {
            const int idx = tid + 128 * i;
            const int r = idx / NCHK, ch = idx % NCHK;
            const int row = m0 + wm * 64 + r, col = n0 + wn * BNW + h * EPI_N + ch * 8;
            const uint4 v = *reinterpret_cast<const uint4*>(stage_c + r * EPI_N + ((ch + r) % NCHK) * 8);
            if (row < M && col < N) *reinterpret_cast<uint4*>(c + (long long)row * ldc + col) = v;
          }
          asm volatile("bar.sync %0, 128;" ::"r"(1 + w) : "memory");
        }
      }
#endif
      if (stamp) TW_STAMP(63, 3);
#ifdef TW_TRACE
      if (stamp) {
        long long ns;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
        trace[((long long)blockIdx.x * 64 + 63) * 8 + 5] = ns;
      }
#endif
    };
    for (int t = cluster_id; t < full; t += clusters) tile(t, kt, false);
    if (sk_unit) tile(full + cluster_id / sks, sk_kb1 - sk_kb0, true);
    }
    // The shared memory stays until the last bulk store has read it.
    if (kTmaStore && tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
  // SWAP keeps the final barrier: no CTA leaves while a peer may still arrive on its
  // barriers. With release semantics: it orders the consumers' last remote arrivals. (Relaxed here,
  // with a cluster fence by the thread that made them, measured 1-2 % slower at 1000^3:
  // docs/tuning/gemm.md, "sm90 cluster barriers".)
  if (CS > 1 && !kPrune) {
    tw::cluster_arrive();
    tw::cluster_wait();
  }
}
