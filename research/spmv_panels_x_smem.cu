// Attacks on the panels kernel's cost on the uniform matrix, for
// research/spmv_panels_x_smem.py (which holds the design notes, the predictions and
// what the runs showed): (A) panels_kv8, (B) panels_xsmem (thread 0 of the consumers is the
// producer: 7x too slow, cause below), (C) panels_xsmem2 (a producer warp; protocol below).
//
// panels_kv8<NT, CL, U, kRoundChunks>: the library's spmv_panels (tilewise/ops/spmv/spmv.cu) line for
//   line (rounds, three groups in flight, atomic tail, cluster sum over DSMEM), except that an
//   entry's key and value come interleaved in one 8-byte word (uint2: key, value bits) and are
//   read with one 8-byte load instead of two 4-byte loads. Reads the library's Panels layout.
//
// panels_xsmem<C, T, S, RW, G>: x staged in shared memory and shared by a cluster of C CTAs.
//   * One CTA a panel of R rows (its y in shared memory); every CTA of the GPU at once.
//   * x is cut into tiles of T floats; a ring of S tile buffers (W = S T floats) sits in every
//     CTA's shared memory at the same offset. Tile t goes to buffer t % S; CTA rank q copies
//     floats [t T + q T / C, t T + (q + 1) T / C) of it with one TMA bulk copy multicast to all
//     C CTAs of the cluster (cp.async.bulk ... .multicast::cluster): the L2 serves each x byte
//     once per cluster, and the copy costs one instruction and no registers.
//   * pf (a kernel argument): when thread 0 issues tile t it also prefetches its slices of the
//     tiles up to t + pf into the L2 (cp.async.bulk.prefetch.L2), so the first cluster to reach a
//     tile does not wait for DRAM (the ring leads by only ~S - 3 tiles); pf = 0: no prefetch.
//   * x's last N % 4 floats (a bulk copy moves multiples of 16 bytes and must not read past x)
//     are loaded once at the start into ring[W .. W + 3]; the builder points their entries there.
//   * Entries: uint2 (key, value bits); key = ring position << 16 | atomic << 15 | row in the
//     panel (15 bits; 0x7FFF is padding: no product, no read of x). The ring position of column
//     c is c % W (c < N & ~3) or W + c - (N & ~3); the kernel never needs the column itself.
//   * A panel's entries, in column order, are cut into rounds of RW x 1024 entries (fewer where a
//     round would span more than S - 2 tiles); round r reads only tiles lo(r) .. hi(r)
//     (meta[r] = lo | hi << 16; lo never decreases along a panel, hi - lo <= S - 3).
//     Race-free adds (no atomics but for rare rows): inside a round, all entries of a row that
//     occurs 2 .. RW times sit in ONE thread (its RW sub-rounds), so its adds are ordered by
//     program order; a row occurring more than RW times in a round (or where the round has too
//     few single entries to fill the holes that grouping leaves) is added with shared-memory
//     atomics for all its entries of that round, and never with plain adds in that round. Every
//     other row occurs once. A __syncthreads ends each round.
//
// Barrier protocol of panels_xsmem (mbarriers in each CTA's shared memory):
//   full[s]  (count 1): phase k of buffer s = tile t = k S + s has landed in THIS CTA. The local
//            producer thread arrives once with expect_tx(bytes of the tile); the C multicast
//            slices (from all CTAs of the cluster, this one included) complete_tx the bytes. A
//            slice may land before the local expect_tx (tx-count goes negative; the phase cannot
//            complete before the local arrival).
//   empty[s] (count C): phase k of buffer s = all C CTAs are done reading tile k S + s. Each CTA,
//            after the __syncthreads that ends the last round reading a tile, arrives on empty[s]
//            of every CTA of the cluster (mbarrier.arrive.release.cluster, remote).
//   Thread 0 of each CTA is its producer: tile t >= S is issued (expect_tx + its slice) only once
//   its own empty[t % S] completed phase t / S - 1, i.e. every CTA released tile t - S, so no
//   multicast overwrites a buffer a peer still reads. Consumers wait on full[t % S] with parity
//   (t / S) & 1 before the first round reading tile t; a CTA releases a tile only after thread 0
//   waited for it (so a phase is never skipped and parities are never ambiguous: a buffer cannot
//   advance two phases past a waiter, as its next fill needs this CTA's release). Threads other
//   than thread 0 skip waits on tiles below lo(r) (they are released or never read); thread 0
//   instead releases them before waiting for round r's tiles (a panel may start past tile S,
//   whose fill needs this CTA's release of tile 0).
//   No deadlock: a round's tiles fit the ring (hi - lo <= S - 1), releases follow every round,
//   and thread 0 issues (pump) inside every wait loop and after every round, so the lowest tile
//   any CTA waits for can always be issued by all C CTAs.
//   End: thread 0 releases and confirms every tile and issues every tile (peers may still need
//   them); a final cluster barrier keeps every CTA (its shared memory and barriers) alive until no
//   multicast and no remote arrive can target it any more.
//
// WHY panels_xsmem WAS 7x TOO SLOW (H200 log bench/results/logs/spmv-x-smem-26125e0.log, 945-1570 us
// against ~145 predicted; SASS of this file read with nvdisasm):
//   * Every release, mbarrier.arrive.release.cluster on a peer's empty[s], compiles to
//     MEMBAR.ALL.CTA; MEMBAR.ALL.GPU; ERRBAR; CGAERRBAR; SYNCS.ARRIVE. The GPU-scope fence waits for
//     every memory operation thread 0 has in flight: the key / value loads of round r + G that it
//     issued just before the round's __syncthreads (one loaded DRAM round trip, ~1-2 us: the G rounds
//     of prefetch are waited for at once, every round); each later arrive waits for the previous
//     remote arrive's acknowledgement (CGAERRBAR: an SM-to-SM round trip, ~0.17 us; 1.9 tiles x C
//     arrives a round). Thread 0 is a consumer too: its warp stalls, and the next __syncthreads
//     makes all 32 warps wait for it. The try_wait.acquire.cluster on empty[s] adds a CCTL.IVALL
//     (the whole L1 invalidated) per tile issued.
//   * Thread 0 issues only at a round's end or inside its own wait loops: a tile whose buffer the
//     last peer released just after thread 0 looked is issued a whole round later, and thread 0
//     spins in a branch divergent from its warp's 31 other lanes (suspended in try_wait).
//   Fit of the log: time = 2.3 us a round + (C x 0.17 + 0.65) us a tile (RW 2 vs 4 gives the
//   per-round part, C 4 vs 8 the per-arrive part, 325 us at both RW); nothing overlaps.
//
// panels_xsmem2<C, T, S, RW, G>: the same layout (built for 31 consumer warps: rounds of RW x 992
//   entries, chunk s x 31 + warp of a round) and the same x staging by multicast, with the
//   producer taken out of the consumers:
//   * Warps 0..30 consume; warp 31 is the producer. It never takes part in a round barrier (the
//     consumers' round barrier is the named barrier 1 of 992 threads), never loads through the
//     generic proxy, and sleeps in try_wait (no spinning, no divergent lanes: the whole warp waits,
//     lane 0 issues, lanes 0 .. C - 1 forward releases, one per destination CTA in parallel).
//   * No fence anywhere in the loop: every arrive uses the default semantics (release.cta, a
//     plain SYNCS.ARRIVE in SASS, as CUTLASS's PipelineTmaAsync does for the same cluster WAR
//     hand-off) and every wait the default acquire.cta (no CCTL.IVALL).
//   * Releases as early as possible: each consumer warp, right after its own adds of round r,
//     arrives (lane 0, after __syncwarp) on consumed[s] of every tile below lo(r + 1); it does
//     not wait for the round barrier nor for the other warps.
//   Barriers (mbarriers in each CTA's shared memory):
//   full[s]     (count 1): phase k = tile t = k S + s landed in THIS CTA: the producer's
//               arrive.expect_tx(bytes of the tile) + the C slices' complete_tx (a slice may land
//               before the expect_tx: the phase cannot complete before the arrival).
//   consumed[s] (count 31): phase k = all 31 consumer warps of THIS CTA are done reading tile
//               k S + s (each warp waited full for it first, then arrived once).
//   empty[s]    (count C): phase k = all C CTAs consumed tile k S + s (the producer of each CTA
//               forwards its consumed phase to all C CTAs: lane q arrives on CTA q's empty[s]).
//   Producer, for t = 0 .. n_tiles - 1: if t >= S: wait consumed[s] phase t / S - 1 (tile t - S),
//   forward it to the C empty[s], wait empty[s] phase t / S - 1 (every CTA done with t - S); then
//   lane 0: arrive.expect_tx(full[s]) and the slice of tile t multicast to all C CTAs, and an L2
//   prefetch of its slice of tile t + pf. Tiles 0 .. S - 1 go out at once.
//   Consumer warp: waits full for every tile in order (tiles no round reads included) and releases
//   every tile in order, a tile only after waiting for it; round r: release tiles < lo(r), wait
//   tiles .. hi(r), gather and add, release tiles < lo(r + 1), named barrier (the adds of the
//   next round may touch the same rows). After the last round: wait and release the remaining
//   tiles, then __syncthreads with the producer, write y, cluster barrier.
//   Parities never ambiguous (each wait is in order, so phase k - 1 is known complete, and phase
//   k + 1 cannot complete before the waiter acts): full phase of t + S needs this CTA's release
//   of t, which needs every warp's wait of t; consumed phase of t + S needs t + S landed, which
//   needs this producer's issue of t + S, after its wait of t; empty phase of t + S needs this
//   CTA's release of t + S, after this producer's issue of t + S, after its wait of empty t.
//   No overwrite: a slice of t + S is issued only after empty phase of t, i.e. after all 31 warps
//   of all C CTAs arrived on consumed for t. No deadlock: a round's tiles fit the ring
//   (hi - lo <= S - 3 < S), so the lowest producer step t only waits for consumers whose next
//   tile is below t, issued by all producers already (see the CPU model simulate_protocol2).
//   End: the forwards of the last S tiles are skipped (no tile t + S to issue), so after its own
//   producer finished and its consumers waited every tile, nothing can still target a CTA: every
//   remote arrive to it was waited for by its producer, every slice by its consumers. A final
//   cluster barrier anyway (no CTA leaves with its own multicasts in flight).
//
// tilewise-instantiate: panels_kv8<1024,2,4,64>
// tilewise-instantiate: panels_xsmem<4,4096,8,4,3>
// tilewise-instantiate: panels_xsmem2<4,4096,8,2,6> panels_xsmem2<4,4096,10,2,6> panels_xsmem2<8,4096,10,2,6> panels_xsmem2<4,4096,8,4,3>
#include "tilewise_common.cuh"

namespace {
constexpr unsigned kPanelPad = 0xFFFFu;  // library layout: row 0xFFFF is padding

__device__ __forceinline__ void write_y(float* y, int row, float sum, float alpha, float beta) {
  y[row] = beta == 0.0f ? alpha * sum : alpha * sum + beta * y[row];
}
__device__ __forceinline__ float panel_gather(const float* __restrict__ x, unsigned k, int b) {
  return (k & kPanelPad) != kPanelPad ? __ldg(x + b + (int)(k >> 16)) : 0.0f;
}
}  // namespace

// ------------------------------------------------------------------------------------ (A) kv8

template <int NT, int CL, int U, int kRoundChunks>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, 1) panels_kv8(
    const uint2* __restrict__ kv, const int* __restrict__ chunk_col0, const int* __restrict__ panel_chunk,
    const int* __restrict__ panel_tail, const float* __restrict__ x, float* __restrict__ y, int M, int R,
    float alpha, float beta) {
  extern __shared__ float ys[];
  constexpr int NW = NT / 32;
  const int p = blockIdx.x / CL;
  const unsigned rank = CL > 1 ? tw::cta_rank() : 0u;
  const int row0 = p * R;
  const int rows = min(R, M - row0);
  for (int i = threadIdx.x; i < rows; i += NT) ys[i] = 0.0f;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c0 = __ldg(panel_chunk + p), t0 = __ldg(panel_tail + p), c1 = __ldg(panel_chunk + p + 1);

  constexpr int RW = kRoundChunks / NW;
  static_assert(RW * NW == kRoundChunks, "a round is a whole number of sub-rounds");
  const long long nr = (t0 - c0) / kRoundChunks;
  const int rb = (int)(nr * rank / CL) * RW, re = (int)(nr * (rank + 1) / CL) * RW;
  if (rb < re) {
    uint2 ea[U], eb[U], ec[U];
    float xa[U], xb[U];
    int bb[U], bc[U];
    auto load = [&](uint2 (&e)[U], int (&b)[U], int q0) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        e[u] = make_uint2(kPanelPad, 0u);
        b[u] = 0;
        if (q0 + u < re) {
          const int cc = c0 + (q0 + u) * NW + warp;
          e[u] = __ldcs(kv + ((long long)cc * 32 + lane));  // key and value: one 8-byte load
          b[u] = __ldg(chunk_col0 + cc);
        }
      }
    };
    {
      int ba[U];
      load(ea, ba, rb);
#pragma unroll
      for (int u = 0; u < U; ++u) xa[u] = panel_gather(x, ea[u].x, ba[u]);
    }
    load(eb, bb, rb + U);
    for (int q = rb; q < re; q += U) {
#pragma unroll
      for (int u = 0; u < U; ++u) xb[u] = panel_gather(x, eb[u].x, bb[u]);
      load(ec, bc, q + 2 * U);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const unsigned k = ea[u].x;
        if ((k & kPanelPad) != kPanelPad) ys[k & kPanelPad] += __uint_as_float(ea[u].y) * xa[u];
        if ((q + u) % RW == RW - 1) __syncthreads();  // the next round may add to the same rows
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        ea[u] = eb[u];
        xa[u] = xb[u];
        eb[u] = ec[u];
        bb[u] = bc[u];
      }
    }
  }

  constexpr int UT = 8;
  const long long n = c1 - t0;
  const int cb = t0 + (int)(n * rank / CL), ce = t0 + (int)(n * (rank + 1) / CL);
  for (int c = cb + warp; c < ce; c += NW * UT) {
    uint2 e[UT];
    float xv[UT];
    int base[UT];
#pragma unroll
    for (int u = 0; u < UT; ++u) {
      const int cc = c + u * NW;
      e[u] = make_uint2(kPanelPad, 0u);
      base[u] = 0;
      if (cc < ce) {
        e[u] = __ldcs(kv + ((long long)cc * 32 + lane));
        base[u] = __ldg(chunk_col0 + cc);
      }
    }
#pragma unroll
    for (int u = 0; u < UT; ++u) xv[u] = panel_gather(x, e[u].x, base[u]);
#pragma unroll
    for (int u = 0; u < UT; ++u) {
      const unsigned k = e[u].x;
      if ((k & kPanelPad) != kPanelPad) atomicAdd(ys + (k & kPanelPad), __uint_as_float(e[u].y) * xv[u]);
    }
  }
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
    write_y(y, row0 + i, s, alpha, beta);
  }
  if (CL > 1) {
    tw::cluster_arrive();
    tw::cluster_wait();
  }
}

// ------------------------------------------------------------------------------------ (B) xsmem

namespace xs {
constexpr unsigned kRowMask = 0x7FFFu;  // row in the panel; 0x7FFF: padding
constexpr unsigned kAtomic = 0x8000u;   // this row is added with atomics in this round
constexpr int kBarBytes = 512;          // full[S], empty[S] (S <= 16), producer counters / consumed[S]; then the ring

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_bar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Has the phase of parity `parity` completed? try_wait may suspend the thread a while (consumers).
__device__ __forceinline__ bool try_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// The same test without suspending (the producer thread, which must keep issuing while it waits).
__device__ __forceinline__ bool test_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// empty[] is arrived on by peers with release.cluster: acquire at cluster scope.
__device__ __forceinline__ bool test_wait_cluster(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.test_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Arrive on the mbarrier at CTA-relative address `bar` of cluster rank `rank` (ours included).
__device__ __forceinline__ void arrive_remote(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n\t.reg .b32 ra;\n\t"
      "mapa.shared::cluster.u32 ra, %0, %1;\n\t"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n\t}" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// Default semantics (acquire.cta; no CCTL.IVALL in SASS), potentially blocking: the thread sleeps
// until the phase completes or a time limit passes.
__device__ __forceinline__ bool try_wait_cta(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void wait_parity(unsigned bar, unsigned parity) {
  while (!try_wait_cta(bar, parity)) {
  }
}
// Local arrive, default semantics (release.cta: a plain SYNCS.ARRIVE, no MEMBAR).
__device__ __forceinline__ void arrive_local(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Arrive on the mbarrier at CTA-relative address `bar` of cluster rank `rank`, default semantics
// (no MEMBAR.ALL.GPU / ERRBAR / CGAERRBAR, unlike arrive_remote's release.cluster).
__device__ __forceinline__ void arrive_remote_cta(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n\t.reg .b32 ra;\n\t"
      "mapa.shared::cluster.u32 ra, %0, %1;\n\t"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n\t}" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// Barrier 1 of the NTC consumer threads (barrier 0 is __syncthreads).
template <int NTC>
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(NTC) : "memory");
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global src to the shared address
// dst of every CTA in mask, each completing `bytes` transactions on its mbarrier at offset bar.
// Warm the L2 with bytes of global memory (no data to the SM).
__device__ __forceinline__ void prefetch_l2(const float* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_multicast(unsigned dst, const float* src, unsigned bytes, unsigned bar,
                                               unsigned short mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "h"(mask)
      : "memory");
}
}  // namespace xs

template <int C, int T, int S, int RW, int G>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(1024, 1) panels_xsmem(
    const uint2* __restrict__ kv, const unsigned* __restrict__ meta, const int* __restrict__ panel_round,
    const float* __restrict__ x, float* __restrict__ y, int M, int N, int R, float alpha, float beta, int pf) {
  constexpr int NT = 1024, NW = NT / 32;
  constexpr int U = G * RW;        // sub-rounds (chunks a warp) in flight: G rounds
  constexpr int RC = RW * NW;      // chunks a round
  constexpr int W = S * T;         // ring floats
  constexpr int SL = T / C;        // floats of a tile each CTA copies
  static_assert(C >= 1 && C <= 8 && SL % 4 == 0, "slices of whole 16-byte pieces");
  static_assert(S >= 3 && S <= 16 && W + 4 <= 65536, "ring position fits 16 bits; barriers fit kBarBytes");
  extern __shared__ __align__(128) unsigned char smem[];
  float* ring = reinterpret_cast<float*>(smem + xs::kBarBytes);
  float* ys = ring + W + 32;  // 128-byte aligned: bank of ys[r] is r % 32
  const unsigned full0 = xs::smem_u32(smem), empty0 = full0 + 8u * S;
  const unsigned rank = tw::cta_rank();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int p = blockIdx.x;  // panel = CTA
  const int row0 = p * R;
  const int rows = max(0, min(R, M - row0));
  const int N4 = N & ~3;
  const int n_tiles = (N + T - 1) / T;

  for (int i = tid; i < rows; i += NT) ys[i] = 0.0f;
  if (tid < N - N4) ring[W + tid] = __ldg(x + N4 + tid);  // x's last N % 4 floats
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      xs::bar_init(full0 + 8u * s, 1);
      xs::bar_init(empty0 + 8u * s, C);
    }
    xs::fence_bar_init();
  }
  // Every CTA's barriers initialized (and every CTA running) before any multicast or remote arrive;
  // also orders the zeroing of ys and the tail floats before the rounds.
  tw::cluster_arrive();
  tw::cluster_wait();

  int have = 0;  // tiles below `have` waited for by this thread (thread 0: all of them, in order)
  // Thread 0's producer counters, in shared memory so that they take no register of the other
  // 1023 threads: prod[0] tiles whose slice this CTA issued, prod[1] tiles this CTA released,
  // prod[2] tiles whose slice this CTA prefetched into the L2.
  int* prod = reinterpret_cast<int*>(smem + 16 * S);

  // Thread 0: issue every tile whose buffer all C CTAs have released (never blocks); prefetch this
  // CTA's slices of the tiles up to pf past the last one issued into the L2 (the first cluster to
  // reach a tile would otherwise wait for DRAM: the ring holds only ~S - 3 tiles of lead).
  auto pump = [&]() {
    int issued = prod[0];
    while (issued < n_tiles) {
      const int t = issued, s = t % S;
      if (t >= S && !xs::test_wait_cluster(empty0 + 8u * s, (unsigned)(t / S - 1) & 1u)) break;
      const int c0 = t * T, c1 = min(c0 + T, N4);
      xs::arrive_expect_tx(full0 + 8u * s, c1 > c0 ? (unsigned)(c1 - c0) * 4u : 0u);
      const int q0 = c0 + (int)rank * SL, q1 = min(q0 + SL, c1);
      if (q1 > q0)
        xs::bulk_multicast(xs::smem_u32(ring + s * T + (int)rank * SL), x + q0, (unsigned)(q1 - q0) * 4u,
                           full0 + 8u * s, (unsigned short)((1u << C) - 1u));
      ++issued;
    }
    prod[0] = issued;
    for (int t = prod[2]; t < min(issued + pf, n_tiles); ++t) {
      const int c1 = min(t * T + T, N4), q0 = t * T + (int)rank * SL, q1 = min(q0 + SL, c1);
      if (q1 > q0) xs::prefetch_l2(x + q0, (unsigned)(q1 - q0) * 4u);
      prod[2] = t + 1;
    }
  };
  // Wait until tile t has landed in this CTA (thread 0 keeps issuing meanwhile).
  auto wait_tile = [&](int t) {
    const unsigned bar = full0 + 8u * (t % S), par = (unsigned)(t / S) & 1u;
    if (tid == 0) {
      while (!xs::test_wait(bar, par)) pump();
    } else {
      while (!xs::try_wait(bar, par)) {
      }
    }
  };
  // Thread 0, after a __syncthreads: tiles below lim are read by no later round of this CTA.
  auto release_upto = [&](int lim) {
    for (int t = prod[1]; t < lim; ++t) {
      for (; have <= t; ++have) wait_tile(have);  // never release a tile before it landed
      const unsigned bar = empty0 + 8u * (t % S);
#pragma unroll
      for (int q = 0; q < C; ++q) xs::arrive_remote(bar, (unsigned)q);
      prod[1] = t + 1;
    }
  };
  if (tid == 0) {
    prod[0] = 0;
    prod[1] = 0;
    prod[2] = 0;
    pump();
  }

  const int rb = __ldg(panel_round + p), re = __ldg(panel_round + p + 1);
  if (rb < re) {
    // Rounds r .. r + G - 1 in registers (sub-round s of round r + g in e[g RW + s], its chunk
    // s NW + warp); once round r + g is added its registers are refilled with round r + g + G, so
    // G rounds of loads are always in flight.
    uint2 e[U];
    // Round metadata, 32 rounds a load: lane i holds meta[32 b + i] of batch b (mcur: the batch of
    // the rounds being added, mnext: the one after), broadcast with a shuffle.
    const int b0 = rb & ~31;
    unsigned mcur = b0 + lane < re ? __ldg(meta + b0 + lane) : 0u;
    unsigned mnext = b0 + 32 + lane < re ? __ldg(meta + b0 + 32 + lane) : 0u;
    int mbase = b0;
    auto load = [&](int g, int rr) {
#pragma unroll
      for (int s = 0; s < RW; ++s) {
        e[g * RW + s] = make_uint2(xs::kRowMask, 0u);
        if (rr < re) e[g * RW + s] = __ldcs(kv + (((long long)rr * RC + s * NW + warp) * 32 + lane));
      }
    };
#pragma unroll
    for (int g = 0; g < G; ++g) load(g, rb + g);
    for (int r = rb; r < re; r += G) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int rr = r + g;
        if (rr < re) {  // uniform over the CTA
          if (rr - mbase == 32) {  // next batch of metadata (uniform)
            mbase += 32;
            mcur = mnext;
            mnext = mbase + 32 + lane < re ? __ldg(meta + mbase + 32 + lane) : 0u;
          }
          const unsigned m = __shfl_sync(0xffffffffu, mcur, rr - mbase);
          const int lo = (int)(m & 0xFFFFu), hi = (int)(m >> 16);
          // Tiles below lo are read by no round from here on. Thread 0 releases them (a no-op but
          // before the first round: the panel may start past tile S, whose fill needs the release
          // of tile 0); the others skip them (they may be released already).
          if (tid == 0) release_upto(lo);
          else if (have < lo) have = lo;
          for (; have <= hi; ++have) wait_tile(have);
          float xv[RW];
#pragma unroll
          for (int s = 0; s < RW; ++s) {  // gathers first: no store to ys comes before them
            const unsigned k = e[g * RW + s].x;
            xv[s] = (k & xs::kRowMask) != xs::kRowMask ? ring[k >> 16] : 0.0f;
          }
#pragma unroll
          for (int s = 0; s < RW; ++s) {
            const unsigned k = e[g * RW + s].x, row = k & xs::kRowMask;
            if (row != xs::kRowMask) {
              const float prod_ = __uint_as_float(e[g * RW + s].y) * xv[s];
              if (k & xs::kAtomic) atomicAdd(ys + row, prod_);  // this row only by atomics in this round
              else ys[row] += prod_;  // this row only in this thread in this round
            }
          }
          load(g, rr + G);
          // lo of the next round (a shuffle: every lane takes part)
          const int j = rr + 1 - mbase;
          const unsigned mn = __shfl_sync(0xffffffffu, j < 32 ? mcur : mnext, j & 31);
          __syncthreads();  // the round's adds and gathers done: next round may touch the same rows
          if (tid == 0) {
            release_upto(rr + 1 < re ? (int)(mn & 0xFFFFu) : n_tiles);
            pump();
          }
        }
      }
    }
  }
  // The last round ended with a __syncthreads (or there was none: ys is zero since the cluster barrier).
  for (int i = tid; i < rows; i += NT) write_y(y, row0 + i, ys[i], alpha, beta);
  if (tid == 0) {
    release_upto(n_tiles);  // confirms every tile landed here: no multicast into us is in flight
    while (prod[0] < n_tiles) pump();  // peers may still need our slices
  }
  // No CTA leaves while a peer may still multicast into it or arrive on its barriers.
  tw::cluster_arrive();
  tw::cluster_wait();
}

// ------------------------------------------------------------------- (C) xsmem2: producer warp

template <int C, int T, int S, int RW, int G>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(1024, 1) panels_xsmem2(
    const uint2* __restrict__ kv, const unsigned* __restrict__ meta, const int* __restrict__ panel_round,
    const float* __restrict__ x, float* __restrict__ y, int M, int N, int R, float alpha, float beta, int pf) {
  constexpr int NT = 1024;
  constexpr int NWC = 31, NTC = NWC * 32;  // consumer warps, threads; warp NWC is the producer
  constexpr int U = G * RW;                // sub-rounds (chunks a warp) in flight: G rounds
  constexpr int RC = RW * NWC;             // chunks a round
  constexpr int W = S * T;                 // ring floats
  constexpr int SL = T / C;                // floats of a tile each CTA copies
  static_assert(C >= 1 && C <= 8 && SL % 4 == 0, "slices of whole 16-byte pieces");
  static_assert(S >= 3 && S <= 16 && W + 4 <= 65536, "ring position fits 16 bits; barriers fit kBarBytes");
  extern __shared__ __align__(128) unsigned char smem[];
  float* ring = reinterpret_cast<float*>(smem + xs::kBarBytes);
  float* ys = ring + W + 32;  // 128-byte aligned: bank of ys[r] is r % 32
  const unsigned full0 = xs::smem_u32(smem), empty0 = full0 + 8u * S, cons0 = full0 + 16u * S;
  const unsigned rank = tw::cta_rank();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int p = blockIdx.x;  // panel = CTA
  const int row0 = p * R;
  const int rows = max(0, min(R, M - row0));
  const int N4 = N & ~3;
  const int n_tiles = (N + T - 1) / T;

  for (int i = tid; i < rows; i += NT) ys[i] = 0.0f;
  if (tid < N - N4) ring[W + tid] = __ldg(x + N4 + tid);  // x's last N % 4 floats
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      xs::bar_init(full0 + 8u * s, 1);
      xs::bar_init(empty0 + 8u * s, C);
      xs::bar_init(cons0 + 8u * s, NWC);
    }
    xs::fence_bar_init();
  }
  // Every CTA's barriers initialized (and every CTA running) before any multicast or remote arrive;
  // also orders the zeroing of ys and the tail floats before the rounds.
  tw::cluster_arrive();
  tw::cluster_wait();

  if (warp == NWC) {
    // ---- producer warp: all lanes wait (asleep in try_wait), lane 0 issues, lanes < C forward.
    int pref = S;  // next tile whose slice to prefetch into the L2 (tiles < S go out at once)
    for (int t = 0; t < n_tiles; ++t) {
      const int s = t % S;
      if (t >= S) {
        const unsigned par = (unsigned)(t / S - 1) & 1u;  // phase of tile t - S
        xs::wait_parity(cons0 + 8u * s, par);             // our 31 warps are done with t - S
        if (lane < C) xs::arrive_remote_cta(empty0 + 8u * s, (unsigned)lane);
        xs::wait_parity(empty0 + 8u * s, par);            // all C CTAs are done with t - S
      }
      if (lane == 0) {
        const int c0 = t * T, c1 = min(c0 + T, N4);
        xs::arrive_expect_tx(full0 + 8u * s, c1 > c0 ? (unsigned)(c1 - c0) * 4u : 0u);
        const int q0 = c0 + (int)rank * SL, q1 = min(q0 + SL, c1);
        if (q1 > q0)
          xs::bulk_multicast(xs::smem_u32(ring + s * T + (int)rank * SL), x + q0, (unsigned)(q1 - q0) * 4u,
                             full0 + 8u * s, (unsigned short)((1u << C) - 1u));
        for (; pref < min(t + pf + 1, n_tiles); ++pref) {
          const int d1 = min(pref * T + T, N4), d0 = pref * T + (int)rank * SL, e1 = min(d0 + SL, d1);
          if (e1 > d0) xs::prefetch_l2(x + d0, (unsigned)(e1 - d0) * 4u);
        }
      }
      __syncwarp();
    }
  } else {
    // ---- consumer warps 0 .. 30
    int have = 0;  // tiles this warp waited for (warp-uniform)
    int rel = 0;   // tiles this warp released (arrived on consumed)
    auto wait_tile = [&](int t) { xs::wait_parity(full0 + 8u * (t % S), (unsigned)(t / S) & 1u); };
    // Tiles below lim are read by no later round of this warp: release them, in order, each only
    // after this warp waited for it (so a phase is never skipped).
    auto release_upto = [&](int lim) {
      for (; rel < lim; ++rel) {
        for (; have <= rel; ++have) wait_tile(have);
        __syncwarp();  // every lane's reads of the tile are done (their values were used)
        if (lane == 0) xs::arrive_local(cons0 + 8u * (rel % S));
      }
    };
    const int rb = __ldg(panel_round + p), re = __ldg(panel_round + p + 1);
    if (rb < re) {
      // Rounds r .. r + G - 1 in registers (sub-round s of round r + g in e[g RW + s], its chunk
      // s NWC + warp); once round r + g is added its registers are refilled with round r + g + G.
      uint2 e[U];
      // Round metadata, 32 rounds a load: lane i holds meta[32 b + i] of batch b (mcur: the batch of
      // the rounds being added, mnext: the one after), broadcast with a shuffle.
      const int b0 = rb & ~31;
      unsigned mcur = b0 + lane < re ? __ldg(meta + b0 + lane) : 0u;
      unsigned mnext = b0 + 32 + lane < re ? __ldg(meta + b0 + 32 + lane) : 0u;
      int mbase = b0;
      auto load = [&](int g, int rr) {
#pragma unroll
        for (int s = 0; s < RW; ++s) {
          e[g * RW + s] = make_uint2(xs::kRowMask, 0u);
          if (rr < re) e[g * RW + s] = __ldcs(kv + (((long long)rr * RC + s * NWC + warp) * 32 + lane));
        }
      };
#pragma unroll
      for (int g = 0; g < G; ++g) load(g, rb + g);
      for (int r = rb; r < re; r += G) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const int rr = r + g;
          if (rr < re) {  // uniform over the CTA
            if (rr - mbase == 32) {  // next batch of metadata (uniform)
              mbase += 32;
              mcur = mnext;
              mnext = mbase + 32 + lane < re ? __ldg(meta + mbase + 32 + lane) : 0u;
            }
            const unsigned m = __shfl_sync(0xffffffffu, mcur, rr - mbase);
            const int lo = (int)(m & 0xFFFFu), hi = (int)(m >> 16);
            release_upto(lo);  // a no-op but before the first round (tiles before the panel's first)
            for (; have <= hi; ++have) wait_tile(have);
            float xv[RW];
#pragma unroll
            for (int s = 0; s < RW; ++s) {  // gathers first: no store to ys comes before them
              const unsigned k = e[g * RW + s].x;
              xv[s] = (k & xs::kRowMask) != xs::kRowMask ? ring[k >> 16] : 0.0f;
            }
#pragma unroll
            for (int s = 0; s < RW; ++s) {
              const unsigned k = e[g * RW + s].x, row = k & xs::kRowMask;
              if (row != xs::kRowMask) {
                const float prod_ = __uint_as_float(e[g * RW + s].y) * xv[s];
                if (k & xs::kAtomic) atomicAdd(ys + row, prod_);  // this row only by atomics in this round
                else ys[row] += prod_;  // this row only in this thread in this round
              }
            }
            load(g, rr + G);
            // lo of the next round (a shuffle: every lane takes part)
            const int j = rr + 1 - mbase;
            const unsigned mn = __shfl_sync(0xffffffffu, j < 32 ? mcur : mnext, j & 31);
            if (rr + 1 < re) release_upto((int)(mn & 0xFFFFu));  // this warp is done with them
            xs::consumer_sync<NTC>();  // all adds of the round done: the next may touch the same rows
          }
        }
      }
    }
    // Wait for and release every tile left (the producer's forwards and our peers' issues need
    // them; and then no slice can still be on its way into this CTA).
    release_upto(n_tiles);
  }
  __syncthreads();  // the producer's loop and the consumers' rounds (ys final) are done
  for (int i = tid; i < rows; i += NT) write_y(y, row0 + i, ys[i], alpha, beta);
  // No CTA leaves while its own multicasts may be in flight (nothing else can target it by now).
  tw::cluster_arrive();
  tw::cluster_wait();
}
