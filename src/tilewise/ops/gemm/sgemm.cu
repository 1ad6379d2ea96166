// matmul: C[z] = A[z] @ B[z] in fp32 on the CUDA cores (no tensor cores), the SGEMM progression.
// Every kernel takes A (M x K), B (K x N) through element strides (batch, row, column), so
// transposed views and a broadcast batch (batch stride 0) need no copy; C is contiguous per batch
// (row stride ldc, batch stride sCb). Batch = gridDim.z. Any M, N, K: out-of-range loads read 0,
// out-of-range stores are skipped.
// tilewise-instantiate: matmul_v1_naive matmul_v2_coalesced matmul_v3_smem matmul_v4_blocktile
// tilewise-instantiate: matmul_v5_vectorized matmul_v6_warptile
#include "tilewise_common.cuh"

#define TW_MATMUL_PARAMS                                                                       \
  const float *__restrict__ A, const float *__restrict__ B, float *__restrict__ C, int M, int N, \
      int K, long long sAb, long long sAm, long long sAk, long long sBb, long long sBk,          \
      long long sBn, long long sCb, long long ldc

#define TW_MATMUL_BATCH_OFFSETS        \
  A += (long long)blockIdx.z * sAb;    \
  B += (long long)blockIdx.z * sBb;    \
  C += (long long)blockIdx.z * sCb;

// v1_naive: one thread per output; threadIdx.x walks rows, so a warp reads 32 different rows of A
// (32 transactions per load) and writes C with a stride of ldc.
extern "C" __global__ void matmul_v1_naive(TW_MATMUL_PARAMS) {
  TW_MATMUL_BATCH_OFFSETS
  const int m = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = blockIdx.y * blockDim.y + threadIdx.y;
  if (m >= M || n >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += A[m * sAm + k * sAk] * B[k * sBk + n * sBn];
  C[m * ldc + n] = acc;
}

// v2_coalesced: threadIdx.x walks columns: a warp reads one A element (broadcast) and 32
// consecutive B elements, and writes 32 consecutive C elements.
extern "C" __global__ void matmul_v2_coalesced(TW_MATMUL_PARAMS) {
  TW_MATMUL_BATCH_OFFSETS
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int m = blockIdx.y * blockDim.y + threadIdx.y;
  if (m >= M || n >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += A[m * sAm + k * sAk] * B[k * sBk + n * sBn];
  C[m * ldc + n] = acc;
}

// v3_smem: the lecture's tiled kernel: a 32 x 32 block stages a 32 x 32 tile of A and of B in
// shared memory per step of K, so each input element is read from global memory once per tile
// (K / 32 times less traffic than v2); one output per thread, one write each.
constexpr int V3_T = 32;
extern "C" __global__ void __launch_bounds__(V3_T * V3_T) matmul_v3_smem(TW_MATMUL_PARAMS) {
  TW_MATMUL_BATCH_OFFSETS
  __shared__ float As[V3_T][V3_T];
  __shared__ float Bs[V3_T][V3_T + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m = blockIdx.y * V3_T + ty;
  const int n = blockIdx.x * V3_T + tx;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += V3_T) {
    As[ty][tx] = (m < M && k0 + tx < K) ? A[m * sAm + (long long)(k0 + tx) * sAk] : 0.f;
    Bs[ty][tx] = (k0 + ty < K && n < N) ? B[(long long)(k0 + ty) * sBk + n * sBn] : 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < V3_T; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (m < M && n < N) C[m * ldc + n] = acc;
}

// v4_blocktile: a 128 x 128 block tile, K steps of 8, 256 threads each holding an 8 x 8 block of
// outputs in registers: each value loaded from shared memory feeds 8 FMAs instead of 1.
constexpr int V4_BM = 128, V4_BN = 128, V4_BK = 8, V4_TM = 8, V4_TN = 8;
extern "C" __global__ void __launch_bounds__(256) matmul_v4_blocktile(TW_MATMUL_PARAMS) {
  TW_MATMUL_BATCH_OFFSETS
  __shared__ float As[V4_BM][V4_BK];
  __shared__ float Bs[V4_BK][V4_BN];
  const int t = threadIdx.x;
  const int tr = t / (V4_BN / V4_TN), tc = t % (V4_BN / V4_TN);
  const int m0 = blockIdx.y * V4_BM, n0 = blockIdx.x * V4_BN;
  float acc[V4_TM][V4_TN] = {};
  float a[V4_TM], b[V4_TN];
  for (int k0 = 0; k0 < K; k0 += V4_BK) {
    // 1024 elements of each tile, 4 per thread; consecutive threads take consecutive k (A) / n (B).
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int i = t + p * 256;
      const int ar = i / V4_BK, ak = i % V4_BK;
      const int gm = m0 + ar, gk = k0 + ak;
      As[ar][ak] = (gm < M && gk < K) ? A[gm * sAm + gk * sAk] : 0.f;
      const int bk = i / V4_BN, bn = i % V4_BN;
      const int gk2 = k0 + bk, gn = n0 + bn;
      Bs[bk][bn] = (gk2 < K && gn < N) ? B[gk2 * sBk + gn * sBn] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < V4_BK; ++k) {
#pragma unroll
      for (int i = 0; i < V4_TM; ++i) a[i] = As[tr * V4_TM + i][k];
#pragma unroll
      for (int j = 0; j < V4_TN; ++j) b[j] = Bs[k][tc * V4_TN + j];
#pragma unroll
      for (int i = 0; i < V4_TM; ++i)
#pragma unroll
        for (int j = 0; j < V4_TN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < V4_TM; ++i) {
    const int gm = m0 + tr * V4_TM + i;
    if (gm >= M) break;
#pragma unroll
    for (int j = 0; j < V4_TN; ++j) {
      const int gn = n0 + tc * V4_TN + j;
      if (gn < N) C[gm * ldc + gn] = acc[i][j];
    }
  }
}

// Loads of 4 consecutive elements along a unit-stride dimension: one 16-byte load when the caller
// vouched for alignment (vec) and all 4 are in range, else 4 checked scalar loads through strides.
__device__ __forceinline__ float4 tw_load4(const float* __restrict__ p, long long stride, int left,
                                           bool vec) {
  if (vec && left >= 4) return __ldg(reinterpret_cast<const float4*>(p));
  float4 r;
  r.x = left > 0 ? p[0] : 0.f;
  r.y = left > 1 ? p[stride] : 0.f;
  r.z = left > 2 ? p[2 * stride] : 0.f;
  r.w = left > 3 ? p[3 * stride] : 0.f;
  return r;
}

__device__ __forceinline__ void tw_store_row(float* __restrict__ c, const float* v, int left,
                                             bool vec) {
  if (vec && left >= 4) {
    *reinterpret_cast<float4*>(c) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < left) c[j] = v[j];
  }
}

// v5_vectorized: v4 with 16-byte global loads and stores (when the launcher finds the unit-stride
// dimension aligned: vecA / vecB / vecC) and the A tile stored transposed (As[k][m]) so that a
// thread reads its 8 values of A as two float4 from shared memory, like B.
constexpr int V5_BM = 128, V5_BN = 128, V5_BK = 8, V5_TM = 8, V5_TN = 8;
extern "C" __global__ void __launch_bounds__(256)
    matmul_v5_vectorized(TW_MATMUL_PARAMS, int vecA, int vecB, int vecC) {
  TW_MATMUL_BATCH_OFFSETS
  __shared__ __align__(16) float As[V5_BK][V5_BM];
  __shared__ __align__(16) float Bs[V5_BK][V5_BN];
  const int t = threadIdx.x;
  const int tr = t / (V5_BN / V5_TN), tc = t % (V5_BN / V5_TN);
  const int m0 = blockIdx.y * V5_BM, n0 = blockIdx.x * V5_BN;
  // A tile 128 x 8: thread t loads row t / 2, k (t % 2) * 4 .. +4; B tile 8 x 128: row t / 32,
  // columns (t % 32) * 4 .. +4.
  const int ar = t / 2, ak = (t % 2) * 4;
  const int bk = t / 32, bn = (t % 32) * 4;
  const bool arow_ok = m0 + ar < M;
  const float* Ap = A + (long long)(m0 + ar) * sAm + ak * sAk;
  const float* Bp = B + (long long)bk * sBk + (long long)(n0 + bn) * sBn;
  float acc[V5_TM][V5_TN] = {};
  for (int k0 = 0; k0 < K; k0 += V5_BK) {
    const float4 av = tw_load4(Ap, sAk, arow_ok ? K - k0 - ak : 0, vecA);
    const float4 bv = tw_load4(Bp, sBn, k0 + bk < K ? N - n0 - bn : 0, vecB);
    As[ak + 0][ar] = av.x;
    As[ak + 1][ar] = av.y;
    As[ak + 2][ar] = av.z;
    As[ak + 3][ar] = av.w;
    *reinterpret_cast<float4*>(&Bs[bk][bn]) = bv;
    Ap += V5_BK * sAk;
    Bp += V5_BK * sBk;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < V5_BK; ++k) {
      float a[V5_TM], b[V5_TN];
      *reinterpret_cast<float4*>(a) = *reinterpret_cast<const float4*>(&As[k][tr * V5_TM]);
      *reinterpret_cast<float4*>(a + 4) = *reinterpret_cast<const float4*>(&As[k][tr * V5_TM + 4]);
      *reinterpret_cast<float4*>(b) = *reinterpret_cast<const float4*>(&Bs[k][tc * V5_TN]);
      *reinterpret_cast<float4*>(b + 4) = *reinterpret_cast<const float4*>(&Bs[k][tc * V5_TN + 4]);
#pragma unroll
      for (int i = 0; i < V5_TM; ++i)
#pragma unroll
        for (int j = 0; j < V5_TN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < V5_TM; ++i) {
    const int gm = m0 + tr * V5_TM + i;
    if (gm >= M) break;
#pragma unroll
    for (int j = 0; j < V5_TN; j += 4) {
      const int gn = n0 + tc * V5_TN + j;
      tw_store_row(C + (long long)gm * ldc + gn, &acc[i][j], N - gn, vecC);
    }
  }
}

// v6_warptile: 128 x 128 x 16 block tile, 8 warps of 64 x 32 each; a lane's 8 x 8 outputs are
// 2 x 2 sub-tiles of 4 x 4 spaced 32 rows / 16 columns apart, so the lanes of a warp read 8 (A)
// and 4 (B) distinct 16-byte words per k: no bank conflicts, broadcast for the rest. Double
// buffered: the next tile is fetched into registers while this one is computed from shared
// memory, then stored into the other buffer: one __syncthreads per K step. Two blocks per SM.
constexpr int V6_BM = 128, V6_BN = 128, V6_BK = 16, V6_PAD = 4;
extern "C" __global__ void __launch_bounds__(256, 2)
    matmul_v6_warptile(TW_MATMUL_PARAMS, int vecA, int vecB, int vecC) {
  TW_MATMUL_BATCH_OFFSETS
  __shared__ __align__(16) float As[2][V6_BK][V6_BM + V6_PAD];
  __shared__ __align__(16) float Bs[2][V6_BK][V6_BN];
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;  // warp tile origin in the block tile
  const int lr = (lane / 4) * 4, lc = (lane % 4) * 4;    // lane origin in a sub-tile
  const int m0 = blockIdx.y * V6_BM, n0 = blockIdx.x * V6_BN;
  // Global -> shared: A tile 128 x 16 as 512 float4 (rows t / 4 and t / 4 + 64, k (t % 4) * 4);
  // B tile 16 x 128 as 512 float4 (rows t / 32 and t / 32 + 8, columns (t % 32) * 4).
  const int ar = t / 4, ak = (t % 4) * 4;
  const int bk = t / 32, bn = (t % 32) * 4;
  const float* Ap = A + (long long)(m0 + ar) * sAm + ak * sAk;
  const float* Bp = B + (long long)bk * sBk + (long long)(n0 + bn) * sBn;
  const long long a_next_rows = 64 * sAm, b_next_rows = 8 * sBk;
  const int arows0 = M - m0 - ar, bcols = N - n0 - bn;
  float4 ra[2], rb[2];

  auto fetch = [&](int k0) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      ra[p] = tw_load4(Ap + p * a_next_rows, sAk, arows0 > p * 64 ? K - k0 - ak : 0, vecA);
      rb[p] = tw_load4(Bp + p * b_next_rows, sBn, k0 + bk + p * 8 < K ? bcols : 0, vecB);
    }
    Ap += V6_BK * sAk;
    Bp += V6_BK * sBk;
  };
  auto stash = [&](int s) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      As[s][ak + 0][ar + p * 64] = ra[p].x;
      As[s][ak + 1][ar + p * 64] = ra[p].y;
      As[s][ak + 2][ar + p * 64] = ra[p].z;
      As[s][ak + 3][ar + p * 64] = ra[p].w;
      *reinterpret_cast<float4*>(&Bs[s][bk + p * 8][bn]) = rb[p];
    }
  };

  float acc[8][8] = {};
  fetch(0);
  stash(0);
  __syncthreads();
  int s = 0;
  for (int k0 = 0; k0 < K; k0 += V6_BK) {
    const bool more = k0 + V6_BK < K;
    if (more) fetch(k0 + V6_BK);
#pragma unroll
    for (int k = 0; k < V6_BK; ++k) {
      float a[8], b[8];
      *reinterpret_cast<float4*>(a) = *reinterpret_cast<const float4*>(&As[s][k][wm + lr]);
      *reinterpret_cast<float4*>(a + 4) = *reinterpret_cast<const float4*>(&As[s][k][wm + 32 + lr]);
      *reinterpret_cast<float4*>(b) = *reinterpret_cast<const float4*>(&Bs[s][k][wn + lc]);
      *reinterpret_cast<float4*>(b + 4) = *reinterpret_cast<const float4*>(&Bs[s][k][wn + 16 + lc]);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] += a[i] * b[j];
    }
    if (more) stash(s ^ 1);  // the other buffer: nobody reads it until after the barrier
    __syncthreads();
    s ^= 1;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int gm = m0 + wm + (i / 4) * 32 + lr + (i % 4);
    if (gm < M) {
#pragma unroll
      for (int j = 0; j < 8; j += 4) {
        const int gn = n0 + wn + (j / 4) * 16 + lc;
        tw_store_row(C + (long long)gm * ldc + gn, &acc[i][j], N - gn, vecC);
      }
    }
  }
}
