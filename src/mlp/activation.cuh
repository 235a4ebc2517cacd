// Device math of the MLP activations (activation.h), shared by the activation kernel and
// the GPU reference. NaN inputs stay NaN (the clamps and relu keep them, as torch's do).
#pragma once

#include "core/dtype.cuh"
#include "moekit/gemm.h"

namespace moekit::detail {

__device__ __forceinline__ float gelu_tanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);  // sqrt(2/pi)
  return 0.5f * x * (1.0f + tanhf(inner));
}

__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

// relu(x)^2; NaN stays NaN.
__device__ __forceinline__ float relu2(float x) {
  const float r = x > 0.0f ? x : (x == x ? 0.0f : x);
  return r * r;
}

// gpt-oss: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1); NaN stays NaN.
__device__ __forceinline__ float swiglu_oai(float g, float u) {
  g = g > 7.0f ? 7.0f : g;
  u = u > 7.0f ? 7.0f : (u < -7.0f ? -7.0f : u);
  return __fdividef(g, 1.0f + __expf(-1.702f * g)) * (u + 1.0f);
}

// The activation of one output column: gate (or the single value of kRelu2 / kNone) g,
// up u (gated activations).
__device__ __forceinline__ float activate(Activation act, float g, float u) {
  switch (act) {
    case Activation::kSiluAndMul:
      return silu(g) * u;
    case Activation::kGeluTanhAndMul:
      return gelu_tanh(g) * u;
    case Activation::kGeluAndMul:
      return gelu_erf(g) * u;
    case Activation::kRelu2:
      return relu2(g);
    case Activation::kSwigluOai:
      return swiglu_oai(g, u);
    case Activation::kNone:
      break;
  }
  return g;
}

}  // namespace moekit::detail
