// Test knob of the public GEMM ops: a kernel configuration forced on moe_grouped_gemm and
// moe_grouped_gemm_fp8 (the random sweep and tests run every config through the public
// entry points, validation included). Kept apart from grouped_gemm.h so that changing it
// does not rebuild the SM90 kernel units.
#pragma once

namespace moekit::detail {

struct PublicGemmForce {
  int config = -1;      // moe_grouped_gemm: a GemmConfig value, -1 = the heuristic
  int split_k = 0;      // with config 3, 4 or 5: GroupedGemmProblem::split_k
  int fp8_config = -1;  // moe_grouped_gemm_fp8: an Fp8GemmConfig value, -1 = the heuristic
};

// Not thread-safe; the default (all -1 / 0) leaves every choice to the heuristic.
PublicGemmForce& public_gemm_force_override();

}  // namespace moekit::detail
