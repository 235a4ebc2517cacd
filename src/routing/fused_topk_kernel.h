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

}  // namespace moekit::detail
