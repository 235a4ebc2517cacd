// CPU tests of the layer planner with FP8 weights (docs/moe.md "FP8-weight decoding"): the
// direct path wherever it can run (also past 16 routes per expert, where bf16 sorts), the
// sorted path refused with the contiguous-FP8-GEMM reason (no expert-MLP plan, no sorted
// candidates), the shared expert's FP8 plan (direct, split 1 / 1, T <= 64), the plan-log key.
#include <gtest/gtest.h>

#include <string>

#include "core/device.h"
#include "moe/layer_planner.h"
#include "moekit/plan.h"

namespace moekit {
namespace {

using detail::LayerProblem;
using detail::RoutedOp;

LayerProblem fp8_problem(int64_t T, int64_t H, int64_t E, int64_t F, int64_t K, int64_t S = 0,
                         RoutedOp op = RoutedOp::kLayer,
                         QuantScheme q = QuantScheme::kFp8Block128) {
  LayerProblem p;
  p.s.dtype = DType::kBF16;
  p.s.T = T;
  p.s.H = H;
  p.s.E = E;
  p.s.F = F;
  p.s.K = K;
  p.s.quant = q;
  p.op = op;
  p.S = S;
  p.shared_quant = S > 0 ? q : QuantScheme::kNone;
  return p;
}

bool contains(const std::string& s, const char* what) {
  return s.find(what) != std::string::npos;
}

TEST(Fp8LayerPlanner, TheIssueRowsTakeTheDecodeKernelsOrARefusal) {
  const detail::DeviceProps h200 = detail::h200_props();
  struct Case {
    const char* name;
    LayerProblem p;
    bool direct;
  };
  const Case cases[] = {
      {"ds-v3 T=1", fp8_problem(1, 7168, 256, 2048, 8, 2048), true},
      {"ds-v3 T=64", fp8_problem(64, 7168, 256, 2048, 8, 2048), true},
      {"ds-v3 T=512", fp8_problem(512, 7168, 256, 2048, 8, 2048), false},
      {"kimi-k2 T=32", fp8_problem(32, 7168, 384, 2048, 8), true},
      {"kimi-k2 T=4096", fp8_problem(4096, 7168, 384, 2048, 8), false},
      {"qwen3-235b T=32", fp8_problem(32, 4096, 128, 1536, 8), true},
      {"qwen3-30b per channel T=1",
       fp8_problem(1, 2048, 128, 768, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel), true},
      {"qwen3-30b per tensor T=4096",
       fp8_problem(4096, 2048, 128, 768, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerTensor),
       false},
      // bf16 sorts here (512 routes > 16 per expert of 8); FP8 has only the direct path.
      {"few experts T=64", fp8_problem(64, 256, 8, 128, 8), true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const LayerPlan plan = detail::plan_layer(c.p, h200);
    const std::string why = detail::layer_plan_rejection(plan, c.p, h200);
    if (c.direct) {
      EXPECT_EQ(plan.routed, RoutedPath::kDirect);
      EXPECT_EQ(why, "");
    } else {
      EXPECT_EQ(plan.routed, RoutedPath::kSorted);
      EXPECT_EQ(plan.experts, MlpPlan());  // no expert-MLP plan: the hook
      EXPECT_TRUE(contains(why,
                           "FP8 weights on the sorted path (taken because the direct path "
                           "cannot run T = "))
          << why;
      EXPECT_TRUE(contains(why, "need the contiguous FP8 grouped GEMM")) << why;
    }
    for (const LayerPlan& cand : detail::layer_plan_candidates(c.p, h200)) {
      EXPECT_EQ(cand.routed, RoutedPath::kDirect) << to_string(cand);
      EXPECT_EQ(detail::layer_plan_rejection(cand, c.p, h200), "") << to_string(cand);
    }
  }
  LayerProblem bf16 = fp8_problem(64, 256, 8, 128, 8);
  bf16.s.quant = QuantScheme::kNone;
  EXPECT_EQ(detail::plan_layer(bf16, h200).routed, RoutedPath::kSorted);
}

TEST(Fp8LayerPlanner, SharedExpertRunsTheDenseDecodeKernel) {
  const detail::DeviceProps h200 = detail::h200_props();
  const LayerPlan plan = detail::plan_layer(fp8_problem(32, 7168, 256, 2048, 8, 2048), h200);
  ASSERT_TRUE(plan.has_shared);
  EXPECT_EQ(plan.shared, detail::fp8_dense_mlp_plan());
  EXPECT_EQ(to_string(plan.shared), "direct{split 1/1}");
  EXPECT_EQ(detail::fp8_dense_mlp_plan_rejection(plan.shared, 64), "");
  EXPECT_TRUE(contains(detail::fp8_dense_mlp_plan_rejection(plan.shared, 65), "T = 65 > 64"));
  MlpPlan gemv;
  gemv.path = MlpPath::kGemv;
  EXPECT_TRUE(contains(detail::fp8_dense_mlp_plan_rejection(gemv, 1), "FP8 decode kernel"));
  EXPECT_EQ(detail::fp8_dense_mlp_plan_candidates(64).size(), 1u);
  EXPECT_TRUE(detail::fp8_dense_mlp_plan_candidates(65).empty());
  // A bf16 routed layer with a FP8 shared expert past 64 tokens: the shared part refuses.
  LayerProblem mixed = fp8_problem(128, 7168, 256, 2048, 8, 2048);
  mixed.s.quant = QuantScheme::kNone;
  const LayerPlan m = detail::plan_layer(mixed, h200);
  EXPECT_TRUE(contains(detail::layer_plan_rejection(m, mixed, h200), "the shared expert: FP8"));
}

TEST(Fp8LayerPlanner, ShapeKeyNamesTheScheme) {
  EXPECT_EQ(detail::shape_key(fp8_problem(1, 7168, 256, 2048, 8).s, 2048),
            "bf16 T=1 H=7168 E=256 F=2048 K=8 S=2048 w=fp8_block128");
}

}  // namespace
}  // namespace moekit
