// CPU reference of the activation quantization (permute/quantize_fp8.h): the same formula,
// in the same f32 operations, so a correct kernel matches it bit for bit.
#pragma once

#include <cstdint>

#include "moekit/tensor.h"
#include "permute/quantize_fp8.h"

namespace moekit::reference {

// x: host [rows, k] bf16 or f16. q: host [rows * k] e4m3 codes. scales: kGroup128
// [rows * ceil(k/128)], kPerToken [rows], kPerTensor unused (tensor_scale is the scale).
void quantize_fp8_rows(const TensorView& x, detail::Fp8ActScales mode, float tensor_scale,
                       uint8_t* q, float* scales);

}  // namespace moekit::reference
