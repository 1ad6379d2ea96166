// embedding: out[n, :] = weight[ids[n], :] and its deterministic backward (no float atomics).
// T: the table's dtype; I: the ids' dtype (int64 or int32).
// tilewise-instantiate: embedding_fwd_v1_naive<float,i64> embedding_fwd_v1_naive<__half,i64> embedding_fwd_v1_naive<__nv_bfloat16,i64>
// tilewise-instantiate: embedding_fwd_v1_naive<float,int> embedding_fwd_v1_naive<__half,int> embedding_fwd_v1_naive<__nv_bfloat16,int>
// tilewise-instantiate: embedding_sort_keys_v2<i64> embedding_sort_keys_v2<int>
// tilewise-instantiate: embedding_bwd_segment_sum<float> embedding_bwd_segment_sum<__half> embedding_bwd_segment_sum<__nv_bfloat16>
// tilewise-instantiate: embedding_bwd_scan_v3<float,i64,1> embedding_bwd_scan_v3<float,i64,2> embedding_bwd_scan_v3<float,i64,4> embedding_bwd_scan_v3<float,i64,8> embedding_bwd_scan_v3<float,int,1> embedding_bwd_scan_v3<float,int,2> embedding_bwd_scan_v3<float,int,4> embedding_bwd_scan_v3<float,int,8>
// tilewise-instantiate: embedding_bwd_scan_v3<__half,i64,1> embedding_bwd_scan_v3<__half,i64,2> embedding_bwd_scan_v3<__half,i64,4> embedding_bwd_scan_v3<__half,i64,8> embedding_bwd_scan_v3<__half,int,1> embedding_bwd_scan_v3<__half,int,2> embedding_bwd_scan_v3<__half,int,4> embedding_bwd_scan_v3<__half,int,8>
// tilewise-instantiate: embedding_bwd_scan_v3<__nv_bfloat16,i64,1> embedding_bwd_scan_v3<__nv_bfloat16,i64,2> embedding_bwd_scan_v3<__nv_bfloat16,i64,4> embedding_bwd_scan_v3<__nv_bfloat16,i64,8> embedding_bwd_scan_v3<__nv_bfloat16,int,1> embedding_bwd_scan_v3<__nv_bfloat16,int,2> embedding_bwd_scan_v3<__nv_bfloat16,int,4> embedding_bwd_scan_v3<__nv_bfloat16,int,8>
// tilewise-instantiate: embedding_bwd_block_scan_v4<float,i64,4,8,32> embedding_bwd_block_scan_v4<float,int,4,8,32> embedding_bwd_block_scan_v4<__half,i64,4,8,32> embedding_bwd_block_scan_v4<__half,int,4,8,32> embedding_bwd_block_scan_v4<__nv_bfloat16,i64,4,8,32> embedding_bwd_block_scan_v4<__nv_bfloat16,int,4,8,32> embedding_bwd_block_scan_v4<float,i64,4,32,32> embedding_bwd_block_scan_v4<float,i64,4,8,64> embedding_bwd_block_scan_v4<float,i64,8,8,64> embedding_bwd_block_scan_v4<float,i64,8,16,32>
#include "tilewise_common.cuh"

// One token per type name: the instantiate lines above are split at spaces.
using i64 = long long;

// Forward, one thread per output element. An id outside [0, V) reads nothing and writes NaN, so
// a bad id shows up in the output instead of reading another allocation.
template <typename T, typename I>
__global__ void embedding_fwd_v1_naive(const I* __restrict__ ids, const T* __restrict__ weight,
                                       T* __restrict__ out, long long n_ids, long long V, long long E) {
  const long long stride = tw::grid_threads();
  const long long total = n_ids * E;
  for (long long k = tw::global_thread_id(); k < total; k += stride) {
    const long long n = k / E;
    const long long e = k - n * E;
    const long long row = static_cast<long long>(ids[n]);
    out[k] = (row >= 0 && row < V) ? weight[row * E + e] : tw::from_float<T>(__int_as_float(0x7fc00000));
  }
}

// Backward, step 1 for n_ids <= 8192, in one block: sort the keys (id << 32 | position) with a
// bitonic sort in shared memory. Equal ids end up in position order, so step 2 adds each row's
// gradients in a fixed order: bit-identical results from run to run. Ids outside [0, V) get the
// id part 0xFFFFFFFF (written out as V), which step 2 never looks for. Dynamic shared memory: n_pow2 x 8 bytes.
// Only the positions are written out: step 2 reads the segments from row_start, never the ids.
template <typename I>
__global__ void __launch_bounds__(1024) embedding_sort_keys_v2(const I* __restrict__ ids,
                                                                long long* __restrict__ sorted_pos,
                                                                int* __restrict__ row_start,
                                                                long long n_ids, long long V, int n_pow2) {
  extern __shared__ unsigned long long keys[];
  for (int i = threadIdx.x; i < n_pow2; i += blockDim.x) {
    unsigned long long key = ~0ull;
    if (i < n_ids) {
      const long long row = static_cast<long long>(ids[i]);
      const unsigned long long idp = (row >= 0 && row < V) ? static_cast<unsigned long long>(row) : 0xFFFFFFFFull;
      key = (idp << 32) | static_cast<unsigned long long>(i);
    }
    keys[i] = key;
  }
  __syncthreads();
  for (int size = 2; size <= n_pow2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < (n_pow2 >> 1); t += blockDim.x) {
        // The t-th compare-exchange pair of this stage: i has bit `stride` clear, j = i + stride.
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const bool up = (i & size) == 0;
        const unsigned long long a = keys[i], b = keys[j];
        if ((a > b) == up) {
          keys[i] = b;
          keys[j] = a;
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < n_ids; i += blockDim.x) sorted_pos[i] = static_cast<long long>(keys[i] & 0xFFFFFFFFull);
  // row_start[v] = first sorted index whose id is >= v, for v in [0, V]: row v's segment is
  // [row_start[v], row_start[v + 1]). Searched here, in shared memory (tens of cycles a probe),
  // so that step 2 reads two numbers instead of chasing ~2 log2(n) dependent global loads.
  // Bad ids (0xFFFFFFFF > V) land after row_start[V]. The launcher keeps V + 1 small (<= 65536).
  for (long long v = threadIdx.x; v <= V; v += blockDim.x) {
    const unsigned long long target = static_cast<unsigned long long>(v) << 32;
    int lo = 0, hi = static_cast<int>(n_ids);
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (keys[mid] < target) lo = mid + 1; else hi = mid;
    }
    row_start[v] = lo;
  }
}

// Backward, step 2: one warp per table row v writes grad_weight[v, :] in full (zeros for rows no id
// names, so no separate memset): v's segment of the sorted ids is [row_start[v], row_start[v + 1])
// (from step 1, or torch.searchsorted for v1); the sum of those positions' grad_out rows in position
// order, in fp32. Eight partial sums per lane keep eight loads in flight for long segments
// (frequent words); they are combined in a fixed order, so the result is the same bits on every
// run. Ids outside [0, V) sort after row_start[V], so no row takes them. Row `padding_idx` (-1:
// none) is written as zeros.
template <typename T>
__global__ void __launch_bounds__(256) embedding_bwd_segment_sum(const int* __restrict__ row_start,
                                                                 const long long* __restrict__ sorted_pos,
                                                                 const T* __restrict__ grad_out,
                                                                 T* __restrict__ grad_weight, long long V,
                                                                 long long E, long long padding_idx) {
  constexpr int U = 8;
  const int lane = threadIdx.x & 31;
  const long long warps = tw::grid_threads() >> 5;
  for (long long v = tw::global_thread_id() >> 5; v < V; v += warps) {
    const long long begin = row_start[v];
    const long long end = row_start[v + 1];
    T* dst = grad_weight + v * E;
    if (begin >= end || v == padding_idx) {
      for (long long e = lane; e < E; e += 32) dst[e] = tw::from_float<T>(0.f);
      continue;
    }
    for (long long e = lane; e < E; e += 32) {
      float acc[U];
#pragma unroll
      for (int u = 0; u < U; ++u) acc[u] = 0.f;
      long long k = begin;
      for (; k + U <= end; k += U) {
#pragma unroll
        for (int u = 0; u < U; ++u) acc[u] += tw::to_float(grad_out[sorted_pos[k + u] * E + e]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (k + u < end) acc[u] += tw::to_float(grad_out[sorted_pos[k + u] * E + e]);
      float total = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) total += acc[u];
      dst[e] = tw::from_float<T>(total);
    }
  }
}

// Backward without a sort (v3_scan): each warp owns RPW consecutive table rows and walks all ids,
// 32 at a time from shared memory; a ballot per row gives the lanes whose id names it, and the
// warp adds those positions' grad_out rows in position order (lane = dim element, EC chunks of
// 32), so each row's sum has a fixed order: the same bits on every run, no atomics. Every row of
// grad_weight is written (zeros for rows no id names and for padding_idx). Ids outside [0, V) are
// stored as -1 and match nothing. Dynamic shared memory: n_ids x 4 bytes.
template <typename T, typename I, int EC>
__global__ void __launch_bounds__(1024) embedding_bwd_scan_v3(const I* __restrict__ ids,
                                                               const T* __restrict__ grad_out,
                                                               T* __restrict__ grad_weight, long long n_ids,
                                                               long long V, long long E, long long padding_idx) {
  constexpr int RPW = 4;
  extern __shared__ int sid[];
  for (long long i = threadIdx.x; i < n_ids; i += blockDim.x) {
    const long long r = static_cast<long long>(ids[i]);
    sid[i] = (r >= 0 && r < V) ? static_cast<int>(r) : -1;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const long long v0 = ((long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * RPW;
  if (v0 >= V) return;  // whole warps; no barrier follows
  bool live[RPW];
  float acc[RPW][EC];
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    live[r] = v0 + r < V && v0 + r != padding_idx;
#pragma unroll
    for (int c = 0; c < EC; ++c) acc[r][c] = 0.f;
  }
  for (long long base = 0; base < n_ids; base += 32) {
    const int id = base + lane < n_ids ? sid[base + lane] : -1;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      unsigned m = __ballot_sync(0xffffffffu, live[r] && id == static_cast<int>(v0 + r));
      while (m) {
        const int b = __ffs(m) - 1;
        m &= m - 1;
        const T* g = grad_out + (base + b) * E;
#pragma unroll
        for (int c = 0; c < EC; ++c) {
          const long long e = lane + 32 * c;
          if (e < E) acc[r][c] += tw::to_float(g[e]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    if (v0 + r >= V) break;
    T* dst = grad_weight + (v0 + r) * E;
#pragma unroll
    for (int c = 0; c < EC; ++c) {
      const long long e = lane + 32 * c;
      if (e < E) dst[e] = tw::from_float<T>(acc[r][c]);
    }
  }
}

// Backward without a sort, split over the ids (v4_block_scan): a block owns RB consecutive table
// rows; while loading the ids into shared memory it maps each to its local row (or -1: another
// block's row, padding_idx, out of range), so the scan is one ballot per 32 ids. Each of the NW
// warps walks a contiguous 1/NW of the ids and adds the matching grad_out rows, in position order,
// into its own shared-memory partial (NW x RB x E floats); the block then sums the partials in warp
// order and writes its RB rows. A fixed order throughout: the same bits on every run, no atomics.
// The ids are loaded LU a thread at a time: all LU loads are issued before the first is used, so a
// block waits for n_ids / (NW x 32 x LU) L2 round trips. Dynamic shared memory:
// (NW x RB x E + n_ids) x 4 bytes (the launcher keeps n_ids far below 2^31).
template <typename T, typename I, int NW, int LU, int RB>
__global__ void __launch_bounds__(NW * 32) embedding_bwd_block_scan_v4(const I* __restrict__ ids,
                                                                      const T* __restrict__ grad_out,
                                                                      T* __restrict__ grad_weight, long long n_ids,
                                                                      long long V, long long E,
                                                                      long long padding_idx) {
  extern __shared__ float smem[];
  const int e_n = static_cast<int>(E);
  float* part = smem;                                      // [NW][RB][E]
  int* loc = reinterpret_cast<int*>(smem + NW * RB * e_n);  // [n_ids]
  const long long r0 = static_cast<long long>(blockIdx.x) * RB;
  for (int i = threadIdx.x; i < NW * RB * e_n; i += NW * 32) part[i] = 0.f;
  const int n = static_cast<int>(n_ids);
  for (int i0 = threadIdx.x; i0 < n; i0 += NW * 32 * LU) {
    long long rr[LU];
#pragma unroll
    for (int u = 0; u < LU; ++u) {
      const int i = i0 + u * NW * 32;
      rr[u] = i < n ? static_cast<long long>(__ldg(ids + i)) : -1;
    }
#pragma unroll
    for (int u = 0; u < LU; ++u) {
      const int i = i0 + u * NW * 32;
      const long long r = rr[u];
      if (i < n) loc[i] = (r >= r0 && r < r0 + RB && r < V && r != padding_idx) ? static_cast<int>(r - r0) : -1;
    }
  }
  __syncthreads();
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int per = (n + NW - 1) / NW;
  const int b0 = w * per;
  const int b1 = b0 + per < n ? b0 + per : n;
  float* mine = part + w * RB * e_n;
  for (int base = b0; base < b1; base += 32) {
    const int l = base + lane < b1 ? loc[base + lane] : -1;
    unsigned m = __ballot_sync(0xffffffffu, l >= 0);
    while (m) {
      const int b = __ffs(m) - 1;
      m &= m - 1;
      const int r = __shfl_sync(0xffffffffu, l, b);
      const T* g = grad_out + static_cast<long long>(base + b) * E;
      float* dst = mine + r * e_n;
#pragma unroll 1  // unrolled, ptxas spilled 4 bytes at 32 registers
      for (int e = lane; e < e_n; e += 32) dst[e] += tw::to_float(g[e]);
    }
  }
  __syncthreads();
  for (int k = threadIdx.x; k < RB * e_n; k += NW * 32) {
    const int r = k / e_n;
    if (r0 + r >= V) break;  // k grows with r
    float s = 0.f;
#pragma unroll
    for (int ww = 0; ww < NW; ++ww) s += part[ww * RB * e_n + k];
    grad_weight[r0 * E + k] = tw::from_float<T>(s);
  }
}
