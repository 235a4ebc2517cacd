// The dense gated MLP (the shared expert): GEMV, direct, stream-K or two GEMMs, as planned.
#include "mlp/dense_mlp.h"

#include <string>

#include "gemm/gemm_planner.h"
#include "mlp/activation.h"
#include "mlp/direct_mlp.h"
#include "mlp/gemv_mlp.h"
#include "mlp/streamk_mlp.h"
#include "moekit/error.h"

namespace moekit::detail {

size_t dense_mlp_scratch_bytes(DType dtype, int64_t T, int64_t H, int64_t S,
                               const DeviceProps& device) {
  return streamk_mlp_scratch_bytes(dtype, T, H, S, device);
}

void* take_dense_mlp_scratch(WorkspaceCarver& ws, DType dtype, int64_t T, int64_t H, int64_t S) {
  const size_t bytes = dense_mlp_scratch_bytes(dtype, T, H, S, device_props());
  return bytes > 0 ? ws.take(bytes) : nullptr;
}

namespace {

// The general path: up (kNone, f32) into pre, the activation kernel (gate/up bias) into act,
// down, then the down-bias pass (in place on an f32 output, else from pre into out).
void run_general_dense_mlp(const MlpPlan& plan, const DenseMlpProblem& p, const void* x,
                           const void* w_gate_up, const void* w_down, void* act, void* out,
                           cudaStream_t stream, const MlpBiases& biases, float* pre,
                           const char* op) {
  if (plan.path != MlpPath::kTwoGemms)
    throw Error(std::string("moekit::") + op + ": plan \"" + to_string(plan) +
                "\" cannot run these arguments: " + dense_mlp_plan_rejection(plan, p, {}));
  if (pre == nullptr) throw Error(std::string("moekit::") + op + ": internal: no pre buffer");
  GroupedGemmProblem up, down;
  dense_mlp_gemms(p, x, w_gate_up, w_down, act, out, &up, &down, pre);
  up.plan = plan.gate_up;
  down.plan = plan.down;
  ActivationLaunch a;  // dense rows: one bias row
  a.dtype = p.dtype;
  a.act = p.mlp.act;
  a.in = pre;
  a.rows = p.T;
  a.cols = p.S;
  a.out = act;
  a.out_dtype = p.dtype;
  run_general_mlp(up, down, a, biases, p.H, out, p.out_dtype, stream, op);
}

}  // namespace

void run_dense_mlp(const MlpPlan& plan, const DenseMlpProblem& p, const void* x,
                   const void* w_gate_up, const void* w_down, void* act, void* out,
                   void* streamk_scratch, cudaStream_t stream, const MlpBiases& biases, float* pre,
                   const char* op) {
  if (p.mlp.general()) {
    run_general_dense_mlp(plan, p, x, w_gate_up, w_down, act, out, stream, biases, pre, op);
    return;
  }
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
    case MlpPath::kTwoGemms: {
      GroupedGemmProblem up, down;
      dense_mlp_gemms(p, x, w_gate_up, w_down, act, out, &up, &down);
      // The GEMM planner's plan on dense rows: two launches (two_gemms); dense rows never chain.
      run_mlp_gemms(plan, up, down, nullptr, stream);
      return;
    }
    case MlpPath::kChain:  // dense rows: dense_mlp_plan_rejection refuses every chain
      throw Error(std::string("moekit::") + op + ": internal: a chain plan reached the dense MLP");
  }
}

}  // namespace moekit::detail
