// Weight quantization inside the MoE and MLP ops: validation of a WeightQuant against the
// shapes (moekit/quant.h has the layouts) and the device view of the scales the FP8 kernels
// take (the decode kernels; past them the FP8 GEMMs, moe/fp8_mlp.h).
#pragma once

#include <cstdint>
#include <string>

#include "core/check.h"
#include "moekit/quant.h"
#include "moekit/tensor.h"

namespace moekit::detail {

constexpr int64_t kQuantBlock = 128;  // kFp8Block128: rows and columns of one scale block

inline bool quantized(QuantScheme q) {
  return q != QuantScheme::kNone;
}

// One of QuantScheme's named values (a value cast from an integer may be none of them).
bool is_quant_scheme(QuantScheme q);

// The scales of one weight set on the device, as the FP8 kernels read them: gate_up over
// [2F, H] matrices, down over [H, F], one per expert; the optional static activation scales
// (fp8_per_tensor; the FP8 GEMM paths, fp8_mlp.h).
struct WeightScales {
  QuantScheme scheme = QuantScheme::kNone;
  const float* gate_up = nullptr;
  const float* down = nullptr;
  const float* a_gate_up = nullptr;
  const float* a_down = nullptr;
};
inline WeightScales weight_scales(const WeightQuant& q) {
  return {q.scheme, q.w_gate_up_scale.ptr<const float>(), q.w_down_scale.ptr<const float>(),
          q.a_gate_up_scale.ptr<const float>(), q.a_down_scale.ptr<const float>()};
}

// FP8 weights past the decode kernels (the sorted path, moe_expert_mlp, the dense MLP past
// kDirectMaxTokens) run the contiguous FP8 grouped GEMMs with activation quantization
// (moe/fp8_mlp.h; docs/moe.md "Quantized weights").

}  // namespace moekit::detail
