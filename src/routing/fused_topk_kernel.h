// Internal: the FusedTopKFwd kernel launch, called by fused_topk.cpp after validation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace moekit::detail {

constexpr int kTopKMaxExperts = 512;  // one warp holds a row in registers: 16 slots per lane
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
};

void launch_fused_topk(const FusedTopKLaunch& l, cudaStream_t stream);

// Test knob (not thread-safe): 0 = default (MOEKIT_ROUTING_LEGACY=1 in the environment
// selects the previous kernel), 1 = current kernel, 2 = previous kernel.
int& fused_topk_variant_override();

// When a FusedTopK grid issues the PDL trigger right after its loads (letting the next
// kernel's CTAs become resident while it runs). Early placement of the next grid is
// greedy: with spare CTA slots on every SM, the SMs that finish first take more of its
// CTAs, and an issue-bound next grid then runs unbalanced (H200, T = 4096, E = 128:
// 5.40 us without PDL, 6.07 with). 0 = always; 1 = only grids of <= one CTA per SM;
// 2 = those, or grids filling >= 95% of the CTA slots (no room to unbalance). A grid
// that does not trigger lets the next kernel launch when its last CTA exits.
// Test / tuning knob (not thread-safe): < 0 = the default; the environment's
// MOEKIT_TOPK_TRIGGER_MODE sets its first value.
int& fused_topk_trigger_mode_override();
constexpr int kTopKTriggerModeDefault = 2;
inline bool fused_topk_early_trigger(int mode, int64_t blocks, int sms, int blocks_per_sm) {
  if (mode == 0 || blocks <= sms) return true;
  if (mode == 1) return false;
  return blocks * 100 >= static_cast<int64_t>(sms) * blocks_per_sm * 95;
}

}  // namespace moekit::detail
