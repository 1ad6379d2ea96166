// The elementwise functors of tilewise (fp32 in, fp32 out), shared by elementwise.cu and the
// kernels tilewise.fuse generates. Accurate libm calls (sinf, expf, erff), not the __sinf
// intrinsics, so that results track PyTorch's to a few ulp.
#pragma once

namespace ew {

struct Neg { __device__ __forceinline__ float operator()(float x) const { return -x; } };
// NaN stays NaN, as in torch.relu.
struct Relu { __device__ __forceinline__ float operator()(float x) const { return x > 0.f || x != x ? x : 0.f; } };
struct Exp { __device__ __forceinline__ float operator()(float x) const { return expf(x); } };
struct Log { __device__ __forceinline__ float operator()(float x) const { return logf(x); } };
struct Sigmoid { __device__ __forceinline__ float operator()(float x) const { return 1.f / (1.f + expf(-x)); } };
struct Tanh { __device__ __forceinline__ float operator()(float x) const { return tanhf(x); } };
// The exact (erf) GELU, torch.nn.functional.gelu's default.
struct Gelu {
  __device__ __forceinline__ float operator()(float x) const { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
};
struct Sin { __device__ __forceinline__ float operator()(float x) const { return sinf(x); } };
struct Cos { __device__ __forceinline__ float operator()(float x) const { return cosf(x); } };

struct Add { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
struct Sub { __device__ __forceinline__ float operator()(float a, float b) const { return a - b; } };
struct Mul { __device__ __forceinline__ float operator()(float a, float b) const { return a * b; } };
struct Div { __device__ __forceinline__ float operator()(float a, float b) const { return a / b; } };
// torch.maximum: a NaN in either operand gives NaN.
struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
};
struct Pow { __device__ __forceinline__ float operator()(float a, float b) const { return powf(a, b); } };
// d relu(x) / dx applied to an incoming gradient: (grad, x) -> x > 0 ? grad : 0.
struct ReluBackward {
  __device__ __forceinline__ float operator()(float g, float x) const { return x > 0.f ? g : 0.f; }
};

}  // namespace ew
