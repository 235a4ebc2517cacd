// Tests of the one-token GEMV MLP (src/mlp/gemv_mlp.h): on the GPU against the CPU
// reference on fresh random inputs through SharedExpertMLPFwd (sizes off every chunk,
// batch and grid boundary, poisoned outputs and workspace), with the PDL chain on and
// off, f32 output, determinism and back-to-back graph replays; on the CPU the supported
// shapes (the path rule: test_mlp_planner.cpp).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/pdl.h"
#include "mlp/gemv_mlp.h"
#include "moekit/moe.h"
#include "support/gpu.h"
#include "test_dense_mlp_common.h"

namespace moekit {
namespace {

using Case = dense_mlp_test::MlpCase;

std::vector<Case> cases() {
  const DType b = DType::kBF16, h = DType::kF16;
  return {
      {b, 1, 8, 8},        // one chunk per row, one column per kernel
      {h, 1, 256, 128},    // H: exactly one chunk per thread
      {b, 1, 1000, 520},   // 125 / 65 chunks: partial batches
      {h, 1, 2056, 7168},  // gate_up k: 257 chunks (one past a thread row); down k 7168
      {b, 1, 24, 18440},   // down k: 2305 chunks, past one batch of 2048; 24 columns
      {b, 1, 7168, 2048},  // ds-v3's shared expert: columns loop over the grid
      {h, 1, 5120, 1536},  // glm45's
      {h, 1, 7168, 64},    // a short down k against 7168 rows
  };
}

TEST(GemvMlpGpu, MatchesReferenceWithAndWithoutPdl) {
  MOEKIT_REQUIRE_GPU();
  dense_mlp_test::expect_path_matches_reference(MlpPath::kGemv, cases(), 9100);
}

// The fused layer's shared expert writes f32 (a later sum).
TEST(GemvMlpGpu, F32OutputMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  dense_mlp_test::expect_f32_output_matches(
      {{DType::kBF16, 1, 1000, 520}, {DType::kF16, 1, 2048, 1024}}, 9200, detail::run_gemv_mlp);
}

TEST(GemvMlpGpu, DeterministicAndCloseToTheGemmPath) {
  MOEKIT_REQUIRE_GPU();
  dense_mlp_test::expect_deterministic_and_close_to_gemm(MlpPath::kGemv,
                                                         {DType::kBF16, 1, 7168, 2048}, 9300);
}

// Back-to-back graph replays with PDL (h's write-after-read between calls).
TEST(GemvMlpGpu, BackToBackGraphReplays) {
  MOEKIT_REQUIRE_GPU();
  dense_mlp_test::expect_graph_replays_match(MlpPath::kGemv, {DType::kF16, 1, 1536, 520}, 9400);
}

TEST(GemvMlp, SupportedOnlyForItsShapes) {
  const detail::DeviceProps h200 = detail::h200_props();
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 2, 256, 128, h200));  // one token only
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 0, 256, 128, h200));
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kF32, 1, 256, 128, h200));
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 1, 260, 128, h200));      // H % 8
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 1, 256, 132, h200));      // S % 8
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 1, 256, 1 << 20, h200));  // h past smem
  EXPECT_TRUE(detail::gemv_mlp_supported(DType::kBF16, 1, 256, 128, h200));
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 1, 256, 128, detail::DeviceProps()));
}

}  // namespace
}  // namespace moekit
