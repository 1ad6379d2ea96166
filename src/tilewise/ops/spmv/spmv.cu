// tilewise-min-arch: sm_90
// spmv: y = alpha * A x + beta * y, fp32 values and vectors, int32 indices.
// beta == 0 never reads y (y may hold anything, NaN included), as in BLAS.
// tilewise-instantiate: spmv_csr_scalar spmv_ell spmv_csr_chunks spmv_csr_stream
// tilewise-instantiate: spmv_csr_vector<2> spmv_csr_vector<4> spmv_csr_vector<8> spmv_csr_vector<16> spmv_csr_vector<32>
// tilewise-instantiate: spmv_csr_merge_fixup spmv_panels_rounds
// tilewise-instantiate: spmv_jds<256,1> spmv_jds<128,1> spmv_jds<512,1> spmv_jds<128,2>
// tilewise-instantiate: spmv_csr_merge<128,5> spmv_csr_merge<128,7> spmv_csr_merge<128,8> spmv_csr_merge<128,9> spmv_csr_merge<128,11> spmv_csr_merge<128,15>
// tilewise-instantiate: spmv_panels<1024,1,3,64> spmv_panels<1024,1,3,128> spmv_panels<1024,1,4,64> spmv_panels<1024,1,4,128> spmv_panels<1024,2,3,64> spmv_panels<1024,2,3,128> spmv_panels<1024,2,4,64> spmv_panels<1024,2,4,128> spmv_panels<1024,2,5,64> spmv_panels<1024,2,5,128> spmv_panels<1024,3,4,64> spmv_panels<1024,3,4,128> spmv_panels<1024,4,4,64> spmv_panels<1024,4,4,128>
// tilewise-instantiate: spmv_csr_merge<256,5> spmv_csr_merge<256,7> spmv_csr_merge<256,8> spmv_csr_merge<256,9> spmv_csr_merge<256,11> spmv_csr_merge<256,15>
#include "tilewise_common.cuh"

namespace {
__device__ __forceinline__ void write_y(float* y, int row, float sum, float alpha, float beta) {
  y[row] = beta == 0.0f ? alpha * sum : alpha * sum + beta * y[row];
}
}  // namespace

// csr_scalar: the lecture's kernel, one thread per row. Neighbouring threads walk different rows,
// so a warp's loads of col/val touch up to 32 separate segments: fine for rows of 1 to 3, poor beyond.
extern "C" __global__ void __launch_bounds__(256) spmv_csr_scalar(
    const int* __restrict__ row_ptr, const int* __restrict__ col, const float* __restrict__ val,
    const float* __restrict__ x, float* __restrict__ y, int M, float alpha, float beta) {
  const long long row = tw::global_thread_id();
  if (row >= M) return;
  float sum = 0.0f;
  const int end = row_ptr[row + 1];
  // Unrolled so that several iterations' loads are in flight before the first add waits.
#pragma unroll 4
  for (int j = row_ptr[row]; j < end; ++j) sum += __ldcs(val + j) * __ldg(x + __ldcs(col + j));
  write_y(y, (int)row, sum, alpha, beta);
}

// csr_vector: SUB consecutive lanes per row (SUB = 2 .. 32, a power of two), so one row's col/val
// are read in SUB-wide coalesced pieces; a shuffle tree of log2(SUB) steps sums the lanes' parts.
// Rows longer than long_len are left to spmv_csr_chunks (row splitting): here they only get
// y = beta * y, and the chunk kernel, launched after this one, adds alpha * (its part) atomically.
template <int SUB>
__global__ void __launch_bounds__(256) spmv_csr_vector(
    const int* __restrict__ row_ptr, const int* __restrict__ col, const float* __restrict__ val,
    const float* __restrict__ x, float* __restrict__ y, int M, float alpha, float beta, int long_len) {
  const long long t = tw::global_thread_id();
  const long long row = t / SUB;
  const int lane = (int)(t % SUB);
  float sum = 0.0f;
  int start = 0, end = 0;
  if (row < M) {
    start = row_ptr[row];
    end = row_ptr[row + 1];
    if (end - start > long_len) end = start;  // split row: the chunk kernel sums it
  }
  // Unrolled so that several iterations' loads are in flight before the first add waits.
#pragma unroll 4
  for (int j = start + lane; j < end; j += SUB) sum += __ldcs(val + j) * __ldg(x + __ldcs(col + j));
  // Every lane of the warp takes part in the shuffles, rows past M included (their sum is 0).
#pragma unroll
  for (int off = SUB / 2; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off, SUB);
  if (lane == 0 && row < M) write_y(y, (int)row, sum, alpha, beta);
}

// csr_chunks: the long rows of csr_vector's split, cut at build time into chunks of at most CHUNK
// nonzeros; one warp per chunk, 16 independent loads per lane, one atomicAdd per chunk. Runs after
// csr_vector has set y[row] = beta * y[row] for these rows.
extern "C" __global__ void __launch_bounds__(256) spmv_csr_chunks(
    const int* __restrict__ row_ptr, const int* __restrict__ col, const float* __restrict__ val,
    const float* __restrict__ x, float* __restrict__ y, const int* __restrict__ chunk_row,
    const int* __restrict__ chunk_start, int n_chunks, float alpha) {
  constexpr int CHUNK = 512;
  const long long w = tw::global_thread_id() >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= n_chunks) return;
  const int row = chunk_row[w];
  const int start = chunk_start[w];
  const int end = min(start + CHUNK, row_ptr[row + 1]);
  float sum = 0.0f;
#pragma unroll 4
  for (int j = start + lane; j < end; j += 32) sum += __ldcs(val + j) * __ldg(x + __ldcs(col + j));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
  if (lane == 0) atomicAdd(y + row, alpha * sum);
}

// ell: one thread per row over a column-major (K, M) padded layout: step k of all rows is
// contiguous, so a warp's loads coalesce. Padding holds col = -1 and ends the row.
extern "C" __global__ void __launch_bounds__(256) spmv_ell(
    const int* __restrict__ col, const float* __restrict__ val, const float* __restrict__ x,
    float* __restrict__ y, int M, int K, float alpha, float beta) {
  const long long row = tw::global_thread_id();
  if (row >= M) return;
  float sum = 0.0f;
  // Unrolled so that several iterations' loads are in flight before the first add waits.
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    const long long i = (long long)k * M + row;
    const int c = __ldcs(col + i);
    if (c < 0) break;
    sum += __ldcs(val + i) * __ldg(x + c);
  }
  write_y(y, (int)row, sum, alpha, beta);
}

// jds: rows sorted by length (longest first), stored diagonal by diagonal: diagonal k holds element k
// of each row that has more than k, at jd_ptr[k] + (rank of the row). Neighbouring threads take
// neighbouring sorted rows, so they read neighbouring entries of each diagonal (coalesced), with no
// padding. Each thread takes R rows NT apart (R = 1: the lecture's kernel), so R rows' loads are in
// flight at once; the first of them is the longest (rows are sorted), which bounds the loop.
template <int NT, int R>
__global__ void __launch_bounds__(NT) spmv_jds(
    const int* __restrict__ perm, const int* __restrict__ len_sorted, const int* __restrict__ jd_ptr,
    const int* __restrict__ col, const float* __restrict__ val, const float* __restrict__ x,
    float* __restrict__ y, int M, float alpha, float beta) {
  const long long s0 = (long long)blockIdx.x * (NT * R) + threadIdx.x;
  int len[R];
  float sum[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const long long s = s0 + (long long)j * NT;
    len[j] = s < M ? __ldcs(len_sorted + s) : 0;
    sum[j] = 0.0f;
  }
  const int kmax = len[0];
  // Unrolled so that several diagonals' loads are in flight before the first add waits.
#pragma unroll 2
  for (int k = 0; k < kmax; ++k) {
    const long long i0 = (long long)__ldg(jd_ptr + k) + s0;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (k < len[j]) {
        const long long i = i0 + (long long)j * NT;
        sum[j] += __ldcs(val + i) * __ldg(x + __ldcs(col + i));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const long long s = s0 + (long long)j * NT;
    if (s < M) write_y(y, __ldcs(perm + s), sum[j], alpha, beta);
  }
}

// csr_stream: for short rows. Block b owns rows block_row[b] .. block_row[b + 1] (about 1024
// nonzeros or 256 rows, planned once per matrix); it first computes every product val * x[col] of
// its nonzeros into shared memory with coalesced loads (the whole block streams one contiguous
// range), then each thread sums one row's products from shared memory. A block whose range does not
// fit in CAP (a long row inside) sums its rows straight from global memory instead.
extern "C" __global__ void __launch_bounds__(256) spmv_csr_stream(
    const int* __restrict__ row_ptr, const int* __restrict__ col, const float* __restrict__ val,
    const float* __restrict__ x, float* __restrict__ y, const int* __restrict__ block_row,
    float alpha, float beta) {
  constexpr int CAP = 2048;
  __shared__ float prod[CAP];
  const int r0 = block_row[blockIdx.x], r1 = block_row[blockIdx.x + 1];
  const int j0 = row_ptr[r0];
  const int n = row_ptr[r1] - j0;
  if (n <= CAP) {  // uniform over the block: the barrier below is reached by all or none
#pragma unroll 4
    for (int j = threadIdx.x; j < n; j += blockDim.x)
      prod[j] = __ldcs(val + j0 + j) * __ldg(x + __ldcs(col + j0 + j));
    __syncthreads();
    for (int r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
      const int e = row_ptr[r + 1] - j0;
      float sum = 0.0f;
      for (int k = row_ptr[r] - j0; k < e; ++k) sum += prod[k];
      write_y(y, r, sum, alpha, beta);
    }
  } else {
    for (int r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
      const int e = row_ptr[r + 1];
      float sum = 0.0f;
#pragma unroll 4
      for (int j = row_ptr[r]; j < e; ++j) sum += __ldcs(val + j) * __ldg(x + __ldcs(col + j));
      write_y(y, r, sum, alpha, beta);
    }
  }
}

// csr_merge: merge-path load balancing. The rows' ends (row_ptr[1:]) and the nonzeros (0 .. nnz-1)
// form one merged path of M + nnz items; block b takes items [b * TILE, (b + 1) * TILE) whatever the
// row lengths, starting at (plan_row[b], plan_nz[b]) (found once per matrix by a binary search on
// row_ptr, cached with the CSR). The block stages its row ends and its products val * x[col] in
// shared memory with coalesced loads, then each thread walks IPT items of the path from there
// (a binary search in shared memory finds its start): a nonzero adds to the open row, a row end
// closes it. A thread's first closed row may have begun in earlier threads: a block-wide segmented
// scan of the threads' open-row sums supplies that part. The block's rows are then written to y
// with coalesced stores, and the sum of the row still open at the block's end goes to carry[b];
// spmv_csr_merge_fixup, launched after, adds each straddling row's carries (no atomics, a fixed
// order: the result is the same on every run).
// An odd IPT keeps the walk's shared-memory reads (threads IPT apart) off a common bank.
template <int NT, int IPT>
__global__ void __launch_bounds__(NT) spmv_csr_merge(
    const int* __restrict__ row_ptr, const int* __restrict__ col, const float* __restrict__ val,
    const float* __restrict__ x, float* __restrict__ y, const int* __restrict__ plan_row,
    const int* __restrict__ plan_nz, float* __restrict__ carry, float alpha, float beta) {
  constexpr int TILE = NT * IPT, WARPS = NT / 32;
  static_assert(NT % 32 == 0, "whole warps");
  // path[0 .. nr) holds the rows' ends (as int bits, relative to z0), path[nr .. nr + nz) the products.
  __shared__ float path[TILE];
  __shared__ float out[TILE];
  __shared__ float warp_sum[WARPS];
  __shared__ int warp_flag[WARPS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = plan_row[blockIdx.x], z0 = plan_nz[blockIdx.x];
  const int nr = plan_row[blockIdx.x + 1] - r0, nz = plan_nz[blockIdx.x + 1] - z0;
  float* prod = path + nr;

  // Stage: every column and value load of the block issued before the first gather from x waits.
  int c[IPT];
  float v[IPT];
#pragma unroll
  for (int u = 0; u < IPT; ++u) {
    const int k = u * NT + tid;
    if (k < nz) {
      c[u] = __ldcs(col + z0 + k);
      v[u] = __ldcs(val + z0 + k);
    }
    if (k < nr) path[k] = __int_as_float(row_ptr[r0 + 1 + k] - z0);
  }
#pragma unroll
  for (int u = 0; u < IPT; ++u) {
    const int k = u * NT + tid;
    if (k < nz) prod[k] = v[u] * __ldg(x + c[u]);
  }
  __syncthreads();

  // This thread's start on the path: i rows closed, j nonzeros taken, i + j = d. Row k closes at
  // item k + end(k), so i = #{k < nr : k + end(k) < d}, searched between the bounds the diagonal allows.
  const int L = nr + nz;
  const int d = min(tid * IPT, L), d_end = min(d + IPT, L);
  int lo = max(0, d - nz), hi = min(d, nr);
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (mid + __float_as_int(path[mid]) < d) lo = mid + 1; else hi = mid;
  }
  int i = lo, j = d - lo;
  float sum = 0.0f, head_sum = 0.0f;
  int head = -1;  // the first row this thread closes: its start may lie in earlier threads
#pragma unroll
  for (int u = 0; u < IPT; ++u) {
    if (d + u < d_end) {
      if (i < nr && __float_as_int(path[i]) <= j) {
        if (head < 0) {
          head = i;
          head_sum = sum;
        } else {
          out[i] = sum;
        }
        sum = 0.0f;
        ++i;
      } else {
        sum += prod[j];
        ++j;
      }
    }
  }

  // Segmented inclusive scan of (closed a row?, open-row sum) over the block: a thread that closed
  // a row starts a new segment. The exclusive prefix is what earlier threads hold of this thread's
  // head row.
  int f = head >= 0;
  float s = sum;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float su = __shfl_up_sync(0xffffffffu, s, off);
    const int fu = __shfl_up_sync(0xffffffffu, f, off);
    if (lane >= off) {
      if (!f) s += su;
      f |= fu;
    }
  }
  if (lane == 31) {
    warp_sum[warp] = s;
    warp_flag[warp] = f;
  }
  __syncthreads();
  float before = 0.0f;  // the earlier warps' open-row sum, in warp order
  for (int w = 0; w < warp; ++w) before = warp_flag[w] ? warp_sum[w] : before + warp_sum[w];
  float ex = __shfl_up_sync(0xffffffffu, s, 1);
  int exf = __shfl_up_sync(0xffffffffu, f, 1);
  if (lane == 0) {
    ex = 0.0f;
    exf = 0;
  }
  if (head >= 0) out[head] = head_sum + (exf ? ex : before + ex);
  if (tid == NT - 1) carry[blockIdx.x] = f ? s : before + s;
  __syncthreads();
#pragma unroll
  for (int u = 0; u < IPT; ++u) {
    const int k = u * NT + tid;
    if (k < nr) write_y(y, r0 + k, out[k], alpha, beta);
  }
}

// csr_merge's second pass: one warp per row that straddles blocks (seg_row, carries of blocks
// seg_b0 .. seg_b1 - 1), summed in a fixed order (lane stride, then a shuffle tree) and added to the
// y[row] that the block closing the row wrote.
extern "C" __global__ void __launch_bounds__(256) spmv_csr_merge_fixup(
    const float* __restrict__ carry, const int* __restrict__ seg_row, const int* __restrict__ seg_b0,
    const int* __restrict__ seg_b1, float* __restrict__ y, int n_seg, float alpha) {
  const long long w = tw::global_thread_id() >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= n_seg) return;
  const int b1 = seg_b1[w];
  float sum = 0.0f;
#pragma unroll 4
  for (int b = seg_b0[w] + lane; b < b1; b += 32) sum += carry[b];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) y[seg_row[w]] += alpha * sum;
}

// panels: for matrices whose columns are spread at random over a wide x (the uniform matrix), where
// every CSR / ELL / JDS kernel pays one 32-byte L2 sector per 4-byte x[col] it gathers. The rows are
// cut into panels of R rows; a panel's nonzeros are stored in column order, so the warps of a CTA
// walk x from left to right and 32 neighbouring nonzeros fall in a few sectors (L1 hits for the
// rest), and each product is added into the panel's y held in shared memory (R floats). Entry
// = (col & 0xFFFF) << 16 | row within the panel, plus its value; entries come in chunks of 32 that
// share one column block (chunk_col0: col & ~0xFFFF), padded with key 0xFFFF (no product: the
// padding reads no x, so an Inf or NaN in x cannot leak into a row).
// A panel's chunks [panel_chunk[p], panel_tail[p]) come in rounds of kRoundChunks chunks (a whole
// number a warp: 64 is two) in which no row repeats (the builder moves repeats to the tail): a round is added with plain
// shared-memory loads and stores and a barrier before the next round. Shared-memory float atomics are a
// compare-and-swap loop on sm_90 (ATOMS.CAST.SPIN, about one lane a clock an SM: the accumulation
// alone took 217 us of the uniform matrix's ~230; docs/tuning/spmv.md, "Panels rounds"): only the tail
// [panel_tail[p], panel_chunk[p + 1]) uses them, and the order of its adds is not fixed (the last
// bits of y may differ between runs when a panel has a tail).
// A cluster of CL CTAs shares a panel: rank r takes the r-th of CL equal runs of the rounds and of
// the tail; after a cluster barrier each CTA sums rows [r R / CL, (r + 1) R / CL) over the CL
// shared-memory copies in rank order (distributed shared memory) and writes y once, then waits at a
// second barrier so no peer's shared memory goes away while it is read. The rounds go by groups of
// U sub-rounds, three groups in flight (one added, one gathered, one loaded).
namespace {
constexpr unsigned kPanelPad = 0xFFFFu;  // a padding key: row 0xFFFF, no product
// x at the entry's column; padding reads nothing.
__device__ __forceinline__ float panel_gather(const float* __restrict__ x, unsigned k, int b) {
  return (k & kPanelPad) != kPanelPad ? __ldg(x + b + (int)(k >> 16)) : 0.0f;
}
}  // namespace

template <int NT, int CL, int U, int kRoundChunks>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, 1) spmv_panels(
    const unsigned* __restrict__ key, const float* __restrict__ val, const int* __restrict__ chunk_col0,
    const int* __restrict__ panel_chunk, const int* __restrict__ panel_tail, const float* __restrict__ x,
    float* __restrict__ y, int M, int R, float alpha, float beta) {
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

  // Rounds of kRoundChunks chunks, each RW sub-rounds of NW chunks: sub-round q holds chunks
  // c0 + q NW .. c0 + q NW + NW - 1, warp w the w-th; a barrier ends each round.
  constexpr int RW = kRoundChunks / NW;
  static_assert(RW * NW == kRoundChunks, "a round is a whole number of sub-rounds");
  const long long nr = (t0 - c0) / kRoundChunks;
  const int rb = (int)(nr * rank / CL) * RW, re = (int)(nr * (rank + 1) / CL) * RW;
  if (rb < re) {
    // Three groups of U sub-rounds in flight: group a's products are added while group b's x is
    // gathered and group c is loaded.
    unsigned ka[U], kb[U], kc[U];
    float va[U], vb[U], vc[U], xa[U], xb[U];
    int ba[U], bb[U], bc[U];
    auto load = [&](unsigned (&k)[U], float (&v)[U], int (&b)[U], int q0) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        k[u] = kPanelPad;
        v[u] = 0.0f;
        b[u] = 0;
        if (q0 + u < re) {
          const int cc = c0 + (q0 + u) * NW + warp;
          const long long e = (long long)cc * 32 + lane;
          k[u] = __ldcs(key + e);
          v[u] = __ldcs(val + e);
          b[u] = __ldg(chunk_col0 + cc);
        }
      }
    };
    load(ka, va, ba, rb);
#pragma unroll
    for (int u = 0; u < U; ++u) xa[u] = panel_gather(x, ka[u], ba[u]);
    load(kb, vb, bb, rb + U);
    for (int q = rb; q < re; q += U) {
#pragma unroll
      for (int u = 0; u < U; ++u) xb[u] = panel_gather(x, kb[u], bb[u]);
      load(kc, vc, bc, q + 2 * U);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if ((ka[u] & kPanelPad) != kPanelPad) ys[ka[u] & kPanelPad] += va[u] * xa[u];
        if ((q + u) % RW == RW - 1) __syncthreads();  // the next round may add to the same rows
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        ka[u] = kb[u];
        va[u] = vb[u];
        xa[u] = xb[u];
        kb[u] = kc[u];
        vb[u] = vc[u];
        bb[u] = bc[u];
      }
    }
  }

  // Tail: rank r takes the r-th of CL equal runs of chunks; any warp any chunk; atomics; UT chunks
  // a warp in flight (the tail is short: fewer, deeper iterations). 4 where 8 spilled under NVRTC
  // 13.0's ptxas at 64 registers (one CTA a cluster, or U = 5: 4 to 92 bytes; 13.5 did not).
  constexpr int UT = (CL == 1 || U > 4) ? 4 : 8;
  const long long n = c1 - t0;
  const int cb = t0 + (int)(n * rank / CL), ce = t0 + (int)(n * (rank + 1) / CL);
  for (int c = cb + warp; c < ce; c += NW * UT) {
    unsigned k[UT];
    float v[UT], xv[UT];
    int base[UT];
#pragma unroll
    for (int u = 0; u < UT; ++u) {
      const int cc = c + u * NW;
      k[u] = kPanelPad;
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
    for (int u = 0; u < UT; ++u) xv[u] = panel_gather(x, k[u], base[u]);
#pragma unroll
    for (int u = 0; u < UT; ++u) {
      if ((k[u] & kPanelPad) != kPanelPad) atomicAdd(ys + (k[u] & kPanelPad), v[u] * xv[u]);
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

// Panels' rounds, packed (Panels.from_csr): one panel a block. The block clears the panel's row
// stamps (shared memory, one int a row); then its first warp walks the panel's entries in column
// order, 32 at a time, and gives each its slot in the panel's rounds part, or -1 when its row is
// already in the current round (the entry goes to the atomic tail and takes no slot: a round holds
// round_slots entries with no holes). A new column block starts a new chunk of 32 slots (a chunk
// has one column base). The result is the one of the serial walk (_packed_rounds_host, the test
// compares them): within 32 entries, an entry is kept when its row is not stamped with the round
// and no earlier entry of the 32 has its row (__match_any_sync); slots are counts of the kept ones
// (ballot, popc), re-aligned at each column-block change; the first entry whose slot would start
// the next round ends the step, and the next step starts there with the next round.
// total[p]: the panel's slots, whole rounds.
__device__ __forceinline__ unsigned tw_lanes(int from, int to) {  // bits from..to-1, 0 <= from <= to < 32
  return ((1u << to) - 1) & ~((1u << from) - 1);
}

extern "C" __global__ void __launch_bounds__(256) spmv_panels_rounds(
    const int* __restrict__ row, const int* __restrict__ blk, const long long* __restrict__ start,
    long long* __restrict__ slot, long long* __restrict__ total, int rows, int round_slots) {
  extern __shared__ int stamp[];
  const int p = blockIdx.x;
  for (int i = threadIdx.x; i < rows; i += blockDim.x) stamp[i] = -1;
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  const long long b = start[p], e = start[p + 1];
  long long pos = 0, end = round_slots, i0 = b;
  int rid = 0, cur = -1;
  int bk = -2, r = -1;  // this step's entry (i0 + lane)
  if (i0 + lane < e) {
    bk = blk[i0 + lane];
    r = row[i0 + lane];
  }
  while (i0 < e) {
    const int n = (int)min(32LL, e - i0);
    const bool valid = lane < n;
    // the next step's entries, loaded now (used when this step takes all 32), and L2 further ahead
    const long long nx = i0 + 32 + lane;
    int nbk = -2, nr = -1;
    if (nx < e) {
      nbk = blk[nx];
      nr = row[nx];
    }
    if (lane < 2 && nx + 1024 < e) {
      const int* ahead = (lane ? blk : row) + nx + 1024;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(ahead));
    }
    int prev = __shfl_up_sync(0xffffffffu, bk, 1);
    if (lane == 0) prev = cur;
    const unsigned heads = __ballot_sync(0xffffffffu, valid && bk != prev);
    const unsigned same = __match_any_sync(0xffffffffu, r);
    const bool keep = valid && (same & tw_lanes(0, lane)) == 0 && stamp[r] != rid;
    const unsigned kept = __ballot_sync(0xffffffffu, keep);
    long long base = pos, run = pos;
    int from = 0, seg = 0;
    for (unsigned hm = heads; hm; hm &= hm - 1) {  // column-block changes, in order (warp-uniform)
      const int h = __ffs(hm) - 1;
      run = (run + __popc(kept & tw_lanes(seg, h)) + 31) & ~31LL;
      seg = h;
      if (h <= lane) {
        base = run;
        from = h;
      }
    }
    const long long at = base + __popc(kept & tw_lanes(from, lane));  // this entry's slot, if kept
    const unsigned over = __ballot_sync(0xffffffffu, valid && at >= end);
    const int take = over ? __ffs(over) - 1 : n;
    if (lane < take) {
      if (keep) stamp[r] = rid;
      slot[i0 + lane] = keep ? at : -1;
    }
    if (over) {
      pos = __shfl_sync(0xffffffffu, at, take);
      ++rid;
      end += round_slots;
    } else {
      pos = __shfl_sync(0xffffffffu, at + (keep ? 1 : 0), n - 1);
    }
    if (take) cur = __shfl_sync(0xffffffffu, bk, take - 1);
    i0 += take;
    if (take == 32) {
      bk = nbk;
      r = nr;
    } else {
      bk = -2;
      r = -1;
      if (i0 + lane < e) {
        bk = blk[i0 + lane];
        r = row[i0 + lane];
      }
    }
    __syncwarp();
  }
  if (lane == 0) total[p] = (pos + round_slots - 1) / round_slots * round_slots;
}
