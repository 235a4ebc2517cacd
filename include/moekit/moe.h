// Expert MLPs and whole MoE layers.
//   MLP_e(x) = w_down[e] . (silu(w_gate[e] . x) * (w_up[e] . x)), f32 accumulation,
//   the F-wide activation rounded to the op's dtype before the down projection.
//   Other activations (gemm.h Activation) and per-expert biases: docs/moe.md "Activations";
//   a bias is added to the GEMM's f32 accumulators (before the activation, before the
//   routing weight). Biases are f32 or the op's dtype.
// Ops that need scratch take a Workspace of at least *_workspace_size(args) bytes
// (the size depends only on shapes and dtypes, so it may be queried with null pointers;
// the query validates the arguments the size depends on and throws what the op would).
// Memory: an output never overlaps another argument or the workspace, except where an op
// says it may be an input itself (in place); errors name the op called (docs/bad-inputs.md).
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "moekit/gemm.h"
#include "moekit/plan.h"
#include "moekit/quant.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace moekit {

// MoEExpertMLPFwd: the MLP of each expert on its rows of a contiguous permuted buffer.
struct ExpertMLPArgs {
  TensorView expert_input;     // [P, H] bf16 / f16
  TensorView layout_metadata;  // [E] i32 inclusive physical ends
  PermutedLayout layout;       // contiguous(alignment)
  TensorView w_gate_up;        // [E, 2F, H] (e4m3 when quantized)
  TensorView w_down;           // [E, H, F]
  WeightQuant quant;           // the weights' scheme and scales (moekit/quant.h)
  TensorView expert_output;    // out [P, H]; padding rows untouched; may be expert_input
  // Activation and optional biases (docs/moe.md "Activations"); w_gate_up holds F rows
  // for kRelu2, else 2F.
  Activation activation = Activation::kSiluAndMul;
  TensorView gate_up_bias;  // optional [E, 2F] ([E, F] for kRelu2), f32 or the dtype
  TensorView down_bias;     // optional [E, H], f32 or the dtype
  Workspace workspace;
  const MlpPlan* plan = nullptr;  // nullptr: the planner's
};
size_t expert_mlp_workspace_size(const ExpertMLPArgs& args);
void moe_expert_mlp(const ExpertMLPArgs& args, cudaStream_t stream);
MlpPlan plan_expert_mlp(const ExpertMLPArgs& args);
std::vector<MlpPlan> expert_mlp_plan_candidates(const ExpertMLPArgs& args);

// FusedMoEExpertsFwd: output[t] = sum_{k: id>=0} w[t,k] * MLP_{id[t,k]}(x_t).
struct FusedMoEExpertsArgs {
  TensorView hidden_states;  // [T, H] bf16 / f16
  TensorView w_gate_up;      // [E, 2F, H] (e4m3 when quantized)
  TensorView w_down;         // [E, H, F]
  WeightQuant quant;         // the weights' scheme and scales (moekit/quant.h)
  TensorView topk_weights;   // [T, K] f32
  TensorView topk_ids;       // [T, K] i32 / i64 in [0, E) or -1 (global ids with expert_map)
  TensorView output;         // out [T, H], fully overwritten; may be hidden_states
  // Activation and optional biases (docs/moe.md "Activations"); w_gate_up holds F rows
  // for kRelu2, else 2F.
  Activation activation = Activation::kSiluAndMul;
  TensorView gate_up_bias;  // optional [E, 2F] ([E, F] for kRelu2), f32 or the dtype
  TensorView down_bias;     // optional [E, H], f32 or the dtype
  Workspace workspace;
  const LayerPlan* plan = nullptr;  // nullptr: the planner's
  // Engine inputs (docs/moe.md, "Engine inputs"): expert parallelism and top-1 models.
  TensorView expert_map;  // optional [E_global] i32: global id -> local id, -1 = other rank
  bool apply_router_weight_on_input = false;  // x scaled by w before the MLP; top_k 1 only
};
size_t fused_moe_experts_workspace_size(const FusedMoEExpertsArgs& args);
void fused_moe_experts(const FusedMoEExpertsArgs& args, cudaStream_t stream);
LayerPlan plan_fused_moe_experts(const FusedMoEExpertsArgs& args);
std::vector<LayerPlan> fused_moe_experts_plan_candidates(const FusedMoEExpertsArgs& args);

// IndexedExpertMLPFwd: the same contract, built for T <= 64 (routes read straight
// from topk_ids, no sort); correct for every T.
using IndexedExpertMLPArgs = FusedMoEExpertsArgs;
size_t indexed_expert_mlp_workspace_size(const IndexedExpertMLPArgs& args);
void indexed_expert_mlp(const IndexedExpertMLPArgs& args, cudaStream_t stream);
LayerPlan plan_indexed_expert_mlp(const IndexedExpertMLPArgs& args);
std::vector<LayerPlan> indexed_expert_mlp_plan_candidates(const IndexedExpertMLPArgs& args);

// FusedMoEFwd: fused_topk followed by fused_moe_experts.
struct FusedMoEArgs {
  TensorView hidden_states;    // [T, H] bf16 / f16
  TensorView gating_output;    // [T, E] bf16 / f16 / f32 ([T, E_global] with expert_map)
  TensorView correction_bias;  // optional [E] f32 ([E_global] with expert_map)
  TopKParams params;
  TensorView w_gate_up;  // [E, 2F, H] (e4m3 when quantized)
  TensorView w_down;     // [E, H, F]
  WeightQuant quant;     // the routed experts' scheme and scales (moekit/quant.h)
  TensorView output;     // out [T, H]; may be hidden_states
  // Activation and optional biases (docs/moe.md "Activations"); w_gate_up holds F rows
  // for kRelu2, else 2F.
  Activation activation = Activation::kSiluAndMul;
  TensorView gate_up_bias;  // optional [E, 2F] ([E, F] for kRelu2), f32 or the dtype
  TensorView down_bias;     // optional [E, H], f32 or the dtype
  Workspace workspace;
  const LayerPlan* plan = nullptr;  // nullptr: the planner's
  // Engine inputs (docs/moe.md, "Engine inputs"); with expert_map, gating_output is
  // [T, E_global] and the routing picks global ids.
  TensorView expert_map;  // optional [E_global] i32: global id -> local id, -1 = other rank
  bool apply_router_weight_on_input = false;  // x scaled by w before the MLP; top_k 1 only
};
size_t fused_moe_workspace_size(const FusedMoEArgs& args);
void fused_moe(const FusedMoEArgs& args, cudaStream_t stream);
LayerPlan plan_fused_moe(const FusedMoEArgs& args);
std::vector<LayerPlan> fused_moe_plan_candidates(const FusedMoEArgs& args);

// FusedMoESharedExpertFwd: fused_moe(...) + SharedMLP(x) (shared expert weight 1).
struct FusedMoESharedExpertArgs {
  FusedMoEArgs moe;  // moe.output receives the sum; moe.plan: the layer's plan. The shared
                     // expert reads the unscaled x and is added once per token (per rank).
  TensorView shared_w_gate_up;  // [2S, H]; both shared weights undefined = no shared expert
  TensorView shared_w_down;     // [H, S]
  // The shared expert runs moe.activation ([S, H] gate rows for kRelu2); optional biases.
  TensorView shared_gate_up_bias;  // optional [2S] ([S] for kRelu2), f32 or the dtype
  TensorView shared_down_bias;     // optional [H], f32 or the dtype
  WeightQuant shared_quant;        // the shared expert's scheme and scales (no E axis)
};
size_t fused_moe_shared_expert_workspace_size(const FusedMoESharedExpertArgs& args);
void fused_moe_shared_expert(const FusedMoESharedExpertArgs& args, cudaStream_t stream);
LayerPlan plan_fused_moe_shared_expert(const FusedMoESharedExpertArgs& args);
std::vector<LayerPlan> fused_moe_shared_expert_plan_candidates(
    const FusedMoESharedExpertArgs& args);

// SharedExpertMLPFwd: a dense gated MLP.
struct SharedExpertMLPArgs {
  TensorView hidden_states;  // [T, H] bf16 / f16
  TensorView w_gate_up;      // [2S, H] (e4m3 when quantized)
  TensorView w_down;         // [H, S]
  WeightQuant quant;         // the weights' scheme and scales (no E axis; moekit/quant.h)
  TensorView output;         // out [T, H]; not hidden_states (no in place)
  // Activation and optional biases (docs/moe.md "Activations"); w_gate_up holds S rows
  // for kRelu2, else 2S.
  Activation activation = Activation::kSiluAndMul;
  TensorView gate_up_bias;  // optional [2S] ([S] for kRelu2), f32 or the dtype
  TensorView down_bias;     // optional [H], f32 or the dtype
  Workspace workspace;
  const MlpPlan* plan = nullptr;  // nullptr: the planner's
};
size_t shared_expert_mlp_workspace_size(const SharedExpertMLPArgs& args);
void shared_expert_mlp(const SharedExpertMLPArgs& args, cudaStream_t stream);
MlpPlan plan_shared_expert_mlp(const SharedExpertMLPArgs& args);
std::vector<MlpPlan> shared_expert_mlp_plan_candidates(const SharedExpertMLPArgs& args);

}  // namespace moekit
