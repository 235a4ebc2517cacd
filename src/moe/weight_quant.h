// Weight quantization inside the MoE and MLP ops: validation of a WeightQuant against the
// shapes (moekit/quant.h has the layouts), the device view the FP8 decode kernels take,
// and the one hook where the contiguous FP8 grouped GEMMs join the layer.
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

// The scales of one weight set on the device, as the FP8 decode kernels read them
// (moe_kernels_fp8.cu): gate_up over [2F, H] matrices, down over [H, F], one per expert.
struct WeightScales {
  QuantScheme scheme = QuantScheme::kNone;
  const float* gate_up = nullptr;
  const float* down = nullptr;
};
inline WeightScales weight_scales(const WeightQuant& q) {
  return {q.scheme, q.w_gate_up_scale.ptr<const float>(), q.w_down_scale.ptr<const float>()};
}

// ---- HOOK (issue 31): FP8 weights beyond the decode kernels ----
// The sorted path (permute -> grouped GEMMs -> combine), moe_expert_mlp and the dense MLP
// past the FP8 decode kernel's token limit need the contiguous FP8 grouped GEMMs with
// activation quantization (docs/moe.md "Quantized weights"). Until they are wired this
// says why those paths refuse FP8 weights; the planners and the ops quote it, and
// run_routed_carved's sorted branch is where the FP8 GEMMs will run.
std::string fp8_gemm_rejection();

}  // namespace moekit::detail
