// Plain f32 GPU references of the ops, for shapes too large for the CPU references
// and as the benchmark's "ref-cuda" alternative. Written from SPEC.md for clarity,
// not speed (but not absurdly slow either): GEMMs run one thread block per (8 rows of
// one expert, 64 output columns), f32 accumulation, with the SPEC's rounding points
// (the F-wide activation rounded to the op dtype before the down projection, the
// output rounded once). Routed ops sort routes by expert on the device first, so a
// call is a pure sequence of launches: no allocation, no sync, graph-capturable.
//
// All pointers are device pointers. Nothing is validated: callers pass valid input
// (ids out of range are skipped like -1). Scratch memory comes from the caller:
// `args.workspace` where the argument struct has one, else an explicit Workspace,
// of at least the matching *_scratch_bytes(args).
//
// `row_mask` (optional, device, one byte per row) restricts the work to the rows
// whose byte is non-zero; the other rows of the output are left untouched. Rows are
// tokens for the token-indexed ops (FusedMoE*, IndexedExpertMLP, SharedExpertMLP) and
// physical rows of the permuted buffer otherwise (e*max_m + m for masked layouts).
// The benchmark uses it to check a sample of rows on very large shapes.
//
// FP8 weights (args.quant) are dequantized as they are read, float(w) * scale
// (moekit/quant.h); the activations are used as given (docs/moe.md "Quantized weights").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "moekit/gemm.h"
#include "moekit/moe.h"
#include "moekit/permute.h"
#include "moekit/reference.h"
#include "moekit/routing.h"

namespace moekit::gpu_reference {

// Largest expert count the sorting kernels take.
constexpr int kMaxExperts = 4096;

// FusedTopKFwd in f32 (one thread per token; ties: lower id first).
void fused_topk(const FusedTopKArgs& args, cudaStream_t stream);

// Ids may be i32 or i64; expert_map (where the op takes one) reads them as global ids
// (docs/routing-permute.md, "Engine ids"). apply_router_weight_on_input scales the input
// rows, round(round(w) * x), and weighs the outputs by 1 (docs/moe.md, "Engine inputs").

// MoEPermuteAlignFwd (block_size may be any value >= 1). One thread block.
void moe_permute_align(const PermuteAlignArgs& args, cudaStream_t stream);
// MoEPrePermuteFwd (contiguous layouts). Needs no workspace.
void moe_pre_permute(const PrePermuteArgs& args, cudaStream_t stream);
// MoEPostPermuteFwd.
void moe_post_permute(const PostPermuteArgs& args, cudaStream_t stream);

// How a routed / MLP reference treats FP8 activations: `mode` (reference.h) and, for a
// dynamic fp8_per_tensor scale of the F-wide activation (no a_down_scale), that
// activation's amax moved by `act_amax_ulps` bf16 steps before the scale is taken. The
// library's activation can round its largest element to a neighbouring bf16 value (FP8
// tensor-core sums, fast silu), and the scale then puts every element on another e4m3 grid:
// rel_l2 ~2e-2 from the f32 reference on a correct result. The sweep retries a failing case
// at +-1 (docs/sweep.md, "FP8 per-tensor ties").
struct Fp8Acts {
  reference::Fp8Activations mode = reference::Fp8Activations::kAsGiven;
  int act_amax_ulps = 0;
  Fp8Acts() = default;
  Fp8Acts(reference::Fp8Activations m, int ulps = 0)  // NOLINT: implicit from the mode
      : mode(m), act_amax_ulps(ulps) {}
};

// MoEGroupedGemmFwd.
size_t grouped_gemm_scratch_bytes(const GroupedGemmArgs& args);
void moe_grouped_gemm(const GroupedGemmArgs& args, Workspace scratch, cudaStream_t stream,
                      const uint8_t* row_mask = nullptr);

// MoEGroupedGemmFP8Fwd.
size_t grouped_gemm_fp8_scratch_bytes(const GroupedGemmFP8Args& args);
void moe_grouped_gemm_fp8(const GroupedGemmFP8Args& args, Workspace scratch, cudaStream_t stream,
                          const uint8_t* row_mask = nullptr);

// MoEExpertMLPFwd (scratch: args.workspace).
size_t expert_mlp_scratch_bytes(const ExpertMLPArgs& args);
void moe_expert_mlp(const ExpertMLPArgs& args, cudaStream_t stream,
                    const uint8_t* row_mask = nullptr, Fp8Acts acts = {});

// FusedMoEExpertsFwd and IndexedExpertMLPFwd (scratch: args.workspace). round_routes:
// each route's expert output rounded before the weighted sum as the library's sorted path
// keeps them (docs/moe.md): to the op's dtype, to bf16 when FP8 activations are quantized;
// the SPEC's math rounds only the output.
size_t fused_moe_experts_scratch_bytes(const FusedMoEExpertsArgs& args);
void fused_moe_experts(const FusedMoEExpertsArgs& args, cudaStream_t stream,
                       const uint8_t* row_mask = nullptr, bool round_routes = false,
                       Fp8Acts acts = {});

// SharedExpertMLPFwd (scratch: args.workspace).
size_t shared_expert_mlp_scratch_bytes(const SharedExpertMLPArgs& args);
void shared_expert_mlp(const SharedExpertMLPArgs& args, cudaStream_t stream,
                       const uint8_t* row_mask = nullptr, Fp8Acts acts = {});

// FusedMoEFwd (scratch: args.workspace).
size_t fused_moe_scratch_bytes(const FusedMoEArgs& args);
void fused_moe(const FusedMoEArgs& args, cudaStream_t stream, const uint8_t* row_mask = nullptr,
               bool round_routes = false, Fp8Acts acts = {});

// FusedMoESharedExpertFwd (scratch: args.moe.workspace).
size_t fused_moe_shared_expert_scratch_bytes(const FusedMoESharedExpertArgs& args);
void fused_moe_shared_expert(const FusedMoESharedExpertArgs& args, cudaStream_t stream,
                             const uint8_t* row_mask = nullptr, bool round_routes = false,
                             Fp8Acts acts = {}, Fp8Acts shared_acts = {});

}  // namespace moekit::gpu_reference
