// The dense gated MLP of the shared expert (docs/dense-mlp.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/workspace.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// Dense gated MLP (shared expert): act = silu_and_mul(x . w_gate_up^T) [T, S] in the
// dtype, then out = act . w_down^T [T, H] in out_dtype (the dtype, or f32). One stream-K
// kernel when `streamk_scratch` (dense_mlp_scratch_bytes bytes, null when that is 0)
// is given and preferred (src/gemm/streamk_mlp.h), else two grouped GEMMs.
void run_dense_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                   const void* w_gate_up, const void* w_down, void* act, void* out, DType out_dtype,
                   void* streamk_scratch, cudaStream_t stream);
// The stream-K scratch a dense MLP of this shape needs (0: it runs as two GEMMs).
size_t dense_mlp_scratch_bytes(DType dtype, int64_t T, int64_t H, int64_t S);
// Carves that scratch (nullptr when it is 0 bytes).
void* take_dense_mlp_scratch(WorkspaceCarver& ws, DType dtype, int64_t T, int64_t H, int64_t S);

}  // namespace moekit::detail
