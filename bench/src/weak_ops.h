// moekit's ops and CPU references, re-declared as weak references: the benchmark links
// the library's object files directly, so an op that is not implemented yet resolves
// to null (the row then says "not implemented") instead of failing the link.
#pragma once

#include "moekit/moekit.h"
#include "moekit/reference.h"

#define MOEKIT_BENCH_WEAK __attribute__((weak))

namespace moekit {
MOEKIT_BENCH_WEAK void fused_topk(const FusedTopKArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK size_t permute_align_workspace_size(const PermuteAlignArgs&);
MOEKIT_BENCH_WEAK void moe_permute_align(const PermuteAlignArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK size_t pre_permute_workspace_size(const PrePermuteArgs&);
MOEKIT_BENCH_WEAK void moe_pre_permute(const PrePermuteArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK void moe_post_permute(const PostPermuteArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK void moe_grouped_gemm(const GroupedGemmArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK void moe_grouped_gemm_fp8(const GroupedGemmFP8Args&, cudaStream_t);
MOEKIT_BENCH_WEAK size_t expert_mlp_workspace_size(const ExpertMLPArgs&);
MOEKIT_BENCH_WEAK void moe_expert_mlp(const ExpertMLPArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK size_t fused_moe_experts_workspace_size(const FusedMoEExpertsArgs&);
MOEKIT_BENCH_WEAK void fused_moe_experts(const FusedMoEExpertsArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK size_t indexed_expert_mlp_workspace_size(const IndexedExpertMLPArgs&);
MOEKIT_BENCH_WEAK void indexed_expert_mlp(const IndexedExpertMLPArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK size_t fused_moe_workspace_size(const FusedMoEArgs&);
MOEKIT_BENCH_WEAK void fused_moe(const FusedMoEArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK size_t fused_moe_shared_expert_workspace_size(const FusedMoESharedExpertArgs&);
MOEKIT_BENCH_WEAK void fused_moe_shared_expert(const FusedMoESharedExpertArgs&, cudaStream_t);
MOEKIT_BENCH_WEAK size_t shared_expert_mlp_workspace_size(const SharedExpertMLPArgs&);
MOEKIT_BENCH_WEAK void shared_expert_mlp(const SharedExpertMLPArgs&, cudaStream_t);

// The planners (the row's plan column, --candidates).
MOEKIT_BENCH_WEAK GemmPlan plan_grouped_gemm(const GroupedGemmArgs&);
MOEKIT_BENCH_WEAK std::vector<GemmPlan> grouped_gemm_plan_candidates(const GroupedGemmArgs&);
MOEKIT_BENCH_WEAK GemmPlan plan_grouped_gemm_fp8(const GroupedGemmFP8Args&);
MOEKIT_BENCH_WEAK std::vector<GemmPlan> grouped_gemm_fp8_plan_candidates(const GroupedGemmFP8Args&);
MOEKIT_BENCH_WEAK MlpPlan plan_expert_mlp(const ExpertMLPArgs&);
MOEKIT_BENCH_WEAK std::vector<MlpPlan> expert_mlp_plan_candidates(const ExpertMLPArgs&);
MOEKIT_BENCH_WEAK MlpPlan plan_shared_expert_mlp(const SharedExpertMLPArgs&);
MOEKIT_BENCH_WEAK std::vector<MlpPlan> shared_expert_mlp_plan_candidates(
    const SharedExpertMLPArgs&);
MOEKIT_BENCH_WEAK LayerPlan plan_fused_moe_experts(const FusedMoEExpertsArgs&);
MOEKIT_BENCH_WEAK std::vector<LayerPlan> fused_moe_experts_plan_candidates(
    const FusedMoEExpertsArgs&);
MOEKIT_BENCH_WEAK LayerPlan plan_indexed_expert_mlp(const IndexedExpertMLPArgs&);
MOEKIT_BENCH_WEAK std::vector<LayerPlan> indexed_expert_mlp_plan_candidates(
    const IndexedExpertMLPArgs&);
MOEKIT_BENCH_WEAK LayerPlan plan_fused_moe(const FusedMoEArgs&);
MOEKIT_BENCH_WEAK std::vector<LayerPlan> fused_moe_plan_candidates(const FusedMoEArgs&);
MOEKIT_BENCH_WEAK LayerPlan plan_fused_moe_shared_expert(const FusedMoESharedExpertArgs&);
MOEKIT_BENCH_WEAK std::vector<LayerPlan> fused_moe_shared_expert_plan_candidates(
    const FusedMoESharedExpertArgs&);

namespace reference {
MOEKIT_BENCH_WEAK void fused_topk(const FusedTopKArgs&);
MOEKIT_BENCH_WEAK void moe_permute_align(const PermuteAlignArgs&);
MOEKIT_BENCH_WEAK void moe_pre_permute(const PrePermuteArgs&);
MOEKIT_BENCH_WEAK void moe_post_permute(const PostPermuteArgs&);
MOEKIT_BENCH_WEAK void moe_grouped_gemm(const GroupedGemmArgs&);
MOEKIT_BENCH_WEAK void moe_grouped_gemm_fp8(const GroupedGemmFP8Args&);
MOEKIT_BENCH_WEAK void moe_expert_mlp(const ExpertMLPArgs&, Fp8Activations);
MOEKIT_BENCH_WEAK void fused_moe_experts(const FusedMoEExpertsArgs&, Fp8Activations, bool);
MOEKIT_BENCH_WEAK void indexed_expert_mlp(const IndexedExpertMLPArgs&, Fp8Activations, bool);
MOEKIT_BENCH_WEAK void fused_moe(const FusedMoEArgs&, Fp8Activations, bool);
MOEKIT_BENCH_WEAK void fused_moe_shared_expert(const FusedMoESharedExpertArgs&, Fp8Activations,
                                               Fp8Activations, bool);
MOEKIT_BENCH_WEAK void shared_expert_mlp(const SharedExpertMLPArgs&, Fp8Activations);
}  // namespace reference
}  // namespace moekit

namespace moekit::bench {
// True when the function was linked in.
template <class F>
bool linked(F* f) {
  return f != nullptr;
}

// Asks an op's planner (both functions weakly linked) about args: *candidates gets
// candidates(args) when linked; *pick gets plan(args) when linked (true), else false.
template <class Plan, class A>
bool ask_planner(Plan (*plan)(const A&), std::vector<Plan> (*candidates)(const A&), const A& args,
                 Plan* pick, std::vector<Plan>* listed) {
  if (linked(candidates)) *listed = candidates(args);
  if (!linked(plan)) return false;
  *pick = plan(args);
  return true;
}
}  // namespace moekit::bench
