// elementwise: map (unary) and zip (binary, broadcasting) over strided tensors, fp32 / fp16 / bf16
// computing in fp32; the op is a template functor so that each (op, dtype) is its own kernel with
// no run-time switch.
// tilewise-instantiate: map_v1_strided<float,ew::Neg> map_v1_strided<float,ew::Relu> map_v1_strided<float,ew::Exp> map_v1_strided<float,ew::Log> map_v1_strided<float,ew::Sigmoid> map_v1_strided<float,ew::Tanh> map_v1_strided<float,ew::Gelu> map_v1_strided<float,ew::Sin> map_v1_strided<float,ew::Cos>
// tilewise-instantiate: map_v2_contiguous<float,ew::Neg> map_v2_contiguous<float,ew::Relu> map_v2_contiguous<float,ew::Exp> map_v2_contiguous<float,ew::Log> map_v2_contiguous<float,ew::Sigmoid> map_v2_contiguous<float,ew::Tanh> map_v2_contiguous<float,ew::Gelu> map_v2_contiguous<float,ew::Sin> map_v2_contiguous<float,ew::Cos>
// tilewise-instantiate: map_v1_strided<__half,ew::Gelu> map_v2_contiguous<__half,ew::Gelu> map_v1_strided<__nv_bfloat16,ew::Gelu> map_v2_contiguous<__nv_bfloat16,ew::Gelu>
// tilewise-instantiate: zip_v1_strided<float,ew::Add> zip_v1_strided<float,ew::Sub> zip_v1_strided<float,ew::Mul> zip_v1_strided<float,ew::Div> zip_v1_strided<float,ew::Max> zip_v1_strided<float,ew::Pow> zip_v1_strided<float,ew::ReluBackward>
// tilewise-instantiate: zip_v2_contiguous<float,ew::Add> zip_v2_contiguous<float,ew::Sub> zip_v2_contiguous<float,ew::Mul> zip_v2_contiguous<float,ew::Div> zip_v2_contiguous<float,ew::Max> zip_v2_contiguous<float,ew::Pow> zip_v2_contiguous<float,ew::ReluBackward>
// tilewise-instantiate: zip_v1_strided<__half,ew::Pow> zip_v2_contiguous<__half,ew::Pow> zip_v1_strided<__nv_bfloat16,ew::Add> zip_v2_contiguous<__nv_bfloat16,ew::Add>
// tilewise-instantiate: divergence_v1_branch divergence_v2_select
// tilewise-instantiate: zip_v3_tiled<float,ew::Add> zip_v3_tiled<float,ew::Mul> zip_v3_tiled<__half,ew::Sub> zip_v3_tiled<__nv_bfloat16,ew::Max>
// tilewise-instantiate: map_v4_blocked<float,ew::Neg,1,256,1> map_v4_blocked<float,ew::Relu,1,256,1> map_v4_blocked<float,ew::Exp,2,128,12> map_v4_blocked<float,ew::Log,2,128,12> map_v4_blocked<float,ew::Sigmoid,2,128,12> map_v4_blocked<float,ew::Tanh,2,128,12> map_v4_blocked<float,ew::Gelu,2,128,12> map_v4_blocked<float,ew::Sin,2,128,12> map_v4_blocked<float,ew::Cos,2,128,12>
// tilewise-instantiate: zip_v4_blocked<float,ew::Add,1,128,1> zip_v4_blocked<float,ew::Sub,1,128,1> zip_v4_blocked<float,ew::Mul,1,128,1> zip_v4_blocked<float,ew::Div,1,128,1> zip_v4_blocked<float,ew::Max,1,128,1> zip_v4_blocked<float,ew::Pow,1,128,1> zip_v4_blocked<float,ew::ReluBackward,1,128,1>
// tilewise-instantiate: zip_v5_rows<float,ew::Add> zip_v5_rows<float,ew::Sub> zip_v5_rows<float,ew::Mul> zip_v5_rows<float,ew::Div> zip_v5_rows<float,ew::Max> zip_v5_rows<float,ew::Pow> zip_v5_rows<float,ew::ReluBackward>
// tilewise-instantiate: map_v4_blocked<__half,ew::Gelu,1,128,1> map_v4_blocked<__nv_bfloat16,ew::Gelu,1,128,1> zip_v4_blocked<__half,ew::Pow,1,128,1> zip_v4_blocked<__nv_bfloat16,ew::Add,1,128,1> zip_v5_rows<__half,ew::Pow> zip_v5_rows<__nv_bfloat16,ew::Add>
#include "tilewise_common.cuh"
#include "strided.cuh"
#include "contiguous.cuh"
#include "elementwise_ops.cuh"

// v1_strided: one thread per output element; each thread decomposes its flat index and reads
// every input through its strides (0 on broadcast dims). Output contiguous.
template <typename T, typename Op>
__global__ void __launch_bounds__(256) map_v1_strided(const T* __restrict__ x, T* __restrict__ out,
                                                      const long long* __restrict__ meta) {
  __shared__ tw::StridedLayout<1> s;
  const long long i = tw::load_layout_at(s, meta);
  if (i >= s.n) return;
  long long off[1];
  tw::broadcast_offsets(s, i, off);
  out[i] = tw::from_float<T>(Op()(tw::to_float(x[off[0]])));
}

template <typename T, typename Op>
__global__ void __launch_bounds__(256) zip_v1_strided(const T* __restrict__ a, const T* __restrict__ b,
                                                      T* __restrict__ out, const long long* __restrict__ meta) {
  __shared__ tw::StridedLayout<2> s;
  const long long i = tw::load_layout_at(s, meta);
  if (i >= s.n) return;
  long long off[2];
  tw::broadcast_offsets(s, i, off);
  out[i] = tw::from_float<T>(Op()(tw::to_float(a[off[0]]), tw::to_float(b[off[1]])));
}

// v2_contiguous (tw::apply_contiguous, contiguous.cuh): contiguous same-shape operands, 16-byte
// aligned: 16-byte loads and stores, a grid-stride loop over one resident wave, UNROLL independent
// vectors per operand in flight per thread (4 for map, 2 per operand for zip, fewer where
// ContiguousUnroll says); the n % (16 / sizeof(T)) tail element-wise. Plain loads and stores: the evict-first hints
// (ld.cs / st.cs) cost ~6 % on the H200 (docs/tuning/pointwise.md, "vector_add: one chunk per
// block, plain loads").
// Vectors in flight per thread in v2 where the default spills: NVRTC 13.0's ptxas spilled 8 bytes
// around fp32 sinf / cosf's range-reduction call at 4 map vectors and 4 bytes around the fp32
// division's slow path at 2 zip vectors (13.5 did not); at 2 and 1 neither does
// (docs/tuning/pointwise.md, "ContiguousUnroll").
template <typename Op, typename T, int DEFAULT> struct ContiguousUnroll { static constexpr int value = DEFAULT; };
template <> struct ContiguousUnroll<ew::Sin, float, 4> { static constexpr int value = 2; };
template <> struct ContiguousUnroll<ew::Cos, float, 4> { static constexpr int value = 2; };
template <> struct ContiguousUnroll<ew::Div, float, 2> { static constexpr int value = 1; };

template <typename T, typename Op>
__global__ void __launch_bounds__(256) map_v2_contiguous(const T* __restrict__ x, T* __restrict__ out,
                                                         long long n) {
  tw::apply_contiguous<ContiguousUnroll<Op, T, 4>::value>(Op(), out, n, x);
}

template <typename T, typename Op>
__global__ void __launch_bounds__(256) zip_v2_contiguous(const T* __restrict__ a, const T* __restrict__ b,
                                                         T* __restrict__ out, long long n) {
  tw::apply_contiguous<ContiguousUnroll<Op, T, 2>::value>(Op(), out, n, a, b);
}

// v3_tiled (zip over a 2-D collapsed layout R x C with a transposed operand): a 32 x 32 tile per
// block step, each input staged through shared memory in the orientation that makes its own
// reads coalesce (along rows when its row stride is the smaller non-zero one, e.g. a transposed
// input), then the output written row-wise. One padding column: no bank conflicts either way.
template <typename T>
__device__ __forceinline__ void load_tile(float (&tile)[32][33], const T* __restrict__ p, long long r0,
                                          long long c0, long long R, long long C, long long sr, long long sc) {
  const bool col_major = sr != 0 && (sc == 0 || sr < sc);
#pragma unroll
  for (int k = 0; k < 32; k += 8) {
    // (i, j): position in the tile; the fast thread index follows the input's fast dim.
    const int i = col_major ? threadIdx.x : threadIdx.y + k;
    const int j = col_major ? threadIdx.y + k : threadIdx.x;
    const long long r = r0 + i, c = c0 + j;
    if (r < R && c < C) tile[i][j] = tw::to_float(p[r * sr + c * sc]);
  }
}

template <typename T, typename Op>
__global__ void __launch_bounds__(256) zip_v3_tiled(const T* __restrict__ a, const T* __restrict__ b,
                                                    T* __restrict__ out, long long R, long long C,
                                                    long long sar, long long sac, long long sbr, long long sbc) {
  __shared__ float ta[32][33], tb[32][33];
  const long long tiles_c = (C + 31) / 32, tiles = ((R + 31) / 32) * tiles_c;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const long long r0 = (t / tiles_c) * 32, c0 = (t % tiles_c) * 32;
    load_tile(ta, a, r0, c0, R, C, sar, sac);
    load_tile(tb, b, r0, c0, R, C, sbr, sbc);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 32; k += 8) {
      const int i = threadIdx.y + k, j = threadIdx.x;
      const long long r = r0 + i, c = c0 + j;
      if (r < R && c < C) out[r * C + c] = tw::from_float<T>(Op()(ta[i][j], tb[i][j]));
    }
    __syncthreads();  // the tiles are refilled next step
  }
}

// v4_blocked: v2's 16-byte accesses without the grid-stride loop (vector_add v3_blocked's
// pattern): block k owns the contiguous chunk of 256 x UNROLL vectors starting at k x 256 x UNROLL,
// each thread UNROLL of them 256 apart (coalesced), all loads issued before the first use. The
// blocks in flight touch one window of memory; a grid-stride loop spreads the resident threads
// over the whole array (~5 % slower on vector_add). The last block does the scalar tail.
// Every block but the last skips the per-vector bounds checks ("full"); with them in every block
// ptxas put a 16-byte vector on the stack in some 2-byte kernels (bf16 Neg, fp16 Div).
// Template knobs (BlockedConfig in elementwise.py): UNROLL vectors per thread, NT threads per
// block, MINB the minimum resident blocks per SM asked of ptxas (a register cap: 1 = none); the
// template defaults are BlockedConfig()'s, the launched ones BLOCKED_DEFAULT's (docs/tuning/pointwise.md,
// "BLOCKED_DEFAULT"). The block's chunk is NT x UNROLL vectors.
// How many of a thread's UNROLL vectors map_v4_blocked loads before computing on them. fp32 Sigmoid at
// 8 spilled 40 bytes around the call to the division's slow path (ptxas, NVRTC 13.5); at 4 it does
// not. The block's chunk stays 256 x UNROLL vectors, so the host's grid does not depend on the op.
template <typename Op, typename T> struct BlockedBatch { static constexpr int value = 8; };
template <> struct BlockedBatch<ew::Sigmoid, float> { static constexpr int value = 4; };

template <typename T, typename Op, int UNROLL = 8, int NT = 256, int MINB = 1>
__global__ void __launch_bounds__(NT, MINB) map_v4_blocked(const T* __restrict__ x, T* __restrict__ out,
                                                           long long n) {
  using V = tw::Vec16<T>;
  constexpr int BATCH = BlockedBatch<Op, T>::value < UNROLL ? BlockedBatch<Op, T>::value : UNROLL;
  static_assert(UNROLL % BATCH == 0, "UNROLL must be a multiple of the batch");
  const long long nvec = n / V::N;
  const uint4* __restrict__ x4 = reinterpret_cast<const uint4*>(x);
  uint4* __restrict__ o4 = reinterpret_cast<uint4*>(out);
  const long long first = static_cast<long long>(blockIdx.x) * NT * UNROLL;
  const long long base = first + threadIdx.x;
  const Op op;
  const bool full = first + UNROLL * NT <= nvec;  // every block but the last
#pragma unroll
  for (int u0 = 0; u0 < UNROLL; u0 += BATCH) {
    V v[BATCH];
#pragma unroll
    for (int u = 0; u < BATCH; ++u) {
      const long long j = base + (u0 + u) * NT;
      if (full || j < nvec) v[u].raw = x4[j];
    }
#pragma unroll
    for (int u = 0; u < BATCH; ++u) {
      const long long j = base + (u0 + u) * NT;
      if (full || j < nvec) {
        V r;
#pragma unroll
        for (int k = 0; k < V::N; ++k) r.v[k] = tw::from_float<T>(op(tw::to_float(v[u].v[k])));
        o4[j] = r.raw;
      }
    }
  }
  if (blockIdx.x == gridDim.x - 1)
    for (long long j = nvec * V::N + threadIdx.x; j < n; j += NT)
      out[j] = tw::from_float<T>(op(tw::to_float(x[j])));
}

template <typename T, typename Op, int UNROLL = 8, int NT = 256, int MINB = 1>
__global__ void __launch_bounds__(NT, MINB) zip_v4_blocked(const T* __restrict__ a, const T* __restrict__ b,
                                                           T* __restrict__ out, long long n) {
  using V = tw::Vec16<T>;
  const long long nvec = n / V::N;
  const uint4* __restrict__ a4 = reinterpret_cast<const uint4*>(a);
  const uint4* __restrict__ b4 = reinterpret_cast<const uint4*>(b);
  uint4* __restrict__ o4 = reinterpret_cast<uint4*>(out);
  const long long first = static_cast<long long>(blockIdx.x) * NT * UNROLL;
  const long long base = first + threadIdx.x;
  const Op op;
  V x[UNROLL], y[UNROLL];
  const bool full = first + UNROLL * NT <= nvec;  // every block but the last
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const long long j = base + u * NT;
    if (full || j < nvec) {
      x[u].raw = a4[j];
      y[u].raw = b4[j];
    }
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const long long j = base + u * NT;
    if (full || j < nvec) {
      V r;
#pragma unroll
      for (int k = 0; k < V::N; ++k) r.v[k] = tw::from_float<T>(op(tw::to_float(x[u].v[k]), tw::to_float(y[u].v[k])));
      o4[j] = r.raw;
    }
  }
  if (blockIdx.x == gridDim.x - 1)
    for (long long j = nvec * V::N + threadIdx.x; j < n; j += NT)
      out[j] = tw::from_float<T>(op(tw::to_float(a[j]), tw::to_float(b[j])));
}

// v5_rows (zip over a 2-D collapsed layout R x C in which every operand walks a row with stride 1
// or 0: a bias row, a bias column, a scalar, rows with padding): no index division per element.
// Block (TX, TY) with TX x TY = 256: thread x owns one 16-byte column vector, thread y a row, and
// each thread ROWS rows TY apart, so one warp reads contiguous bytes of one row (or of 32 / TX
// neighbouring rows when rows are short). A stride-1 operand is read with 16-byte loads (the host
// checks that its start and row stride keep them aligned); a stride-0 operand (bias column,
// scalar) with one scalar load per row, splat; an operand with row stride 0 (bias row) is loaded
// once per thread and reused across its ROWS rows. The block index is split into (column block,
// row block) once per thread: grid.y (at most 65535) would not cover 2^26 rows of 4 elements.
template <typename T, int ROWS>
__device__ __forceinline__ void load_rows(tw::Vec16<T> (&v)[ROWS], const T* __restrict__ p, long long r0, int dy,
                                          long long R, bool full, long long cv, long long sr, long long sc) {
  using V = tw::Vec16<T>;
  if (sr == 0) {  // the same data for every row: one load (r0 may be past R; the address is not)
    if (sc != 0) v[0].raw = reinterpret_cast<const uint4*>(p)[cv];
    else {
      const T s = p[0];
#pragma unroll
      for (int k = 0; k < V::N; ++k) v[0].v[k] = s;
    }
#pragma unroll
    for (int u = 1; u < ROWS; ++u) v[u].raw = v[0].raw;
  } else if (sc != 0) {
#pragma unroll
    for (int u = 0; u < ROWS; ++u) {
      const long long r = r0 + static_cast<long long>(u) * dy;
      if (full || r < R) v[u].raw = reinterpret_cast<const uint4*>(p + r * sr)[cv];
    }
  } else {
#pragma unroll
    for (int u = 0; u < ROWS; ++u) {
      const long long r = r0 + static_cast<long long>(u) * dy;
      if (full || r < R) {
        const T s = p[r * sr];
#pragma unroll
        for (int k = 0; k < V::N; ++k) v[u].v[k] = s;
      }
    }
  }
}

template <typename T, typename Op>
__global__ void __launch_bounds__(256) zip_v5_rows(const T* __restrict__ a, const T* __restrict__ b,
                                                   T* __restrict__ out, long long R, long long C,
                                                   long long sar, long long sac, long long sbr, long long sbc) {
  using V = tw::Vec16<T>;
  constexpr int ROWS = 8;
  const long long CV = C / V::N;  // the host checks C % V::N == 0: output rows stay 16-byte aligned
  const unsigned gx = static_cast<unsigned>((CV + blockDim.x - 1) / blockDim.x);
  const unsigned bx = blockIdx.x % gx, by = blockIdx.x / gx;
  const long long cv = static_cast<long long>(bx) * blockDim.x + threadIdx.x;
  if (cv >= CV) return;  // no barrier below
  const long long rows_per_block = static_cast<long long>(blockDim.y) * ROWS;
  const long long r0 = by * rows_per_block + threadIdx.y;
  const bool full = (by + 1) * rows_per_block <= R;  // every row of this block exists: no checks
  const int dy = blockDim.y;
  V x[ROWS], y[ROWS];
  load_rows<T, ROWS>(x, a, r0, dy, R, full, cv, sar, sac);
  load_rows<T, ROWS>(y, b, r0, dy, R, full, cv, sbr, sbc);
  uint4* __restrict__ o4 = reinterpret_cast<uint4*>(out);
  const Op op;
#pragma unroll
  for (int u = 0; u < ROWS; ++u) {
    const long long r = r0 + static_cast<long long>(u) * dy;
    if (full || r < R) {
      V o;
#pragma unroll
      for (int k = 0; k < V::N; ++k) o.v[k] = tw::from_float<T>(op(tw::to_float(x[u].v[k]), tw::to_float(y[u].v[k])));
      o4[r * CV + cv] = o.raw;
    }
  }
}

// Warp divergence, measured: the same data-dependent choice between two equally long arithmetic
// chains, written as a branch (v1_branch: a warp whose lanes disagree runs both chains one after
// the other, its lanes masked) and branch-free (v2_select: every lane runs both chains and selects).
// On inputs whose sign is uniform per warp the branch costs one chain; split in every warp, two.
__device__ __forceinline__ float chain_pos(float v, int work) {
  for (int k = 0; k < work; ++k) v = fmaf(v, 0.999f, 0.5f);
  return v;
}
__device__ __forceinline__ float chain_neg(float v, int work) {
  for (int k = 0; k < work; ++k) v = fmaf(v, 0.998f, -0.25f);
  return v;
}

extern "C" __global__ void __launch_bounds__(256) divergence_v1_branch(const float* __restrict__ x,
                                                                      float* __restrict__ out, long long n,
                                                                      int work) {
  for (long long i = tw::global_thread_id(); i < n; i += tw::grid_threads()) {
    const float v = x[i];
    float r;
    if (v > 0.f) r = chain_pos(v, work);
    else r = chain_neg(v, work);
    out[i] = r;
  }
}

extern "C" __global__ void __launch_bounds__(256) divergence_v2_select(const float* __restrict__ x,
                                                                      float* __restrict__ out, long long n,
                                                                      int work) {
  for (long long i = tw::global_thread_id(); i < n; i += tw::grid_threads()) {
    const float v = x[i];
    const float p = chain_pos(v, work), q = chain_neg(v, work);
    out[i] = v > 0.f ? p : q;
  }
}
