// CPU tests of the dense-MLP planner (src/mlp/mlp_planner.h) on the seed page's dense MLP
// shapes with an H200's properties: the plan is the decision run_dense_mlp and
// direct_gemm_plan made before the planner (GEMV at one token on >= 256 MB of weights, the
// direct kernels at <= 32 tokens below that, stream-K at <= 64 tokens above it, else two
// GEMMs; the direct k splits by cluster capacity), every candidate passes the rejection,
// bad plans are refused with a reason, and a device without sm_90 gets the GEMMs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device.h"
#include "gemm/gemm_planner.h"
#include "mlp/dense_mlp.h"
#include "mlp/mlp_planner.h"
#include "moekit/error.h"
#include "moekit/moe.h"
#include "test_moe_planner_common.h"

namespace moekit {
namespace {

using detail::DenseMlpProblem;
using planner_test::h200_capacity;

DenseMlpProblem problem(int64_t T, int64_t H, int64_t S, DType out = DType::kBF16,
                        const detail::DeviceProps& device = detail::h200_props()) {
  DenseMlpProblem p;
  p.dtype = DType::kBF16;
  p.out_dtype = out;
  p.T = T;
  p.H = H;
  p.S = S;
  p.streamk_scratch = detail::dense_mlp_scratch_bytes(p.dtype, T, H, S, device) > 0;
  return p;
}

MlpPlan plan(const DenseMlpProblem& p) {
  return detail::plan_dense_mlp(p, detail::h200_props(), h200_capacity(p));
}

MlpPlan gemms(const DenseMlpProblem& p, const detail::DeviceProps& device) {
  detail::GroupedGemmProblem up, down;
  detail::dense_mlp_gemms(p, nullptr, nullptr, nullptr, nullptr, nullptr, &up, &down);
  return detail::plan_mlp_gemms(up, down, device);
}

// SharedExpertMLP's seed rows and the fused layers' shared experts (f32 output).
TEST(MlpPlanner, SeedRowsTakeTodaysPaths) {
  // kimi-k2 (H 7168, S 18432: 793 MB): GEMV at one token, stream-K at 32 / 64 (the
  // layer's shared expert), two GEMMs beyond.
  EXPECT_EQ(to_string(plan(problem(1, 7168, 18432))), "gemv");
  EXPECT_EQ(to_string(plan(problem(32, 7168, 18432, DType::kF32))), "streamk{split 132/132}");
  EXPECT_EQ(to_string(plan(problem(64, 7168, 18432, DType::kF32))), "streamk{split 132/132}");
  const DenseMlpProblem kimi512 = problem(512, 7168, 18432);
  EXPECT_EQ(plan(kimi512), gemms(kimi512, detail::h200_props()));
  EXPECT_EQ(plan(kimi512).path, MlpPath::kTwoGemms);
  // ds-v3 (7168, 2048: 88 MB): direct at 1 and 32 tokens; at 32 the 8-rank gate_up clusters
  // (32 of them) do not all fit the H200 at once (30), 7 ranks do.
  EXPECT_EQ(to_string(plan(problem(1, 7168, 2048, DType::kF32))), "direct{split 8/4}");
  EXPECT_EQ(to_string(plan(problem(32, 7168, 2048))), "direct{split 7/4}");
  EXPECT_EQ(plan(problem(64, 7168, 2048, DType::kF32)).path, MlpPath::kTwoGemms);
  const DenseMlpProblem ds4096 = problem(4096, 7168, 2048);
  EXPECT_EQ(plan(ds4096), gemms(ds4096, detail::h200_props()));
  // glm45 (5120, 1536: 47 MB).
  EXPECT_EQ(to_string(plan(problem(1, 5120, 1536, DType::kF32))), "direct{split 8/6}");
  EXPECT_EQ(to_string(plan(problem(32, 5120, 1536))), "direct{split 8/6}");
  EXPECT_EQ(plan(problem(64, 5120, 1536, DType::kF32)).path, MlpPath::kTwoGemms);
  // Without cluster capacity data the direct GEMMs keep their first splits (8 ranks).
  EXPECT_EQ(to_string(detail::plan_dense_mlp(problem(32, 7168, 2048), detail::h200_props())),
            "direct{split 8/4}");
  // Stream-K needs its scratch in the workspace; without it, the GEMMs.
  DenseMlpProblem no_scratch = problem(32, 7168, 18432);
  no_scratch.streamk_scratch = false;
  EXPECT_EQ(plan(no_scratch).path, MlpPath::kTwoGemms);
}

std::vector<DenseMlpProblem> seed_problems() {
  std::vector<DenseMlpProblem> out;
  for (int64_t T : {1, 32, 64, 128, 512})
    for (auto hs : {std::pair<int64_t, int64_t>{7168, 18432}, {7168, 2048}, {5120, 1536}})
      for (DType o : {DType::kBF16, DType::kF32}) out.push_back(problem(T, hs.first, hs.second, o));
  return out;
}

TEST(MlpPlanner, PlanIsACandidateAndEveryCandidatePasses) {
  for (const DenseMlpProblem& p : seed_problems()) {
    SCOPED_TRACE("T " + std::to_string(p.T) + " H " + std::to_string(p.H) + " S " +
                 std::to_string(p.S));
    const std::vector<MlpPlan> all = detail::dense_mlp_plan_candidates(p, detail::h200_props());
    const MlpPlan chosen = plan(p);
    bool found = false;
    for (const MlpPlan& m : all) {
      EXPECT_EQ(detail::dense_mlp_plan_rejection(m, p, detail::h200_props()), "") << to_string(m);
      found = found || m == chosen;
    }
    EXPECT_TRUE(found) << to_string(chosen) << " is not a candidate";
  }
  // ds-v3 at 32 tokens: the direct split pairs whose x slices fit, no GEMV (32 tokens),
  // stream-K (its scratch is carved up to 64 tokens), the GEMMs.
  const std::vector<MlpPlan> all =
      detail::dense_mlp_plan_candidates(problem(32, 7168, 2048), detail::h200_props());
  int direct = 0, gemv = 0, streamk = 0;
  for (const MlpPlan& m : all) {
    direct += m.path == MlpPath::kDirect;
    gemv += m.path == MlpPath::kGemv;
    streamk += m.path == MlpPath::kStreamK;
  }
  EXPECT_EQ(gemv, 0);
  EXPECT_EQ(streamk, 1);
  EXPECT_GT(direct, 8);
}

TEST(MlpPlanner, BadPlansAreRefusedWithAReason) {
  const detail::DeviceProps h200 = detail::h200_props();
  MlpPlan m;
  m.path = MlpPath::kGemv;
  EXPECT_NE(detail::dense_mlp_plan_rejection(m, problem(32, 7168, 2048), h200), "");
  m.path = MlpPath::kDirect;
  m.split_gate_up = 9;
  m.split_down = 4;
  EXPECT_NE(detail::dense_mlp_plan_rejection(m, problem(32, 7168, 2048), h200).find("split 9"),
            std::string::npos);
  m.split_gate_up = 1;  // all 7168 k of 32 tokens in one CTA's shared memory
  EXPECT_NE(detail::dense_mlp_plan_rejection(m, problem(32, 7168, 2048), h200).find("shared"),
            std::string::npos);
  m.split_gate_up = 7;
  EXPECT_EQ(detail::dense_mlp_plan_rejection(m, problem(32, 7168, 2048), h200), "");
  EXPECT_NE(detail::dense_mlp_plan_rejection(m, problem(33, 7168, 2048), h200), "");
  m.path = MlpPath::kStreamK;
  m.split_gate_up = m.split_down = 133;
  EXPECT_NE(detail::dense_mlp_plan_rejection(m, problem(32, 7168, 18432), h200), "");
  m.split_gate_up = m.split_down = 61;  // a smaller grid runs
  EXPECT_EQ(detail::dense_mlp_plan_rejection(m, problem(32, 7168, 18432), h200), "");
  EXPECT_NE(detail::dense_mlp_plan_rejection(m, problem(65, 7168, 18432), h200), "");
  m.path = MlpPath::kChain;  // the chain needs grouped (contiguous) rows
  EXPECT_NE(detail::dense_mlp_plan_rejection(m, problem(32, 7168, 2048), h200), "");
}

// arch 0 (no usable device): only the GEMMs, which run anywhere.
TEST(MlpPlanner, WithoutSm90OnlyTheGemms) {
  const detail::DeviceProps none;
  for (const DenseMlpProblem& seed : seed_problems()) {
    const DenseMlpProblem p = problem(seed.T, seed.H, seed.S, seed.out_dtype, none);
    EXPECT_FALSE(p.streamk_scratch);
    const MlpPlan m = detail::plan_dense_mlp(p, none);
    EXPECT_EQ(m.path, MlpPath::kTwoGemms) << to_string(m);
    EXPECT_EQ(detail::dense_mlp_plan_rejection(m, p, none), "");
    for (const MlpPlan& c : detail::dense_mlp_plan_candidates(p, none))
      EXPECT_EQ(c.path, MlpPath::kTwoGemms) << to_string(c);
  }
}

// The public op refuses a plan that cannot run its arguments, naming the op, the plan and
// why (the workspace query too: the size is the plan's).
TEST(MlpPlanner, OpRefusesABadPlan) {
  SharedExpertMLPArgs a;
  a.hidden_states = planner_test::null_view(DType::kBF16, {32, 7168});
  a.w_gate_up = planner_test::null_view(DType::kBF16, {4096, 7168});
  MlpPlan m;
  m.path = MlpPath::kDirect;
  m.split_gate_up = 9;
  m.split_down = 4;
  a.plan = &m;
  try {
    shared_expert_mlp_workspace_size(a);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("shared_expert_mlp"), std::string::npos) << what;
    EXPECT_NE(what.find("direct{split 9/4}"), std::string::npos) << what;
    EXPECT_NE(what.find("direct"), std::string::npos) << what;  // the reason
  }
  a.plan = nullptr;
  const MlpPlan planned = plan_shared_expert_mlp(a);
  a.plan = &planned;
  EXPECT_NO_THROW(shared_expert_mlp_workspace_size(a));
}

}  // namespace
}  // namespace moekit
