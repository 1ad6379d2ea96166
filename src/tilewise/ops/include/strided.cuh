// Strided indexing for tensors described by (shape, strides), up to 8 dimensions, with
// NumPy/PyTorch broadcasting (a size-1 dimension of an input reads stride 0).
//
// Kernels receive the layout as a small int64 device array ("meta", built and cached by
// tilewise/ops/_strided.py) because cuda.core cannot pass structs by value and 8 dims x K tensors
// of separate scalars would not index dynamically without a trip through local memory:
//
//   meta[0]                       ndim (dims already collapsed on the host where memory allows)
//   meta[1]                       n, the number of output elements
//   meta[2 + d]                   shape[d]                        d < kMaxDims (unused dims: 1)
//   meta[2 + 8 + d]               magic multiplier of shape[d]     (fast 32-bit division)
//   meta[2 + 16 + d]              magic shift of shape[d]
//   meta[2 + 24 + 8 * k + d]      strides of input k (elements; 0 on broadcast dims)
//
// The block copies it to shared memory once; every thread then decomposes its flat index from the
// innermost dimension outwards. When n < 2^31 the division by each extent is a multiply-high and a
// shift (Granlund-Montgomery magic numbers computed on the host), else a plain 64-bit division.
#pragma once

#include "tilewise_common.cuh"

namespace tw {

constexpr int kMaxDims = 8;
constexpr int kMetaHeader = 2 + 3 * kMaxDims;

__host__ __device__ constexpr int meta_words(int num_inputs) { return kMetaHeader + kMaxDims * num_inputs; }

// The layout a kernel reads, in shared memory.
template <int K>
struct StridedLayout {
  long long ndim;
  long long n;
  long long shape[kMaxDims];
  long long mul[kMaxDims];
  long long shr[kMaxDims];
  long long strides[K][kMaxDims];
};

// Cooperative copy of the meta array into a shared StridedLayout; ends with a barrier.
template <int K>
__device__ __forceinline__ void load_layout(StridedLayout<K>& s, const long long* __restrict__ meta) {
  long long* dst = reinterpret_cast<long long*>(&s);
  for (int i = threadIdx.x; i < meta_words(K); i += blockDim.x) dst[i] = meta[i];
  __syncthreads();
}

// Quotient of x by a divisor with magic (mul, shr); exact for x, divisor < 2^31.
__device__ __forceinline__ unsigned fast_div(unsigned x, unsigned mul, unsigned shr) {
  return mul == 0 ? x : (__umulhi(x, mul) >> shr);
}

// flat index -> multi-index (row-major over shape[0..ndim)).
__device__ __forceinline__ void flat_to_multi(long long flat, int ndim, const long long* shape,
                                              long long* idx) {
  for (int d = ndim - 1; d >= 0; --d) {
    long long q = flat / shape[d];
    idx[d] = flat - q * shape[d];
    flat = q;
  }
}

// multi-index -> storage offset (elements) through strides.
__device__ __forceinline__ long long multi_to_offset(const long long* idx, const long long* strides,
                                                     int ndim) {
  long long off = 0;
  for (int d = 0; d < ndim; ++d) off += idx[d] * strides[d];
  return off;
}

// Broadcast: output flat index -> the storage offset of each of the K inputs in one pass over the
// dimensions (no multi-index kept). Input strides are 0 on the dims it broadcasts along.
template <int K>
__device__ __forceinline__ void broadcast_offsets(const StridedLayout<K>& s, long long flat,
                                                  long long (&off)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] = 0;
  const int ndim = static_cast<int>(s.ndim);
  if (s.n < (1LL << 31)) {
    unsigned f = static_cast<unsigned>(flat);
#pragma unroll 1
    for (int d = ndim - 1; d > 0; --d) {
      unsigned q = fast_div(f, static_cast<unsigned>(s.mul[d]), static_cast<unsigned>(s.shr[d]));
      long long r = static_cast<long long>(f - q * static_cast<unsigned>(s.shape[d]));
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += r * s.strides[k][d];
      f = q;
    }
    // The outermost index is what is left: no division.
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += static_cast<long long>(f) * s.strides[k][0];
  } else {
#pragma unroll 1
    for (int d = ndim - 1; d > 0; --d) {
      long long q = flat / s.shape[d];
      long long r = flat - q * s.shape[d];
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += r * s.strides[k][d];
      flat = q;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += flat * s.strides[k][0];
  }
}

// One thread per output element: load_layout, then this thread's element (its offsets are
// broadcast_offsets' once it is known to be below s.n).
template <int K>
__device__ __forceinline__ long long load_layout_at(StridedLayout<K>& s, const long long* __restrict__ meta) {
  load_layout(s, meta);
  return global_thread_id();
}

}  // namespace tw
