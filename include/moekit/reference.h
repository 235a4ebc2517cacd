// Plain CPU references of every op, written from SPEC.md with f64 accumulation.
// They take the same argument structs as the kernels, with HOST pointers, and
// ignore workspaces. They validate nothing: tests call them on valid input.
#pragma once

#include "moekit/gemm.h"
#include "moekit/moe.h"
#include "moekit/permute.h"
#include "moekit/routing.h"

namespace moekit::reference {

void fused_topk(const FusedTopKArgs& args);
void moe_permute_align(const PermuteAlignArgs& args);
void moe_pre_permute(const PrePermuteArgs& args);
void moe_post_permute(const PostPermuteArgs& args);
void moe_grouped_gemm(const GroupedGemmArgs& args);
void moe_grouped_gemm_fp8(const GroupedGemmFP8Args& args);
void moe_expert_mlp(const ExpertMLPArgs& args);
void fused_moe_experts(const FusedMoEExpertsArgs& args);
void indexed_expert_mlp(const IndexedExpertMLPArgs& args);
void fused_moe(const FusedMoEArgs& args);
void fused_moe_shared_expert(const FusedMoESharedExpertArgs& args);
void shared_expert_mlp(const SharedExpertMLPArgs& args);

}  // namespace moekit::reference
