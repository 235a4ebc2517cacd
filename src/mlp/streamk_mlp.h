// The stream-K dense MLP (docs/dense-mlp.md "Stream-K MLP"): both GEMMs of a gated MLP over
// few tokens in one cooperative Hopper kernel, for SharedExpertMLPFwd and the fused
// layer's shared expert. The dense-MLP planner (mlp_planner.h) takes it where
// streamk_mlp_scratch_bytes > 0 and the caller's workspace holds that scratch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "moekit/tensor.h"

namespace moekit::detail {

constexpr int64_t kStreamkMlpMaxTokens = 64;

// Weight bytes (gate, up and down, 2 bytes each) from which the dense-MLP planner prefers
// the weight-streaming kernels (GEMV at one token, else stream-K) to the direct ones
// (docs/dense-mlp.md "Which path runs").
constexpr int64_t kStreamkMlpMinWeightBytes = int64_t{256} << 20;

// Workspace bytes the kernel needs beside act (per-tile counters and f32 partial sums for
// a grid of one CTA per SM) for T tokens, hidden H, intermediate S on `device`; 0 when it
// cannot run there (not bf16/f16, T outside 1..64, H or S outside 1..2^30, not sm_90).
size_t streamk_mlp_scratch_bytes(DType dtype, int64_t T, int64_t H, int64_t S,
                                 const DeviceProps& device);

// act [T, S] (dtype) = silu(x w_gate_up[:S]^T) * (x w_gate_up[S:]^T); out [T, H] (dtype or
// f32) = act w_down^T on a grid of `grid` CTAs (1..SMs; the planner's is one per SM).
// `scratch` holds streamk_mlp_scratch_bytes(...) bytes (> 0); x, weights, act and out
// 16-byte aligned; H and S multiples of 8.
void run_streamk_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                     const void* w_gate_up, const void* w_down, void* act, void* out,
                     DType out_dtype, int grid, void* scratch, cudaStream_t stream);

}  // namespace moekit::detail
