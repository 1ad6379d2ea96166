"""Matrix multiply: the public gemm / linear and its routing, the Triton kernels, the sm_90a wgmma
kernels, the sgemm teaching progression and the cuBLAS / cuBLASLt baselines."""
