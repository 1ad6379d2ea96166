// transpose: out[b, n, m] = in[b, m, n] for a contiguous (B, M, N) input (B = 1 for a matrix).
// Grids: blockIdx.x walks the (M, N) tiles (tiles_n per tile row), blockIdx.y the batch (looping when
// B > 65535, the grid's y limit). Indices are 64-bit: M * N may pass 2^31.
// tilewise-instantiate: transpose_v1_naive<float> transpose_v1_naive<__half> transpose_v1_naive<__nv_bfloat16>
// tilewise-instantiate: transpose_v2_smem<float> transpose_v2_smem<__half> transpose_v2_smem<__nv_bfloat16>
// tilewise-instantiate: transpose_v3_padded<float> transpose_v3_padded<__half> transpose_v3_padded<__nv_bfloat16>
// tilewise-instantiate: transpose_v4_vec<float,true,64,64,256,5,8,true,false> transpose_v4_vec<float,false,64,64,256,5,8,true,false>
// tilewise-instantiate: transpose_v4_vec<float,true,64,64,128,1,16,false,true> transpose_v4_vec<float,false,64,64,128,1,16,false,true>
// tilewise-instantiate: transpose_v4_vec<__half,true,64,64,256,1,8,true,false> transpose_v4_vec<__half,false,64,64,256,1,8,true,false>
// tilewise-instantiate: transpose_v4_vec<__half,true,128,64,512,2,8,false,true> transpose_v4_vec<__half,false,128,64,512,2,8,false,true>
// tilewise-instantiate: transpose_v4_vec<__nv_bfloat16,true,64,64,256,1,8,true,false> transpose_v4_vec<__nv_bfloat16,false,64,64,256,1,8,true,false>
// tilewise-instantiate: transpose_v4_vec<__nv_bfloat16,true,128,64,512,2,8,false,true> transpose_v4_vec<__nv_bfloat16,false,128,64,512,2,8,false,true>
#include "tilewise_common.cuh"

namespace {
constexpr int T32 = 32;  // v1-v3 tile edge
constexpr int ROWS = 8;  // v1-v3 block is 32 x 8: each thread moves 4 elements of a 32 x 32 tile
}  // namespace

// v1_naive: each thread reads one element along a row (coalesced) and writes it down a column
// (each lane of a warp hits a different output row: 32 sectors per warp store).
template <typename T>
__global__ void __launch_bounds__(256) transpose_v1_naive(const T* __restrict__ in, T* __restrict__ out,
                                                          long long M, long long N, long long tiles_n,
                                                          long long B) {
  const long long tm = blockIdx.x / tiles_n, tn = blockIdx.x % tiles_n;
  const long long n = tn * T32 + threadIdx.x;
  for (long long b = blockIdx.y; b < B; b += gridDim.y) {
    const T* src = in + b * M * N;
    T* dst = out + b * M * N;
#pragma unroll
    for (int j = 0; j < T32; j += ROWS) {
      const long long m = tm * T32 + threadIdx.y + j;
      if (m < M && n < N) dst[n * M + m] = src[m * N + n];
    }
  }
}

// v2_smem and v3_padded: a 32 x 32 tile through shared memory so that reads and writes are both
// along rows. The column read tile[x][y] has a row pitch of PITCH elements: at PITCH = 32 (v2), for
// fp32 all 32 lanes hit one bank (32-way conflict), for 2-byte types 16 lanes share a bank (16-way);
// v3 pads each tile row by one element (PITCH = 33): a column's 32 elements fall in 32 different
// banks (fp32: word 33x; 2-byte: words 16.5x, i.e. banks k and k + 16 for lanes 2k, 2k+1).
template <typename T, int PITCH>
__device__ __forceinline__ void transpose_smem_tiles(const T* __restrict__ in, T* __restrict__ out, long long M,
                                                     long long N, long long tiles_n, long long B) {
  __shared__ T tile[T32][PITCH];
  const long long tm = blockIdx.x / tiles_n, tn = blockIdx.x % tiles_n;
  for (long long b = blockIdx.y; b < B; b += gridDim.y) {
    const T* src = in + b * M * N;
    T* dst = out + b * M * N;
#pragma unroll
    for (int j = 0; j < T32; j += ROWS) {
      const long long m = tm * T32 + threadIdx.y + j, n = tn * T32 + threadIdx.x;
      if (m < M && n < N) tile[threadIdx.y + j][threadIdx.x] = src[m * N + n];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < T32; j += ROWS) {
      const long long n = tn * T32 + threadIdx.y + j, m = tm * T32 + threadIdx.x;
      if (m < M && n < N) dst[n * M + m] = tile[threadIdx.x][threadIdx.y + j];
    }
    __syncthreads();  // the next batch item overwrites the tile
  }
}

template <typename T>
__global__ void __launch_bounds__(256) transpose_v2_smem(const T* __restrict__ in, T* __restrict__ out,
                                                         long long M, long long N, long long tiles_n,
                                                         long long B) {
  transpose_smem_tiles<T, T32>(in, out, M, N, tiles_n, B);
}

template <typename T>
__global__ void __launch_bounds__(256) transpose_v3_padded(const T* __restrict__ in, T* __restrict__ out,
                                                           long long M, long long N, long long tiles_n,
                                                           long long B) {
  transpose_smem_tiles<T, T32 + 1>(in, out, M, N, tiles_n, B);
}

// v4_vec: 16-byte global loads and stores through a TM x TW-word shared tile (TW 32-bit words per
// tile row: TW fp32 or 2 TW fp16/bf16 columns), NT threads, pitch TW + 1 words.
// For 2-byte types a word holds two neighbouring columns n, n + 1 of one input row, so shared memory
// is only ever accessed in words and the 2 x 2 swap happens in registers (__byte_perm): the same
// conflict analysis holds for every dtype.
//  * load phase: a warp covers 4 rows x 8 vectors (128 contiguous bytes per row); lane (r, c) stores
//    words r * (TW + 1) + 4c + j: r + 4c (mod 32) is distinct over the warp -> no conflicts.
//    Each thread keeps TM * TW / (8 * NT) vectors in flight before the first shared store.
//  * store phase: a lane owns one word column w and V = 16 / sizeof(T) consecutive tile rows
//    g V .. g V + V - 1 (one 16-byte output vector per output row it feeds). GL lanes go along g
//    (GL * 16 contiguous bytes per output row per store instruction), 32 / GL along w. Lane (w, g)
//    reads words (g V + k)(TW + 1) + w: bank g V + w + k, distinct while GL * V <= 32; GL * V = 64
//    costs 2-way conflicts and buys 128-byte (2-byte types) or 256-byte (fp32) store rows.
// Launch order: blockIdx.x -> (tm, tn) tile-row-major when group <= 0; otherwise in groups of
// `group` tile rows, tm fastest within a group, so that the blocks resident at one time cover a
// near-square patch: long runs per DRAM page on both the read side and the write side.
// LDCS / STCS: streaming (evict-first) cache hints on the loads / stores.
// VEC = true needs M and N multiples of 16 / sizeof(T) and 16-byte aligned pointers (the launcher
// checks); VEC = false moves single elements with the same tile and covers every other case.
template <typename T, bool VEC, int TM, int TW, int NT, int MINB, int GL, bool LDCS, bool STCS>
__global__ void __launch_bounds__(NT, MINB) transpose_v4_vec(const T* __restrict__ in, T* __restrict__ out,
                                                             long long M, long long N, long long tiles_m,
                                                             long long tiles_n, long long B, long long group) {
  constexpr int E = 4 / sizeof(T);   // elements per word
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte vector
  constexpr int PITCH = TW + 1;
  constexpr int NW = NT / 32;        // warps
  constexpr int TN = TW * E;         // tile columns (input N)
  constexpr int CV = TW / 4;         // 16-byte vectors per tile row
  static_assert(TW % 32 == 0 && TM % 32 == 0 && NT % 32 == 0, "tile and block shapes");
  constexpr int LPIECES = (TM / 4) * (CV / 8);  // (4-row x 8-vector) load pieces
  static_assert(LPIECES % NW == 0, "load pieces must split evenly over the warps");
  constexpr int LOADS = LPIECES / NW;
  static_assert(GL * V >= 32 && GL * V <= 64 && TM % (GL * V) == 0, "store lanes along g");
  constexpr int WL = 32 / GL;                   // lanes along w
  constexpr int GCH = TM / (V * GL);            // g-chunks per word-column group
  constexpr int SPIECES = (TW / WL) * GCH;
  static_assert(SPIECES % NW == 0, "store pieces must split evenly over the warps");
  constexpr int STORES = SPIECES / NW;
  __shared__ unsigned int tile[TM * PITCH];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // 32-bit tile arithmetic (the launcher keeps tiles_m * tiles_n below 2^31): once per block, but
  // 64-bit divisions would cost registers that the load buffer needs.
  const unsigned bx = blockIdx.x, tn_count = (unsigned)tiles_n;
  unsigned tm, tn;
  if (group <= 0 || group >= tiles_m) {
    if (group <= 0) {
      tm = bx / tn_count;
      tn = bx % tn_count;
    } else {  // one group: tile-column-major
      tm = bx % (unsigned)tiles_m;
      tn = bx / (unsigned)tiles_m;
    }
  } else {
    const unsigned gs = (unsigned)group, per = gs * tn_count, gi = bx / per, first = gi * gs;
    const unsigned rows = min(gs, (unsigned)tiles_m - first), r = bx - gi * per;
    tm = first + r % rows;
    tn = r / rows;
  }
  const long long m0 = (long long)tm * TM, n0 = (long long)tn * TN;

  for (long long b = blockIdx.y; b < B; b += gridDim.y) {
    const T* src = in + b * M * N;
    T* dst = out + b * M * N;
    {
      uint4 buf[LOADS];
#pragma unroll
      for (int i = 0; i < LOADS; ++i) {
        const int q = i * NW + warp;
        const int r = (q / (CV / 8)) * 4 + (lane >> 3), c = (q % (CV / 8)) * 8 + (lane & 7);
        const long long m = m0 + r, n = n0 + (long long)c * V;
        if (VEC) {
          buf[i] = make_uint4(0u, 0u, 0u, 0u);
          if (m < M && n < N) {
            const uint4* p = reinterpret_cast<const uint4*>(src + m * N + n);
            buf[i] = LDCS ? __ldcs(p) : *p;
          }
        } else {
          tw::Vec16<T> v;
#pragma unroll
          for (int j = 0; j < V; ++j) v.v[j] = (m < M && n + j < N) ? src[m * N + n + j] : T(0.0f);
          buf[i] = v.raw;
        }
      }
#pragma unroll
      for (int i = 0; i < LOADS; ++i) {
        const int q = i * NW + warp;
        const int r = (q / (CV / 8)) * 4 + (lane >> 3), c = (q % (CV / 8)) * 8 + (lane & 7);
        unsigned int* row = tile + r * PITCH + 4 * c;
        row[0] = buf[i].x;
        row[1] = buf[i].y;
        row[2] = buf[i].z;
        row[3] = buf[i].w;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < STORES; ++i) {
      const int q = i * NW + warp;
      const int w = (q / GCH) * WL + lane / GL;
      const int g = (q % GCH) * GL + lane % GL;
      unsigned int words[V];
#pragma unroll
      for (int k = 0; k < V; ++k) words[k] = tile[(g * V + k) * PITCH + w];
      const long long m = m0 + (long long)g * V;
      if constexpr (E == 1) {
        const long long n = n0 + w;
        if (VEC) {
          if (n < N && m < M) {
            uint4* p = reinterpret_cast<uint4*>(dst + n * M + m);
            const uint4 v = make_uint4(words[0], words[1], words[2], words[3]);
            if (STCS) __stcs(p, v); else *p = v;
          }
        } else if (n < N) {
#pragma unroll
          for (int k = 0; k < V; ++k)
            if (m + k < M) dst[n * M + m + k] = __uint_as_float(words[k]);
        }
      } else {
        // Word k holds (in[m + k][n], in[m + k][n + 1]) in its low and high halves; output row n
        // takes the low halves of words 0..7, row n + 1 the high halves.
        uint4 lo, hi;
        lo.x = __byte_perm(words[0], words[1], 0x5410);
        lo.y = __byte_perm(words[2], words[3], 0x5410);
        lo.z = __byte_perm(words[4], words[5], 0x5410);
        lo.w = __byte_perm(words[6], words[7], 0x5410);
        hi.x = __byte_perm(words[0], words[1], 0x7632);
        hi.y = __byte_perm(words[2], words[3], 0x7632);
        hi.z = __byte_perm(words[4], words[5], 0x7632);
        hi.w = __byte_perm(words[6], words[7], 0x7632);
        const long long n = n0 + 2LL * w;
        if (VEC) {
          if (m < M) {
            uint4* p = reinterpret_cast<uint4*>(dst + n * M + m);
            if (n < N) { if (STCS) __stcs(p, lo); else *p = lo; }
            if (n + 1 < N) { if (STCS) __stcs(p + M / V, hi); else p[M / V] = hi; }
          }
        } else {
          tw::Vec16<T> vl, vh;
          vl.raw = lo;
          vh.raw = hi;
#pragma unroll
          for (int k = 0; k < V; ++k) {
            if (m + k < M) {
              if (n < N) dst[n * M + m + k] = vl.v[k];
              if (n + 1 < N) dst[(n + 1) * M + m + k] = vh.v[k];
            }
          }
        }
      }
    }
    __syncthreads();
  }
}
