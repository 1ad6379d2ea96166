// reduce: sum / max / mean of x along one dimension (length R, stride rs), any strides; the other
// dimensions are walked through strided.cuh (row -> base offset). fp32 accumulation; mean = sum
// times scale (1 / R). Masked mean over padded sequences, forward and backward.
// tilewise-instantiate: reduce_v1_thread<float,rd::Sum> reduce_v1_thread<float,rd::Max> reduce_v1_thread<__half,rd::Sum> reduce_v1_thread<__nv_bfloat16,rd::Max>
// tilewise-instantiate: reduce_v2_smem<float,rd::Sum> reduce_v2_smem<float,rd::Max> reduce_v2_smem<__half,rd::Sum> reduce_v2_smem<__nv_bfloat16,rd::Max>
// tilewise-instantiate: reduce_v3_warp<float,rd::Sum> reduce_v3_warp<float,rd::Max> reduce_v3_warp<__half,rd::Sum> reduce_v3_warp<__nv_bfloat16,rd::Sum> reduce_v3_warp<__nv_bfloat16,rd::Max>
// tilewise-instantiate: reduce_v4_columns<float,rd::Sum> reduce_v4_columns<float,rd::Max> reduce_v4_columns<__half,rd::Sum> reduce_v4_columns<__nv_bfloat16,rd::Sum>
// tilewise-instantiate: reduce_v5_columns<float,rd::Sum,32,8,4,1> reduce_v5_columns<float,rd::Max,32,8,4,1> reduce_v5_columns<__half,rd::Sum,32,8,4,1> reduce_v5_columns<__nv_bfloat16,rd::Sum,32,8,4,1>
// tilewise-instantiate: reduce_finish<float,rd::Sum> reduce_finish<float,rd::Max> reduce_finish<__half,rd::Sum> reduce_finish<__nv_bfloat16,rd::Sum>
// tilewise-instantiate: masked_mean_fwd<float,i64> masked_mean_fwd<__half,i64> masked_mean_fwd<__nv_bfloat16,int> masked_mean_fwd<float,int>
// tilewise-instantiate: masked_mean_bwd<float,i64> masked_mean_bwd<__half,i64> masked_mean_bwd<__nv_bfloat16,int> masked_mean_bwd<float,int>
#include "tilewise_common.cuh"
#include "strided.cuh"

// One-token name for template arguments (the instantiate lines split on spaces).
using i64 = long long;

namespace rd {
struct Sum {
  static __device__ __forceinline__ float identity() { return 0.f; }
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
// NaN-propagating, as torch.amax.
struct Max {
  static __device__ __forceinline__ float identity() { return __int_as_float(0xff800000); }
  __device__ __forceinline__ float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
};
}  // namespace rd

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op()(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T, typename Op>
__device__ __forceinline__ float serial_row(const T* __restrict__ p, long long R, long long rs, long long start,
                                            long long step) {
  float acc = Op::identity();
  for (long long r = start; r < R; r += step) acc = Op()(acc, tw::to_float(p[r * rs]));
  return acc;
}

// v1_thread: one thread per output, a serial loop over the row. Coalesced only when neighbouring
// outputs are neighbours in memory (reducing a leading dim).
template <typename T, typename Op>
__global__ void __launch_bounds__(256) reduce_v1_thread(const T* __restrict__ x, T* __restrict__ out,
                                                        const long long* __restrict__ meta, long long R,
                                                        long long rs, float scale) {
  __shared__ tw::StridedLayout<1> s;
  const long long o = tw::load_layout_at(s, meta);
  if (o >= s.n) return;
  long long off[1];
  tw::broadcast_offsets(s, o, off);
  out[o] = tw::from_float<T>(serial_row<T, Op>(x + off[0], R, rs, 0, 1) * scale);
}

// v2_smem: one block per output row; threads stride the row, then a shared-memory tree.
template <typename T, typename Op>
__global__ void __launch_bounds__(256) reduce_v2_smem(const T* __restrict__ x, T* __restrict__ out,
                                                      const long long* __restrict__ meta, long long R,
                                                      long long rs, float scale) {
  __shared__ tw::StridedLayout<1> s;
  __shared__ float part[256];
  tw::load_layout(s, meta);
  for (long long o = blockIdx.x; o < s.n; o += gridDim.x) {
    long long off[1];
    tw::broadcast_offsets(s, o, off);
    part[threadIdx.x] = serial_row<T, Op>(x + off[0], R, rs, threadIdx.x, blockDim.x);
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) part[threadIdx.x] = Op()(part[threadIdx.x], part[threadIdx.x + w]);
      __syncthreads();
    }
    if (threadIdx.x == 0) out[o] = tw::from_float<T>(part[0] * scale);
    __syncthreads();  // part[] is reused by the next row
  }
}

// v3_warp: a group of `wpr` warps per row (8 / wpr rows per 256-thread block, so short rows still
// fill the block); 16-byte loads when the row is contiguous and aligned; warp shuffles, then one
// shared-memory step across the group's warps.
template <typename T, typename Op>
__global__ void __launch_bounds__(256) reduce_v3_warp(const T* __restrict__ x, T* __restrict__ out,
                                                      const long long* __restrict__ meta, long long R,
                                                      long long rs, float scale, int wpr) {
  using V = tw::Vec16<T>;
  __shared__ tw::StridedLayout<1> s;
  __shared__ float part[8];
  tw::load_layout(s, meta);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = warp / wpr, gw = warp % wpr;
  const int rows_per_block = 8 / wpr;
  const long long o = static_cast<long long>(blockIdx.x) * rows_per_block + group;
  float acc = Op::identity();
  if (o < s.n) {
    long long off[1];
    tw::broadcast_offsets(s, o, off);
    const T* p = x + off[0];
    const int t = gw * 32 + lane, nt = wpr * 32;
    if (rs == 1 && (reinterpret_cast<unsigned long long>(p) & 15) == 0) {
      const long long nvec = R / V::N;
      const uint4* p4 = reinterpret_cast<const uint4*>(p);
      long long i = t;
      for (; i + nt < nvec; i += 2 * nt) {  // two 16-byte loads in flight per thread
        V a, b;
        a.raw = __ldcs(p4 + i);
        b.raw = __ldcs(p4 + i + nt);
#pragma unroll
        for (int k = 0; k < V::N; ++k) acc = Op()(acc, Op()(tw::to_float(a.v[k]), tw::to_float(b.v[k])));
      }
      for (; i < nvec; i += nt) {
        V a;
        a.raw = __ldcs(p4 + i);
#pragma unroll
        for (int k = 0; k < V::N; ++k) acc = Op()(acc, tw::to_float(a.v[k]));
      }
      for (long long r = nvec * V::N + t; r < R; r += nt) acc = Op()(acc, tw::to_float(p[r]));
    } else {
      acc = serial_row<T, Op>(p, R, rs, t, nt);
    }
  }
  acc = warp_reduce<Op>(acc);
  if (wpr > 1) {
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (gw == 0 && lane == 0) {
      for (int w = 1; w < wpr; ++w) acc = Op()(acc, part[warp + w]);
    }
  }
  if (o < s.n && gw == 0 && lane == 0) out[o] = tw::from_float<T>(acc * scale);
}

// v4_columns: for rows whose neighbouring outputs are neighbours in memory (reducing a leading
// dim): a 32 x 8 block covers 32 adjacent outputs (coalesced 128-byte reads per warp) and splits
// the row 8 ways over threadIdx.y and gridDim.y ways over blocks, so enough loads are in flight;
// with gridDim.y > 1 the partials go to a float workspace [gridDim.y, n] that reduce_finish folds.
template <typename T, typename Op>
__global__ void __launch_bounds__(256) reduce_v4_columns(const T* __restrict__ x, T* __restrict__ out,
                                                         float* __restrict__ ws, const long long* __restrict__ meta,
                                                         long long R, long long rs, float scale) {
  __shared__ tw::StridedLayout<1> s;
  __shared__ float part[8][33];
  tw::load_layout(s, meta);
  const long long o = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x;
  const long long chunk = (R + gridDim.y - 1) / gridDim.y;
  const long long r0 = blockIdx.y * chunk, r1 = min(R, r0 + chunk);
  float acc = Op::identity();
  if (o < s.n) {
    long long off[1];
    tw::broadcast_offsets(s, o, off);
    const T* p = x + off[0];
    long long r = r0 + threadIdx.y;
    for (; r + 24 < r1; r += 32) {  // four independent loads per thread per step
      float a = tw::to_float(p[r * rs]), b = tw::to_float(p[(r + 8) * rs]);
      float c = tw::to_float(p[(r + 16) * rs]), d = tw::to_float(p[(r + 24) * rs]);
      acc = Op()(acc, Op()(Op()(a, b), Op()(c, d)));
    }
    for (; r < r1; r += 8) acc = Op()(acc, tw::to_float(p[r * rs]));
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < s.n) {
#pragma unroll
    for (int y = 1; y < 8; ++y) acc = Op()(acc, part[y][threadIdx.x]);
    if (gridDim.y == 1) out[o] = tw::from_float<T>(acc * scale);
    else ws[blockIdx.y * s.n + o] = acc;
  }
}

// v5_columns: v4's job with 16-byte loads and more bytes in flight. x is seen as (B, R, C) with
// strides (sb, rs, 1) (the host collapses the kept dims; C, sb, rs multiples of 16 / sizeof(T),
// 16-byte aligned base). Block (TX, TY) owns TX x N adjacent columns (N = 16 / sizeof(T), one
// 16-byte vector per thread: a warp reads TX x 16 contiguous bytes of a row) of one b, and a chunk
// of `chunk` rows (grid.y splits R); each thread walks its chunk TY rows apart with U vector loads
// in flight, N fp32 accumulators. The TY partials meet in shared memory ([TY][N][TX]: conflict-free
// stores); with grid.y > 1 each split writes its partial to the workspace [grid.y, B x C] and
// reduce_finish folds the splits in a fixed order (deterministic, no atomics).
// With `counters` non-null (ColumnsConfig fold="last"), the last split block of each column block
// to finish (an atomic count per grid.x block, reset by that block for the next launch) folds the
// partials itself, in split order, instead of a second kernel: one launch fewer, same result.
template <typename T, typename Op, int TX, int TY, int U, int MINB>
__global__ void __launch_bounds__(TX * TY, MINB) reduce_v5_columns(
    const T* __restrict__ x, T* __restrict__ out, float* __restrict__ ws, unsigned* __restrict__ counters,
    long long B, long long R, long long C, long long sb, long long rs, long long col_blocks, long long chunk,
    float scale) {
  using V = tw::Vec16<T>;
  constexpr int N = V::N;
  __shared__ float part[TY][N][TX];
  const long long bc = blockIdx.x % col_blocks, b = blockIdx.x / col_blocks;
  const long long c0 = (bc * TX + threadIdx.x) * N;
  const long long r0 = static_cast<long long>(blockIdx.y) * chunk;
  const long long r1 = min(R, r0 + chunk);
  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = Op::identity();
  if (c0 < C) {
    // A pointer that steps by TY rows (no 64-bit multiply per load); the tail loop is kept rolled
    // (unrolled, it cost ~30 registers for a handful of rows).
    long long r = r0 + threadIdx.y;
    const T* __restrict__ p = x + b * sb + c0 + r * rs;
    const long long step = TY * rs;
    for (; r + (U - 1) * TY < r1; r += U * TY, p += U * step) {
      V v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u].raw = *reinterpret_cast<const uint4*>(p + u * step);
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int k = 0; k < N; ++k) acc[k] = Op()(acc[k], tw::to_float(v[u].v[k]));
      }
    }
#pragma unroll 1
    for (; r < r1; r += TY, p += step) {
      V v;
      v.raw = *reinterpret_cast<const uint4*>(p);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] = Op()(acc[k], tw::to_float(v.v[k]));
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) part[threadIdx.y][k][threadIdx.x] = acc[k];
  __syncthreads();
  // Thread t folds the TY partials of the block's column t (and t + TX x TY ...): contiguous writes.
  const long long n = B * C;
#pragma unroll 1
  for (int o = threadIdx.y * TX + threadIdx.x; o < TX * N; o += TX * TY) {
    const int tx = o / N, k = o % N;
    float a = part[0][k][tx];
#pragma unroll
    for (int y = 1; y < TY; ++y) a = Op()(a, part[y][k][tx]);
    const long long c = bc * TX * N + o;
    if (c < C) {
      if (gridDim.y == 1) out[b * C + c] = tw::from_float<T>(a * scale);
      else ws[static_cast<long long>(blockIdx.y) * n + b * C + c] = a;
    }
  }
  if (gridDim.y == 1 || counters == nullptr) return;
  __shared__ bool last;
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
#pragma unroll 1
  for (int o = threadIdx.y * TX + threadIdx.x; o < TX * N; o += TX * TY) {
    const long long c = bc * TX * N + o;
    if (c >= C) continue;
    float a = Op::identity();
#pragma unroll 1
    for (unsigned k = 0; k < gridDim.y; ++k) a = Op()(a, __ldcg(ws + k * n + b * C + c));  // L2: written by other SMs
    out[b * C + c] = tw::from_float<T>(a * scale);
  }
  if (threadIdx.x == 0 && threadIdx.y == 0) counters[blockIdx.x] = 0;  // ready for the next launch
}

template <typename T, typename Op>
__global__ void __launch_bounds__(256) reduce_finish(const float* __restrict__ ws, T* __restrict__ out,
                                                     long long n, int splits, float scale) {
  const long long o = tw::global_thread_id();
  if (o >= n) return;
  float acc = Op::identity();
  for (int k = 0; k < splits; ++k) acc = Op()(acc, ws[k * n + o]);
  out[o] = tw::from_float<T>(acc * scale);
}

// Masked mean (mean pooling of padded sentences): out[b, e] = sum_{t < len[b]} x[b, t, e] / len[b]
// (0 when len[b] == 0; len[b] > T reads as T). One thread per (b, e): consecutive e coalesce.
template <typename T, typename L>
__global__ void __launch_bounds__(256) masked_mean_fwd(const T* __restrict__ x, const L* __restrict__ lengths,
                                                       T* __restrict__ out, long long B, long long Tn, long long E,
                                                       long long sb, long long st, long long se) {
  const long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long b = blockIdx.y;
  if (e >= E) return;
  long long len = static_cast<long long>(lengths[b]);
  len = len < 0 ? 0 : (len > Tn ? Tn : len);
  const T* p = x + b * sb + e * se;
  float acc = 0.f;
  for (long long t = 0; t < len; ++t) acc += tw::to_float(p[t * st]);
  out[b * E + e] = tw::from_float<T>(len ? acc / static_cast<float>(len) : 0.f);
}

// Backward: grad_x[b, t, e] = grad_out[b, e] / len[b] for t < len[b], else 0; grad_x contiguous.
template <typename T, typename L>
__global__ void __launch_bounds__(256) masked_mean_bwd(const T* __restrict__ g, const L* __restrict__ lengths,
                                                       T* __restrict__ gx, long long B, long long Tn, long long E,
                                                       long long sgb, long long sge) {
  const long long n = B * Tn * E;
  for (long long i = tw::global_thread_id(); i < n; i += tw::grid_threads()) {
    const long long e = i % E, bt = i / E, t = bt % Tn, b = bt / Tn;
    long long len = static_cast<long long>(lengths[b]);
    len = len < 0 ? 0 : (len > Tn ? Tn : len);
    gx[i] = tw::from_float<T>(t < len ? tw::to_float(g[b * sgb + e * sge]) / static_cast<float>(len) : 0.f);
  }
}
