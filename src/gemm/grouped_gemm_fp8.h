// Internal entry to the FP8 (e4m3, 128-block scaled) masked grouped GEMM.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace moekit::detail {

// c[g, m, :] (bf16) for m < count[g] (clamped to max_m); other rows untouched.
//   a [G, max_m, k] e4m3, a_scale [G, max_m, ceil(k/128)] f32,
//   b [G, n, k] e4m3, b_scale [G, ceil(n/128), ceil(k/128)] f32, c [G, max_m, n] bf16.
// k % 16 == 0, n % 8 == 0. All pointers are device pointers.
struct GroupedGemmFP8Problem {
  const void* a = nullptr;
  const float* a_scale = nullptr;
  const void* b = nullptr;
  const float* b_scale = nullptr;
  void* c = nullptr;
  const int32_t* layout_metadata = nullptr;  // device [G] masked counts
  int num_groups = 0;
  int64_t max_m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int config = -1;  // -1 = heuristic, else a Fp8GemmConfig value
};

enum Fp8GemmConfig : int {
  kFp8ConfigDecode = 0,   // 32x128 tiles, 4 warps
  kFp8ConfigPrefill = 1,  // 128x128 tiles, 8 warps
  // SM90 TMA + wgmma, 128x128x128 tiles, persistent (sm90_fp8_grouped_gemm.cu): the
  // heuristic's pick wherever it takes the problem (H200-verified 2026-12-02).
  kFp8ConfigSm90 = 2,
  kFp8ConfigCount = 3,
};

// problem.config, else MOEKIT_GEMM_CONFIG, else the heuristic (docs/gemm.md).
int select_grouped_gemm_fp8_config(const GroupedGemmFP8Problem& problem);

// Validates nothing; launches on `stream`.
void run_grouped_gemm_fp8(const GroupedGemmFP8Problem& problem, cudaStream_t stream);

// The SM90 config: whether it takes the problem (k > 0, at most 1024 groups, 32-bit
// extents), and its launcher (throws outside those limits).
bool sm90_fp8_supports(const GroupedGemmFP8Problem& problem);
void launch_grouped_gemm_sm90_fp8(const GroupedGemmFP8Problem& problem, cudaStream_t stream);
// Host check of the SM90 config's shared-memory and accumulator layout assumptions:
// empty when they hold, else what differs (CPU test).
std::string sm90_fp8_layout_mismatch();

}  // namespace moekit::detail
