// Grouped GEMMs over expert-grouped buffers: bf16/f16 and FP8 block-scaled.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "moekit/plan.h"
#include "moekit/tensor.h"

namespace moekit {

// The grouped GEMM's epilogue runs kNone and kSiluAndMul; the expert-MLP and layer ops
// (moe.h) run every activation but kNone (docs/moe.md "Activations"). With F the MLP's
// intermediate size, g / u the gate / up pre-activations:
enum class Activation {
  kNone,
  kSiluAndMul,      // b holds 2N rows (gate then up); c = silu(a.gate^T) * (a.up^T)
  kGeluTanhAndMul,  // gelu(g) * u, gelu's tanh approximation; gate rows then up rows
  kGeluAndMul,      // gelu(g) * u, exact gelu (erf); gate rows then up rows
  kRelu2,           // relu(x)^2, not gated: w_gate_up holds F rows
  kSwigluOai,       // gpt-oss: rows interleaved (2j gate j, 2j+1 up j); g' = min(g, 7),
                    // u' = clamp(u, -7, 7), out = g' * sigmoid(1.702 g') * (u' + 1)
};

// MoEGroupedGemmFwd.
//   contiguous: a [P, Kd], c [P, N], layout_metadata[e] = inclusive end row of expert e.
//   masked:     a [E, max_m, Kd], c [E, max_m, N], layout_metadata[e] = row count <= max_m.
// b is [E, N, Kd] ([E, 2N, Kd] with kSiluAndMul). c: a's dtype or f32, overlapping no input.
// Rows outside every expert's block (padding, or past a masked count) are left untouched.
// workspace is optional: with grouped_gemm_workspace_size(args) bytes (256-aligned,
// any contents, not shared with a call running at the same time) the Hopper kernels
// hand tiles out dynamically (SMs that run ahead take more; docs/gemm.md
// "Persistent grid and dynamic schedule"); without one they walk a static schedule. Same
// results either way.
struct GroupedGemmArgs {
  TensorView a;
  TensorView b;
  TensorView layout_metadata;  // [E] i32
  PermutedLayout layout;
  Activation activation = Activation::kNone;
  TensorView c;
  Workspace workspace;
  const GemmPlan* plan = nullptr;  // nullptr: the planner's (plan_grouped_gemm)
};

size_t grouped_gemm_workspace_size(const GroupedGemmArgs& args);
void moe_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream);
GemmPlan plan_grouped_gemm(const GroupedGemmArgs& args);
std::vector<GemmPlan> grouped_gemm_plan_candidates(const GroupedGemmArgs& args);

// How the FP8 GEMM's f32 scales apply (docs/gemm.md, "FP8 scale modes"). R: a's rows
// (masked E*max_m as [E, max_m], contiguous P), Bn: b's rows per expert (N, or 2N with
// kSiluAndMul), KB = ceil(Kd / 128).
enum class Fp8Scales : uint8_t {
  kBlock,       // a_scale [R.., KB] per row per 128 k; b_scale [E, ceil(Bn/128), KB] per
                // 128x128 block (DeepSeek-V3 style); promoted into f32 every 128 k
  kPerChannel,  // a_scale [R..] per row (token); b_scale [E, Bn] per b row (output channel)
  kPerTensor,   // a_scale [1]; b_scale [E], one per expert
};

// MoEGroupedGemmFP8Fwd: e4m3 x e4m3 -> bf16 (or e4m3 with c_scale), f32 accumulation.
//   masked (the default; DeepGEMM-style): a [E, max_m, Kd], c [E, max_m, N],
//     layout_metadata[e] = row count (clamped to max_m); max_m is a's dim 1 (layout.max_m
//     0, or equal to it).
//   contiguous(alignment): a [P, Kd], c [P, N], layout_metadata[e] = inclusive end row,
//     as MoEGroupedGemmFwd's contiguous layout; padding rows are never read as data nor
//     written.
// b [E, N, Kd] ([E, 2N, Kd], gate rows then up rows, with kSiluAndMul:
// c = silu(gate) * up, each scaled before the product). Scales: Fp8Scales; with kBlock,
// c = sum over k blocks kb of a_scale[row, kb] * b_scale[e, j / 128, kb] * (a . b_j over kb);
// per-channel / per-tensor: c = a_scale[row] * b_scale[e, j] * (a . b_j) (one scale after the
// whole k). Limits: Kd % 16 == 0, N % 8 == 0 (kSiluAndMul with kBlock: N % 64 == 0), at most
// 1024 experts, c overlapping no input. workspace is optional, as GroupedGemmArgs's
// (grouped_gemm_fp8_workspace_size(args) bytes: the dynamic tile schedule; same results).
struct GroupedGemmFP8Args {
  TensorView a;                // fp8e4m3, masked [E, max_m, Kd] or contiguous [P, Kd]
  TensorView a_scale;          // f32, per `scales`
  TensorView b;                // [E, N or 2N, Kd] fp8e4m3
  TensorView b_scale;          // f32, per `scales`
  TensorView layout_metadata;  // [E] i32 masked counts or contiguous inclusive ends
  TensorView c;  // out bf16 (or fp8e4m3, below), masked [E, max_m, N] or contiguous [P, N]
  // With an fp8e4m3 c (e.g. the down GEMM's a operand, per-tensor scale): its given scale,
  // [1] f32: c = e4m3(value / c_scale), rounded to nearest even, saturated at +-448 (the value
  // rounded once). Undefined with a bf16 c. A positive normal float (>= 2^-126): the kernels
  // multiply by its reciprocal, which overflows under 2^-128, where a zero value then
  // stores NaN instead of 0.
  TensorView c_scale;
  PermutedLayout layout = PermutedLayout::masked(0);
  Fp8Scales scales = Fp8Scales::kBlock;
  Activation activation = Activation::kNone;
  Workspace workspace;
  const GemmPlan* plan = nullptr;  // nullptr: the planner's (plan_grouped_gemm_fp8)
};

size_t grouped_gemm_fp8_workspace_size(const GroupedGemmFP8Args& args);
void moe_grouped_gemm_fp8(const GroupedGemmFP8Args& args, cudaStream_t stream);
GemmPlan plan_grouped_gemm_fp8(const GroupedGemmFP8Args& args);
std::vector<GemmPlan> grouped_gemm_fp8_plan_candidates(const GroupedGemmFP8Args& args);

}  // namespace moekit
