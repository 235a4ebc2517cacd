// CPU reference of the activation quantization (quantize_fp8.h's formula, f32 arithmetic).
#include "reference/fp8_quant_ref.h"

#include <algorithm>
#include <cmath>

#include "core/host_dtype.h"

namespace moekit::reference {

void quantize_fp8_rows(const TensorView& x, detail::Fp8ActScales mode, float tensor_scale,
                       uint8_t* q, float* scales) {
  const int64_t rows = x.shape[0], k = x.shape[1];
  const int64_t groups = (k + 127) / 128;
  // Columns [c0, c1) of a row share one scale: 128-column groups, the row, or the tensor.
  const int64_t span = mode == detail::Fp8ActScales::kGroup128 ? 128 : k;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < k; c0 += span) {
      const int64_t c1 = std::min(k, c0 + span);
      float scale = tensor_scale;
      if (mode != detail::Fp8ActScales::kPerTensor) {
        float amax = 0.f;  // bf16 / f16 widen to f32 exactly
        for (int64_t c = c0; c < c1; ++c) {
          amax = std::max(amax, std::fabs(static_cast<float>(host::load(x, r * k + c))));
        }
        scale = std::max(amax, detail::kFp8ScaleFloor) / detail::kFp8Max;
        if (mode == detail::Fp8ActScales::kGroup128) {
          scales[r * groups + c0 / 128] = scale;
        } else {
          scales[r] = scale;
        }
      }
      for (int64_t c = c0; c < c1; ++c) {
        const float v = static_cast<float>(host::load(x, r * k + c)) / scale;
        q[r * k + c] = host::float_to_fp8e4m3(v);
      }
    }
  }
}

}  // namespace moekit::reference
