// Device-side element types and conversions shared by the kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "moekit/error.h"
#include "moekit/tensor.h"

namespace moekit::detail {

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Two floats -> one 32-bit word of two 16-bit values, x in the low half (round to nearest
// even); the pointer argument only picks the type. For 32-bit-wide stores of pairs.
__device__ __forceinline__ uint32_t pack2(float x, float y, __nv_bfloat16*) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack2(float x, float y, __half*) {
  const __half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// silu(z) = z / (1 + e^-z) with the approximate division (MUFU.RCP and a multiply, ~2 ulp):
// IEEE division calls a slow-path subroutine for NaN, infinite or huge operands (the
// padding rows of a permuted buffer, gates below -88), and that call, taken by some lanes
// of an SM90 epilogue, hung the (since removed) paired GEMM kernels on the H200 (2026-12-03,
// docs/JOURNAL.md (the paired configs' hang)). Here no branch: z < -88 gives -0, NaN NaN.
__device__ __forceinline__ float silu(float z) {
  return __fdividef(z, 1.0f + __expf(-z));
}

}  // namespace moekit::detail

// Runs the body with `scalar_t` bound to the CUDA type of a 16-bit float dtype.
#define MOEKIT_DISPATCH_HALF(DTYPE, OPNAME, ...)                                          \
  do {                                                                                    \
    if ((DTYPE) == ::moekit::DType::kBF16) {                                              \
      using scalar_t = __nv_bfloat16;                                                     \
      __VA_ARGS__();                                                                      \
    } else if ((DTYPE) == ::moekit::DType::kF16) {                                        \
      using scalar_t = __half;                                                            \
      __VA_ARGS__();                                                                      \
    } else {                                                                              \
      throw ::moekit::Error(std::string("moekit::") + (OPNAME) + ": unsupported dtype " + \
                            ::moekit::dtype_name(DTYPE));                                 \
    }                                                                                     \
  } while (0)
