// Internal entry to the FP8 (e4m3, 128-block scaled) masked grouped GEMM.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "moekit/plan.h"

namespace moekit::detail {

// c[g, m, :] (bf16) for m < count[g] (clamped to max_m); other rows untouched.
//   a [G, max_m, k] e4m3, a_scale [G, max_m, ceil(k/128)] f32,
//   b [G, n, k] e4m3, b_scale [G, ceil(n/128), ceil(k/128)] f32, c [G, max_m, n] bf16.
// k % 16 == 0, n % 8 == 0. All pointers are device pointers.
struct GroupedGemmFP8Problem {
  const void* a = nullptr;
  const float* a_scale = nullptr;
  const void* b = nullptr;
  const float* b_scale = nullptr;
  void* c = nullptr;
  const int32_t* layout_metadata = nullptr;  // device [G] masked counts
  int num_groups = 0;
  int64_t max_m = 0;
  int64_t n = 0;
  int64_t k = 0;
  // What runs: kFp8Sm90 or kFp8Decode (gemm_planner.h plan_gemm_fp8, or a forced plan
  // that gemm_fp8_plan_rejection accepts).
  GemmPlan plan;
};

// Validates nothing but the plan (throws moekit::Error when it cannot run the problem);
// launches problem.plan on `stream`.
void run_grouped_gemm_fp8(const GroupedGemmFP8Problem& problem, cudaStream_t stream);

// kFp8Sm90: whether it takes the problem (k > 0, at most 1024 groups, 32-bit
// extents), and its launcher (throws outside those limits).
bool sm90_fp8_supports(const GroupedGemmFP8Problem& problem);
void launch_grouped_gemm_sm90_fp8(const GroupedGemmFP8Problem& problem, cudaStream_t stream);
// Host check of the SM90 kernel's shared-memory and accumulator layout assumptions:
// empty when they hold, else what differs (CPU test).
std::string sm90_fp8_layout_mismatch();

}  // namespace moekit::detail
