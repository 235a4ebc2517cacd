// The one-token dense MLP (docs/dense-mlp.md "GEMV MLP"): the two GEMMs of a gated MLP at
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
// else one token on MLPs of >= kStreamkMlpMinWeightBytes of weights, where it replaces
// stream-K. H200 (docs/dense-mlp.md "GEMV MLP"): SharedExpertMLP kimi-k2-t1 (793 MB) 0.186 ms
// vs 0.212 on stream-K; on 47-88 MB MLPs the direct kernels stay ahead (FusedMoESharedExpert
// glm45-t1 0.1333 vs 0.1387, ds-v3-grouped-t1 0.2314 vs 0.2375).
bool gemv_mlp_preferred(int64_t T, int64_t H, int64_t S);

// act [S] (dtype) = silu(x w_gate_up[:S]^T) * (x w_gate_up[S:]^T); out [H] (dtype or f32) =
// act w_down^T. x, weights and act 16-byte aligned.
void run_gemv_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                  const void* w_gate_up, const void* w_down, void* act, void* out, DType out_dtype,
                  cudaStream_t stream);

}  // namespace moekit::detail
