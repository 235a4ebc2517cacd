// The dense-MLP planner (docs/dense-mlp.md "Which path runs"): which kernels run a dense
// gated MLP (SharedExpertMLPFwd, the fused layer's shared expert) of a given shape. Pure
// functions of the problem's shape, the device's properties and (for the direct kernels'
// k split) the device's cluster capacity, passed in; unit-tested on the CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm.h"
#include "mlp/activation.h"
#include "mlp/direct_mlp.h"
#include "moekit/plan.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// act [T, S] = silu_and_mul(x [T, H] . w_gate_up [2S, H]^T) in dtype, then
// out [T, H] = act . w_down [H, S]^T in out_dtype (dtype, or f32 for a later sum).
// mlp.general(): another activation or biases, on the two GEMMs (kNone) around the
// activation kernel only (activation.h).
struct DenseMlpProblem {
  DType dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  int64_t T = 0, H = 0, S = 0;
  bool streamk_scratch = false;  // the workspace holds dense_mlp_scratch_bytes(...) bytes
  MlpActivation mlp;
};

// The direct kernels' cluster capacity (direct_mlp.h): co-resident clusters of each GEMM's
// kernel by (split, shared bytes). Empty: unknown (each GEMM keeps its first split).
struct DirectCapacity {
  ClusterCapacity gate_up, down;
};
// The current device's, for problem p.
DirectCapacity device_direct_capacity(const DenseMlpProblem& p);

// The plan: GEMV (one token, >= kStreamkMlpMinWeightBytes of weights), else direct (<= 32
// tokens below that line), else stream-K (>= that line, scratch given), else the two
// dense GEMMs (plan_mlp_gemms); each where it can run the shape on `device`.
MlpPlan plan_dense_mlp(const DenseMlpProblem& p, const GemmDevice& device,
                       const DirectCapacity& capacity = {});
// Every plan this build can run p with: the GEMV, every direct split pair, the stream-K
// kernel on one CTA per SM (smaller grids run too), the GEMM candidates.
std::vector<MlpPlan> dense_mlp_plan_candidates(const DenseMlpProblem& p, const GemmDevice& device);
// Empty when `plan` can run p on `device`, else why not.
std::string dense_mlp_plan_rejection(const MlpPlan& plan, const DenseMlpProblem& p,
                                     const GemmDevice& device);

// The two GEMM problems of the kTwoGemms path (pointers as given; null to plan). The
// general path's up writes f32 into `pre` [T, gate_up_rows], its down into `pre` too
// (f32, [T, H]) when a down bias follows and out_dtype is not f32.
void dense_mlp_gemms(const DenseMlpProblem& p, const void* x, const void* w_gate_up,
                     const void* w_down, void* act, void* out, GroupedGemmProblem* up,
                     GroupedGemmProblem* down, float* pre = nullptr);

}  // namespace moekit::detail
