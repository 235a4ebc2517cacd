// parse_plan (include/moekit/plan.h): every plan the planners offer for the seed models'
// layers (and their expert / shared MLPs and GEMMs) at token counts 1 to 16384 on an H200
// parses back from its to_string; malformed strings are refused with what was expected
// where. CPU only.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/device.h"
#include "moe/layer_planner.h"
#include "moekit/plan.h"

namespace moekit {
namespace {

struct Model {
  const char* name;
  int64_t H, E, F, K, S;
};

// The seed models (bench/workloads/seed1.json), full and expert-parallel (E / 8).
const Model kModels[] = {
    {"ds-v3", 7168, 256, 2048, 8, 2048},    {"ds-v3-ep8", 7168, 32, 2048, 8, 2048},
    {"kimi-k2", 7168, 384, 2048, 8, 2048},  {"kimi-k2-big-shared", 7168, 384, 2048, 8, 18432},
    {"qwen3-235b", 4096, 128, 1536, 8, 0},  {"qwen3-30b", 2048, 128, 768, 8, 0},
    {"qwen3-30b-ep8", 2048, 16, 768, 8, 0}, {"glm45", 5120, 160, 1536, 8, 1536},
};

const int64_t kCounts[] = {1, 2, 7, 16, 32, 64, 65, 128, 512, 2048, 16384};

template <class Plan>
void expect_round_trip(const Plan& plan, std::set<std::string>* seen) {
  const std::string text = to_string(plan);
  Plan back;
  std::string error;
  ASSERT_TRUE(parse_plan(text, &back, &error)) << text << ": " << error;
  EXPECT_EQ(back, plan) << text << " came back as " << to_string(back);
  EXPECT_EQ(to_string(back), text);
  seen->insert(text);
}

void expect_mlp_round_trip(const MlpPlan& m, std::set<std::string>* seen) {
  expect_round_trip(m, seen);
  if (m.path == MlpPath::kTwoGemms || m.path == MlpPath::kChain) {
    expect_round_trip(m.gate_up, seen);
    expect_round_trip(m.down, seen);
  }
}

TEST(PlanParse, EveryCandidateOfTheSeedModelsRoundTrips) {
  const detail::GemmDevice h200(detail::h200_props());
  std::set<std::string> seen;
  size_t layers = 0;
  for (const Model& m : kModels) {
    for (int64_t T : kCounts) {
      for (auto op :
           {detail::RoutedOp::kLayer, detail::RoutedOp::kIndexed, detail::RoutedOp::kSortedOnly}) {
        detail::LayerProblem p;
        p.s = {DType::kBF16, T, m.H, m.E, m.F, m.K};
        p.op = op;
        p.S = op == detail::RoutedOp::kLayer ? m.S : 0;
        for (const LayerPlan& plan : detail::layer_plan_candidates(p, h200)) {
          SCOPED_TRACE(std::string(m.name) + " T=" + std::to_string(T));
          expect_round_trip(plan, &seen);
          if (plan.routed == RoutedPath::kSorted) expect_mlp_round_trip(plan.experts, &seen);
          if (plan.has_shared) expect_mlp_round_trip(plan.shared, &seen);
          ++layers;
        }
      }
    }
  }
  // Every kind of plan took part: each routed path, MLP path and most GEMM kernels.
  const auto has = [&seen](const std::string& prefix) {
    for (const std::string& s : seen)
      if (s.compare(0, prefix.size(), prefix) == 0) return true;
    return false;
  };
  for (const char* prefix :
       {"direct", "sorted chain{", "sorted two_gemms{", "gemv", "direct{split", "streamk{split",
        "decode_splitk", "decode_stream_deep", "sm90_pairs", "decode_persistent"})
    EXPECT_TRUE(has(prefix)) << prefix;
  EXPECT_GT(layers, 500u);
}

// The same for FP8 weights in each scheme (the layers and their shared experts): the FP8
// GEMMs' tile shapes in both schedules.
TEST(PlanParse, EveryFp8CandidateRoundTrips) {
  const detail::GemmDevice h200(detail::h200_props());
  std::set<std::string> seen;
  for (const Model& m : kModels) {
    for (int64_t T : kCounts) {
      for (QuantScheme q :
           {QuantScheme::kFp8Block128, QuantScheme::kFp8PerChannel, QuantScheme::kFp8PerTensor}) {
        detail::LayerProblem p;
        p.s = {DType::kBF16, T, m.H, m.E, m.F, m.K};
        p.s.quant = q;
        p.S = m.S;
        p.shared_quant = m.S > 0 ? q : QuantScheme::kNone;
        for (const LayerPlan& plan : detail::layer_plan_candidates(p, h200)) {
          SCOPED_TRACE(std::string(m.name) + " T=" + std::to_string(T));
          expect_round_trip(plan, &seen);
          if (plan.routed == RoutedPath::kSorted) expect_mlp_round_trip(plan.experts, &seen);
          if (plan.has_shared) expect_mlp_round_trip(plan.shared, &seen);
        }
      }
    }
  }
  for (const char* plan : {"fp8_sm90 128x128", "fp8_sm90 128x128 dynamic", "fp8_sm90 128x256",
                           "fp8_sm90 128x256 dynamic"})
    EXPECT_EQ(seen.count(plan), 1u) << plan;
}

TEST(PlanParse, HandWrittenForms) {
  GemmPlan g;
  ASSERT_TRUE(parse_plan("decode_splitk 32x128 split4", &g));
  EXPECT_EQ(g.kernel, GemmKernel::kDecodeSplitK);
  EXPECT_EQ(g.split, 4);
  ASSERT_TRUE(parse_plan("sm90 128x224 dynamic", &g));
  EXPECT_EQ(g.tile_n, 224);
  EXPECT_EQ(g.schedule, GemmSchedule::kDynamic);
  EXPECT_FALSE(g.swap_tails);
  ASSERT_TRUE(parse_plan("sm90_pairs 128x256 dynamic swap_tails", &g));
  EXPECT_TRUE(g.swap_tails);
  EXPECT_EQ(to_string(g), "sm90_pairs 128x256 dynamic swap_tails");
  ASSERT_TRUE(parse_plan("sm90 128x256 swap_tails", &g));
  EXPECT_TRUE(g.swap_tails);
  EXPECT_EQ(g.schedule, GemmSchedule::kStatic);
  LayerPlan l;
  ASSERT_TRUE(parse_plan("direct + shared streamk{split 132/132}", &l));
  EXPECT_EQ(l.routed, RoutedPath::kDirect);
  EXPECT_TRUE(l.has_shared);
  EXPECT_EQ(l.shared.path, MlpPath::kStreamK);
  EXPECT_EQ(l.shared.split_down, 132);
}

struct Bad {
  const char* text;
  const char* error;  // a part of the message
};

template <class Plan>
void expect_rejected(const Bad& bad) {
  Plan plan;
  const Plan before = plan;
  std::string error;
  EXPECT_FALSE(parse_plan(bad.text, &plan, &error)) << bad.text;
  EXPECT_NE(error.find(bad.error), std::string::npos)
      << "'" << bad.text << "': " << error << " (wanted '" << bad.error << "')";
  EXPECT_EQ(plan, before) << "a refused parse left *out changed";
}

TEST(PlanParse, MalformedGemmPlansSayWhatWasExpectedWhere) {
  const Bad kBad[] = {
      {"", "at character 1: expected a GEMM kernel (decode / decode_splitk"},
      {"decod 32x128", "at character 1: expected a GEMM kernel"},
      {"decode", "at character 7: expected ' ', found the end"},
      {"decode 32y128", "at character 10: expected a tile M x N"},
      {"decode 32x", "expected a tile M x N (e.g. 32x128), found the end"},
      {"decode 032x128", "at character 8: expected a tile"},
      {"decode 32x128 split", "at character 20: expected a split of 2 or more"},
      {"decode 32x128 split1", "a split of 2 or more (to_string omits split 1)"},
      {"decode 32x128 static", "at character 14: expected the end of the plan, found ' static'"},
      {"decode 32x128 dynamic ", "at character 22: expected the end of the plan"},
      {"Decode 32x128", "at character 1: expected a GEMM kernel"},
  };
  for (const Bad& b : kBad) expect_rejected<GemmPlan>(b);
}

TEST(PlanParse, MalformedMlpAndLayerPlansSayWhatWasExpectedWhere) {
  const Bad kMlp[] = {
      {"two_gemms", "at character 10: expected '{gate_up: ', found the end"},
      {"chain{gate_up: sm90 128x256}", "at character 28: expected ', down: ', found '}'"},
      {"chain{gate_up: sm90 128x256, down: sm9 128x256}",
       "at character 36: expected a GEMM kernel"},
      {"chain{gate_up: sm90 128x256, down: sm90 128x256", "expected '}', found the end"},
      {"direct{split 8}", "at character 15: expected '/', found '}'"},
      {"direct{split 0/4}", "at character 14: expected gate_up's split"},
      {"streamk{split 132/}", "at character 19: expected down's split"},
      {"gemv{}", "at character 5: expected the end of the plan"},
      {"dense", "at character 1: expected an MLP plan"},
  };
  for (const Bad& b : kMlp) expect_rejected<MlpPlan>(b);
  const Bad kLayer[] = {
      {"", "at character 1: expected a routed path"},
      {"sorted", "at character 1: expected a routed path"},
      {"sorted gemm", "at character 8: expected an MLP plan"},
      {"direct + shared", "at character 7: expected the end of the plan, found ' + shared'"},
      {"direct + shared gemv + shared gemv", "at character 21: expected the end of the plan"},
      {"direct+shared gemv", "at character 7: expected the end of the plan"},
      {"direct shared gemv", "at character 7: expected the end of the plan"},
  };
  for (const Bad& b : kLayer) expect_rejected<LayerPlan>(b);
}

}  // namespace
}  // namespace moekit
