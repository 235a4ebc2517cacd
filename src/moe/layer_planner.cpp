// The layer planner: the routed path rules of docs/moe.md ("fused_moe", "indexed_expert_mlp").
#include "moe/layer_planner.h"

#include "gemm/gemm_planner.h"
#include "gemm/sm90/device.h"
#include "mlp/dense_mlp.h"
#include "moe/moe_validate.h"
#include "permute/permute_kernels.h"

namespace moekit::detail {
namespace {

// The layer ops take the direct path for small batches with few routes per expert: beyond
// ~16 routes per expert its 8-route chunks re-read each weight tile (from L2) while the
// sorted path's GEMM tiles take 64+ rows at once (docs/moe.md "fused_moe").
constexpr int64_t kDirectMaxRoutesPerExpert = 16;

bool takes_direct(const LayerProblem& p) {
  switch (p.op) {
    case RoutedOp::kSortedOnly:
      return false;
    case RoutedOp::kIndexed:
      return direct_path_eligible(p.s);
    case RoutedOp::kLayer:
      return direct_path_eligible(p.s) && p.s.T * p.s.K <= kDirectMaxRoutesPerExpert * p.s.E;
  }
  return false;
}

// The sorted path's expert-MLP GEMMs with stand-in pointers: the planners compare them
// (which buffers alias, whether counters are given), never read them.
SortedExpertGemms planning_gemms(const MoEShapes& s) {
  static char permuted, meta, act, weights, counters;
  return sorted_expert_gemms(s, &permuted, reinterpret_cast<const int32_t*>(&meta), &act, &weights,
                             &weights, &counters);
}

std::vector<MlpPlan> shared_candidates(const LayerProblem& p, const DeviceProps& device) {
  if (p.S == 0) return {MlpPlan()};
  return dense_mlp_plan_candidates(shared_mlp_problem(p.s, p.S, DType::kF32, device), device);
}

std::string sorted_rejection(const LayerPlan& plan, const LayerProblem& p,
                             const DeviceProps& device) {
  if (p.s.E > kPermuteMaxExperts)
    return "the sorted path takes at most " + str(kPermuteMaxExperts) + " experts, not " +
           str(p.s.E);
  const SortedExpertGemms g = planning_gemms(p.s);
  const std::string why = mlp_gemms_plan_rejection(plan.experts, g.up, g.down, device);
  return why.empty() ? why : "the expert MLP: " + why;
}

std::string direct_rejection(const LayerProblem& p) {
  if (p.op == RoutedOp::kSortedOnly) return "fused_moe_experts runs only the sorted path";
  const std::string why = direct_path_rejection(p.s);
  return why.empty() ? why : "the direct path cannot run " + why;
}

}  // namespace

std::string direct_path_rejection(const MoEShapes& s) {
  if (s.T > kDirectMaxTokens) return "T = " + str(s.T) + " > " + str(kDirectMaxTokens);
  if (s.T * s.K > kDirectMaxRoutes)
    return "T*top_k = " + str(s.T * s.K) + " > " + str(kDirectMaxRoutes);
  if (s.E > kDirectMaxExperts) return "E = " + str(s.E) + " > " + str(kDirectMaxExperts);
  if (2 * s.F * s.H >= (int64_t{1} << 31)) return "2*F*H = " + str(2 * s.F * s.H) + " >= 2^31";
  return {};
}

std::string shape_key(const MoEShapes& s, int64_t S) {
  std::string key = std::string(dtype_name(s.dtype)) + " T=" + str(s.T) + " H=" + str(s.H);
  if (s.E > 0) key += " E=" + str(s.E) + " F=" + str(s.F) + " K=" + str(s.K);
  if (S > 0) key += " S=" + str(S);
  return key;
}

int64_t sorted_rows(const MoEShapes& s) {
  return permuted_rows(s.T, static_cast<int>(s.K), static_cast<int>(s.E), kSortedAlignment);
}

DenseMlpProblem shared_mlp_problem(const MoEShapes& s, int64_t S, DType out_dtype,
                                   const DeviceProps& device) {
  DenseMlpProblem p;
  p.dtype = s.dtype;
  p.out_dtype = out_dtype;
  p.T = s.T;
  p.H = s.H;
  p.S = S;
  p.streamk_scratch = dense_mlp_scratch_bytes(s.dtype, s.T, s.H, S, device) > 0;
  return p;
}

SortedExpertGemms sorted_expert_gemms(const MoEShapes& s, void* permuted,
                                      const int32_t* layout_metadata, void* act,
                                      const void* w_gate_up, const void* w_down,
                                      void* tile_counters) {
  static_assert(kExpertMlpCounterBytes == 2 * kTileCounterBytes + kSm90MlpChainScratchBytes,
                "one counter per GEMM, then the chain's scratch");
  SortedExpertGemms g;
  g.chain_scratch =
      tile_counters ? static_cast<char*>(tile_counters) + 2 * kTileCounterBytes : nullptr;
  if (!sm90_dynamic_mlp()) tile_counters = nullptr;  // static schedules (gemm/sm90/device.h)
  GroupedGemmProblem& up = g.up;
  up.in_dtype = s.dtype;
  up.out_dtype = s.dtype;  // the activation is rounded to the op's dtype (SPEC)
  up.a = permuted;
  up.b = w_gate_up;
  up.c = act;
  up.num_groups = static_cast<int>(s.E);
  up.n = s.F;
  up.k = s.H;
  up.activation = Activation::kSiluAndMul;
  up.rows = GemmRows::kContiguous;
  up.layout_metadata = layout_metadata;
  up.alignment = kSortedAlignment;
  up.m = sorted_rows(s);
  up.routed_counts = true;  // ragged, skewed counts from top-k routing
  up.tile_counter = static_cast<unsigned*>(tile_counters);
  GroupedGemmProblem& down = g.down;
  down = up;
  down.a = act;
  down.b = w_down;
  down.c = permuted;
  down.n = s.H;
  down.k = s.F;
  down.activation = Activation::kNone;
  down.tile_counter =
      tile_counters
          ? reinterpret_cast<unsigned*>(static_cast<char*>(tile_counters) + kTileCounterBytes)
          : nullptr;
  return g;
}

LayerPlan plan_layer(const LayerProblem& p, const DeviceProps& device,
                     const DirectCapacity& shared_capacity) {
  LayerPlan plan;
  if (takes_direct(p)) {
    plan.routed = RoutedPath::kDirect;
  } else {
    plan.routed = RoutedPath::kSorted;
    const SortedExpertGemms g = planning_gemms(p.s);
    plan.experts = plan_mlp_gemms(g.up, g.down, device);
  }
  plan.has_shared = p.S > 0;
  if (plan.has_shared)
    plan.shared =
        plan_dense_mlp(shared_mlp_problem(p.s, p.S, DType::kF32, device), device, shared_capacity);
  return plan;
}

std::vector<LayerPlan> layer_plan_candidates(const LayerProblem& p, const DeviceProps& device) {
  std::vector<LayerPlan> routed;
  if (direct_rejection(p).empty()) {
    LayerPlan direct;
    direct.routed = RoutedPath::kDirect;
    routed.push_back(direct);
  }
  if (p.s.E <= kPermuteMaxExperts) {
    const SortedExpertGemms g = planning_gemms(p.s);
    for (const MlpPlan& m : mlp_gemms_plan_candidates(g.up, g.down, device)) {
      LayerPlan sorted;
      sorted.experts = m;
      routed.push_back(sorted);
    }
  }
  std::vector<LayerPlan> out;
  for (const MlpPlan& shared : shared_candidates(p, device)) {
    for (LayerPlan plan : routed) {
      plan.has_shared = p.S > 0;
      plan.shared = shared;
      out.push_back(plan);
    }
  }
  return out;
}

std::string layer_plan_rejection(const LayerPlan& plan, const LayerProblem& p,
                                 const DeviceProps& device) {
  const std::string routed =
      plan.routed == RoutedPath::kDirect ? direct_rejection(p) : sorted_rejection(plan, p, device);
  if (!routed.empty()) return routed;
  if (plan.has_shared != (p.S > 0))
    return p.S > 0 ? "the layer has a shared expert: the plan needs its MLP"
                   : "the layer has no shared expert";
  if (!plan.has_shared) return {};
  const std::string shared = dense_mlp_plan_rejection(
      plan.shared, shared_mlp_problem(p.s, p.S, DType::kF32, device), device);
  return shared.empty() ? shared : "the shared expert: " + shared;
}

}  // namespace moekit::detail
