// Validation of the routing inputs shared by fused_topk and the layer ops that route
// (fused_moe, fused_moe_shared_expert), so that an error names the op the caller called.
#pragma once

#include "core/check.h"
#include "moekit/routing.h"

namespace moekit::detail {

// Checks gating_output [T, E] (bf16/f16/f32, E within the kernel's limit), the optional
// correction_bias [E] f32 and every TopKParams field. Returns E.
int64_t check_routing_inputs(const ArgCheck& check, const TensorView& gating_output,
                             const TensorView& correction_bias, const TopKParams& params);

}  // namespace moekit::detail
