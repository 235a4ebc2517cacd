// The dense gated MLP (the shared expert): GEMV, direct, stream-K or two GEMMs.
#include "mlp/dense_mlp.h"

#include "gemm/gemm_planner.h"
#include "mlp/direct_mlp.h"
#include "mlp/gemv_mlp.h"
#include "mlp/streamk_mlp.h"

namespace moekit::detail {

size_t dense_mlp_scratch_bytes(DType dtype, int64_t T, int64_t H, int64_t S) {
  return streamk_mlp_scratch_bytes(dtype, T, H, S);
}

void* take_dense_mlp_scratch(WorkspaceCarver& ws, DType dtype, int64_t T, int64_t H, int64_t S) {
  const size_t bytes = dense_mlp_scratch_bytes(dtype, T, H, S);
  return bytes > 0 ? ws.take(bytes) : nullptr;
}

// Dense gated MLP: act = silu_and_mul(x . w_gate_up^T) [T, S] in the dtype, then
// out = act . w_down^T [T, H] in out_dtype (the dtype, or f32 for a later sum).
void run_dense_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                   const void* w_gate_up, const void* w_down, void* act, void* out, DType out_dtype,
                   void* streamk_scratch, cudaStream_t stream) {
  if (gemv_mlp_preferred(T, H, S) && gemv_mlp_supported(dtype, T, H, S)) {
    run_gemv_mlp(dtype, x, T, H, S, w_gate_up, w_down, act, out, out_dtype, stream);
    return;
  }
  if (direct_mlp_preferred(T, H, S) && direct_mlp_supported(dtype, T, H, S)) {
    run_direct_mlp(dtype, x, T, H, S, w_gate_up, w_down, act, out, out_dtype, stream);
    return;
  }
  if (streamk_scratch && streamk_mlp_preferred(H, S)) {
    run_streamk_mlp(dtype, x, T, H, S, w_gate_up, w_down, act, out, out_dtype, streamk_scratch,
                    stream);
    return;
  }
  GroupedGemmProblem up;
  up.in_dtype = dtype;
  up.out_dtype = dtype;
  up.a = x;
  up.b = w_gate_up;
  up.c = act;
  up.num_groups = 1;
  up.n = S;
  up.k = H;
  up.activation = Activation::kSiluAndMul;
  up.rows = GemmRows::kDense;
  up.m = T;

  GroupedGemmProblem down = up;
  down.out_dtype = out_dtype;
  down.a = act;
  down.b = w_down;
  down.c = out;
  down.n = H;
  down.k = S;
  down.activation = Activation::kNone;
  run_mlp_gemms(plan_mlp_gemms(up, down, current_gemm_device()), up, down, nullptr, stream,
                "shared_expert_mlp");
}

}  // namespace moekit::detail
