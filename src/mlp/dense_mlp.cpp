// The dense gated MLP (the shared expert): GEMV, direct, stream-K or two GEMMs, as planned.
#include "mlp/dense_mlp.h"

#include "gemm/gemm_planner.h"
#include "mlp/direct_mlp.h"
#include "mlp/gemv_mlp.h"
#include "mlp/streamk_mlp.h"

namespace moekit::detail {

size_t dense_mlp_scratch_bytes(DType dtype, int64_t T, int64_t H, int64_t S,
                               const DeviceProps& device) {
  return streamk_mlp_scratch_bytes(dtype, T, H, S, device);
}

void* take_dense_mlp_scratch(WorkspaceCarver& ws, DType dtype, int64_t T, int64_t H, int64_t S) {
  const size_t bytes = dense_mlp_scratch_bytes(dtype, T, H, S, device_props());
  return bytes > 0 ? ws.take(bytes) : nullptr;
}

void run_dense_mlp(const MlpPlan& plan, const DenseMlpProblem& p, const void* x,
                   const void* w_gate_up, const void* w_down, void* act, void* out,
                   void* streamk_scratch, cudaStream_t stream) {
  switch (plan.path) {
    case MlpPath::kGemv:
      run_gemv_mlp(p.dtype, x, p.T, p.H, p.S, w_gate_up, w_down, act, out, p.out_dtype, stream);
      return;
    case MlpPath::kDirect:
      run_direct_mlp(p.dtype, x, p.T, p.H, p.S, w_gate_up, w_down, act, out, p.out_dtype,
                     plan.split_gate_up, plan.split_down, stream);
      return;
    case MlpPath::kStreamK:
      run_streamk_mlp(p.dtype, x, p.T, p.H, p.S, w_gate_up, w_down, act, out, p.out_dtype,
                      plan.split_gate_up, streamk_scratch, stream);
      return;
    case MlpPath::kTwoGemms:
    case MlpPath::kChain: {
      GroupedGemmProblem up, down;
      dense_mlp_gemms(p, x, w_gate_up, w_down, act, out, &up, &down);
      // Two launches (a PDL chain with gemm_pdl_override() on: up writes only act).
      run_mlp_gemms(plan, up, down, nullptr, stream);
      return;
    }
  }
}

}  // namespace moekit::detail
