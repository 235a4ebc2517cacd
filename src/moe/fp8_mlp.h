// The FP8-weight MLP on the contiguous FP8 grouped GEMMs (docs/moe.md "Quantized weights"):
// the sorted path's expert MLP (E groups of permuted rows) and the dense shared expert past
// the FP8 direct kernel (one group of T rows).
//
//   input rows, e4m3 [P, H] + scales (the FP8 pre-permute, or launch_quantize_fp8 for dense)
//   -> gate/up FP8 GEMM with silu_and_mul -> act bf16 [P, F] (a static a_down_scale: e4m3
//      straight from the GEMM's epilogue)
//   -> act quantized (group 128 / per token / per tensor, dynamic scales; the groups' rows
//      only: padding rows the GEMM did not write are neither read nor quantized)
//   -> down FP8 GEMM -> out bf16 [P, H]
//
// Activation scales per scheme: fp8_block128 per token per 128 columns, fp8_per_channel per
// token, fp8_per_tensor one scale (a_*_scale when given, else max|x| over the valid rows).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/workspace.h"
#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm.h"
#include "moe/weight_quant.h"
#include "moekit/plan.h"
#include "permute/quantize_fp8.h"

namespace moekit::detail {

// The shapes of one FP8 MLP: P rows (grouped: E experts' contiguous rows; dense: E = 1).
struct Fp8MlpShapes {
  DType dtype = DType::kBF16;  // the input rows' (the layer's hidden dtype)
  int64_t P = 0, E = 1, H = 0, F = 0;
  int alignment = 1;  // the groups' contiguous(alignment) layout
  QuantScheme scheme = QuantScheme::kFp8Block128;
  bool static_act = false;  // fp8_per_tensor with a_down_scale (planning: the e4m3 epilogue)
  // The fused layers' sorted path, whose callers can give bf16 input rows: weight-only plans
  // may run (run_fp8_weight_only_mlp).
  bool weight_only_ok = false;
};

Fp8ActScales fp8_act_scales(QuantScheme scheme);
Fp8Scales fp8_gemm_scales(QuantScheme scheme);
// f32 scales of `rows` x `cols` activations under `scheme` (0: a static per-tensor scale).
int64_t fp8_act_scale_count(QuantScheme scheme, int64_t rows, int64_t cols, bool given);

// The two GEMM problems (for planning: pointers stand-ins where the planner looks at them).
GroupedGemmFP8Problem fp8_gate_up_problem(const Fp8MlpShapes& s);
GroupedGemmFP8Problem fp8_down_problem(const Fp8MlpShapes& s);
// Weight-only FP8 (docs/moe.md "Quantized weights"): the rows stay bf16 (no activation
// quantization) and both GEMMs read the e4m3 weights on decode_persistent's weight-only tiles
// (per-channel or per-tensor scales, bf16 layers). The plan, whether a plan is one (both GEMMs
// on decode_persistent), and its two GEMM problems (pointers stand-ins: planning).
MlpPlan fp8_weight_only_plan();
bool fp8_weight_only(const MlpPlan& plan);
std::pair<GroupedGemmProblem, GroupedGemmProblem> fp8_weight_only_problems(const Fp8MlpShapes& s);
// kTwoGemms with the FP8 GEMM planner's plan for each.
MlpPlan plan_fp8_mlp(const Fp8MlpShapes& s, const GemmDevice& device);
std::vector<MlpPlan> fp8_mlp_plan_candidates(const Fp8MlpShapes& s, const GemmDevice& device);
std::string fp8_mlp_plan_rejection(const MlpPlan& plan, const Fp8MlpShapes& s,
                                   const GemmDevice& device);

// Workspace buffers after the input rows (carve order): in_scales, act (bf16), q_act (e4m3),
// act_scales, the per-tensor amax word, the dense ends (static scales or not: the same).
struct Fp8MlpBuffers {
  float* in_scales = nullptr;  // block [P, ceil(H/128)], channel [P], tensor [1] (dynamic)
  void* act = nullptr;
  void* q_act = nullptr;
  float* act_scales = nullptr;
  uint32_t* amax = nullptr;          // fp8_per_tensor without a static scale
  int32_t* ends = nullptr;           // dense: [1] = P
  unsigned* tile_counter = nullptr;  // the GEMMs' dynamic schedule (kTileCounterBytes)
};
Fp8MlpBuffers carve_fp8_mlp(const Fp8MlpShapes& s, bool dense, WorkspaceCarver& ws);

// One run: q_in (e4m3 [P, H]) and b.in_scales already written (quantize_fp8_input or the FP8
// pre-permute); layout_metadata the groups' inclusive ends (nullptr, dense: b.ends, filled
// here). The static per-tensor scales are scales.a_gate_up / a_down (s's static flags: theirs).
struct Fp8MlpRun {
  Fp8MlpShapes s;
  MlpPlan plan;
  const void* q_in = nullptr;
  const int32_t* layout_metadata = nullptr;
  const void* w_gate_up = nullptr;  // e4m3 [E, 2F, H]
  const void* w_down = nullptr;     // e4m3 [E, H, F]
  WeightScales scales;
  Fp8MlpBuffers b;
  void* out = nullptr;  // bf16 [P, H]; rows outside the groups untouched
};
void run_fp8_mlp(const Fp8MlpRun& r, cudaStream_t stream);
// A weight-only plan's run: `in` the bf16 input rows [P, H] (r.q_in unused), act in r.b.act.
void run_fp8_weight_only_mlp(const Fp8MlpRun& r, const void* in, cudaStream_t stream);

// Which rows of a [rows, cols] buffer hold data: all (ends == nullptr), or those in the E
// groups of a contiguous(alignment) layout with inclusive ends `ends` (device).
struct Fp8RowGroups {
  const int32_t* ends = nullptr;
  int64_t E = 0;
  int alignment = 1;
};
// The dynamic per-tensor scale: tensor_scale[0] = max(max |x|, 1e-10) / 448 over the rows of
// x [rows, cols] that hold data. `amax`: a 4-byte word of workspace (zeroed here).
void launch_fp8_tensor_scale(const void* x, DType dtype, int64_t rows, int64_t cols,
                             const Fp8RowGroups& groups, uint32_t* amax, float* tensor_scale,
                             cudaStream_t stream);
// The same scale from an amax already gathered (the f32 bits of max |x|: an FP8 GEMM's
// c_amax).
void launch_fp8_scale_from_amax(const uint32_t* amax, float* tensor_scale, cudaStream_t stream);
// The rows of `groups` of x [P, H] quantized into q / b.in_scales by `s`'s input scheme (per
// tensor: static_scale, or the dynamic scale computed first over those rows); the other rows
// of q / b.in_scales are left untouched.
void quantize_fp8_input(const Fp8MlpShapes& s, const void* x, const float* static_scale,
                        const Fp8RowGroups& groups, const Fp8MlpBuffers& b, void* q,
                        cudaStream_t stream);
// out[i] (f32 or f16 / bf16) = in[i] (bf16), n elements: the FP8 GEMMs' bf16 rows where the
// caller wants another dtype.
void launch_cast_bf16(const void* in, int64_t n, void* out, DType out_dtype, cudaStream_t stream);
// *p = value on the device (a 1-group layout's end).
void launch_fill_i32(int32_t* p, int32_t value, cudaStream_t stream);

}  // namespace moekit::detail
