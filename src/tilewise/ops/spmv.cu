// spmv: y = alpha * A x + beta * y, fp32 values and vectors, int32 indices.
// beta == 0 never reads y (y may hold anything, NaN included), as in BLAS.
// tilewise-instantiate: spmv_csr_scalar spmv_ell spmv_jds spmv_csr_chunks spmv_csr_stream
// tilewise-instantiate: spmv_csr_vector<2> spmv_csr_vector<4> spmv_csr_vector<8> spmv_csr_vector<16> spmv_csr_vector<32>
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
// of each row that has more than k, at jd_ptr[k] + (rank of the row). One thread per sorted row;
// neighbouring threads read neighbouring entries of each diagonal (coalesced) with no padding.
extern "C" __global__ void __launch_bounds__(256) spmv_jds(
    const int* __restrict__ perm, const int* __restrict__ len_sorted, const int* __restrict__ jd_ptr,
    const int* __restrict__ col, const float* __restrict__ val, const float* __restrict__ x,
    float* __restrict__ y, int M, float alpha, float beta) {
  const long long s = tw::global_thread_id();
  if (s >= M) return;
  const int len = len_sorted[s];
  float sum = 0.0f;
  // Unrolled so that several iterations' loads are in flight before the first add waits.
#pragma unroll 4
  for (int k = 0; k < len; ++k) {
    const long long i = (long long)__ldg(jd_ptr + k) + s;
    sum += __ldcs(val + i) * __ldg(x + __ldcs(col + i));
  }
  write_y(y, perm[s], sum, alpha, beta);
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
