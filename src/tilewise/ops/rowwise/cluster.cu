// tilewise-min-arch: sm_90
// Long rows (softmax, log-softmax, their backward, cross-entropy with its gradient) on sm_90 thread-block clusters:
// a row is split over the CL CTAs of one cluster, each CTA holds its slice in registers (CH 16-byte chunks a thread,
// kept packed), the row statistics are reduced in the block and then across the cluster through distributed shared
// memory, and the output is written from the registers. One read of the input and one write of the output: the bytes
// floor, where a single CTA (at most 64K 32-bit registers) cannot hold a 128k-element row and a two-pass kernel must
// read it twice.
// Layout: rows of unit stride, row starts and N a multiple of 16 bytes (the launcher checks). Columns of the CTA of
// cluster rank r: [r * L, min(N, (r + 1) * L)) with L = ceil(N / CL) rounded up to whole 16-byte vectors; chunk c of
// thread t holds the vector at c * NT + t (coalesced per chunk). Rows are walked by cluster id with a
// cluster-uniform stride, so the kernel is right whether the launch grid counts clusters or blocks.
// Cluster protocol per row: thread 0 writes the CTA's partials to shared memory; arrive/wait (release/acquire) makes
// them visible; every warp reads the CL partials (lane i from rank i) and combines them with shuffles; arrive (done
// reading the others' shared memory) ... compute and store ... wait: no CTA reuses or releases its partials while
// another may still read them.
// tilewise-instantiate: rc_softmax_fwd<__nv_bfloat16,2,256,8> rc_softmax_fwd<__nv_bfloat16,4,256,8> rc_softmax_fwd<__nv_bfloat16,8,256,8> rc_softmax_fwd<__nv_bfloat16,8,1024,4> rc_softmax_fwd<__nv_bfloat16,8,512,4>
// tilewise-instantiate: rc_softmax_fwd<__half,2,256,8> rc_softmax_fwd<__half,4,256,8> rc_softmax_fwd<__half,8,256,8> rc_softmax_fwd<__half,8,1024,4>
// tilewise-instantiate: rc_softmax_fwd<float,2,512,8> rc_softmax_fwd<float,4,512,8> rc_softmax_fwd<float,8,512,8> rc_softmax_fwd<float,8,1024,8> rc_softmax_fwd<float,8,1024,4>
// tilewise-instantiate: rc_softmax_bwd<__nv_bfloat16,2,256,8> rc_softmax_bwd<__nv_bfloat16,4,256,8> rc_softmax_bwd<__nv_bfloat16,8,256,8> rc_softmax_bwd<__nv_bfloat16,8,1024,4> rc_softmax_bwd<__nv_bfloat16,8,512,4>
// tilewise-instantiate: rc_softmax_bwd<__half,2,256,8> rc_softmax_bwd<__half,4,256,8> rc_softmax_bwd<__half,8,256,8> rc_softmax_bwd<__half,8,1024,4>
// tilewise-instantiate: rc_softmax_bwd<float,2,512,8> rc_softmax_bwd<float,4,512,8> rc_softmax_bwd<float,8,512,8> rc_softmax_bwd<float,8,1024,4>
// tilewise-instantiate: rc_cross_entropy<__nv_bfloat16,2,256,8> rc_cross_entropy<__nv_bfloat16,4,256,8> rc_cross_entropy<__nv_bfloat16,8,256,8> rc_cross_entropy<__nv_bfloat16,8,1024,4> rc_cross_entropy<__nv_bfloat16,8,512,4>
// tilewise-instantiate: rc_cross_entropy<__half,2,256,8> rc_cross_entropy<__half,4,256,8> rc_cross_entropy<__half,8,256,8> rc_cross_entropy<__half,8,1024,4>
// tilewise-instantiate: rc_cross_entropy<float,2,512,8> rc_cross_entropy<float,4,512,8> rc_cross_entropy<float,8,512,8> rc_cross_entropy<float,8,1024,8> rc_cross_entropy<float,8,1024,4>
// tilewise-instantiate: rc_softmax_fwd_pipe<__nv_bfloat16,2,256,8> rc_softmax_fwd_pipe<__nv_bfloat16,4,256,8> rc_softmax_fwd_pipe<__nv_bfloat16,8,256,8> rc_softmax_fwd_pipe<__nv_bfloat16,8,1024,4>
// tilewise-instantiate: rc_softmax_fwd_pipe<__half,2,256,8> rc_softmax_fwd_pipe<__half,4,256,8> rc_softmax_fwd_pipe<__half,8,256,8> rc_softmax_fwd_pipe<__half,8,1024,4>
// tilewise-instantiate: rc_softmax_fwd_pipe<float,2,512,8> rc_softmax_fwd_pipe<float,4,512,8> rc_softmax_fwd_pipe<float,8,512,8>
// tilewise-instantiate: rc_cross_entropy_pipe<__nv_bfloat16,2,256,8> rc_cross_entropy_pipe<__nv_bfloat16,4,256,8> rc_cross_entropy_pipe<__nv_bfloat16,8,256,8> rc_cross_entropy_pipe<__nv_bfloat16,8,1024,4>
// tilewise-instantiate: rc_cross_entropy_pipe<__half,2,256,8> rc_cross_entropy_pipe<__half,4,256,8> rc_cross_entropy_pipe<__half,8,256,8> rc_cross_entropy_pipe<__half,8,1024,4>
// tilewise-instantiate: rc_cross_entropy_pipe<float,2,512,8> rc_cross_entropy_pipe<float,4,512,8> rc_cross_entropy_pipe<float,8,512,8>
// tilewise-instantiate: rc_softmax_fwd<__nv_bfloat16,8,256,8,true> rc_cross_entropy<__nv_bfloat16,8,256,8,true> rc_softmax_fwd<float,8,512,8,true> rc_cross_entropy<float,8,512,8,true>
// tilewise-instantiate: rc_softmax_fwd_tma<__nv_bfloat16,8,256,8,2,3> rc_softmax_fwd_tma<__nv_bfloat16,8,256,8,1,4> rc_softmax_fwd_tma<__nv_bfloat16,8,256,8,2,4> rc_softmax_fwd_tma<__nv_bfloat16,8,512,4,1,3> rc_softmax_fwd_tma<__nv_bfloat16,8,512,4,2,3> rc_softmax_fwd_tma<__half,8,128,16,1,5> rc_cross_entropy_tma<__nv_bfloat16,8,128,16,1,5> rc_cross_entropy_tma<__half,8,128,16,1,5> rc_cross_entropy_tma<__nv_bfloat16,8,256,8,1,4> rc_softmax_fwd_tma<__nv_bfloat16,8,128,16,1,5>
#include "tilewise_common.cuh"

namespace rc {

constexpr float kLog2e = 1.4426950408889634f;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

using tw::cta_rank;
__device__ __forceinline__ unsigned cluster_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_count() {
  unsigned r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}
using tw::cluster_arrive;
using tw::cluster_wait;
using tw::load_remote;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Every thread gets the block's result; `red` (32 floats) is free again after the next barrier.
template <int NT>
__device__ __forceinline__ float block_max(float v, float* red) {
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < NT / 32 ? red[threadIdx.x & 31] : -INFINITY;
  return warp_max(v);
}
template <int NT>
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < NT / 32 ? red[threadIdx.x & 31] : 0.f;
  return warp_sum(v);
}

template <typename T>
struct Pack {
  static constexpr int V = 16 / sizeof(T);
  __device__ static __forceinline__ void unpack(const uint4& u, float (&f)[V]) {
    tw::Vec16<T> w;
    w.raw = u;
#pragma unroll
    for (int i = 0; i < V; ++i) f[i] = tw::to_float(w.v[i]);
  }
  __device__ static __forceinline__ uint4 pack(const float (&f)[V]) {
    tw::Vec16<T> w;
#pragma unroll
    for (int i = 0; i < V; ++i) w.v[i] = tw::from_float<T>(f[i]);
    return w.raw;
  }
};

// This CTA's column range of a row of N and the column of chunk c of this thread.
template <typename T, int CL, int NT>
struct Slice {
  long long c0, c1;
  __device__ Slice(long long N, unsigned rank) {
    constexpr int V = Pack<T>::V;
    const long long L = (N + (long long)CL * V - 1) / ((long long)CL * V) * V;
    c0 = rank * L;
    c1 = c0 + L < N ? c0 + L : N;
  }
  __device__ __forceinline__ long long col(int c) const {
    return c0 + ((long long)c * NT + threadIdx.x) * Pack<T>::V;
  }
};

// The largest of this thread's elements of the row, read through at(c) (-inf for none).
template <typename T, int CL, int NT, int CH, class At>
__device__ __forceinline__ float thread_max(const At& at, const Slice<T, CL, NT>& sl) {
  using P = Pack<T>;
  float m = -INFINITY;
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    if (sl.col(c) < sl.c1) {
      float f[P::V];
      P::unpack(at(c), f);
#pragma unroll
      for (int i = 0; i < P::V; ++i) m = fmaxf(m, f[i]);
    }
  }
  return m;
}

// The row's max Mx (Ms = Mx log2 e, 0 for an all -inf row) and sum of exp(x - Mx), from each
// lane's CTA partial (pm: the CTA's max, ps: its sum of exp(x - pm); lanes past CL hold -inf, 0).
__device__ __forceinline__ void combine(float pm, float ps, float& Mx, float& Ms, float& S) {
  Mx = warp_max(pm);
  Ms = Mx == -INFINITY ? 0.f : Mx * kLog2e;
  S = warp_sum(pm == -INFINITY ? 0.f : ps * exp2f(fmaf(pm, kLog2e, -Ms)));
}

// One row of (log-)softmax over this thread's CH vectors, read through at(c) (registers in v5, shared memory in v6):
// block then cluster reductions, then the thread's outputs written to yr. The caller ends the row with
// cluster_wait() (nobody may reuse `part` while a peer reads it).
// X1: one exp an element instead of two (softmax only): the sum pass stores exp(x - block max) back over x, packed
// in T, and the output multiplies it by one per-thread factor; for 2-byte T that rounds e to T before the multiply
// (within the output's own rounding). The exp unit (16 a clock an SM) otherwise does 2 x 5.4e8 exps at 4096 x
// 131072, half the time the bytes take (docs/tuning/rowwise.md, "One exp an element").
template <typename T, int CL, int NT, int CH, bool X1, class At>
__device__ __forceinline__ void softmax_row(const At& at, const Slice<T, CL, NT>& sl, T* yr, int log,
                                            float* red_a, float* red_b, float* part) {
  using P = Pack<T>;
  constexpr int V = P::V;
  float m = block_max<NT>(thread_max<T, CL, NT, CH>(at, sl), red_a);
  const float ms = m == -INFINITY ? 0.f : m * kLog2e;
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    if (sl.col(c) < sl.c1) {
      float f[V];
      P::unpack(at(c), f);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        f[i] = exp2f(fmaf(f[i], kLog2e, -ms));
        s += f[i];
      }
      if (X1 && !log) at(c) = P::pack(f);
    }
  }
  s = block_sum<NT>(s, red_b);
  if (threadIdx.x == 0) {
    part[0] = m;
    part[1] = s;
  }
  cluster_arrive();
  cluster_wait();
  const unsigned lane = threadIdx.x & 31;
  const float pm = lane < CL ? load_remote(&part[0], lane) : -INFINITY;
  const float ps = lane < CL ? load_remote(&part[1], lane) : 0.f;
  cluster_arrive();
  float Mx, Ms, S;
  combine(pm, ps, Mx, Ms, S);
  const float inv = S > 0.f ? 1.f / S : 0.f;
  const float lse = (Mx == -INFINITY ? 0.f : Mx) + logf(S);
  const float rescale = m == -INFINITY ? 0.f : exp2f(ms - Ms) * inv;  // X1: block-max e -> output
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    const long long col = sl.col(c);
    if (col < sl.c1) {
      float f[V];
      P::unpack(at(c), f);
#pragma unroll
      for (int i = 0; i < V; ++i)
        f[i] = log ? (S > 0.f ? f[i] - lse : -INFINITY)
                   : X1 ? f[i] * rescale : exp2f(fmaf(f[i], kLog2e, -Ms)) * inv;
      __stcs(reinterpret_cast<uint4*>(yr + col), P::pack(f));
    }
  }
}

// One row of cross-entropy (see rc_cross_entropy) over this thread's vectors read through at(c);
// the caller ends the row with cluster_wait().
template <typename T, int CL, int NT, int CH, bool X1, class At>
__device__ __forceinline__ void ce_row(const At& at, const Slice<T, CL, NT>& sl, unsigned rank, const T* xr,
                                       long long t, long long ignore_index, float* loss_row, T* dr, long long N,
                                       float smoothing, float grad_scale, int grad, float* red_a,
                                       float* red_b, float* red_c, float* part) {
  using P = Pack<T>;
  constexpr int V = P::V;
  const bool valid = t != ignore_index;
  const bool smooth = smoothing > 0.f;
  float m = block_max<NT>(thread_max<T, CL, NT, CH>(at, sl), red_a);
  const float ms = m == -INFINITY ? 0.f : m * kLog2e;
  float s = 0.f, sxv = 0.f;
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    if (sl.col(c) < sl.c1) {
      float f[V];
      P::unpack(at(c), f);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        sxv += f[i];
        f[i] = exp2f(fmaf(f[i], kLog2e, -ms));
        s += f[i];
      }
      if (X1) at(c) = P::pack(f);
    }
  }
  s = block_sum<NT>(s, red_b);
  if (smooth) sxv = block_sum<NT>(sxv, red_c);
  if (threadIdx.x == 0) {
    part[0] = m;
    part[1] = s;
    part[2] = sxv;
  }
  cluster_arrive();
  cluster_wait();
  const unsigned lane = threadIdx.x & 31;
  const float pm = lane < CL ? load_remote(&part[0], lane) : -INFINITY;
  const float ps = lane < CL ? load_remote(&part[1], lane) : 0.f;
  const float px = lane < CL && smooth ? load_remote(&part[2], lane) : 0.f;
  cluster_arrive();
  float Mx, Ms, S;
  combine(pm, ps, Mx, Ms, S);
  const float Mz = Mx == -INFINITY ? 0.f : Mx;
  const float SX = smooth ? warp_sum(px) : 0.f;
  if (rank == 0 && threadIdx.x == 0) {
    float l = 0.f;
    if (valid) l = Mz + logf(S) - (1.f - smoothing) * tw::to_float(xr[t]) - smoothing / (float)N * SX;
    *loss_row = l;
  }
  if (grad) {
    const float inv = valid && S > 0.f ? grad_scale / S : 0.f;
    const float hit = valid ? (1.f - smoothing) * grad_scale : 0.f;
    const float off = valid ? smoothing / (float)N * grad_scale : 0.f;
    const float rescale = m == -INFINITY ? 0.f : exp2f(ms - Ms) * inv;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const long long col = sl.col(c);
      if (col < sl.c1) {
        float f[V];
        P::unpack(at(c), f);
#pragma unroll
        for (int i = 0; i < V; ++i)
          f[i] = (X1 ? f[i] * rescale : exp2f(fmaf(f[i], kLog2e, -Ms)) * inv) - (col + i == t ? hit : 0.f) - off;
        __stcs(reinterpret_cast<uint4*>(dr + col), P::pack(f));
      }
    }
  }
}

}  // namespace rc

// y = softmax(x) (log_softmax when log != 0) along rows of N.
template <typename T, int CL, int NT, int CH, bool X1 = false>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT)
rc_softmax_fwd(const T* __restrict__ x, T* __restrict__ y, long long M, long long N, long long sx,
               long long sy, int log) {
  __shared__ float red_a[32], red_b[32];
  __shared__ float part[2];
  const rc::Slice<T, CL, NT> sl(N, rc::cta_rank());
  for (long long row = rc::cluster_id(); row < M; row += rc::cluster_count()) {
    const T* xr = x + row * sx;
    uint4 buf[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const long long col = sl.col(c);
      if (col < sl.c1) buf[c] = __ldcs(reinterpret_cast<const uint4*>(xr + col));
    }
    rc::softmax_row<T, CL, NT, CH, X1>([&](int c) -> uint4& { return buf[c]; }, sl, y + row * sy, log, red_a, red_b, part);
    rc::cluster_wait();
  }
}

// dx = y * (dy - sum(y * dy)) (softmax) or dx = dy - exp(y) * sum(dy) (log_softmax, y = log-probs).
template <typename T, int CL, int NT, int CH>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT)
rc_softmax_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, long long M,
               long long N, long long sy, long long sdy, long long sdx, int log) {
  using P = rc::Pack<T>;
  constexpr int V = P::V;
  __shared__ float red[32];
  __shared__ float part[1];
  const unsigned rank = rc::cta_rank();
  const rc::Slice<T, CL, NT> sl(N, rank);
  for (long long row = rc::cluster_id(); row < M; row += rc::cluster_count()) {
    const T* yr = y + row * sy;
    const T* gr = dy + row * sdy;
    uint4 yb[CH], gb[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const long long col = sl.col(c);
      if (col < sl.c1) {
        yb[c] = __ldcs(reinterpret_cast<const uint4*>(yr + col));
        gb[c] = __ldcs(reinterpret_cast<const uint4*>(gr + col));
      }
    }
    float d = 0.f;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      if (sl.col(c) < sl.c1) {
        float fy[V], fg[V];
        P::unpack(yb[c], fy);
        P::unpack(gb[c], fg);
#pragma unroll
        for (int i = 0; i < V; ++i) d += log ? fg[i] : fy[i] * fg[i];
      }
    }
    d = rc::block_sum<NT>(d, red);
    if (threadIdx.x == 0) part[0] = d;
    rc::cluster_arrive();
    rc::cluster_wait();
    const unsigned lane = threadIdx.x & 31;
    const float pd = lane < CL ? rc::load_remote(&part[0], lane) : 0.f;
    rc::cluster_arrive();
    const float D = rc::warp_sum(pd);
    T* dr = dx + row * sdx;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const long long col = sl.col(c);
      if (col < sl.c1) {
        float fy[V], fg[V];
        P::unpack(yb[c], fy);
        P::unpack(gb[c], fg);
#pragma unroll
        for (int i = 0; i < V; ++i)
          fy[i] = log ? fg[i] - exp2f(fy[i] * rc::kLog2e) * D : fy[i] * (fg[i] - D);
        __stcs(reinterpret_cast<uint4*>(dr + col), P::pack(fy));
      }
    }
    rc::cluster_wait();
  }
}

// Cross-entropy of each row of logits against target[row] (int64; ignore_index rows give loss 0
// and gradient 0), label smoothing e: loss = lse - (1 - e) x_t - (e / N) sum_j x_j; with grad != 0
// also dx = (softmax(x) - (1 - e) [j == t] - e / N) * grad_scale, written from the registers.
template <typename T, int CL, int NT, int CH, bool X1 = false>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT)
rc_cross_entropy(const T* __restrict__ x, const long long* __restrict__ target, float* __restrict__ loss,
                 T* __restrict__ dx, long long M, long long N, long long sx, long long sdx,
                 long long ignore_index, float smoothing, float grad_scale, const float* __restrict__ scale_dev,
                 int grad) {
  __shared__ float red_a[32], red_b[32], red_c[32];
  __shared__ float part[3];
  const unsigned rank = rc::cta_rank();
  const rc::Slice<T, CL, NT> sl(N, rank);
  for (long long row = rc::cluster_id(); row < M; row += rc::cluster_count()) {
    const T* xr = x + row * sx;
    uint4 buf[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const long long col = sl.col(c);
      // plain caching: the loss reads x[t] back from L2
      if (col < sl.c1) buf[c] = __ldg(reinterpret_cast<const uint4*>(xr + col));
    }
    // scale_dev: a device scalar multiplying grad_scale (1 / rows that count, for 'mean', known only
    // on the device when the targets are checked there), or null. Read a row at a time: a value
    // live across the whole loop cost the fp32 8 x 512 x 8 kernel a spill.
    const float gs = scale_dev != nullptr ? grad_scale * __ldg(scale_dev) : grad_scale;
    rc::ce_row<T, CL, NT, CH, X1>([&](int c) -> uint4& { return buf[c]; }, sl, rank, xr, target[row], ignore_index,
                              loss + row, dx + row * sdx, N, smoothing, gs, grad, red_a, red_b,
                              red_c, part);
    rc::cluster_wait();
  }
}

// ---------------------------------------------------------------------------------------------
// Pipelined versions (v6): a persistent grid of clusters walks the rows; each thread copies its
// 16-byte vectors of the NEXT row into shared memory with cp.async (double buffer: 2 x CH x NT x
// 16 bytes) before working on the current one, so loads stay in flight through the reductions,
// the cluster barriers and the stores that left the memory system idle in v5 (one row per
// cluster, registers only). Each thread reads back only the vectors it copied itself, so
// cp.async.wait_group alone orders them (no block barrier on the data).

namespace rc {
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

template <typename T, int CL, int NT, int CH>
__device__ __forceinline__ void issue_row(uint4* buf, const T* row, const Slice<T, CL, NT>& sl) {
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    const long long col = sl.col(c);
    if (col < sl.c1) cp_async16(&buf[c * NT + threadIdx.x], row + col);
  }
}
}  // namespace rc

template <typename T, int CL, int NT, int CH, bool X1 = false>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT)
rc_softmax_fwd_pipe(const T* __restrict__ x, T* __restrict__ y, long long M, long long N, long long sx,
                    long long sy, int log) {
  extern __shared__ uint4 sbuf[];  // [2][CH][NT]
  __shared__ float red_a[32], red_b[32];
  __shared__ float part[2];
  const rc::Slice<T, CL, NT> sl(N, rc::cta_rank());
  const long long step = rc::cluster_count();
  long long row = rc::cluster_id();
  int cur = 0;
  if (row < M) rc::issue_row<T, CL, NT, CH>(sbuf, x + row * sx, sl);
  rc::cp_async_commit();
  for (; row < M; row += step) {
    if (row + step < M) rc::issue_row<T, CL, NT, CH>(sbuf + (cur ^ 1) * CH * NT, x + (row + step) * sx, sl);
    rc::cp_async_commit();
    rc::cp_async_wait<1>();  // this row's copies (all groups but the newest) have landed
    uint4* buf = sbuf + cur * CH * NT;
    rc::softmax_row<T, CL, NT, CH, X1>([&](int c) -> uint4& { return buf[c * NT + threadIdx.x]; }, sl, y + row * sy, log,
                                   red_a, red_b, part);
    rc::cluster_wait();
    cur ^= 1;
  }
  rc::cp_async_wait<0>();
}

template <typename T, int CL, int NT, int CH, bool X1 = false>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT)
rc_cross_entropy_pipe(const T* __restrict__ x, const long long* __restrict__ target, float* __restrict__ loss,
                      T* __restrict__ dx, long long M, long long N, long long sx, long long sdx,
                      long long ignore_index, float smoothing, float grad_scale,
                      const float* __restrict__ scale_dev, int grad) {
  extern __shared__ uint4 sbuf[];  // [2][CH][NT]
  __shared__ float red_a[32], red_b[32], red_c[32];
  __shared__ float part[3];
  const unsigned rank = rc::cta_rank();
  const rc::Slice<T, CL, NT> sl(N, rank);
  const long long step = rc::cluster_count();
  long long row = rc::cluster_id();
  int cur = 0;
  if (row < M) rc::issue_row<T, CL, NT, CH>(sbuf, x + row * sx, sl);
  rc::cp_async_commit();
  for (; row < M; row += step) {
    if (row + step < M) rc::issue_row<T, CL, NT, CH>(sbuf + (cur ^ 1) * CH * NT, x + (row + step) * sx, sl);
    rc::cp_async_commit();
    const long long t = target[row];
    rc::cp_async_wait<1>();
    uint4* buf = sbuf + cur * CH * NT;
    const float gs = scale_dev != nullptr ? grad_scale * __ldg(scale_dev) : grad_scale;  // as rc_cross_entropy
    rc::ce_row<T, CL, NT, CH, X1>([&](int c) -> uint4& { return buf[c * NT + threadIdx.x]; }, sl, rank, x + row * sx, t,
                              ignore_index, loss + row, dx + row * sdx, N, smoothing, gs, grad,
                              red_a, red_b, red_c, part);
    rc::cluster_wait();
    cur ^= 1;
  }
  rc::cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------------
// TMA-pipelined versions (v7): a persistent grid of clusters walks the rows; each CTA's slice of
// a row is one contiguous run of bytes, so ONE thread fetches it with a single bulk copy
// (cp.async.bulk, the TMA engine) into one of S shared-memory stages, completing on an mbarrier.
// The copies of the next S - 1 rows are in flight while the threads work on the current one, so
// DRAM keeps streaming through the exp pass, the reductions and the cluster barrier that left v5's
// memory pipe idle (and v6's per-thread cp.async cost an instruction per 16 bytes).
// Per row, one cluster barrier: every warp reduces its threads' (max, sum of exp(x - max)) pairs
// and leaves one pair in shared memory (double-buffered by row parity); after barrier.cluster
// every warp reads all CL x NT/32 pairs through distributed shared memory and combines them. The
// barrier also tells thread 0 that every thread of its CTA has copied the stage into registers, so
// it refills that stage with the row S steps ahead at once. Each thread keeps exp(x - its own
// max) packed in T (one exp an element) and multiplies by exp(own max - row max) / row sum.
// Configurations and their measurements: docs/tuning/rowwise.md, "TMA configs".

namespace rc {
__device__ __forceinline__ __half __low2half_or_bf16(__half2 a) { return __low2half(a); }
__device__ __forceinline__ __half __high2half_or_bf16(__half2 a) { return __high2half(a); }
__device__ __forceinline__ __nv_bfloat16 __low2half_or_bf16(__nv_bfloat162 a) { return __low2bfloat16(a); }
__device__ __forceinline__ __nv_bfloat16 __high2half_or_bf16(__nv_bfloat162 a) { return __high2bfloat16(a); }
using tw::mbar_expect_tx;
using tw::mbar_init;
using tw::mbar_wait;
using tw::smem_addr;
// bytes (a multiple of 16) from global src (16-byte aligned) into this CTA's shared dst, completing on bar.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ float4 load_remote4(const float4* p, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
__device__ __forceinline__ float2 load_remote2(const float2* p, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
  return v;
}
// Combine (max, sum of exp(x - max)) pairs across a warp; m == -inf marks an empty pair.
__device__ __forceinline__ void warp_combine(float& m, float& s) {
  const float M = warp_max(m);
  s = m == -INFINITY ? 0.f : s * exp2f((m - M) * kLog2e);
  s = warp_sum(s);
  m = M;
}

template <typename T> struct Pair;
template <> struct Pair<__half> { using type = __half2; static constexpr unsigned kNegInf2 = 0xFC00FC00u; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; static constexpr unsigned kNegInf2 = 0xFF80FF80u; };
template <> struct Pair<float> { using type = float; static constexpr unsigned kNegInf2 = 0u; };

// The largest of this thread's CH vectors (-inf for none); 2-byte types by paired max
// instructions on the packed values (exact: a max only picks one of its inputs; NaN is skipped as
// by fmaxf), half the instructions of unpacking every element first.
template <typename T, int CL, int NT, int CH>
__device__ __forceinline__ float packed_max(const uint4 (&buf)[CH], const Slice<T, CL, NT>& sl) {
  if constexpr (sizeof(T) == 2) {
    using T2 = typename Pair<T>::type;
    const unsigned ninf = Pair<T>::kNegInf2;
    unsigned acc = ninf;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      if (sl.col(c) < sl.c1) {
        const unsigned w[4] = {buf[c].x, buf[c].y, buf[c].z, buf[c].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          T2 a = *reinterpret_cast<const T2*>(&acc), b = *reinterpret_cast<const T2*>(&w[i]);
          a = __hmax2(a, b);
          acc = *reinterpret_cast<unsigned*>(&a);
        }
      }
    }
    const T2 a = *reinterpret_cast<const T2*>(&acc);
    return fmaxf(tw::to_float(__low2half_or_bf16(a)), tw::to_float(__high2half_or_bf16(a)));
  } else {
    float m = -INFINITY;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      if (sl.col(c) < sl.c1) {
        float f[Pack<T>::V];
        Pack<T>::unpack(buf[c], f);
#pragma unroll
        for (int i = 0; i < Pack<T>::V; ++i) m = fmaxf(m, f[i]);
      }
    }
    return m;
  }
}

// The pipeline of one CTA: S stages of its row slice, filled by bulk copies (thread 0 issues).
template <typename T, int CL, int NT, int CH, int S>
struct TmaRows {
  uint4* stage;                 // [S][CH * NT] vectors, dynamic shared memory
  unsigned long long* full;     // [S] mbarriers
  unsigned bytes;               // this CTA's slice of a row (0: nothing to fetch or wait for)
  long long c0;
  // The pipeline over this CTA's slice sl of each row.
  __device__ static TmaRows over(uint4* stage, unsigned long long* full, const Slice<T, CL, NT>& sl) {
    const long long n_mine = sl.c1 > sl.c0 ? sl.c1 - sl.c0 : 0;
    return TmaRows{stage, full, static_cast<unsigned>(n_mine * sizeof(T)), sl.c0};
  }
  __device__ void fetch(int s, const T* row) const {
    if (threadIdx.x == 0 && bytes) {
      mbar_expect_tx(smem_addr(&full[s]), bytes);
      bulk_load(stage + s * CH * NT, row + c0, bytes, &full[s]);
    }
  }
  __device__ void wait(int s, unsigned phase) const {
    if (bytes) mbar_wait(smem_addr(&full[s]), phase);
  }
  // Barriers initialised (and made visible to the copy engine), then the first S rows of this
  // cluster's rows first, first + step, ... (< M) requested.
  __device__ void start(long long first, long long step, long long M, const T* x, long long sx) const {
    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < S; ++s) mbar_init(smem_addr(&full[s]), 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < S; ++s)
      if (first + s * step < M) fetch(s, x + (first + s * step) * sx);
  }
  // The it-th row's slice, once arrived in stage s = it % S, into this thread's registers.
  __device__ void take(int s, int it, uint4 (&buf)[CH], const Slice<T, CL, NT>& sl) const {
    wait(s, static_cast<unsigned>(it / S) & 1u);
    const uint4* st = stage + s * CH * NT;
#pragma unroll
    for (int c = 0; c < CH; ++c)
      if (sl.col(c) < sl.c1) buf[c] = st[c * NT + threadIdx.x];
  }
};

// (pm, ps) <- the running (max, sum of exp(x - max)) merged with another pair (xm, xs); either
// max may be -inf (no elements).
__device__ __forceinline__ void merge(float& pm, float& ps, float xm, float xs) {
  const float Mx = fmaxf(pm, xm);
  ps = (pm == -INFINITY ? 0.f : ps * exp2f((pm - Mx) * kLog2e)) +
       (xm == -INFINITY ? 0.f : xs * exp2f((xm - Mx) * kLog2e));
  pm = Mx;
}
}  // namespace rc

template <typename T, int CL, int NT, int CH, int S, int MINB>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, MINB)
rc_softmax_fwd_tma(const T* __restrict__ x, T* __restrict__ y, long long M, long long N, long long sx,
                   long long sy, int log) {
  using P = rc::Pack<T>;
  constexpr int V = P::V;
  constexpr int NW = NT / 32;
  extern __shared__ __align__(128) uint4 tma_stage[];  // [S][CH][NT]
  __shared__ __align__(8) unsigned long long full[S];
  __shared__ float2 part[2][NW];
  const unsigned rank = rc::cta_rank();
  const rc::Slice<T, CL, NT> sl(N, rank);
  const auto pipe = rc::TmaRows<T, CL, NT, CH, S>::over(tma_stage, full, sl);
  const long long step = rc::cluster_count();
  const long long first = rc::cluster_id();
  pipe.start(first, step, M, x, sx);
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int it = 0;
  for (long long row = first; row < M; row += step, ++it) {
    const int s = it % S;
    uint4 buf[CH];
    pipe.take(s, it, buf, sl);
    // This thread's max and sum of exp(x - max); softmax keeps the exps in place of x.
    const float m = rc::packed_max<T, CL, NT, CH>(buf, sl);
    const float ms = m == -INFINITY ? 0.f : m * rc::kLog2e;
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      if (sl.col(c) < sl.c1) {
        float f[V];
        P::unpack(buf[c], f);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          f[i] = exp2f(fmaf(f[i], rc::kLog2e, -ms));
          sum += f[i];
        }
        if (!log) buf[c] = P::pack(f);
      }
    }
    float wm = m, ws = sum;
    rc::warp_combine(wm, ws);
    if (lane == 0) part[it & 1][warp] = make_float2(wm, ws);
    rc::cluster_arrive();
    rc::cluster_wait();
    // Every thread of this CTA holds its part of stage s in registers: refill it.
    if (row + S * step < M) pipe.fetch(s, x + (row + S * step) * sx);
    float pm = -INFINITY, ps = 0.f;
#pragma unroll
    for (int k = 0; k < (CL * NW + 31) / 32; ++k) {  // lane takes pairs lane, lane + 32, ...
      const int idx = lane + 32 * k;
      if (idx < CL * NW) {
        const float2 p = rc::load_remote2(&part[it & 1][idx % NW], idx / NW);
        rc::merge(pm, ps, p.x, p.y);
      }
    }
    rc::warp_combine(pm, ps);  // the row's max and sum
    T* yr = y + row * sy;
    const float lse = (pm == -INFINITY ? 0.f : pm) + logf(ps);
    const float rescale = m == -INFINITY || !(ps > 0.f) ? 0.f : exp2f((m - pm) * rc::kLog2e) / ps;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const long long col = sl.col(c);
      if (col < sl.c1) {
        float f[V];
        P::unpack(buf[c], f);
#pragma unroll
        for (int i = 0; i < V; ++i) f[i] = log ? (ps > 0.f ? f[i] - lse : -INFINITY) : f[i] * rescale;
        __stcs(reinterpret_cast<uint4*>(yr + col), P::pack(f));
      }
    }
  }
  // No CTA leaves while a peer may still read its partials.
  rc::cluster_arrive();
  rc::cluster_wait();
}

// Cross-entropy with its gradient on the v7 pipeline (as rc_cross_entropy: loss[row] and, with
// grad != 0, dx = (softmax(x) - (1 - e) [j == t] - e / N) * grad_scale): the row's slice arrives
// by one bulk copy; each warp leaves (max, sum of exp(x - max), sum of x) in shared memory; one
// cluster barrier; every warp combines all CL x NT/32 triples through distributed shared memory.
template <typename T, int CL, int NT, int CH, int S, int MINB>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, MINB)
rc_cross_entropy_tma(const T* __restrict__ x, const long long* __restrict__ target, float* __restrict__ loss,
                     T* __restrict__ dx, long long M, long long N, long long sx, long long sdx,
                     long long ignore_index, float smoothing, float grad_scale,
                     const float* __restrict__ scale_dev, int grad) {
  using P = rc::Pack<T>;
  constexpr int V = P::V;
  constexpr int NW = NT / 32;
  extern __shared__ __align__(128) uint4 tma_stage[];  // [S][CH][NT]
  __shared__ __align__(8) unsigned long long full[S];
  __shared__ float4 part[2][NW];
  const unsigned rank = rc::cta_rank();
  const rc::Slice<T, CL, NT> sl(N, rank);
  const auto pipe = rc::TmaRows<T, CL, NT, CH, S>::over(tma_stage, full, sl);
  const long long step = rc::cluster_count();
  const long long first = rc::cluster_id();
  const bool smooth = smoothing > 0.f;
  pipe.start(first, step, M, x, sx);
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int it = 0;
  for (long long row = first; row < M; row += step, ++it) {
    const int s = it % S;
    const long long t = target[row];
    const bool valid = t != ignore_index;
    // Read before the cluster barrier: dx may be x itself (linear_cross_entropy), written only after it.
    const float xt = rank == 0 && threadIdx.x == 0 && valid ? tw::to_float(x[row * sx + t]) : 0.f;
    uint4 buf[CH];
    pipe.take(s, it, buf, sl);
    const float m = rc::packed_max<T, CL, NT, CH>(buf, sl);
    const float ms = m == -INFINITY ? 0.f : m * rc::kLog2e;
    float sum = 0.f, sxv = 0.f;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      if (sl.col(c) < sl.c1) {
        float f[V];
        P::unpack(buf[c], f);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          sxv += f[i];
          f[i] = exp2f(fmaf(f[i], rc::kLog2e, -ms));
          sum += f[i];
        }
        buf[c] = P::pack(f);
      }
    }
    float wm = m, ws = sum;
    rc::warp_combine(wm, ws);
    const float wx = smooth ? rc::warp_sum(sxv) : 0.f;
    if (lane == 0) part[it & 1][warp] = make_float4(wm, ws, wx, 0.f);
    rc::cluster_arrive();
    rc::cluster_wait();
    if (row + S * step < M) pipe.fetch(s, x + (row + S * step) * sx);
    float pm = -INFINITY, ps = 0.f, px = 0.f;
#pragma unroll
    for (int k = 0; k < (CL * NW + 31) / 32; ++k) {
      const int idx = lane + 32 * k;
      if (idx < CL * NW) {
        const float4 p = rc::load_remote4(&part[it & 1][idx % NW], idx / NW);
        rc::merge(pm, ps, p.x, p.y);
        px += p.z;
      }
    }
    rc::warp_combine(pm, ps);  // the row's max and sum
    const float SX = smooth ? rc::warp_sum(px) : 0.f;
    if (rank == 0 && threadIdx.x == 0) {
      float l = 0.f;
      if (valid)
        l = (pm == -INFINITY ? 0.f : pm) + logf(ps) - (1.f - smoothing) * xt - smoothing / (float)N * SX;
      loss[row] = l;
    }
    if (grad) {
      const float gs = scale_dev != nullptr ? grad_scale * __ldg(scale_dev) : grad_scale;
      const float inv = valid && ps > 0.f ? gs / ps : 0.f;
      const float hit = valid ? (1.f - smoothing) * gs : 0.f;
      const float off = valid ? smoothing / (float)N * gs : 0.f;
      const float rescale = m == -INFINITY ? 0.f : exp2f((m - pm) * rc::kLog2e) * inv;
      T* dr = dx + row * sdx;
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const long long col = sl.col(c);
        if (col < sl.c1) {
          float f[V];
          P::unpack(buf[c], f);
#pragma unroll
          for (int i = 0; i < V; ++i) f[i] = f[i] * rescale - (col + i == t ? hit : 0.f) - off;
          __stcs(reinterpret_cast<uint4*>(dr + col), P::pack(f));
        }
      }
    }
  }
  rc::cluster_arrive();
  rc::cluster_wait();
}
