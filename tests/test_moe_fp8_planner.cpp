// CPU tests of the layer planner with FP8 weights (docs/moe.md "Quantized weights"): the
// direct path wherever it can run (T <= 128, T*K <= 1024; also past 16 routes per expert,
// where bf16 sorts), past it the sorted path's two FP8 GEMMs (fp8_sm90; refused off sm_90
// devices), the shared expert's FP8 plan (direct, split 1 / 1, T <= 64 and 2*S*H < 2^31; the
// FP8 GEMMs past it), the plan-log key.
#include <gtest/gtest.h>

#include <string>

#include "core/device.h"
#include "moe/fp8_mlp.h"
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
      // Past 64 tokens (to T = 128, T*K <= 1024): the direct path for per-channel and
      // per-tensor scales with F <= 768 and <= 8 routes an expert (the H200 A/B's winners),
      // except at F <= 128 from 2 routes an expert (the weight-only GEMMs won there).
      {"qwen3.5-35b per channel T=128",
       fp8_problem(128, 4096, 257, 128, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel),
       false},
      {"F = 128 per channel T=96 (2 routes an expert)",
       fp8_problem(96, 4096, 384, 128, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel), false},
      {"F = 128 per channel T=95 (1.98 routes an expert)",
       fp8_problem(95, 4096, 384, 128, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel), true},
      {"qwen3.5-397b per channel T=96 (1.5 routes an expert)",
       fp8_problem(96, 4096, 513, 128, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel), true},
      {"f = 128 per tensor T=64 (8 routes an expert)",
       fp8_problem(64, 4096, 64, 128, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerTensor), true},
      {"qwen3.5-35b per channel T=129",
       fp8_problem(129, 4096, 257, 128, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel),
       false},
      {"qwen3-30b per tensor T=96 top-8",
       fp8_problem(96, 2048, 128, 768, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerTensor), true},
      {"128 experts per channel T=128 top-8",
       fp8_problem(128, 2048, 128, 768, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel), true},
      {"127 experts per channel T=128 top-8",
       fp8_problem(128, 2048, 127, 768, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel),
       false},
      {"F = 896 per channel T=96",
       fp8_problem(96, 2048, 128, 896, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel), false},
      // Block scales sort past 64 (DeepSeek-V3's layer lost 1.13x-1.41x on the direct path).
      {"ds-v3 T=65 top-8", fp8_problem(65, 7168, 256, 2048, 8, 2048), false},
      {"qwen3-30b blocks T=96", fp8_problem(96, 2048, 128, 768, 8), false},
      // indexed_expert_mlp past 64 tokens: the same rule.
      {"indexed qwen3.5-35b per channel T=128",
       fp8_problem(128, 4096, 257, 128, 8, 0, RoutedOp::kIndexed, QuantScheme::kFp8PerChannel),
       false},
      {"indexed qwen3-30b per channel T=128",
       fp8_problem(128, 2048, 128, 768, 8, 0, RoutedOp::kIndexed, QuantScheme::kFp8PerChannel),
       true},
      {"indexed ds-v3 blocks T=96", fp8_problem(96, 7168, 256, 2048, 8, 0, RoutedOp::kIndexed),
       false},
      {"indexed 16 experts per tensor T=65",
       fp8_problem(65, 4096, 16, 768, 4, 0, RoutedOp::kIndexed, QuantScheme::kFp8PerTensor), false},
      // Mixtral-8x7B's shape: 8 experts at top-2 sort from T = 65.
      {"8 experts top-2 T=64", fp8_problem(64, 4096, 8, 14336, 2), true},
      {"8 experts top-2 T=65",
       fp8_problem(65, 4096, 8, 14336, 2, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel), false},
  };
  MlpPlan fp8_gemms;
  fp8_gemms.path = MlpPath::kTwoGemms;
  fp8_gemms.gate_up = {GemmKernel::kFp8Sm90, 128, 128};
  fp8_gemms.down = {GemmKernel::kFp8Sm90, 128, 128};
  detail::DeviceProps a100 = h200;
  a100.arch = 80;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const LayerPlan plan = detail::plan_layer(c.p, h200);
    EXPECT_EQ(detail::layer_plan_rejection(plan, c.p, h200), "");
    // Sorted with per-tensor / per-channel scales, F <= 128, <= 16 routes an expert: the
    // weight-only GEMMs, which need no sm_90 (the decode tiles).
    const bool weight_only = !c.direct && c.p.s.quant != QuantScheme::kFp8Block128 &&
                             c.p.s.F <= 128 && c.p.s.T * c.p.s.K <= 16 * c.p.s.E;
    if (c.direct) {
      EXPECT_EQ(plan.routed, RoutedPath::kDirect);
    } else if (weight_only) {
      EXPECT_EQ(plan.routed, RoutedPath::kSorted);
      EXPECT_EQ(plan.experts, detail::fp8_weight_only_plan()) << to_string(plan.experts);
      EXPECT_EQ(detail::layer_plan_rejection(detail::plan_layer(c.p, a100), c.p, a100), "");
    } else {
      EXPECT_EQ(plan.routed, RoutedPath::kSorted);
      // Per-tensor / per-channel scales on >= 256 rows an expert, block scales on >= 80:
      // the 256-wide tiles.
      MlpPlan want = fp8_gemms;
      const bool block = c.p.s.quant == QuantScheme::kFp8Block128;
      if (c.p.s.T * c.p.s.K >= (block ? 80 : 256) * c.p.s.E)
        want.gate_up.tile_n = want.down.tile_n = 256;
      // More tiles than SMs and the layer's workspace holds a counter: the dynamic schedule.
      want.gate_up.schedule = want.down.schedule = GemmSchedule::kDynamic;
      EXPECT_EQ(plan.experts, want) << to_string(plan.experts);
      // Off sm_90 the FP8 GEMMs cannot run: the routed direct kernels where they can (T <= 128,
      // T*K <= 1024; a shared expert's dense form to T = 64), else refused, saying why.
      const LayerPlan off = detail::plan_layer(c.p, a100);
      const std::string why = detail::layer_plan_rejection(off, c.p, a100);
      const bool direct_runs = c.p.s.T <= 128 && c.p.s.T * c.p.s.K <= 1024;
      if (direct_runs) EXPECT_EQ(off.routed, RoutedPath::kDirect);
      if (direct_runs && (c.p.S == 0 || c.p.s.T <= 64))
        EXPECT_EQ(why, "");
      else
        EXPECT_TRUE(contains(why, "fp8_sm90 needs an sm_90 device")) << why;
    }
    int sorted = 0;
    for (const LayerPlan& cand : detail::layer_plan_candidates(c.p, h200)) {
      EXPECT_EQ(detail::layer_plan_rejection(cand, c.p, h200), "") << to_string(cand);
      if (cand.routed == RoutedPath::kSorted) {
        ++sorted;
        EXPECT_EQ(cand.experts.path, MlpPath::kTwoGemms) << to_string(cand);
      }
    }
    EXPECT_GE(sorted, 1);
    // A bf16 expert-MLP plan (the chain) cannot run FP8 weights.
    LayerPlan chain = plan;
    chain.routed = RoutedPath::kSorted;
    chain.experts.path = MlpPath::kChain;
    EXPECT_TRUE(contains(detail::layer_plan_rejection(chain, c.p, h200), "two_gemms"));
  }
  LayerProblem bf16 = fp8_problem(64, 256, 8, 128, 8);
  bf16.s.quant = QuantScheme::kNone;
  EXPECT_EQ(detail::plan_layer(bf16, h200).routed, RoutedPath::kSorted);
}

TEST(Fp8LayerPlanner, SharedExpertRunsTheDenseDecodeKernelThenTheFp8Gemms) {
  const detail::DeviceProps h200 = detail::h200_props();
  const LayerProblem p = fp8_problem(32, 7168, 256, 2048, 8, 2048);
  const LayerPlan plan = detail::plan_layer(p, h200);
  ASSERT_TRUE(plan.has_shared);
  EXPECT_EQ(plan.shared, detail::fp8_dense_mlp_plan());
  EXPECT_EQ(to_string(plan.shared), "direct{split 1/1}");
  const auto rejection = [&](const MlpPlan& m, int64_t T) {
    detail::MoEShapes s = p.s;
    s.T = T;
    return detail::fp8_dense_mlp_plan_rejection(m, s, 2048, QuantScheme::kFp8Block128, h200);
  };
  const auto candidates = [&](int64_t T) {
    detail::MoEShapes s = p.s;
    s.T = T;
    return detail::fp8_dense_mlp_plan_candidates(s, 2048, QuantScheme::kFp8Block128, h200);
  };
  EXPECT_EQ(rejection(plan.shared, 64), "");
  EXPECT_TRUE(contains(rejection(plan.shared, 65),
                       "FP8 weights past the FP8 direct kernel (T = 65 > 64): FP8 weights run two "
                       "FP8 GEMMs (two_gemms)"))
      << rejection(plan.shared, 65);
  MlpPlan gemv;
  gemv.path = MlpPath::kGemv;
  EXPECT_TRUE(contains(rejection(gemv, 1), "FP8 direct kernel"));
  EXPECT_EQ(candidates(64).size(), 1u);
  ASSERT_FALSE(candidates(65).empty());
  for (const MlpPlan& m : candidates(65)) {
    EXPECT_EQ(m.path, MlpPath::kTwoGemms);
    EXPECT_EQ(rejection(m, 65), "") << to_string(m);
  }
  // A bf16 routed layer with a FP8 shared expert past 64 tokens: the FP8 GEMMs, one group.
  LayerProblem mixed = fp8_problem(128, 7168, 256, 2048, 8, 2048);
  mixed.s.quant = QuantScheme::kNone;
  const LayerPlan m = detail::plan_layer(mixed, h200);
  EXPECT_EQ(m.shared.path, MlpPath::kTwoGemms);
  EXPECT_EQ(detail::layer_plan_rejection(m, mixed, h200), "");
}

// The dense decode kernel addresses weight rows by 32-bit offsets (as the routed form, whose
// 2*F*H < 2^31 the direct path's eligibility checks): a shared expert with 2*S*H >= 2^31 runs
// the FP8 GEMMs even at T = 1, and a forced decode plan is refused naming the offsets.
TEST(Fp8LayerPlanner, SharedExpertPastThe32BitOffsetsRunsTheFp8Gemms) {
  const detail::DeviceProps h200 = detail::h200_props();
  struct Case {
    int64_t H, S;
    bool decode;
  };
  const Case cases[] = {
      {7168, 2048, true},
      {16384, 65536 - 128, true},  // 2*S*H = 2^31 - 2^22
      {16384, 65536, false},       // 2*S*H = 2^31
      {32768, 65536, false},       // (S + 8) * H > INT32_MAX: the offsets would wrap
  };
  for (const QuantScheme q :
       {QuantScheme::kFp8Block128, QuantScheme::kFp8PerChannel, QuantScheme::kFp8PerTensor}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(quant_scheme_name(q)) + " H=" + std::to_string(c.H) +
                   " S=" + std::to_string(c.S));
      detail::MoEShapes s = fp8_problem(1, c.H, 256, 2048, 8, c.S, RoutedOp::kLayer, q).s;
      const MlpPlan plan = detail::plan_fp8_dense_mlp(s, c.S, q, h200);
      EXPECT_EQ(detail::fp8_dense_mlp_plan_rejection(plan, s, c.S, q, h200), "") << to_string(plan);
      EXPECT_EQ(detail::fp8_dense_uses_gemm(s.T, s.H, c.S), !c.decode);
      const std::string direct =
          detail::fp8_dense_mlp_plan_rejection(detail::fp8_dense_mlp_plan(), s, c.S, q, h200);
      if (c.decode) {
        EXPECT_EQ(plan, detail::fp8_dense_mlp_plan());
        EXPECT_EQ(direct, "");
        continue;
      }
      EXPECT_EQ(plan.path, MlpPath::kTwoGemms) << to_string(plan);
      const std::string offsets =
          "FP8 weights past the FP8 direct kernel (2*S*H = " + std::to_string(2 * c.S * c.H) +
          " >= 2^31: its weight offsets are 32-bit): FP8 weights run two FP8 GEMMs (two_gemms), "
          "not direct";
      EXPECT_TRUE(contains(direct, offsets.c_str())) << direct;
      const auto cands = detail::fp8_dense_mlp_plan_candidates(s, c.S, q, h200);
      ASSERT_FALSE(cands.empty());
      for (const MlpPlan& m : cands) {
        EXPECT_EQ(m.path, MlpPath::kTwoGemms) << to_string(m);
        EXPECT_EQ(detail::fp8_dense_mlp_plan_rejection(m, s, c.S, q, h200), "") << to_string(m);
      }
      // In a layer: the routed part (2*F*H small) stays direct, the shared part the GEMMs;
      // the shared part forced onto the decode kernel is refused.
      const LayerProblem p = fp8_problem(1, c.H, 256, 2048, 8, c.S, RoutedOp::kLayer, q);
      LayerPlan layer = detail::plan_layer(p, h200);
      EXPECT_EQ(layer.routed, RoutedPath::kDirect);
      EXPECT_EQ(layer.shared.path, MlpPath::kTwoGemms) << to_string(layer);
      EXPECT_EQ(detail::layer_plan_rejection(layer, p, h200), "") << to_string(layer);
      for (const LayerPlan& cand : detail::layer_plan_candidates(p, h200))
        EXPECT_EQ(cand.shared.path, MlpPath::kTwoGemms) << to_string(cand);
      layer.shared = detail::fp8_dense_mlp_plan();
      EXPECT_TRUE(contains(detail::layer_plan_rejection(layer, p, h200),
                           ("the shared expert: " + offsets).c_str()))
          << detail::layer_plan_rejection(layer, p, h200);
    }
  }
}

// Per-tensor weights with a given a_down_scale (MoEShapes::static_act): the gate/up GEMM
// writes the down GEMM's e4m3 input (a c_scale), which fp8_sm90 128x256 cannot. The planners
// pick 128x256 for this shape's GEMMs without the scale, the 128x128 kernel with it, for the
// routed and the shared expert each by its own scale; every candidate then runs. (moekit-sweep
// found the layer ops refusing their own plan, 2026-12-06.)
TEST(Fp8LayerPlanner, StaticActivationScalesKeepTheGateUpGemmOff128x256) {
  const detail::DeviceProps h200 = detail::h200_props();
  const QuantScheme tensor = QuantScheme::kFp8PerTensor;
  LayerProblem p = fp8_problem(4096, 2048, 128, 768, 8, 1024, RoutedOp::kLayer, tensor);
  const LayerPlan dynamic = detail::plan_layer(p, h200);
  ASSERT_EQ(dynamic.routed, RoutedPath::kSorted);
  EXPECT_EQ(to_string(dynamic.experts.gate_up), "fp8_sm90 128x256 dynamic");
  EXPECT_EQ(to_string(dynamic.shared.gate_up), "fp8_sm90 128x256 dynamic");
  for (bool routed_static : {false, true}) {
    for (bool shared_static : {false, true}) {
      SCOPED_TRACE(std::to_string(routed_static) + std::to_string(shared_static));
      p.s.static_act = routed_static;
      p.shared_static_act = shared_static;
      const LayerPlan plan = detail::plan_layer(p, h200);
      EXPECT_EQ(to_string(plan.experts.gate_up),
                routed_static ? "fp8_sm90 128x128 dynamic" : "fp8_sm90 128x256 dynamic");
      EXPECT_EQ(to_string(plan.shared.gate_up),
                shared_static ? "fp8_sm90 128x128 dynamic" : "fp8_sm90 128x256 dynamic");
      EXPECT_EQ(detail::layer_plan_rejection(plan, p, h200), "");
      for (const LayerPlan& c : detail::layer_plan_candidates(p, h200))
        EXPECT_EQ(detail::layer_plan_rejection(c, p, h200), "") << to_string(c);
      if (routed_static)
        EXPECT_TRUE(contains(detail::layer_plan_rejection(dynamic, p, h200), "no c_scale"));
    }
  }
}

// The weight-only FP8 sorted plan (bf16 rows, decode_persistent's e4m3 tiles): a candidate of
// the per-channel / per-tensor bf16 layers, and refused, saying why, with block scales, f16
// rows and k % 16 != 0; the dense FP8 MLPs (the shared expert) never take it.
TEST(Fp8LayerPlanner, WeightOnlyPlanIsACandidateWhereItRunsAndRefusedElsewhere) {
  const detail::DeviceProps h200 = detail::h200_props();
  LayerPlan weight_only;
  ASSERT_TRUE(parse_plan(
      "sorted two_gemms{gate_up: decode_persistent 32x256, down: decode_persistent 32x256}",
      &weight_only));
  const auto listed = [&](const LayerProblem& p, const detail::DeviceProps& d) {
    for (const LayerPlan& c : detail::layer_plan_candidates(p, d))
      if (c == weight_only) return true;
    return false;
  };
  for (QuantScheme q : {QuantScheme::kFp8PerChannel, QuantScheme::kFp8PerTensor}) {
    for (RoutedOp op : {RoutedOp::kLayer, RoutedOp::kSortedOnly}) {
      const LayerProblem p = fp8_problem(256, 4096, 257, 128, 8, 0, op, q);
      EXPECT_EQ(detail::layer_plan_rejection(weight_only, p, h200), "") << quant_scheme_name(q);
      EXPECT_TRUE(listed(p, h200)) << quant_scheme_name(q);
    }
  }
  const LayerProblem block = fp8_problem(256, 4096, 257, 128, 8);
  EXPECT_TRUE(contains(detail::layer_plan_rejection(weight_only, block, h200), "128 x 128 blocks"));
  EXPECT_FALSE(listed(block, h200));
  LayerProblem f16 =
      fp8_problem(256, 4096, 257, 128, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel);
  f16.s.dtype = DType::kF16;
  EXPECT_TRUE(contains(detail::layer_plan_rejection(weight_only, f16, h200), "bf16 rows"));
  const LayerProblem odd_k =
      fp8_problem(256, 4096, 257, 136, 8, 0, RoutedOp::kLayer, QuantScheme::kFp8PerChannel);
  EXPECT_TRUE(contains(detail::layer_plan_rejection(weight_only, odd_k, h200), "k % 16 == 0"));
  // The shared expert's dense FP8 MLP past its direct kernel: the FP8 GEMMs only.
  const LayerProblem shared =
      fp8_problem(256, 4096, 257, 128, 8, 1024, RoutedOp::kLayer, QuantScheme::kFp8PerChannel);
  for (const LayerPlan& c : detail::layer_plan_candidates(shared, h200))
    EXPECT_FALSE(detail::fp8_weight_only(c.shared)) << to_string(c);
  LayerPlan shared_weight_only = detail::plan_layer(shared, h200);
  shared_weight_only.shared = weight_only.experts;
  EXPECT_TRUE(
      contains(detail::layer_plan_rejection(shared_weight_only, shared, h200), "sorted path only"));
}

// The planner's rule: per-channel / per-tensor FP8 layers with F <= 128 past the direct path
// and T*K <= 16E take the weight-only plan (fused_moe and fused_moe_experts alike); block
// scales, larger F and more routes an expert the FP8 GEMMs.
TEST(Fp8LayerPlanner, SmallFLayersPastTheDirectPathTakeTheWeightOnlyPlan) {
  const detail::DeviceProps h200 = detail::h200_props();
  const QuantScheme channel = QuantScheme::kFp8PerChannel, tensor = QuantScheme::kFp8PerTensor;
  struct Case {
    const char* name;
    LayerProblem p;
    bool weight_only;
  };
  const Case cases[] = {
      {"qwen3.5-35b-e257-i128 T=192",
       fp8_problem(192, 4096, 257, 128, 8, 0, RoutedOp::kLayer, channel), true},
      {"qwen3.5-35b-e257-i128 T=514 (16 E)",
       fp8_problem(514, 4096, 257, 128, 8, 0, RoutedOp::kLayer, channel), true},
      {"qwen3.5-35b-e257-i128 T=515",
       fp8_problem(515, 4096, 257, 128, 8, 0, RoutedOp::kLayer, channel), false},
      {"qwen3.5-397b-e513-i128 T=1024",
       fp8_problem(1024, 4096, 513, 128, 8, 0, RoutedOp::kLayer, channel), true},
      {"per tensor F=64 experts op T=8",
       fp8_problem(8, 1024, 16, 64, 4, 0, RoutedOp::kSortedOnly, tensor), true},
      {"F=192", fp8_problem(192, 4096, 192, 192, 8, 0, RoutedOp::kLayer, tensor), false},
      {"block F=128", fp8_problem(192, 4096, 257, 128, 8), false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const LayerPlan plan = detail::plan_layer(c.p, h200);
    ASSERT_EQ(plan.routed, RoutedPath::kSorted);
    EXPECT_EQ(detail::fp8_weight_only(plan.experts), c.weight_only) << to_string(plan);
    EXPECT_EQ(detail::layer_plan_rejection(plan, c.p, h200), "");
  }
  // Within the direct path's reach (to T = 128, <= 8 routes an expert) the weight-only GEMMs
  // from 2 routes an expert, the direct kernels below.
  for (int64_t T : {96, 128}) {
    const LayerProblem p = fp8_problem(T, 4096, 257, 128, 8, 0, RoutedOp::kLayer, channel);
    const LayerPlan plan = detail::plan_layer(p, h200);
    EXPECT_EQ(plan.routed, RoutedPath::kSorted) << T;
    EXPECT_TRUE(detail::fp8_weight_only(plan.experts)) << to_string(plan);
  }
  EXPECT_EQ(
      detail::plan_layer(fp8_problem(96, 4096, 513, 128, 8, 0, RoutedOp::kLayer, channel), h200)
          .routed,
      RoutedPath::kDirect);
  // f16 rows (the weight-only tiles are bf16 only): the direct kernels stay.
  LayerProblem f16 = fp8_problem(128, 4096, 257, 128, 8, 0, RoutedOp::kLayer, channel);
  f16.s.dtype = DType::kF16;
  EXPECT_EQ(detail::plan_layer(f16, h200).routed, RoutedPath::kDirect);
}

// The sorted path's FP8 MLP checks its down GEMM's plan as its gate/up's (an sm_90 device, so
// that the gate/up plan passes): a tile fp8_sm90 does not run is refused, naming that GEMM.
TEST(Fp8LayerPlanner, Fp8DownGemmPlanIsCheckedToo) {
  const detail::DeviceProps h200 = detail::h200_props();
  LayerPlan plan;
  ASSERT_TRUE(
      parse_plan("sorted two_gemms{gate_up: fp8_sm90 128x128, down: fp8_sm90 128x64}", &plan));
  EXPECT_EQ(detail::layer_plan_rejection(plan, fp8_problem(256, 4096, 64, 1024, 8), h200),
            "the FP8 expert MLP: the FP8 down GEMM: fp8_sm90 runs 128x128 tiles");
}

TEST(Fp8LayerPlanner, ShapeKeyNamesTheScheme) {
  EXPECT_EQ(detail::shape_key(fp8_problem(1, 7168, 256, 2048, 8).s, 2048),
            "bf16 T=1 H=7168 E=256 F=2048 K=8 S=2048 w=fp8_block128");
}

}  // namespace
}  // namespace moekit
