// Plain CPU references of every op, written from SPEC.md with f64 accumulation.
// They take the same argument structs as the kernels, with HOST pointers, and
// ignore workspaces. They validate nothing: tests call them on valid input.
// FP8 weights (args.quant) enter dequantized, float(w) * scale (moekit/quant.h), with the
// activations as given: what the FP8 direct kernels compute (docs/moe.md "Quantized
// weights"). A path that quantizes activations is checked against these references fed the
// dequantized activations of quantize_activations_e4m3.
#pragma once

#include "moekit/gemm.h"
#include "moekit/moe.h"
#include "moekit/permute.h"
#include "moekit/routing.h"

namespace moekit::reference {

void fused_topk(const FusedTopKArgs& args);
void moe_permute_align(const PermuteAlignArgs& args);
void moe_pre_permute(const PrePermuteArgs& args);
void moe_post_permute(const PostPermuteArgs& args);
void moe_grouped_gemm(const GroupedGemmArgs& args);
void moe_grouped_gemm_fp8(const GroupedGemmFP8Args& args);

// Which activations the references multiply with FP8 weights (docs/moe.md "Quantized
// weights"); without FP8 weights both are the same.
enum class Fp8Activations : uint8_t {
  kAsGiven,    // as given: the FP8 direct kernels (the direct path, the dense MLP at T <= 64)
  kQuantized,  // as the FP8 GEMM paths: the gate/up input rows (after
               // apply_router_weight_on_input's scaling; fp8_per_tensor's amax over all T rows)
               // and the F-wide activation (bf16, then quantized over every valid route / row)
               // quantized by quantize_activations_e4m3 with the scheme, a_*_scale when given;
               // each MLP's output rows in bf16, as the FP8 down GEMM stores them
  kQuantizedTiesFlipped,  // (CPU references only) as kQuantized, but every F-wide activation
                          // value within 2^-12 (relative) of an e4m3 rounding midpoint rounds
                          // the other way: the second reading a checker may accept where the
                          // library's f32 sums land on the other side of such a tie
};
void moe_expert_mlp(const ExpertMLPArgs& args, Fp8Activations acts = Fp8Activations::kAsGiven);
// round_routes: each route's expert output rounded before the weighted sum, as the sorted
// path stores its rows (the op's dtype; bf16 with kQuantized FP8 activations); the SPEC's
// math (false) rounds only the output.
void fused_moe_experts(const FusedMoEExpertsArgs& args,
                       Fp8Activations acts = Fp8Activations::kAsGiven, bool round_routes = false);
void indexed_expert_mlp(const IndexedExpertMLPArgs& args,
                        Fp8Activations acts = Fp8Activations::kAsGiven, bool round_routes = false);
void fused_moe(const FusedMoEArgs& args, Fp8Activations acts = Fp8Activations::kAsGiven,
               bool round_routes = false);
// acts: the routed experts'; shared_acts: the shared expert's.
void fused_moe_shared_expert(const FusedMoESharedExpertArgs& args,
                             Fp8Activations acts = Fp8Activations::kAsGiven,
                             Fp8Activations shared_acts = Fp8Activations::kAsGiven,
                             bool round_routes = false);
void shared_expert_mlp(const SharedExpertMLPArgs& args,
                       Fp8Activations acts = Fp8Activations::kAsGiven);

// The activations a FP8 scheme's GEMM path quantizes, quantized and dequantized: out [R, C]
// (f32, or x's dtype) = float(e4m3_rn_satfinite(x / s)) * s with s = max(amax, 1e-10) / 448
// over each row's 128-column groups (fp8_block128), each row (fp8_per_channel) or the whole
// x (fp8_per_tensor; s = static_scale[0] when given); kNone copies x.
void quantize_activations_e4m3(QuantScheme scheme, const TensorView& x,
                               const TensorView& static_scale, const TensorView& out);

}  // namespace moekit::reference
