// CPU tests of the layer planner (src/moe/layer_planner.h) on the seed page's routed rows
// with an H200's properties: the routed path is the one layer_takes_direct /
// indexed_takes_direct chose before the planner (fused_moe_experts always sorted), the
// sorted path's expert MLP is the GEMM planner's plan of the permuted problems (routed
// counts), the shared expert's plan is the dense-MLP planner's (f32 output); every
// candidate passes the rejection; bad plans are refused with a reason; arch 0 plans run.
// On the GPU: every candidate of a few layer shapes against the CPU reference.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "gemm/gemm_planner.h"
#include "moe/layer_planner.h"
#include "moekit/error.h"
#include "moekit/moe.h"
#include "moekit/reference.h"
#include "support/gpu.h"
#include "test_dense_mlp_common.h"
#include "test_moe_common.h"
#include "test_moe_planner_common.h"

namespace moekit {
namespace {

using detail::LayerProblem;
using detail::RoutedOp;

struct Row {
  const char* name;
  RoutedOp op;
  int64_t T, H, E, F, K, S;
  RoutedPath routed;  // today's decision
};

// The seed rows (bench/workloads/seed1.json), bf16, top_k 8.
const Row kRows[] = {
    {"FusedMoE qwen3-235b-decode", RoutedOp::kLayer, 512, 4096, 128, 1536, 8, 0,
     RoutedPath::kSorted},
    {"FusedMoE qwen3-235b-prefill", RoutedOp::kLayer, 4096, 4096, 128, 1536, 8, 0,
     RoutedPath::kSorted},
    {"FusedMoE qwen3-30b-decode-b1", RoutedOp::kLayer, 1, 2048, 128, 768, 8, 0,
     RoutedPath::kDirect},
    {"FusedMoE qwen3-30b-decode-b32", RoutedOp::kLayer, 32, 2048, 128, 768, 8, 0,
     RoutedPath::kDirect},
    {"FusedMoE ds-v3-grouped-decode", RoutedOp::kLayer, 512, 7168, 256, 2048, 8, 0,
     RoutedPath::kSorted},
    {"FusedMoE kimi-k2-prefill", RoutedOp::kLayer, 4096, 7168, 256, 2048, 8, 0,
     RoutedPath::kSorted},
    {"FusedMoESharedExpert kimi-k2-t1", RoutedOp::kLayer, 1, 7168, 384, 2048, 8, 18432,
     RoutedPath::kDirect},
    {"FusedMoESharedExpert kimi-k2-t32", RoutedOp::kLayer, 32, 7168, 384, 2048, 8, 18432,
     RoutedPath::kDirect},
    {"FusedMoESharedExpert kimi-k2-t64", RoutedOp::kLayer, 64, 7168, 384, 2048, 8, 18432,
     RoutedPath::kSorted},
    {"FusedMoESharedExpert kimi-k2-t128", RoutedOp::kLayer, 128, 7168, 384, 2048, 8, 18432,
     RoutedPath::kSorted},
    {"FusedMoESharedExpert ds-v3-grouped-t1", RoutedOp::kLayer, 1, 7168, 256, 2048, 8, 2048,
     RoutedPath::kDirect},
    {"FusedMoESharedExpert ds-v3-grouped-t32", RoutedOp::kLayer, 32, 7168, 256, 2048, 8, 2048,
     RoutedPath::kDirect},
    {"FusedMoESharedExpert ds-v3-grouped-t512", RoutedOp::kLayer, 512, 7168, 256, 2048, 8, 2048,
     RoutedPath::kSorted},
    {"FusedMoESharedExpert glm45-t64", RoutedOp::kLayer, 64, 5120, 160, 1536, 8, 1536,
     RoutedPath::kSorted},
    {"FusedMoESharedExpert glm45-t4096", RoutedOp::kLayer, 4096, 5120, 160, 1536, 8, 1536,
     RoutedPath::kSorted},
    {"FusedMoESharedExpert qwen3-235b-t512", RoutedOp::kLayer, 512, 4096, 128, 1536, 8, 0,
     RoutedPath::kSorted},
    {"FusedMoEExperts qwen3-235b-decode", RoutedOp::kSortedOnly, 512, 4096, 128, 1536, 8, 0,
     RoutedPath::kSorted},
    {"FusedMoEExperts ds-v3-prefill", RoutedOp::kSortedOnly, 4096, 7168, 256, 2048, 8, 0,
     RoutedPath::kSorted},
    {"IndexedExpertMLP ds-v3-t1", RoutedOp::kIndexed, 1, 7168, 256, 2048, 8, 0,
     RoutedPath::kDirect},
    {"IndexedExpertMLP ds-v3-t64", RoutedOp::kIndexed, 64, 7168, 256, 2048, 8, 0,
     RoutedPath::kDirect},
    {"IndexedExpertMLP qwen3-235b-t32", RoutedOp::kIndexed, 32, 4096, 128, 1536, 8, 0,
     RoutedPath::kDirect},
};

LayerProblem problem(const Row& r) {
  LayerProblem p;
  p.s.dtype = DType::kBF16;
  p.s.T = r.T;
  p.s.H = r.H;
  p.s.E = r.E;
  p.s.F = r.F;
  p.s.K = r.K;
  p.op = r.op;
  p.S = r.S;
  return p;
}

detail::DirectCapacity shared_capacity(const LayerProblem& p) {
  return planner_test::h200_capacity(
      detail::shared_mlp_problem(p.s, p.S, DType::kF32, detail::h200_props(), {}));
}

MlpPlan sorted_experts(const LayerProblem& p, const detail::DeviceProps& device) {
  static char permuted, meta, act, weights, counters;
  const detail::ExpertMlpGemms g = detail::sorted_expert_gemms(
      p.s, &permuted, reinterpret_cast<const int32_t*>(&meta), &act, &weights, &weights, &counters);
  const auto [up, down] = detail::expert_mlp_problems(g);
  EXPECT_TRUE(up.routed_counts);
  EXPECT_EQ(up.m, p.s.T * p.s.K);
  return detail::plan_mlp_gemms(up, down, device);
}

TEST(LayerPlanner, SeedRowsTakeTodaysPaths) {
  const detail::DeviceProps h200 = detail::h200_props();
  for (const Row& r : kRows) {
    SCOPED_TRACE(r.name);
    const LayerProblem p = problem(r);
    const LayerPlan plan = detail::plan_layer(p, h200, shared_capacity(p));
    EXPECT_EQ(plan.routed, r.routed) << to_string(plan);
    if (r.routed == RoutedPath::kSorted) EXPECT_EQ(plan.experts, sorted_experts(p, h200));
    EXPECT_EQ(plan.has_shared, r.S > 0);
    if (r.S > 0) {
      const detail::DenseMlpProblem sp =
          detail::shared_mlp_problem(p.s, r.S, DType::kF32, h200, {});
      EXPECT_EQ(sp.out_dtype, DType::kF32);
      EXPECT_EQ(plan.shared, detail::plan_dense_mlp(sp, h200, shared_capacity(p)));
    }
  }
  // The shared experts' paths, written out (docs/dense-mlp.md "Which path runs").
  const auto shared = [&](int i) {
    return to_string(
        detail::plan_layer(problem(kRows[i]), h200, shared_capacity(problem(kRows[i]))).shared);
  };
  EXPECT_EQ(shared(6), "gemv");                    // kimi-k2-t1
  EXPECT_EQ(shared(7), "streamk{split 132/132}");  // kimi-k2-t32
  EXPECT_EQ(shared(8), "streamk{split 132/132}");  // kimi-k2-t64
  EXPECT_EQ(shared(10), "direct{split 8/4}");      // ds-v3-grouped-t1
  EXPECT_EQ(shared(11), "direct{split 7/4}");      // ds-v3-grouped-t32
  EXPECT_EQ(to_string(detail::plan_layer(problem(kRows[2]), h200)), "direct");
}

// The plan log's shape key (MOEKIT_LOG_PLANS: one line per op and shape).
TEST(LayerPlanner, ShapeKey) {
  LayerProblem p = problem(kRows[11]);  // ds-v3-grouped-t32
  EXPECT_EQ(detail::shape_key(p.s, p.S), "bf16 T=32 H=7168 E=256 F=2048 K=8 S=2048");
  p.s.E = 0;  // a dense MLP
  EXPECT_EQ(detail::shape_key(p.s, 2048), "bf16 T=32 H=7168 S=2048");
}

// The layer ops' direct path also needs T <= 32 and at most 4 routes per expert on
// average; indexed_expert_mlp takes it wherever it runs.
TEST(LayerPlanner, LayerRuleNeedsFewRoutesPerExpert) {
  const detail::DeviceProps h200 = detail::h200_props();
  Row few = {"E 4", RoutedOp::kLayer, 16, 256, 4, 64, 8, 0, RoutedPath::kSorted};
  EXPECT_EQ(detail::plan_layer(problem(few), h200).routed, RoutedPath::kSorted);  // 128 > 16
  few.T = 2;
  EXPECT_EQ(detail::plan_layer(problem(few), h200).routed, RoutedPath::kDirect);  // 16 <= 16
  few.T = 3;
  EXPECT_EQ(detail::plan_layer(problem(few), h200).routed, RoutedPath::kSorted);  // 24 > 16
  Row many = {"E 256", RoutedOp::kLayer, 32, 256, 256, 64, 8, 0, RoutedPath::kDirect};
  EXPECT_EQ(detail::plan_layer(problem(many), h200).routed, RoutedPath::kDirect);
  many.T = 33;  // 264 routes over 256 experts, but past 32 tokens
  EXPECT_EQ(detail::plan_layer(problem(many), h200).routed, RoutedPath::kSorted);
  few.T = 8;
  few.T = 16;
  few.op = RoutedOp::kIndexed;
  EXPECT_EQ(detail::plan_layer(problem(few), h200).routed, RoutedPath::kDirect);
  few.T = 200;  // T*K = 1600 > 1024 routes
  EXPECT_EQ(detail::plan_layer(problem(few), h200).routed, RoutedPath::kSorted);
}

TEST(LayerPlanner, PlanIsACandidateAndEveryCandidatePasses) {
  const detail::DeviceProps h200 = detail::h200_props();
  for (const Row& r : kRows) {
    SCOPED_TRACE(r.name);
    const LayerProblem p = problem(r);
    const LayerPlan chosen = detail::plan_layer(p, h200, shared_capacity(p));
    bool found = false;
    for (const LayerPlan& c : detail::layer_plan_candidates(p, h200)) {
      EXPECT_EQ(detail::layer_plan_rejection(c, p, h200), "") << to_string(c);
      found = found || c == chosen;
    }
    EXPECT_TRUE(found) << to_string(chosen) << " is not a candidate";
  }
}

TEST(LayerPlanner, BadPlansAreRefusedWithAReason) {
  const detail::DeviceProps h200 = detail::h200_props();
  LayerPlan direct;
  direct.routed = RoutedPath::kDirect;
  // fused_moe_experts sorts; the direct path stops at 64 tokens.
  EXPECT_NE(detail::layer_plan_rejection(direct, problem(kRows[16]), h200).find("sorted path"),
            std::string::npos);
  EXPECT_NE(detail::layer_plan_rejection(direct, problem(kRows[0]), h200).find("T = 512 > 64"),
            std::string::npos);
  // A shared expert's plan on a layer without one, and none on a layer with one.
  LayerPlan with_shared = direct;
  with_shared.has_shared = true;
  EXPECT_NE(detail::layer_plan_rejection(with_shared, problem(kRows[2]), h200), "");
  EXPECT_NE(detail::layer_plan_rejection(direct, problem(kRows[6]), h200), "");
  // A shared plan its shape cannot take: GEMV at 32 tokens.
  with_shared.shared.path = MlpPath::kGemv;
  EXPECT_NE(detail::layer_plan_rejection(with_shared, problem(kRows[7]), h200).find("shared"),
            std::string::npos);
  // The sorted path past moe_pre_permute's 1024 experts (indexed_expert_mlp at one token).
  Row many = {"E 1025", RoutedOp::kIndexed, 1, 256, 1025, 64, 8, 0, RoutedPath::kDirect};
  LayerPlan sorted = detail::plan_layer(problem(kRows[0]), h200);
  EXPECT_NE(detail::layer_plan_rejection(sorted, problem(many), h200)
                .find("the sorted path takes at most 1024 experts, not 1025"),
            std::string::npos);
  // E = 513 and 1024: the sorted path is among the candidates (E <= 512 only before).
  for (int64_t E : {513, 1024}) {
    Row odd = {"E > 512", RoutedOp::kIndexed, 1, 256, E, 64, 8, 0, RoutedPath::kDirect};
    bool has_sorted = false;
    for (const LayerPlan& c : detail::layer_plan_candidates(problem(odd), h200)) {
      EXPECT_EQ(detail::layer_plan_rejection(c, problem(odd), h200), "") << to_string(c);
      has_sorted |= c.routed == RoutedPath::kSorted;
    }
    EXPECT_TRUE(has_sorted) << E;
  }
}

// Another activation or a bias: the general path (docs/moe.md "Activations"): sorted at
// every T, no chain, the shared expert on two dense GEMMs; every candidate passes, and a
// silu plan's chain, the direct path and a dense kernel are refused with the reason.
TEST(LayerPlanner, GeneralActivationsTakeTheGeneralPath) {
  const detail::DeviceProps h200 = detail::h200_props();
  for (const Row& r : kRows) {
    SCOPED_TRACE(r.name);
    for (int variant = 0; variant < 3; ++variant) {
      LayerProblem p = problem(r);
      const LayerPlan silu = detail::plan_layer(p, h200, shared_capacity(p));
      if (variant == 0) p.s.mlp.act = Activation::kSwigluOai;
      if (variant == 1) p.s.mlp.down_bias = true;  // silu_and_mul with a bias
      if (variant == 2) p.s.mlp.act = Activation::kRelu2;
      p.shared_mlp = p.s.mlp;
      const LayerPlan plan = detail::plan_layer(p, h200);
      EXPECT_EQ(plan.routed, RoutedPath::kSorted) << to_string(plan);
      EXPECT_EQ(plan.experts.path, MlpPath::kTwoGemms) << to_string(plan);
      if (r.S > 0) EXPECT_EQ(plan.shared.path, MlpPath::kTwoGemms) << to_string(plan);
      for (const LayerPlan& c : detail::layer_plan_candidates(p, h200)) {
        EXPECT_EQ(detail::layer_plan_rejection(c, p, h200), "") << to_string(c);
        EXPECT_EQ(c.routed, RoutedPath::kSorted) << to_string(c);
        EXPECT_NE(c.experts.path, MlpPath::kChain) << to_string(c);
      }
      const std::string why = detail::layer_plan_rejection(silu, p, h200);
      if (silu.routed == RoutedPath::kDirect) {
        EXPECT_NE(why.find("the direct kernels run silu_and_mul without biases"), std::string::npos)
            << why;
      } else if (silu.experts.path == MlpPath::kChain) {
        EXPECT_NE(why.find("the chain runs silu_and_mul without biases"), std::string::npos) << why;
      }
      if (r.S > 0 && silu.shared.path != MlpPath::kTwoGemms) {
        LayerPlan shared = plan;
        shared.shared = silu.shared;
        EXPECT_NE(detail::layer_plan_rejection(shared, p, h200)
                      .find("the dense MLP kernels run silu_and_mul without biases"),
                  std::string::npos);
      }
    }
  }
  LayerProblem p = problem(kRows[11]);  // ds-v3-grouped-t32
  p.s.mlp.act = Activation::kGeluAndMul;
  p.s.mlp.gate_up_bias = true;
  EXPECT_EQ(detail::shape_key(p.s, p.S),
            "bf16 T=32 H=7168 E=256 F=2048 K=8 S=2048 act=gelu_and_mul bias");
}

// arch 0 (no usable device): every plan is one that runs anywhere (no sm_90 kernels).
TEST(LayerPlanner, WithoutSm90PlansRunAnywhere) {
  const detail::DeviceProps none;
  for (const Row& r : kRows) {
    SCOPED_TRACE(r.name);
    const LayerProblem p = problem(r);
    const LayerPlan plan = detail::plan_layer(p, none);
    EXPECT_EQ(plan.routed, r.routed);  // the routed path does not depend on the device
    EXPECT_NE(plan.experts.path, MlpPath::kChain);
    if (r.S > 0) EXPECT_EQ(plan.shared.path, MlpPath::kTwoGemms) << to_string(plan);
    EXPECT_EQ(detail::layer_plan_rejection(plan, p, none), "");
  }
}

// The public ops: a plan that cannot run the arguments throws from the workspace query
// (the size depends on the path) naming the op, the plan and the reason.
TEST(LayerPlanner, OpsRefuseABadPlan) {
  FusedMoEExpertsArgs a;
  a.hidden_states = planner_test::null_view(DType::kBF16, {512, 4096});
  a.w_gate_up = planner_test::null_view(DType::kBF16, {128, 3072, 4096});
  a.topk_ids = planner_test::null_view(DType::kI32, {512, 8});
  LayerPlan direct;
  direct.routed = RoutedPath::kDirect;
  a.plan = &direct;
  for (int indexed = 0; indexed < 2; ++indexed) {
    const std::string op = indexed ? "indexed_expert_mlp" : "fused_moe_experts";
    try {
      indexed ? indexed_expert_mlp_workspace_size(a) : fused_moe_experts_workspace_size(a);
      ADD_FAILURE() << op << ": no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(op), std::string::npos) << what;
      EXPECT_NE(what.find("'plan'"), std::string::npos) << what;
      EXPECT_NE(what.find("direct ("), std::string::npos) << what;
    }
  }
  // The planner's own plan passes, and its workspace is the sorted path's.
  a.plan = nullptr;
  const LayerPlan planned = plan_fused_moe_experts(a);
  EXPECT_EQ(planned.routed, RoutedPath::kSorted);
  const size_t bytes = fused_moe_experts_workspace_size(a);
  a.plan = &planned;
  EXPECT_EQ(fused_moe_experts_workspace_size(a), bytes);
  // indexed_expert_mlp at one token: direct by default, the sorted plan forced (another
  // workspace: the permuted buffers instead of the per-route f32 rows).
  a.hidden_states = planner_test::null_view(DType::kBF16, {1, 4096});
  a.topk_ids = planner_test::null_view(DType::kI32, {1, 8});
  a.plan = nullptr;
  EXPECT_EQ(plan_indexed_expert_mlp(a).routed, RoutedPath::kDirect);
  const size_t direct_bytes = indexed_expert_mlp_workspace_size(a);
  LayerPlan sorted;
  bool have_sorted = false;
  for (const LayerPlan& c : indexed_expert_mlp_plan_candidates(a)) {
    if (c.routed == RoutedPath::kSorted) {
      sorted = c;
      have_sorted = true;
    }
  }
  ASSERT_TRUE(have_sorted);
  a.plan = &sorted;
  EXPECT_NE(indexed_expert_mlp_workspace_size(a), direct_bytes);

  // fused_moe_shared_expert: the plan is args.moe.plan; a layer plan without the shared
  // expert's MLP is refused.
  FusedMoESharedExpertArgs l;
  l.moe.hidden_states = planner_test::null_view(DType::kBF16, {1, 7168});
  l.moe.gating_output = planner_test::null_view(DType::kF32, {1, 256});
  l.moe.params.top_k = 8;
  l.moe.w_gate_up = planner_test::null_view(DType::kBF16, {256, 4096, 7168});
  l.shared_w_gate_up = planner_test::null_view(DType::kBF16, {4096, 7168});
  const LayerPlan layer = plan_fused_moe_shared_expert(l);
  EXPECT_TRUE(layer.has_shared);
  EXPECT_EQ(layer.routed, RoutedPath::kDirect);
  l.moe.plan = &direct;
  EXPECT_THROW(fused_moe_shared_expert_workspace_size(l), Error);
  l.moe.plan = &layer;
  EXPECT_NO_THROW(fused_moe_shared_expert_workspace_size(l));
  // fused_moe: the same layer without the shared expert.
  l.moe.plan = nullptr;
  EXPECT_EQ(to_string(plan_fused_moe(l.moe)), "direct");
  EXPECT_FALSE(fused_moe_plan_candidates(l.moe).empty());
}

}  // namespace
}  // namespace moekit

// ---- GPU: every candidate plan against the reference ----

namespace moekit {
namespace {

// fused_moe_shared_expert (a shared expert of width S; fused_moe's plans when S = 0) on
// fresh random inputs under each of its candidate plans, against the CPU reference: the
// direct and sorted routed paths, every expert-MLP plan and every shared-expert plan
// (each direct split pair, stream-K, the GEMMs), poisoned output each run.
void expect_every_layer_candidate_matches(DType dt, int64_t T, int64_t H, int64_t E, int64_t F,
                                          int K, int64_t S, uint64_t seed) {
  SCOPED_TRACE("T " + std::to_string(T) + " E " + std::to_string(E) + " S " + std::to_string(S));
  std::mt19937_64 rng(seed);
  const HostTensor x = moetest::normal(rng, dt, {T, H}, 1.0);
  const HostTensor logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
  const HostTensor wgu = moetest::normal(rng, dt, {E, 2 * F, H}, 1.0 / std::sqrt(double(H)));
  const HostTensor wd = moetest::normal(rng, dt, {E, H, F}, 1.0 / std::sqrt(double(F)));
  const int64_t s = S > 0 ? S : 8;
  const HostTensor sgu = moetest::normal(rng, dt, {2 * s, H}, 1.0 / std::sqrt(double(H)));
  const HostTensor sd = moetest::normal(rng, dt, {H, s}, 1.0 / std::sqrt(double(s)));
  testing::DeviceTensor dx(x), dlogits(logits), dwgu(wgu), dwd(wd), dsgu(sgu), dsd(sd);
  testing::DeviceTensor out(dt, {T, H}, dense_mlp_test::kPoison);
  FusedMoESharedExpertArgs a;
  a.moe.hidden_states = dx.view();
  a.moe.gating_output = dlogits.view();
  a.moe.params.top_k = K;
  a.moe.w_gate_up = dwgu.view();
  a.moe.w_down = dwd.view();
  a.moe.output = out.view();
  if (S > 0) {
    a.shared_w_gate_up = dsgu.view();
    a.shared_w_down = dsd.view();
  }
  HostTensor ref(dt, {T, H});
  FusedMoESharedExpertArgs r = a;
  r.moe.hidden_states = x.view();
  r.moe.gating_output = logits.view();
  r.moe.w_gate_up = wgu.view();
  r.moe.w_down = wd.view();
  r.moe.output = ref.view();
  r.shared_w_gate_up = S > 0 ? sgu.view() : TensorView{};
  r.shared_w_down = S > 0 ? sd.view() : TensorView{};
  reference::fused_moe_shared_expert(r);
  const std::vector<LayerPlan> plans = fused_moe_shared_expert_plan_candidates(a);
  EXPECT_FALSE(plans.empty());
  for (const LayerPlan& plan : plans) {
    a.moe.plan = &plan;
    testing::DeviceWorkspace ws(fused_moe_shared_expert_workspace_size(a));
    a.moe.workspace = ws.get();
    ASSERT_EQ(cudaMemset(out.data(), dense_mlp_test::kPoison, ref.nbytes()), cudaSuccess);
    fused_moe_shared_expert(a, nullptr);
    dense_mlp_test::sync_ok();
    dense_mlp_test::expect_close(out.download(), ref, dt, to_string(plan));
  }
}

TEST(LayerPlannerGpu, EveryCandidateMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  // Few tokens (direct and sorted routed paths; GEMV, direct, stream-K and the GEMMs for
  // the shared expert), more tokens (sorted only; stream-K and the GEMMs), no shared expert.
  expect_every_layer_candidate_matches(DType::kBF16, 1, 256, 16, 128, 4, 136, 5100);
  expect_every_layer_candidate_matches(DType::kF16, 19, 264, 32, 72, 6, 520, 5200);
  expect_every_layer_candidate_matches(DType::kBF16, 100, 136, 8, 64, 2, 72, 5300);
  expect_every_layer_candidate_matches(DType::kF16, 7, 256, 64, 128, 8, 0, 5400);
}

// E = 513 (odd, past 512: the routing's 32-slot rows, the sorted path's 1024-expert
// PrePermute instances) and E = 1024, at a small hidden size: every candidate plan at
// T = 1, 7 and 64 (direct and sorted candidates) and 4096 (sorted), with and without a
// shared expert.
TEST(LayerPlannerGpu, EveryCandidateMatchesReferenceManyExperts) {
  MOEKIT_REQUIRE_GPU();
  struct Shape {
    DType dt;
    int64_t T, E, S;
  };
  const Shape shapes[] = {{DType::kBF16, 1, 513, 0},   {DType::kF16, 7, 513, 72},
                          {DType::kBF16, 64, 513, 0},  {DType::kBF16, 4096, 513, 136},
                          {DType::kBF16, 7, 1024, 0},  {DType::kF16, 64, 1024, 0},
                          {DType::kF16, 4096, 1024, 0}};
  uint64_t seed = 5500;
  for (const Shape& x : shapes)
    expect_every_layer_candidate_matches(x.dt, x.T, 128, x.E, 64, 8, x.S, seed += 100);
}

}  // namespace
}  // namespace moekit
