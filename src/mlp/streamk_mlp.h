// The stream-K dense MLP (docs/dense-mlp.md "Stream-K MLP"): both GEMMs of a gated MLP over
// few tokens in one cooperative Hopper kernel, for SharedExpertMLPFwd and the fused
// layer's shared expert. run_dense_mlp takes it where streamk_mlp_scratch_bytes > 0
// and the caller's workspace holds that scratch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::detail {

constexpr int64_t kStreamkMlpMaxTokens = 64;

// Workspace bytes the kernel needs beside h (per-tile counters and f32 partial sums)
// for T tokens, hidden H, intermediate S on the current device; 0 when it cannot run
// there (not bf16/f16, T outside 1..64, H or S outside 1..2^30, not an sm_90 device).
size_t streamk_mlp_scratch_bytes(DType dtype, int64_t T, int64_t H, int64_t S);

// Which dense-MLP path run_dense_mlp takes (src/moe/expert_mlp.cpp): 0 = default (the
// MOEKIT_DENSE_MLP environment variable, `gemm`, `streamk`, `direct` or `gemv`; unset =
// the GEMV kernels at one token, the direct kernels where they run, else stream-K for
// MLPs of >= kStreamkMlpMinWeightBytes of weights, else the GEMMs), 1 = stream-K, 2 = the
// two grouped GEMMs, 3 = direct, 4 = GEMV. A test / benchmark knob (not thread-safe). A
// forced path that cannot run a shape falls back to the GEMMs.
int& dense_mlp_path_override();
// The override, else the environment's path, else 0.
int dense_mlp_forced_path();
constexpr int64_t kStreamkMlpMinWeightBytes = int64_t{256} << 20;
// Stream-K over the GEMMs (forced, or by default for >= kStreamkMlpMinWeightBytes).
bool streamk_mlp_preferred(int64_t H, int64_t S);
// Test knob: CTAs of the stream-K grid (0 = one per SM; else clamped to 1..SMs), so tests
// can move the split points of the (tile, k) ranges.
int& streamk_mlp_grid_override();
// Timing knobs (tests/test_gemm_timing.cu): phases = bit 0 gate_up, bit 1 down (3 = the
// MLP; a lone phase gives wrong results); trace = device buffer of 6 globaltimer stamps
// per CTA (streamk_mlp_kernel.cuh), or null.
struct StreamkMlpDebug {
  int phases = 3;
  unsigned long long* trace = nullptr;
  int weight_evict_first = 1;  // 0: weight loads without the L2 evict-first hint
};
StreamkMlpDebug& streamk_mlp_debug();

// act [T, S] (dtype) = silu(x w_gate_up[:S]^T) * (x w_gate_up[S:]^T); out [T, H] (dtype or
// f32) = act w_down^T. `scratch` holds streamk_mlp_scratch_bytes(...) bytes (> 0); x,
// weights, act and out 16-byte aligned; H and S multiples of 8.
void run_streamk_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                     const void* w_gate_up, const void* w_down, void* act, void* out,
                     DType out_dtype, void* scratch, cudaStream_t stream);

}  // namespace moekit::detail
