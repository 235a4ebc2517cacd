// e4m3 weights unpacked to bf16 in registers (the FP8 direct kernels, the weight-only FP8
// decode GEMM).
//
// Exact: a byte s.eeee.mmm placed as the bf16 bits s.0000eeee.mmm0000 is the e4m3 value times
// 2^-120 (normal and subnormal alike: bf16's exponent bias is 120 more), then one bf16x2
// multiply by 2^120 restores it.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace moekit::detail {

// Bytes 2h and 2h+1 of `word` (h = 0 or 1) as one bf16x2 word, byte 2h in the low half.
template <int h>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t word) {
  static_assert(h == 0 || h == 1, "a word holds two byte pairs");
  // The two bytes into the low byte of each 16-bit half, each with its sign replicated over
  // the half's high byte (prmt's sign mode): shifted left by 4, a half holds the magnitude at
  // bits 4..10 and the sign at 15, and the mask clears the sign's other copies at 11..14
  // (four instructions with the multiply, not five).
  uint32_t t;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(t) : "r"(word), "r"(h == 0 ? 0x9180u : 0xB3A2u));
  const uint32_t bits = (t << 4) & 0x87F087F0u;
  __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&bits);
  b = __hmul2(b, __floats2bfloat162_rn(0x1p120f, 0x1p120f));
  return *reinterpret_cast<const uint32_t*>(&b);
}

}  // namespace moekit::detail
