// The GEMM planner and the expert-MLP GEMMs' planner (docs/gemm.md): pure functions of a
// problem's shapes and the device's properties (no CUDA calls, no globals), unit-tested
// on the CPU with made-up DeviceProps.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "core/device.h"
#include "gemm/grouped_gemm.h"
#include "moekit/plan.h"

namespace moekit::detail {

// The plan run_grouped_gemm runs for `p` when the caller names none.
GemmPlan plan_gemm(const GroupedGemmProblem& p, const DeviceProps& device);
// Every plan this build can run `p` with (the planner's pick among them).
std::vector<GemmPlan> gemm_plan_candidates(const GroupedGemmProblem& p, const DeviceProps& device);
// Empty when `plan` can run `p`, else why not (for moekit::Error messages).
std::string gemm_plan_rejection(const GemmPlan& plan, const GroupedGemmProblem& p,
                                const DeviceProps& device);

// The two GEMMs of a gated MLP: `up` (silu_and_mul into act) then `down` (from act).
// kTwoGemms or kChain (one persistent SM90 launch).
MlpPlan plan_mlp_gemms(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                       const DeviceProps& device);
std::vector<MlpPlan> mlp_gemms_plan_candidates(const GroupedGemmProblem& up,
                                               const GroupedGemmProblem& down,
                                               const DeviceProps& device);
std::string mlp_gemms_plan_rejection(const MlpPlan& plan, const GroupedGemmProblem& up,
                                     const GroupedGemmProblem& down, const DeviceProps& device);
// Runs (up, down) as `plan` says. scratch: kSm90MlpChainScratchBytes (kChain), may be null
// otherwise.
void run_mlp_gemms(const MlpPlan& plan, const GroupedGemmProblem& up,
                   const GroupedGemmProblem& down, void* scratch, cudaStream_t stream);

}  // namespace moekit::detail
