// Host-side conversions between float and the 16-bit / 8-bit storage formats,
// used by the CPU references and the tests (round-to-nearest-even throughout).
#pragma once

#include <cstdint>
#include <cstring>

#include "moekit/tensor.h"

namespace moekit::host {

float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float value);
float fp8e4m3_to_float(uint8_t bits);
uint8_t float_to_fp8e4m3(float value);  // saturates to +-448, NaN stays NaN

// Element `i` (flat index) of a host tensor, widened to double.
double load(const TensorView& t, int64_t i);
// Stores `value` rounded to t's dtype at flat index `i`.
void store(const TensorView& t, int64_t i, double value);
// Rounds a value to what `dtype` can hold (identity for f32 -> float rounding).
double round_to(DType dtype, double value);

}  // namespace moekit::host
