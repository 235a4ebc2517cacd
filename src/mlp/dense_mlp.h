// The dense gated MLP of the shared expert (docs/dense-mlp.md): runs a plan of the
// dense-MLP planner (mlp_planner.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "core/workspace.h"
#include "mlp/mlp_planner.h"
#include "moekit/plan.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// act = silu_and_mul(x . w_gate_up^T) [T, S] in the dtype, then out = act . w_down^T
// [T, H] in p.out_dtype, as `plan` says (one dense_mlp_plan_rejection accepted).
// streamk_scratch: dense_mlp_scratch_bytes bytes (null when that is 0). The general path
// (p.mlp.general()) adds `biases` and needs `pre`: T rows of
// general_pre_cols(p.mlp, S, H, out_dtype == f32) f32 columns.
void run_dense_mlp(const MlpPlan& plan, const DenseMlpProblem& p, const void* x,
                   const void* w_gate_up, const void* w_down, void* act, void* out,
                   void* streamk_scratch, cudaStream_t stream, const MlpBiases& biases = {},
                   float* pre = nullptr, const char* op = "shared_expert_mlp");
// The stream-K scratch a dense MLP of this shape may use on `device` (0: stream-K cannot
// run it). The ops carve it whenever it is > 0, whichever path runs.
size_t dense_mlp_scratch_bytes(DType dtype, int64_t T, int64_t H, int64_t S,
                               const DeviceProps& device);
// Carves that scratch on the current device (nullptr when it is 0 bytes).
void* take_dense_mlp_scratch(WorkspaceCarver& ws, DType dtype, int64_t T, int64_t H, int64_t S);

}  // namespace moekit::detail
