// Internal entry to the FP8 (e4m3) grouped GEMMs: masked or contiguous rows, block,
// per-channel or per-tensor scales, optional silu_and_mul.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "moekit/gemm.h"
#include "moekit/plan.h"

namespace moekit::detail {

// Where a scale of a or b lives, as strides (elements of f32) of the scale tensors:
//   a scale of row r (flattened: masked g * max_m + m, contiguous the row of a), k block kb:
//     a_scale[r * a_row + kb * a_kb]
//   b scale of expert g, b row j (gate rows then up rows with silu_and_mul), k block kb:
//     b_scale[g * b_group + (j / b_row_div) * b_row + kb * b_kb]
// kBlock: (KB, 1; Bn*KB, 128, KB, 1); kPerChannel: (1, 0; Bn, 1, 1, 0); kPerTensor: (0, 0;
// 1, 1, 0, 0), with KB = ceil(k / 128) and Bn = b rows per expert. Shared by the SM90
// kernel and the f32 GPU reference.
struct Fp8ScaleIndex {
  int64_t a_row = 0, a_kb = 0;
  int64_t b_group = 0, b_row = 0, b_kb = 0;
  int b_row_div = 1;
};
Fp8ScaleIndex fp8_scale_index(Fp8Scales scales, int64_t b_rows, int64_t k);

// c[row, :] (bf16; or e4m3 of the value / *c_scale) = act(sum over k blocks of scale * (a[row] .
// b[g]^T over the block)) for every row of every group g; other rows untouched. Rows:
//   contiguous: a [m, k], c [m, n], layout_metadata = inclusive ends (alignment);
//   masked:     a [G, max_m, k], c [G, max_m, n], layout_metadata = counts (clamped to max_m).
// b [G, n, k] ([G, 2n, k], gate rows then up rows, with kSiluAndMul); scales per `scales`
// (Fp8ScaleIndex). k % 16 == 0, n % 8 == 0 (kSiluAndMul with kBlock: n % 64 == 0, so that
// each 64-row b box lies in one 128-row scale block). All pointers are device pointers.
struct GroupedGemmFP8Problem {
  const void* a = nullptr;
  const float* a_scale = nullptr;
  const void* b = nullptr;
  const float* b_scale = nullptr;
  void* c = nullptr;               // bf16, or e4m3 with c_scale
  const float* c_scale = nullptr;  // e4m3 c: device [1], c = e4m3(value / c_scale)
  // bf16 c: atomicMax of the f32 bits of max |c| over the values written (NaN ignored) into
  // *c_amax, which the caller zeroes (the FP8 MLP's per-tensor activation scale). nullptr: none.
  uint32_t* c_amax = nullptr;
  // silu_and_mul only: c is e4m3, each row quantized in groups of 128 output columns with a
  // dynamic scale (quantize_fp8.h's kGroup128 formula: max(|v|, floor) / 448, c = e4m3(v /
  // scale)) written here, device [rows, n / 128] (the down GEMM's block-scaled a). nullptr:
  // none. Only fp8_sm90 128x256 with block scales writes it (gemm_fp8_plan_rejection).
  float* c_group_scales = nullptr;
  const int32_t* layout_metadata = nullptr;  // device [G]: masked counts or contiguous ends
  bool contiguous = false;                   // else masked
  int alignment = 1;                         // contiguous
  int num_groups = 0;
  int64_t max_m = 0;  // masked
  int64_t m = 0;      // contiguous: rows of a and c (P)
  int64_t n = 0;      // output columns
  int64_t k = 0;
  Fp8Scales scales = Fp8Scales::kBlock;
  Activation activation = Activation::kNone;
  // The dynamic schedule's counter (kTileCounterBytes, grouped_gemm.h; zeroed by the launch), or
  // nullptr: the static walk only. As GroupedGemmProblem::tile_counter.
  unsigned* tile_counter = nullptr;
  // What runs: kFp8Sm90 (gemm_planner.h plan_gemm_fp8, or a forced plan that
  // gemm_fp8_plan_rejection accepts).
  GemmPlan plan;
};

// Rows of a / c in all (masked G * max_m, contiguous m).
inline int64_t fp8_total_rows(const GroupedGemmFP8Problem& p) {
  return p.contiguous ? p.m : p.max_m * p.num_groups;
}
// Rows per group the planner goes by (masked max_m; contiguous m / G).
inline int64_t fp8_rows_per_group(const GroupedGemmFP8Problem& p) {
  if (!p.contiguous) return p.max_m;
  return p.num_groups > 0 ? p.m / p.num_groups : 0;
}

// The problem of public args (checked as moe_grouped_gemm_fp8 checks them; *launches: whether
// it launches anything). For tests of the internal fields (c_amax).
GroupedGemmFP8Problem fp8_problem_of(const GroupedGemmFP8Args& args, bool* launches);

// Validates nothing but the plan (throws moekit::Error when it cannot run the problem);
// launches problem.plan on `stream` (k == 0: launch_fp8_empty_sums, whatever the plan).
void run_grouped_gemm_fp8(const GroupedGemmFP8Problem& problem, cudaStream_t stream);

// kFp8Sm90: whether it takes the problem (k > 0, at most 1024 groups, 32-bit
// extents), and its launcher (throws outside those limits).
bool sm90_fp8_supports(const GroupedGemmFP8Problem& problem);
void launch_grouped_gemm_sm90_fp8(const GroupedGemmFP8Problem& problem, cudaStream_t stream);
// Its fast-accumulation form, plan fp8_sm90 128x256 (fp8_fast_gemm.cu): per-tensor or
// per-channel scales, bf16 c, within sm90_fp8_supports' limits.
void launch_grouped_gemm_sm90_fp8_fast(const GroupedGemmFP8Problem& problem, cudaStream_t stream);
// Plan fp8_sm90 128x256 with block scales (fp8_block256_gemm.cu): bf16 c, silu_and_mul with
// n % 128 == 0, within sm90_fp8_supports' limits.
void launch_grouped_gemm_sm90_fp8_block256(const GroupedGemmFP8Problem& problem,
                                           cudaStream_t stream);
// k == 0: every valid row of c is the empty sum's value, act(0) = 0 (bf16, or e4m3 of
// 0 / c_scale), in any scale mode and activation; reads no operand and no scale.
void launch_fp8_empty_sums(const GroupedGemmFP8Problem& problem, cudaStream_t stream);
// Host check of the SM90 kernel's shared-memory and accumulator layout assumptions:
// empty when they hold, else what differs (CPU test).
std::string sm90_fp8_layout_mismatch();

}  // namespace moekit::detail
