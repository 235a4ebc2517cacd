// FusedTopKFwd: scores, optional bias and grouping, top-k selection, weights. The outputs
// overlap neither the inputs nor each other (docs/bad-inputs.md).
#pragma once

#include <cuda_runtime_api.h>

#include "moekit/tensor.h"

namespace moekit {

enum class ScoringFunc { kSoftmax, kSigmoid };

struct TopKParams {
  int top_k = 8;
  bool renormalize = false;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  int num_expert_group = 0;  // 0 = no grouping
  int topk_group = 0;
  float routed_scaling_factor = 1.0f;
};

struct FusedTopKArgs {
  TensorView gating_output;    // [T, E] bf16 / f16 / f32
  TensorView correction_bias;  // optional [E] f32
  TopKParams params;
  TensorView topk_weights;  // out [T, K] f32
  TensorView topk_ids;      // out [T, K] i32, descending score; ties: lower id first
};

void fused_topk(const FusedTopKArgs& args, cudaStream_t stream);

}  // namespace moekit
