// The GEMM planner on the CPU (no GPU needed): the seed rows' GEMM shapes get the plans the
// heuristic it replaced (select_grouped_gemm_config and the chain rule at 8f7ab1b) picked
// with no environment set, every candidate passes gemm_plan_rejection, bad plans are
// rejected with a reason, and a device without the SM90 kernels gets plans that run there.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device.h"
#include "gemm/gemm_planner.h"
#include "moekit/plan.h"

namespace moekit {
namespace {

using detail::GemmDevice;
using detail::GemmRows;
using detail::GroupedGemmProblem;

unsigned g_counters[2];  // stand-ins: the planner only asks whether a counter is given
char g_act;              // the MLP's activation buffer: up writes it, down reads it

GroupedGemmProblem gemm(GemmRows rows, int groups, int64_t m, int64_t n, int64_t k, bool silu,
                        bool routed, unsigned* counter) {
  GroupedGemmProblem p;
  p.rows = rows;
  p.num_groups = groups;
  p.n = n;
  p.k = k;
  p.activation = silu ? Activation::kSiluAndMul : Activation::kNone;
  p.routed_counts = routed;
  p.tile_counter = counter;
  (rows == GemmRows::kMasked ? p.max_m : p.m) = m;
  return p;
}

struct MlpGemms {
  GroupedGemmProblem up, down;
};

// An MLP's two GEMMs over P rows of G groups: H hidden, F intermediate columns. Dense rows
// (a shared expert) carve no tile counters.
MlpGemms mlp(GemmRows rows, int groups, int64_t P, int64_t H, int64_t F, bool routed) {
  const bool dense = rows == GemmRows::kDense;
  MlpGemms g;
  g.up = gemm(rows, groups, P, F, H, true, routed, dense ? nullptr : &g_counters[0]);
  g.up.c = &g_act;
  g.down = gemm(rows, groups, P, H, F, false, routed, dense ? nullptr : &g_counters[1]);
  g.down.a = &g_act;
  return g;
}

struct GemmSeed {
  const char* name;
  GroupedGemmProblem p;
  const char* plan;
};

std::vector<GemmSeed> gemm_seeds() {
  const GemmRows C = GemmRows::kContiguous;
  unsigned* c = &g_counters[0];
  return {
      {"ds-v3-decode-mlp-up", gemm(C, 256, 4096, 4096, 7168, false, false, c),
       "decode_stream_deep 32x128"},
      {"ds-v3-prefill-mlp-up", gemm(C, 256, 32768, 4096, 7168, false, false, c),
       "sm90_pairs 128x256 dynamic swap_tails"},
      {"ds-v3-prefill-mlp-up without workspace",
       gemm(C, 256, 32768, 4096, 7168, false, false, nullptr), "sm90_pairs 128x256 swap_tails"},
      {"ds-v3-decode-down", gemm(C, 256, 4096, 7168, 2048, false, false, c),
       "decode_persistent 32x128"},
      {"ds-v3-prefill-down", gemm(C, 256, 32768, 7168, 2048, false, false, c),
       "sm90_pairs 128x256 dynamic swap_tails"},
      {"qwen3-30b-ep8-decode", gemm(C, 16, 8, 1536, 2048, false, false, c),
       "decode_stream_narrow 32x64"},
      {"qwen3-30b-ep8-routed256", gemm(C, 16, 256, 1536, 2048, false, false, c),
       "decode_stream_narrow 32x64"},
      {"ds-v3-decode-swiglu", gemm(C, 256, 4096, 2048, 7168, true, false, c),
       "decode_stream_deep 32x128"},
      {"ds-v3-prefill-swiglu", gemm(C, 256, 32768, 2048, 7168, true, false, c),
       "sm90_pairs 128x256 dynamic swap_tails"},
      {"ds-v3-ep8-masked", gemm(GemmRows::kMasked, 32, 128, 4096, 7168, false, false, c),
       "sm90 128x256 dynamic swap_tails"},
  };
}

struct MlpSeed {
  const char* name;
  MlpGemms g;
  const char* plan;
};

std::vector<MlpSeed> mlp_seeds() {
  const GemmRows C = GemmRows::kContiguous, D = GemmRows::kDense;
  return {
      // moe_expert_mlp (standalone counts).
      {"expert_mlp qwen3-235b-decode", mlp(C, 128, 4096, 4096, 1536, false),
       "two_gemms{gate_up: decode_stream 32x128, down: decode_persistent 32x128}"},
      {"expert_mlp qwen3-235b-prefill", mlp(C, 128, 32768, 4096, 1536, false),
       "chain{gate_up: sm90_pairs 128x256 dynamic swap_tails, down: sm90_pairs 128x256 dynamic "
       "swap_tails}"},
      {"expert_mlp ds-v3-decode", mlp(C, 256, 4096, 7168, 2048, false),
       "two_gemms{gate_up: decode_stream_deep 32x128, down: decode_persistent 32x128}"},
      {"expert_mlp ds-v3-prefill", mlp(C, 256, 32768, 7168, 2048, false),
       "chain{gate_up: sm90_pairs 128x256 dynamic swap_tails, down: sm90_pairs 128x256 dynamic "
       "swap_tails}"},
      // The fused layers' sorted path: T * 8 routed rows, routed counts.
      {"fused kimi-k2-t128", mlp(C, 384, 128 * 8, 7168, 2048, true),
       "two_gemms{gate_up: decode_stream_deep 32x128, down: decode_persistent 32x128}"},
      {"fused kimi-k2-t512", mlp(C, 384, 512 * 8, 7168, 2048, true),
       "two_gemms{gate_up: decode_stream_deep 32x128, down: decode_persistent 32x128}"},
      {"fused kimi-k2-t2048", mlp(C, 384, 2048 * 8, 7168, 2048, true),
       "chain{gate_up: sm90 128x256 dynamic swap_tails, down: sm90 128x256 dynamic swap_tails}"},
      {"fused kimi-k2-t4096", mlp(C, 384, 4096 * 8, 7168, 2048, true),
       "chain{gate_up: sm90 128x256 dynamic swap_tails, down: sm90 128x256 dynamic swap_tails}"},
      {"fused ds-v3-grouped-t128", mlp(C, 256, 128 * 8, 7168, 2048, true),
       "two_gemms{gate_up: decode_stream_deep 32x128, down: decode_persistent 32x128}"},
      {"fused ds-v3-grouped-t512", mlp(C, 256, 512 * 8, 7168, 2048, true),
       "chain{gate_up: sm90 128x256 dynamic swap_tails, down: sm90 128x256 dynamic swap_tails}"},
      {"fused ds-v3-grouped-t4096", mlp(C, 256, 4096 * 8, 7168, 2048, true),
       "chain{gate_up: sm90_pairs 128x256 dynamic swap_tails, down: sm90_pairs 128x256 dynamic "
       "swap_tails}"},
      {"fused glm45-t512", mlp(C, 160, 512 * 8, 5120, 1536, true),
       "chain{gate_up: sm90 128x256 dynamic swap_tails, down: sm90 128x256 dynamic swap_tails}"},
      {"fused qwen3-235b-t512", mlp(C, 128, 512 * 8, 4096, 1536, true),
       "chain{gate_up: sm90 128x256 dynamic swap_tails, down: sm90 128x256 dynamic swap_tails}"},
      // Dense shared experts on two GEMMs (the split from the CPU's capacity model).
      {"shared kimi-k2-t512", mlp(D, 1, 512, 7168, 18432, false),
       "two_gemms{gate_up: sm90 128x192, down: sm90 128x224}"},
      {"shared ds-v3-t4096", mlp(D, 1, 4096, 7168, 2048, false),
       "two_gemms{gate_up: sm90 128x256 swap_tails, down: sm90 128x256 swap_tails}"},
      {"shared ds-v3-t128", mlp(D, 1, 128, 7168, 2048, false),
       "two_gemms{gate_up: decode 32x128, down: decode 32x128}"},
      {"shared ds-v3-t32", mlp(D, 1, 32, 7168, 2048, false),
       "two_gemms{gate_up: decode_splitk 32x128 split8, down: decode_splitk 32x128 split4}"},
      {"shared kimi-k2-t1", mlp(D, 1, 1, 7168, 18432, false),
       "two_gemms{gate_up: decode_splitk 32x128 split3, down: decode_splitk 32x128 split4}"},
  };
}

bool contains(const std::vector<GemmPlan>& v, const GemmPlan& p) {
  for (const GemmPlan& q : v) {
    if (q == p) return true;
  }
  return false;
}

TEST(GemmPlanner, SeedRowsGetTheHeuristicsPlans) {
  const GemmDevice h200(detail::h200_props());
  for (const GemmSeed& s : gemm_seeds()) {
    const GemmPlan plan = detail::plan_gemm(s.p, h200);
    EXPECT_EQ(to_string(plan), s.plan) << s.name;
    EXPECT_EQ(detail::gemm_plan_rejection(plan, s.p, h200), "") << s.name;
    EXPECT_TRUE(contains(detail::gemm_plan_candidates(s.p, h200), plan)) << s.name;
  }
  for (const MlpSeed& s : mlp_seeds()) {
    const MlpPlan plan = detail::plan_mlp_gemms(s.g.up, s.g.down, h200);
    EXPECT_EQ(to_string(plan), s.plan) << s.name;
    EXPECT_EQ(detail::mlp_gemms_plan_rejection(plan, s.g.up, s.g.down, h200), "") << s.name;
  }
}

TEST(GemmPlanner, MeasuredClusterCapacitiesChangeTheSplit) {
  // ds-v3-t32's gate_up: 32 tiles; with 30 co-resident 8-CTA clusters (an H200's GPCs) the
  // eighth split spills into a second wave, so 7 wins (split_k.h).
  GemmDevice d(detail::h200_props());
  for (int s = 1; s <= detail::kMaxSplitK; ++s) d.splitk_clusters[s] = 264 / s;
  d.splitk_clusters[8] = 30;
  const MlpGemms g = mlp(GemmRows::kDense, 1, 32, 7168, 2048, false);
  EXPECT_EQ(to_string(detail::plan_gemm(g.up, d)), "decode_splitk 32x128 split7");
}

TEST(GemmPlanner, EveryCandidatePassesTheRejectionCheck) {
  const GemmDevice h200(detail::h200_props());
  for (const GemmSeed& s : gemm_seeds()) {
    const std::vector<GemmPlan> all = detail::gemm_plan_candidates(s.p, h200);
    EXPECT_GE(all.size(), 10u) << s.name;
    for (const GemmPlan& plan : all) {
      EXPECT_EQ(detail::gemm_plan_rejection(plan, s.p, h200), "")
          << s.name << " " << to_string(plan);
    }
  }
  for (const MlpSeed& s : mlp_seeds()) {
    const std::vector<MlpPlan> all = detail::mlp_gemms_plan_candidates(s.g.up, s.g.down, h200);
    bool has_pick = false;
    for (const MlpPlan& plan : all) {
      has_pick = has_pick || plan == detail::plan_mlp_gemms(s.g.up, s.g.down, h200);
      EXPECT_EQ(detail::mlp_gemms_plan_rejection(plan, s.g.up, s.g.down, h200), "")
          << s.name << " " << to_string(plan);
    }
    EXPECT_TRUE(has_pick) << s.name;
  }
}

// Rejects `plan` for `p` with a reason containing `why`.
void expect_rejected(const GemmPlan& plan, const GroupedGemmProblem& p, const GemmDevice& d,
                     const std::string& why) {
  const std::string got = detail::gemm_plan_rejection(plan, p, d);
  EXPECT_NE(got.find(why), std::string::npos) << to_string(plan) << ": \"" << got << "\"";
}

TEST(GemmPlanner, BadPlansAreRejectedWithAReason) {
  const GemmDevice h200(detail::h200_props());
  const GemmDevice none;  // no GPU
  GroupedGemmProblem p =
      gemm(GemmRows::kContiguous, 256, 32768, 2048, 7168, true, false, &g_counters[0]);
  GemmPlan plan{GemmKernel::kSm90, 128, 224, 1, GemmSchedule::kStatic};
  expect_rejected(plan, p, h200, "128x224 (no silu_and_mul)");
  plan = {GemmKernel::kSm90, 128, 256, 1, GemmSchedule::kStatic};
  expect_rejected(plan, p, none, "sm_90 device");
  plan = {GemmKernel::kDecode, 32, 128, 2, GemmSchedule::kStatic};
  expect_rejected(plan, p, h200, "does not split k");
  plan = {GemmKernel::kDecode, 32, 128, 1, GemmSchedule::kDynamic};
  expect_rejected(plan, p, h200, "static schedule only");
  plan = {GemmKernel::kDecodeSplitK, 32, 128, 9, GemmSchedule::kStatic};
  expect_rejected(plan, p, h200, "splits 2..8");
  plan = {GemmKernel::kDecodeStreamNarrow, 32, 128, 1, GemmSchedule::kStatic};
  expect_rejected(plan, p, h200, "32x64 tiles");
  plan = {GemmKernel::kFp8Sm90, 128, 128, 1, GemmSchedule::kStatic};
  expect_rejected(plan, p, h200, "FP8 inputs only");
  plan = {GemmKernel::kSm90Pairs, 128, 256, 1, GemmSchedule::kDynamic};
  p.tile_counter = nullptr;
  expect_rejected(plan, p, h200, "tile counter");
  p = gemm(GemmRows::kContiguous, 1500, 1500 * 64, 2048, 0, false, false, nullptr);
  plan = {GemmKernel::kDecodePersistent, 32, 128, 1, GemmSchedule::kStatic};
  expect_rejected(plan, p, h200, "k > 0");
  plan = {GemmKernel::kSm90, 128, 256, 1, GemmSchedule::kStatic};
  expect_rejected(plan, p, h200, "k > 0");
  p.k = 1024;
  expect_rejected(plan, p, h200, "1024 groups");

  // Swapped tail tiles: the bf16 / f16 SM90 kernels at 256 wide only.
  p = gemm(GemmRows::kContiguous, 256, 32768, 2048, 7168, true, false, &g_counters[0]);
  plan = {GemmKernel::kSm90, 128, 192, 1, GemmSchedule::kStatic};
  plan.swap_tails = true;
  expect_rejected(plan, p, h200, "swap_tails runs on sm90 / sm90_pairs 128x256");
  plan = {GemmKernel::kDecodeStream, 32, 128, 1, GemmSchedule::kStatic};
  plan.swap_tails = true;
  expect_rejected(plan, p, h200, "swap_tails runs on sm90 / sm90_pairs 128x256");
  plan = {GemmKernel::kSm90Pairs, 128, 256, 1, GemmSchedule::kDynamic};
  plan.swap_tails = true;
  EXPECT_EQ(detail::gemm_plan_rejection(plan, p, h200), "");

  // The MLP chain: one kernel for both GEMMs, and only an expert MLP's GEMMs.
  const MlpGemms g = mlp(GemmRows::kContiguous, 256, 32768, 7168, 2048, false);
  MlpPlan m = detail::plan_mlp_gemms(g.up, g.down, h200);
  ASSERT_EQ(m.path, MlpPath::kChain);
  m.down.kernel = GemmKernel::kSm90;
  EXPECT_NE(detail::mlp_gemms_plan_rejection(m, g.up, g.down, h200), "");
  const MlpGemms dense = mlp(GemmRows::kDense, 1, 4096, 7168, 2048, false);
  m = detail::plan_mlp_gemms(dense.up, dense.down, h200);
  EXPECT_EQ(m.path, MlpPath::kTwoGemms);
  m.path = MlpPath::kChain;
  m.gate_up = m.down = GemmPlan{GemmKernel::kSm90, 128, 256, 1, GemmSchedule::kDynamic};
  EXPECT_NE(detail::mlp_gemms_plan_rejection(m, dense.up, dense.down, h200).find("contiguous"),
            std::string::npos);
  m.path = MlpPath::kDirect;
  EXPECT_NE(detail::mlp_gemms_plan_rejection(m, dense.up, dense.down, h200), "");
  // A chain swaps both GEMMs' tails or neither.
  m = detail::plan_mlp_gemms(g.up, g.down, h200);
  ASSERT_TRUE(m.gate_up.swap_tails && m.down.swap_tails);
  m.gate_up.swap_tails = false;
  EXPECT_NE(detail::mlp_gemms_plan_rejection(m, g.up, g.down, h200).find("swap_tails"),
            std::string::npos);
  m.down.swap_tails = false;
  EXPECT_EQ(detail::mlp_gemms_plan_rejection(m, g.up, g.down, h200), "");
}

// Every 256-wide SM90 pick swaps its tails; the plain tiles stay candidates (the A/B).
TEST(GemmPlanner, SwappedTailsArePickedAt256Wide) {
  const GemmDevice h200(detail::h200_props());
  for (const GemmSeed& s : gemm_seeds()) {
    const GemmPlan pick = detail::plan_gemm(s.p, h200);
    const bool sm90 = pick.kernel == GemmKernel::kSm90 || pick.kernel == GemmKernel::kSm90Pairs;
    EXPECT_EQ(pick.swap_tails, sm90 && pick.tile_n == 256) << s.name;
    GemmPlan plain = pick;
    plain.swap_tails = false;
    EXPECT_TRUE(contains(detail::gemm_plan_candidates(s.p, h200), plain)) << s.name;
  }
  for (const MlpSeed& s : mlp_seeds()) {
    const MlpPlan pick = detail::plan_mlp_gemms(s.g.up, s.g.down, h200);
    if (pick.path == MlpPath::kChain) EXPECT_TRUE(pick.gate_up.swap_tails) << s.name;
    bool chain = false, swapped_chain = false;
    for (const MlpPlan& plan : detail::mlp_gemms_plan_candidates(s.g.up, s.g.down, h200)) {
      chain |= plan.path == MlpPath::kChain && !plan.gate_up.swap_tails;
      swapped_chain |= plan.path == MlpPath::kChain && plan.gate_up.swap_tails;
    }
    EXPECT_EQ(swapped_chain, chain) << s.name;
  }
}

TEST(GemmPlanner, WithoutTheSm90KernelsEveryPlanRunsOnTheMmaSyncKernels) {
  const GemmDevice none;  // arch 0: no GPU
  for (const GemmSeed& s : gemm_seeds()) {
    const GemmPlan plan = detail::plan_gemm(s.p, none);
    EXPECT_EQ(detail::gemm_plan_rejection(plan, s.p, none), "") << s.name;
    EXPECT_TRUE(plan.kernel != GemmKernel::kSm90 && plan.kernel != GemmKernel::kSm90Pairs)
        << s.name;
    for (const GemmPlan& c : detail::gemm_plan_candidates(s.p, none)) {
      EXPECT_TRUE(c.kernel != GemmKernel::kSm90 && c.kernel != GemmKernel::kSm90Pairs) << s.name;
    }
  }
  for (const MlpSeed& s : mlp_seeds()) {
    const MlpPlan plan = detail::plan_mlp_gemms(s.g.up, s.g.down, none);
    EXPECT_EQ(plan.path, MlpPath::kTwoGemms) << s.name;
    EXPECT_EQ(detail::mlp_gemms_plan_rejection(plan, s.g.up, s.g.down, none), "") << s.name;
  }
}

TEST(GemmPlanner, KZeroAndManyGroupsFallBackToTheDecodeTiles) {
  const GemmDevice h200(detail::h200_props());
  // Many rows per group but k == 0 (c = 0): no TMA descriptor; the decode tiles write zeros.
  GroupedGemmProblem p = gemm(GemmRows::kContiguous, 16, 16 * 512, 4096, 0, false, false, nullptr);
  EXPECT_EQ(to_string(detail::plan_gemm(p, h200)), "decode 32x128");
  // More groups than the SM90 group table holds.
  p = gemm(GemmRows::kContiguous, 1500, 1500 * 256, 4096, 2048, false, false, nullptr);
  const GemmPlan plan = detail::plan_gemm(p, h200);
  EXPECT_EQ(to_string(plan), "decode 32x128");
  EXPECT_EQ(detail::gemm_plan_rejection(plan, p, h200), "");
}

// fp8_sm90 128x256: whole-k sums scaled once for per-tensor and per-channel scales
// (fp8_fast_gemm.cu, k <= kFp8FastMaxK), block scales promoted every 128 k
// (fp8_block256_gemm.cu, any k; with silu_and_mul n % 128 == 0); a bf16 c only.
TEST(GemmPlanner, Fp8FastAccumulationTakesConstantScalesAndABf16C) {
  const GemmDevice h200(detail::h200_props());
  const GemmPlan fast{GemmKernel::kFp8Sm90, 128, 256, 1, GemmSchedule::kStatic};
  detail::GroupedGemmFP8Problem p;
  p.contiguous = true;
  p.num_groups = 128;
  p.m = 32768 + 128 * 15;
  p.alignment = 16;
  p.n = 768;
  p.k = 2048;
  p.activation = Activation::kSiluAndMul;
  for (Fp8Scales scales : {Fp8Scales::kPerChannel, Fp8Scales::kPerTensor}) {
    p.scales = scales;
    EXPECT_EQ(detail::gemm_fp8_plan_rejection(fast, p, h200), "");
    // >= 256 rows a group on average: the planner's pick, first.
    std::vector<GemmPlan> all = detail::gemm_fp8_plan_candidates(p, h200);
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0], fast);
    EXPECT_EQ(to_string(all[1]), "fp8_sm90 128x128");
    EXPECT_EQ(detail::plan_gemm_fp8(p, h200), fast);
    // Fewer: 128 x 128 first.
    p.m = 255 * 128;
    all = detail::gemm_fp8_plan_candidates(p, h200);
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(to_string(all[0]), "fp8_sm90 128x128");
    EXPECT_EQ(all[1], fast);
    EXPECT_EQ(detail::plan_gemm_fp8(p, h200), all[0]);
    p.m = 32768 + 128 * 15;
  }
  // Past kFp8FastMaxK (the accumulator's rounding grows with k): 128 x 128 only.
  p.k = detail::kFp8FastMaxK;
  EXPECT_EQ(detail::plan_gemm_fp8(p, h200), fast);
  p.k = detail::kFp8FastMaxK + 128;
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(fast, p, h200),
            "fp8_sm90 128x256 sums the whole k in the wgmma accumulator: k <= 4096 only");
  EXPECT_EQ(detail::gemm_fp8_plan_candidates(p, h200).size(), 1u);
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(p, h200)), "fp8_sm90 128x128");
  p.k = 2048;
  // Block scales: 128 x 256 promotes every 128 k (any k), the planner's pick from 80 rows a
  // group. With silu_and_mul each 128-row b box must be one scale block: n % 128 == 0.
  p.scales = Fp8Scales::kBlock;
  p.k = detail::kFp8FastMaxK + 128;
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(fast, p, h200), "");
  EXPECT_EQ(detail::gemm_fp8_plan_candidates(p, h200).size(), 2u);
  EXPECT_EQ(detail::plan_gemm_fp8(p, h200), fast);
  {
    detail::GroupedGemmFP8Problem silu = p;
    silu.activation = Activation::kSiluAndMul;
    silu.n = 192;
    EXPECT_EQ(detail::gemm_fp8_plan_rejection(fast, silu, h200),
              "fp8_sm90 128x256 with block scales and silu_and_mul needs n % 128 == 0");
    silu.n = 256;
    EXPECT_EQ(detail::gemm_fp8_plan_rejection(fast, silu, h200), "");
  }
  p.k = 2048;
  p.scales = Fp8Scales::kPerChannel;
  static const float scale = 1.f;
  p.c_scale = &scale;
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(fast, p, h200),
            "fp8_sm90 128x256 writes a bf16 c only (no c_scale)");
  EXPECT_EQ(detail::gemm_fp8_plan_candidates(p, h200).size(), 1u);
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(p, h200)), "fp8_sm90 128x128");
  p.c_scale = nullptr;
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(fast, p, GemmDevice()),
            "fp8_sm90 needs an sm_90 device");
  GemmPlan other = fast;
  other.tile_n = 192;
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(other, p, h200), "fp8_sm90 runs 128x128 tiles");
  GemmPlan parsed;
  std::string why;
  ASSERT_TRUE(parse_plan("fp8_sm90 128x256", &parsed, &why)) << why;
  EXPECT_EQ(parsed, fast);
}

// Masked block-scaled groups of <= 128 rows (max_m) at k >= 2048 take 128 x 256 tiles where
// their waves (twice the work a tile) are at most 10% longer than 128 x 128's: the page's FP8
// GEMM rows, as measured on the H200 (gemm_planner.h kFp8BlockWideMaskedMinK).
TEST(GemmPlanner, Fp8MaskedBlockRowsTakeWideTilesWhereTheyWon) {
  const GemmDevice h200(detail::h200_props());
  struct Row {
    const char* name;
    int64_t groups, max_m, n, k;
    int tile_n;
  };
  const Row rows[] = {
      {"ds-v3-e8-up-masked", 8, 128, 4096, 7168, 256},  // 1 wave of 128 tiles against 2
      {"ds-v3-e8-down-masked", 8, 128, 7168, 2048, 256},
      {"ds-v3-dec-b64-up", 32, 64, 4096, 7168, 256},
      {"ds-v3-dec-b64-down", 32, 64, 7168, 2048, 256},
      {"kimi-k2-dec-b64-up", 48, 64, 4096, 7168, 256},
      {"kimi-k2-dec-b64-down", 48, 64, 7168, 2048, 256},     // 2 x 11 waves against 21
      {"qwen3-235b-dec-b64-up", 16, 64, 3072, 4096, 128},    // 2 x 2 waves against 3
      {"qwen3-235b-dec-b64-down", 16, 64, 4096, 1536, 128},  // k < 2048
      {"ds-v3-dec-b256-up", 32, 256, 4096, 7168, 128},       // max_m > 128: not measured
  };
  for (const Row& r : rows) {
    detail::GroupedGemmFP8Problem p;
    p.num_groups = r.groups;
    p.max_m = r.max_m;
    p.n = r.n;
    p.k = r.k;
    const GemmPlan plan = detail::plan_gemm_fp8(p, h200);
    EXPECT_EQ(plan.tile_n, r.tile_n) << r.name << ": " << to_string(plan);
    EXPECT_EQ(detail::gemm_fp8_plan_rejection(plan, p, h200), "") << r.name;
    EXPECT_EQ(detail::gemm_fp8_plan_candidates(p, h200)[0], plan) << r.name;
    // Per-channel and per-tensor scales keep 128 x 128 on masked rows.
    p.scales = Fp8Scales::kPerChannel;
    EXPECT_EQ(detail::plan_gemm_fp8(p, h200).tile_n, 128) << r.name;
  }
  // One wave of 128 x 256 tiles: the static schedule, as every one-wave FP8 plan.
  detail::GroupedGemmFP8Problem e8;
  e8.num_groups = 8;
  e8.max_m = 128;
  e8.n = 4096;
  e8.k = 7168;
  static unsigned counter = 0;
  e8.tile_counter = &counter;
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(e8, h200)), "fp8_sm90 128x256");
  e8.n = 7168;
  e8.k = 2048;
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(e8, h200)), "fp8_sm90 128x256 dynamic");
  // silu_and_mul with n % 128 != 0 cannot take the wide block tile: 128 x 128.
  e8.activation = Activation::kSiluAndMul;
  e8.n = 7168 + 64;
  EXPECT_EQ(detail::plan_gemm_fp8(e8, h200).tile_n, 128);
}

TEST(GemmPlanner, Fp8PlansTheSm90KernelWhereItTakesTheProblem) {
  const GemmDevice h200(detail::h200_props());
  const GemmPlan sm90{GemmKernel::kFp8Sm90, 128, 128, 1, GemmSchedule::kStatic};
  detail::GroupedGemmFP8Problem p;
  p.num_groups = 32;
  p.max_m = 256;
  p.n = 4096;
  p.k = 7168;
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(p, h200)), "fp8_sm90 128x128");
  ASSERT_EQ(detail::gemm_fp8_plan_candidates(p, h200).size(), 2u);  // and 128 x 256
  EXPECT_EQ(detail::gemm_fp8_plan_candidates(p, h200)[0], sm90);
  EXPECT_EQ(to_string(detail::gemm_fp8_plan_candidates(p, h200)[1]), "fp8_sm90 128x256");
  // Off sm_90 the same plan, refused with the reason; no candidate.
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(p, GemmDevice())), "fp8_sm90 128x128");
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(sm90, p, GemmDevice()),
            "fp8_sm90 needs an sm_90 device");
  EXPECT_TRUE(detail::gemm_fp8_plan_candidates(p, GemmDevice()).empty());
  EXPECT_NE(detail::gemm_fp8_plan_rejection(
                GemmPlan{GemmKernel::kDecode, 32, 128, 1, GemmSchedule::kStatic}, p, h200),
            "");
  // More groups than the kernel's group table.
  p.num_groups = 1025;
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(sm90, p, h200),
            "fp8_sm90 needs at most 1024 groups and 32-bit extents");
  EXPECT_TRUE(detail::gemm_fp8_plan_candidates(p, h200).empty());
  // k == 0 (the fill of the empty sums, run_grouped_gemm_fp8) in every scale mode, with
  // silu_and_mul or an e4m3 output: the same plan, its only candidate.
  p.num_groups = 32;
  p.k = 0;
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(p, h200)), "fp8_sm90 128x128");
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(sm90, p, h200), "");
  for (Fp8Scales scales : {Fp8Scales::kBlock, Fp8Scales::kPerChannel, Fp8Scales::kPerTensor})
    for (bool e4m3 : {false, true}) {
      detail::GroupedGemmFP8Problem q = p;
      q.scales = scales;
      if (e4m3) {
        static const float scale = 1.f;
        q.c_scale = &scale;
      } else {
        q.activation = Activation::kSiluAndMul;
      }
      EXPECT_EQ(detail::gemm_fp8_plan_rejection(sm90, q, h200), "");
      ASSERT_EQ(detail::gemm_fp8_plan_candidates(q, h200).size(), 1u);
      EXPECT_EQ(to_string(detail::plan_gemm_fp8(q, h200)), "fp8_sm90 128x128");
      // Only its tiles, static, unsplit.
      GemmPlan other = sm90;
      other.tile_m = 32;
      EXPECT_NE(detail::gemm_fp8_plan_rejection(other, q, h200), "");
      other = sm90;
      other.schedule = GemmSchedule::kDynamic;
      EXPECT_NE(detail::gemm_fp8_plan_rejection(other, q, h200), "");
    }
}

}  // namespace
}  // namespace moekit
