// CPU reference of the activation quantization a FP8 scheme implies (docs/moe.md "Quantized
// weights"): e4m3 values and f32 scales per 128-column group (fp8_block128), per row
// (fp8_per_channel) or per tensor (fp8_per_tensor, the static scale when given), returned
// dequantized.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/reference.h"

namespace moekit::reference {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kMinAmax = 1e-10f;  // an all-zero group gets a tiny scale, not 0 (no 0/0)

// s = max(amax, 1e-10) / 448 in f32.
float scale_of(float amax) {
  return std::max(amax, kMinAmax) / kE4m3Max;
}

}  // namespace

void quantize_activations_e4m3(QuantScheme scheme, const TensorView& x,
                               const TensorView& static_scale, const TensorView& out) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const auto value = [&](int64_t r, int64_t c) {
    return static_cast<float>(host::load(x, r * cols + c));
  };
  const auto quant = [&](int64_t r, int64_t c, float s) {
    const float q = host::fp8e4m3_to_float(host::float_to_fp8e4m3(value(r, c) / s));
    host::store(out, r * cols + c, static_cast<double>(q * s));
  };
  if (scheme == QuantScheme::kNone) {
    for (int64_t i = 0; i < rows * cols; ++i) host::store(out, i, host::load(x, i));
    return;
  }
  if (scheme == QuantScheme::kFp8PerTensor) {
    float s = 0.f;
    if (static_scale.defined()) {
      s = static_cast<float>(host::load(static_scale, 0));
    } else {
      float amax = 0.f;
      for (int64_t i = 0; i < rows * cols; ++i)
        amax = std::max(amax, std::fabs(static_cast<float>(host::load(x, i))));
      s = scale_of(amax);
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) quant(r, c, s);
    return;
  }
  const int64_t group = scheme == QuantScheme::kFp8Block128 ? 128 : cols;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += group) {
      const int64_t c1 = std::min(cols, c0 + group);
      float amax = 0.f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(value(r, c)));
      const float s = scale_of(amax);
      for (int64_t c = c0; c < c1; ++c) quant(r, c, s);
    }
  }
}

}  // namespace moekit::reference
