// The one-token dense MLP (docs/dense-mlp.md "GEMV MLP"): the two GEMMs of a gated MLP at
// T = 1 as two weight-streaming GEMV kernels (gemv_mlp_kernel.cuh), chained with PDL.
// The dense-MLP planner (mlp_planner.h) picks it for one token on large MLPs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/device.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// bf16/f16, T = 1, H and S multiples of 8 whose x / h rows fit the shared memory, and
// `device` is an sm_90 part.
bool gemv_mlp_supported(DType dtype, int64_t T, int64_t H, int64_t S, const DeviceProps& device);

// act [S] (dtype) = silu(x w_gate_up[:S]^T) * (x w_gate_up[S:]^T); out [H] (dtype or f32) =
// act w_down^T. x, weights and act 16-byte aligned.
void run_gemv_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                  const void* w_gate_up, const void* w_down, void* act, void* out, DType out_dtype,
                  cudaStream_t stream);

}  // namespace moekit::detail
