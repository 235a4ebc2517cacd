// Tests of the direct dense MLP (src/mlp/direct_mlp.h): on the GPU against the CPU
// reference on fresh random inputs through SharedExpertMLPFwd (token counts 1..32 on
// both tile widths, sizes off every chunk / slice / cluster boundary, every 1..8-rank k
// split forced through args.plan, poisoned outputs), with the PDL chain on and off, f32
// output, determinism and back-to-back graph replays; on the CPU the host plan.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/pdl.h"
#include "mlp/direct_mlp.h"
#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "support/gpu.h"
#include "test_dense_mlp_common.h"
#include "test_moe_common.h"

namespace moekit {
namespace {

using Case = dense_mlp_test::MlpCase;

std::vector<Case> cases() {
  const DType b = DType::kBF16, h = DType::kF16;
  return {
      {b, 1, 256, 128},     // TN 8, one chunk batch
      {h, 1, 7168, 2048},   // ds-v3 t1: split gate_up, slices of 3584
      {b, 3, 72, 8},        // k = 72: a partial chunk; S = 8: one silu warp of 8
      {h, 8, 136, 72},      // TN 8 full
      {b, 9, 264, 40},      // TN 32, n off the CTA's columns
      {h, 17, 1000, 1000},  // k off the chunk; n off 16 and 64
      {b, 32, 7168, 2048},  // ds-v3 t32: 8-rank gate_up clusters, 4-rank down
      {h, 31, 5120, 1536},  // glm45
      {b, 32, 8, 8},        // the smallest shape
      {h, 5, 7168, 64},     // down with k = 64 against H = 7168 rows
      {b, 2, 520, 7168},    // gate_up with many silu columns, down with k 7168
  };
}

TEST(DirectMlpGpu, MatchesReferenceWithAndWithoutPdl) {
  MOEKIT_REQUIRE_GPU();
  dense_mlp_test::expect_path_matches_reference(MlpPath::kDirect, cases(), 8100);
}

// Every split pair the planner accepts, on cases that take both weight-load schemes (paired
// lanes where a k slice is >= 1024, single lanes below; the partner swap must hand each
// lane its own row's line half; k ends off a line and rows off 128 bytes included) and
// every cluster size 1-8 (the push sum's owner slot layouts for splits that do not divide
// the 8 warps).
TEST(DirectMlpGpu, EveryCandidateMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  const DType b = DType::kBF16, h = DType::kF16;
  dense_mlp_test::expect_every_candidate_matches_reference(
      MlpPath::kDirect,
      {{b, 32, 7168, 2048}, {h, 8, 2048, 2048}, {b, 17, 1000, 1000}, {h, 3, 896, 8}}, 8500);
}

// The fused layer's shared expert writes f32 (a later sum).
TEST(DirectMlpGpu, F32OutputMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  dense_mlp_test::expect_f32_output_matches(
      {{DType::kBF16, 4, 1000, 520}, {DType::kF16, 32, 2048, 1024}}, 8200,
      [](DType dt, const void* x, int64_t T, int64_t H, int64_t S, const void* wgu, const void* wd,
         void* act, void* out, DType out_dt, cudaStream_t stream) {
        const detail::DeviceProps& device = detail::device_props();
        const int su = detail::direct_gemm_plan(T, S, H, true, device.sms).split;
        const int sd = detail::direct_gemm_plan(T, H, S, false, device.sms).split;
        detail::run_direct_mlp(dt, x, T, H, S, wgu, wd, act, out, out_dt, su, sd, stream);
      });
}

TEST(DirectMlpGpu, DeterministicAndCloseToTheGemmPath) {
  MOEKIT_REQUIRE_GPU();
  dense_mlp_test::expect_deterministic_and_close_to_gemm(MlpPath::kDirect,
                                                         {DType::kBF16, 32, 7168, 2048}, 8300);
}

// Back-to-back graph replays with PDL (h's write-after-read between calls).
TEST(DirectMlpGpu, BackToBackGraphReplays) {
  MOEKIT_REQUIRE_GPU();
  dense_mlp_test::expect_graph_replays_match(MlpPath::kDirect, {DType::kF16, 20, 1536, 520}, 8400);
}

// The host plan: at most 8 ranks, slices of whole load batches that cover k exactly
// once (no rank without k), x slices that fit the shared memory.
TEST(DirectMlp, PlanCoversKOnceWithinTheClusterLimit) {
  for (int64_t T : {1, 8, 9, 32})
    for (int64_t k : {8, 72, 1000, 1536, 2048, 5120, 7168, 18432})
      for (int64_t n : {8, 40, 1536, 7168, 36864})
        for (bool silu : {false, true}) {
          const detail::DirectGemmPlan pl = detail::direct_gemm_plan(T, n, k, silu, 132);
          SCOPED_TRACE("T " + std::to_string(T) + " k " + std::to_string(k) + " n " +
                       std::to_string(n));
          EXPECT_GE(pl.split, 1);
          EXPECT_LE(pl.split, 8);
          EXPECT_EQ(pl.k_slice % 128, 0);
          EXPECT_GE(int64_t{pl.split} * pl.k_slice, k);
          EXPECT_LT(int64_t{pl.split - 1} * pl.k_slice, k);
          EXPECT_EQ(pl.tn, T <= 8 ? 8 : 32);
          EXPECT_GE(int64_t{pl.row_groups} * (silu ? 64 : 128), n);
          EXPECT_LT(int64_t{pl.row_groups - 1} * (silu ? 64 : 128), n);
        }
}

// With the device's cluster capacity the split shrinks until all row groups' clusters
// are resident at once (one wave), and keeps the first choice when none fits.
TEST(DirectMlp, PlanKeepsEveryClusterInOneWave) {
  // ds-v3's 32-token gate_up: 32 row groups, 8 ranks first; the H200 held 30 such
  // clusters of 8 and 32 of 7.
  const detail::DirectGemmPlan free_plan = detail::direct_gemm_plan(32, 2048, 7168, true, 132);
  EXPECT_EQ(free_plan.split, 8);
  EXPECT_EQ(free_plan.row_groups, 32);
  int queries = 0;
  const detail::DirectGemmPlan pl =
      detail::direct_gemm_plan(32, 2048, 7168, true, 132, [&](int split, int smem) {
        ++queries;
        EXPECT_LE(smem, 200 * 1024);
        return split >= 8 ? 30 : 32;
      });
  EXPECT_EQ(pl.split, 7);
  EXPECT_EQ(pl.k_slice, 1024);
  EXPECT_EQ(queries, 2);
  // Capacity to spare: the first choice stands.
  const detail::DirectGemmPlan roomy =
      detail::direct_gemm_plan(32, 2048, 7168, true, 132, [](int, int) { return 64; });
  EXPECT_EQ(roomy.split, free_plan.split);
  EXPECT_EQ(roomy.k_slice, free_plan.k_slice);
  // Nothing fits: the first choice (a second wave is still correct).
  const detail::DirectGemmPlan none =
      detail::direct_gemm_plan(32, 2048, 7168, true, 132, [](int, int) { return 1; });
  EXPECT_EQ(none.split, free_plan.split);
  EXPECT_EQ(none.k_slice, free_plan.k_slice);
}

// A given split's launch shape (what a plan's split runs): whole load batches per slice,
// at most 8 ranks, and the split a k cannot give reported back.
TEST(DirectMlp, PlanForASplit) {
  const detail::DirectGemmPlan pl = detail::direct_gemm_plan_for_split(32, 2048, 7168, true, 5);
  EXPECT_EQ(pl.split, 5);
  EXPECT_EQ(pl.k_slice, 1536);  // ceil(7168 / 5) rounded up to whole load batches (128)
  EXPECT_EQ(pl.row_groups, 32);
  // The partial slots: ceil(8 / 5) * 5 = 10 (the push reduction's owner layout).
  EXPECT_EQ(pl.smem, 32 * (1536 + 32) * 2 + 10 * 4 * 32 * 16);
  // One rank would stage all 7168 k of 32 tokens: more shared memory than a CTA takes.
  EXPECT_GT(detail::direct_gemm_plan_for_split(32, 2048, 7168, true, 1).smem,
            detail::kDirectMlpMaxSmem);
  // Splits stop at 8 ranks (portable clusters): 10 asked gives 8, slices of 640.
  const detail::DirectGemmPlan wide = detail::direct_gemm_plan_for_split(32, 1536, 5120, true, 10);
  EXPECT_EQ(wide.split, 8);
  EXPECT_EQ(wide.k_slice, 640);
  // k = 72 is one load batch: any split gives one rank.
  EXPECT_EQ(detail::direct_gemm_plan_for_split(3, 8, 72, false, 4).split, 1);
}

TEST(DirectMlp, SupportedOnlyForItsShapes) {
  const detail::DeviceProps h200 = detail::h200_props();
  EXPECT_FALSE(detail::direct_mlp_supported(DType::kBF16, 33, 256, 128, h200));
  EXPECT_FALSE(detail::direct_mlp_supported(DType::kBF16, 0, 256, 128, h200));
  EXPECT_FALSE(detail::direct_mlp_supported(DType::kF32, 8, 256, 128, h200));
  EXPECT_FALSE(detail::direct_mlp_supported(DType::kBF16, 8, 260, 128, h200));
  EXPECT_TRUE(detail::direct_mlp_supported(DType::kBF16, 8, 256, 128, h200));
  EXPECT_FALSE(detail::direct_mlp_supported(DType::kBF16, 8, 256, 128, detail::DeviceProps()));
}

}  // namespace
}  // namespace moekit
