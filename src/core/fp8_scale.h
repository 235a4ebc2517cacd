// The dynamic FP8 e4m3 activation scale of a group's max |x| (permute/quantize_fp8.h has the
// whole formula): one definition for the quantize kernels and the GEMM epilogues that
// quantize their output.
#pragma once

namespace moekit::detail {

constexpr float kFp8Max = 448.f;          // largest finite e4m3
constexpr float kFp8ScaleFloor = 1e-10f;  // amax floor: an all-zero group gets a finite scale

#ifdef __CUDACC__
// max(amax, floor) / 448, rounded to nearest (the reference's formula).
__device__ __forceinline__ float fp8_dynamic_scale(float amax) {
  return __fdiv_rn(fmaxf(amax, kFp8ScaleFloor), kFp8Max);
}
#endif

}  // namespace moekit::detail
