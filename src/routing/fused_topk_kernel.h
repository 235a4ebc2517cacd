// Internal: the FusedTopKFwd kernel launch, called by fused_topk.cpp after validation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// One warp holds a row in registers: up to 32 slots per lane (E <= 512 uses at most 16;
// the 32-slot instance serves only E > 512).
constexpr int kTopKMaxExperts = 1024;
constexpr int kTopKMaxK = 16;

struct FusedTopKLaunch {
  const void* gating = nullptr;  // [T, E]
  DType dtype = DType::kUndefined;
  const float* bias = nullptr;  // [E] or null
  int64_t num_tokens = 0;
  int num_experts = 0;
  TopKParams params;
  float* topk_weights = nullptr;  // [T, K]
  int32_t* topk_ids = nullptr;    // [T, K]
  // The layer ops' expert map ([num_experts] i32, docs/moe.md "Engine inputs"): when given,
  // topk_ids get the local ids (-1 outside [0, num_local)) from a mapped kernel instance.
  const int32_t* expert_map = nullptr;
  int num_local = 0;
};

void launch_fused_topk(const FusedTopKLaunch& l, cudaStream_t stream);

// Whether a FusedTopK grid issues the PDL trigger right after its loads. Early
// placement of the next grid is greedy: with spare CTA slots on every SM, the SMs that
// finish first take more of its CTAs and an issue-bound next grid runs unbalanced
// (docs/routing-permute.md). So only grids of <= one CTA per SM, or grids filling >= 95%
// of the CTA slots, trigger; the others let the next kernel launch as their last CTA exits.
inline bool fused_topk_early_trigger(int64_t blocks, int sms, int blocks_per_sm) {
  if (blocks <= sms) return true;
  return blocks * 100 >= static_cast<int64_t>(sms) * blocks_per_sm * 95;
}

}  // namespace moekit::detail
