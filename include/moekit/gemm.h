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

// MoEGroupedGemmFP8Fwd (DeepGEMM-style masked layout, 128-wide block scales).
struct GroupedGemmFP8Args {
  TensorView a;                    // [E, max_m, Kd] fp8e4m3
  TensorView a_scale;              // [E, max_m, ceil(Kd/128)] f32
  TensorView b;                    // [E, N, Kd] fp8e4m3
  TensorView b_scale;              // [E, ceil(N/128), ceil(Kd/128)] f32
  TensorView layout_metadata;      // [E] i32 masked counts
  TensorView c;                    // out [E, max_m, N] bf16, overlapping no input
  const GemmPlan* plan = nullptr;  // nullptr: the planner's (plan_grouped_gemm_fp8)
};

void moe_grouped_gemm_fp8(const GroupedGemmFP8Args& args, cudaStream_t stream);
GemmPlan plan_grouped_gemm_fp8(const GroupedGemmFP8Args& args);
std::vector<GemmPlan> grouped_gemm_fp8_plan_candidates(const GroupedGemmFP8Args& args);

}  // namespace moekit
