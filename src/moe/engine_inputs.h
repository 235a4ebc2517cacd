// apply_router_weight_on_input (top-1 models, as vLLM defines it): the route weight
// scales the token's input row before the expert MLP and the output is not weighted.
// Runs only when asked: one pass writes the scaled rows and unit weights into workspace,
// and the routed path then runs on them unchanged (docs/moe.md, "Engine inputs").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::detail {

// With K = 1 (validated): x_scaled[t, h] = round(round(w[t]) * x[t, h]) (the weight
// rounded to the dtype first, the product of the two dtype values rounded once, as
// vLLM's `x * w.to(x.dtype)`), and unit_weights[t] = 1. x [T, H] bf16/f16, H % 8 == 0.
struct RouterWeightOnInput {
  DType dtype = DType::kBF16;
  const void* x = nullptr;
  const float* weights = nullptr;  // [T]
  int64_t T = 0, H = 0;
  void* x_scaled = nullptr;       // [T, H]
  float* unit_weights = nullptr;  // [T]
};
void launch_router_weight_on_input(const RouterWeightOnInput& p, cudaStream_t stream);

}  // namespace moekit::detail
