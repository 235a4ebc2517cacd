// FusedTopKFwd: argument validation, then one kernel launch (fused_topk.cu).
#include <cmath>
#include <string>

#include "core/check.h"
#include "moekit/routing.h"
#include "routing/fused_topk_kernel.h"
#include "routing/topk_params_check.h"

namespace moekit {

namespace detail {

int64_t check_routing_inputs(const ArgCheck& check, const TensorView& gating_output,
                             const TensorView& correction_bias, const TopKParams& p) {
  const auto any = kAnyDim;
  check.tensor("gating_output", gating_output, {DType::kBF16, DType::kF16, DType::kF32},
               {any, any});
  const int64_t T = gating_output.size(0);
  const int64_t E = gating_output.size(1);
  MOEKIT_REQUIRE(check, E >= 1 && E <= kTopKMaxExperts, "gating_output",
                 "1 to " + std::to_string(kTopKMaxExperts) + " experts (dim 1)",
                 gating_output.describe());
  MOEKIT_REQUIRE(check, T <= INT32_MAX, "gating_output", "at most 2^31-1 tokens",
                 gating_output.describe());
  MOEKIT_REQUIRE(
      check, p.top_k >= 1 && p.top_k <= kTopKMaxK && p.top_k <= E, "top_k",
      "1 to min(" + std::to_string(kTopKMaxK) + ", num_experts=" + std::to_string(E) + ")",
      std::to_string(p.top_k));
  MOEKIT_REQUIRE(
      check, p.scoring_func == ScoringFunc::kSoftmax || p.scoring_func == ScoringFunc::kSigmoid,
      "scoring_func", "softmax or sigmoid", std::to_string(static_cast<int>(p.scoring_func)));
  MOEKIT_REQUIRE(check, std::isfinite(p.routed_scaling_factor), "routed_scaling_factor",
                 "a finite value", std::to_string(p.routed_scaling_factor));
  if (p.num_expert_group == 0) {
    MOEKIT_REQUIRE(check, p.topk_group == 0, "topk_group",
                   "0 when num_expert_group is 0 (no grouping)", std::to_string(p.topk_group));
  } else {
    MOEKIT_REQUIRE(check, p.num_expert_group > 0 && E % p.num_expert_group == 0, "num_expert_group",
                   "0 or a positive divisor of num_experts=" + std::to_string(E),
                   std::to_string(p.num_expert_group));
    MOEKIT_REQUIRE(check, p.topk_group >= 1 && p.topk_group <= p.num_expert_group, "topk_group",
                   "1 to num_expert_group=" + std::to_string(p.num_expert_group),
                   std::to_string(p.topk_group));
    const int64_t selectable = static_cast<int64_t>(p.topk_group) * (E / p.num_expert_group);
    MOEKIT_REQUIRE(
        check, p.top_k <= selectable, "top_k",
        "at most topk_group * num_experts / num_expert_group = " + std::to_string(selectable),
        std::to_string(p.top_k));
  }
  check.optional_tensor("correction_bias", correction_bias, {DType::kF32}, {E});
  return E;
}

}  // namespace detail

void fused_topk(const FusedTopKArgs& args, cudaStream_t stream) {
  detail::ArgCheck check("fused_topk");
  detail::check_routing_inputs(check, args.gating_output, args.correction_bias, args.params);
  const int64_t T = args.gating_output.size(0);
  const int64_t E = args.gating_output.size(1);
  const TopKParams& p = args.params;
  check.tensor("topk_weights", args.topk_weights, {DType::kF32}, {T, p.top_k});
  check.tensor("topk_ids", args.topk_ids, {DType::kI32}, {T, p.top_k});
  check.outputs_disjoint(
      {{"topk_weights", args.topk_weights}, {"topk_ids", args.topk_ids}},
      {{"gating_output", args.gating_output}, {"correction_bias", args.correction_bias}});
  if (T == 0) return;
  check.launch_target(stream, "topk_weights", args.topk_weights);

  detail::FusedTopKLaunch l;
  l.gating = args.gating_output.data;
  l.dtype = args.gating_output.dtype;
  l.bias = args.correction_bias.defined() ? args.correction_bias.ptr<const float>() : nullptr;
  l.num_tokens = T;
  l.num_experts = static_cast<int>(E);
  l.params = p;
  l.topk_weights = args.topk_weights.ptr<float>();
  l.topk_ids = args.topk_ids.ptr<int32_t>();
  detail::launch_fused_topk(l, stream);
}

}  // namespace moekit
