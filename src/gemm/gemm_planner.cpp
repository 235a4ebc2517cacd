// TEMPORARY adapter over select_grouped_gemm_config (the helper rewriting the GEMM engine
// replaces this file with the real planner).
#include "gemm/gemm_planner.h"

namespace moekit::detail {
namespace {

GemmPlan from_config(int config, const GroupedGemmProblem& p) {
  GemmPlan g;
  switch (config) {
    case kGemmConfigDecodeSplitK:
      g = {GemmKernel::kDecodeSplitK, 32, 128, 2, GemmSchedule::kStatic};
      break;
    case kGemmConfigDecodeStream:
      g = {GemmKernel::kDecodeStream, 32, 128, 1, GemmSchedule::kStatic};
      break;
    case kGemmConfigDecodeStreamDeep:
      g = {GemmKernel::kDecodeStreamDeep, 32, 128, 1, GemmSchedule::kStatic};
      break;
    case kGemmConfigDecodeStreamNarrow:
      g = {GemmKernel::kDecodeStreamNarrow, 32, 64, 1, GemmSchedule::kStatic};
      break;
    case kGemmConfigDecodePersistent:
      g = {GemmKernel::kDecodePersistent, 32, 128, 1, GemmSchedule::kStatic};
      break;
    case kGemmConfigSm90:
      g = {GemmKernel::kSm90, 128, sm90_tile_n(p), 1,
           p.tile_counter ? GemmSchedule::kDynamic : GemmSchedule::kStatic};
      break;
    case kGemmConfigSm90PairAuto:
      g = {GemmKernel::kSm90Pairs, 128, 256, 1,
           p.tile_counter ? GemmSchedule::kDynamic : GemmSchedule::kStatic};
      break;
    default:
      g = {GemmKernel::kDecode, 32, 128, 1, GemmSchedule::kStatic};
      break;
  }
  return g;
}

}  // namespace

GemmPlan plan_gemm(const GroupedGemmProblem& p, const DeviceProps&) {
  return from_config(select_grouped_gemm_config(p), p);
}

std::vector<GemmPlan> gemm_plan_candidates(const GroupedGemmProblem& p, const DeviceProps& d) {
  return {plan_gemm(p, d)};
}

std::string gemm_plan_rejection(const GemmPlan& plan, const GroupedGemmProblem& p,
                                const DeviceProps& d) {
  return plan == plan_gemm(p, d) ? std::string() : "not implemented";
}

MlpPlan plan_mlp_gemms(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                       const DeviceProps& d) {
  MlpPlan m;
  m.path = sm90_mlp_chain_rule(up, down) && d.sm90() ? MlpPath::kChain : MlpPath::kTwoGemms;
  m.gate_up = plan_gemm(up, d);
  m.down = plan_gemm(down, d);
  return m;
}

std::vector<MlpPlan> mlp_gemms_plan_candidates(const GroupedGemmProblem& up,
                                               const GroupedGemmProblem& down,
                                               const DeviceProps& d) {
  return {plan_mlp_gemms(up, down, d)};
}

std::string mlp_gemms_plan_rejection(const MlpPlan& plan, const GroupedGemmProblem& up,
                                     const GroupedGemmProblem& down, const DeviceProps& d) {
  return plan == plan_mlp_gemms(up, down, d) ? std::string() : "not implemented";
}

void run_mlp_gemms(const MlpPlan& plan, const GroupedGemmProblem& up,
                   const GroupedGemmProblem& down, void* scratch, cudaStream_t stream) {
  if (plan.path == MlpPath::kChain && run_sm90_mlp_chain(up, down, scratch, stream)) return;
  run_grouped_gemm_pair(up, down, stream);
}

}  // namespace moekit::detail
