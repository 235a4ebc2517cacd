// The one-token dense MLP (docs/gemm.md "GEMV MLP"): the two GEMMs of a gated MLP at
// T = 1 as two weight-streaming GEMV kernels (gemv_mlp_kernel.cuh), chained with PDL.
// SharedExpertMLPFwd and the fused layer's shared expert take it where
// gemv_mlp_preferred() and gemv_mlp_supported() hold.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::detail {

// bf16/f16, T = 1, H and S multiples of 8 whose x / h rows fit the shared memory, an
// sm_90 device.
bool gemv_mlp_supported(DType dtype, int64_t T, int64_t H, int64_t S);

// run_dense_mlp's choice: forced (dense_mlp_forced_path() == 4, `MOEKIT_DENSE_MLP=gemv`),
// else by default at one token (H200 measurements in docs/gemm.md).
bool gemv_mlp_preferred(int64_t T, int64_t H, int64_t S);

// act [S] (dtype) = silu(x w_gate_up[:S]^T) * (x w_gate_up[S:]^T); out [H] (dtype or f32) =
// act w_down^T. x, weights and act 16-byte aligned.
void run_gemv_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                  const void* w_gate_up, const void* w_down, void* act, void* out, DType out_dtype,
                  cudaStream_t stream);

}  // namespace moekit::detail
