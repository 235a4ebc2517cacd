// SharedExpertMLPFwd: a dense gated MLP (src/mlp/dense_mlp.h runs the dense-MLP planner's
// plan, or the one args.plan names).
#include "mlp/dense_mlp.h"
#include "moe/layer_planner.h"
#include "moe/moe_internal.h"
#include "moe/moe_validate.h"
#include "moekit/moe.h"

namespace moekit {

// ---- SharedExpertMLPFwd ----

namespace {

constexpr const char* kOp = "shared_expert_mlp";

// hidden_states [T, H] and w_gate_up [2S, H]: what the workspace size and the plan depend on.
detail::MoEShapes check_shared_mlp_shapes(const detail::ArgCheck& c, const SharedExpertMLPArgs& a) {
  detail::MoEShapes s =
      detail::check_mlp_inputs(c, a, "hidden_states", a.hidden_states, /*experts=*/false);
  detail::check_biases(c, s, "gate_up_bias", a.gate_up_bias, "down_bias", a.down_bias,
                       /*experts=*/false);
  return s;
}

// The workspace: act [T, S] in the dtype, the dense MLP's stream-K scratch (s.F = S), then
// (general path) the f32 pre-activations, then (FP8 weights past the decode kernel) the FP8
// MLP's buffers.
detail::SharedMlpBuffers carve_shared_mlp(const detail::MoEShapes& s, detail::WorkspaceCarver& ws) {
  detail::SharedMlpBuffers b;
  b.act = ws.take(static_cast<size_t>(s.T * s.F) * dtype_size(s.dtype));
  b.scratch = detail::take_dense_mlp_scratch(ws, s.dtype, s.T, s.H, s.F);
  b.pre = detail::take_general_pre(ws, s.mlp, s.T, s.F, s.H, /*out_f32=*/false);
  detail::carve_shared_fp8(s, s.F, s.quant, s.dtype, b, ws);
  return b;
}

size_t shared_mlp_bytes(const detail::MoEShapes& s) {
  return detail::carved_bytes(s, [&](detail::WorkspaceCarver& ws) { carve_shared_mlp(s, ws); });
}

// The planner's plan on this device (s.F = S; the output in the dtype).
MlpPlan planned(const detail::MoEShapes& s, const detail::GemmDevice& device) {
  return detail::plan_shared_mlp(
      s, s.F, s.quant, s.mlp, s.dtype, device,
      detail::shared_mlp_capacity(s, s.F, s.quant, s.mlp, s.dtype, device));
}

// args.plan checked against the shapes, else the planner's (FP8 weights: one that runs them).
MlpPlan shared_plan(const detail::ArgCheck& c, const SharedExpertMLPArgs& a,
                    const detail::MoEShapes& s) {
  static const std::string fp8_paths =
      "FP8 weights on a path that runs them (the FP8 direct kernel: T <= " +
      detail::str(detail::kDirectMaxTokens) +
      ", 2*S*H < 2^31; else the FP8 GEMMs on an sm_90 device)";
  const detail::GemmDevice device = detail::current_gemm_device();
  return detail::resolve_plan(
      c, a.plan,
      [&](const MlpPlan& plan) {
        return detail::shared_mlp_plan_rejection(plan, s, s.F, s.quant, s.mlp, s.dtype, device);
      },
      [&] { return planned(s, device); }, detail::quantized(s.quant) ? "w_gate_up" : nullptr,
      fp8_paths.c_str());
}

}  // namespace

size_t shared_expert_mlp_workspace_size(const SharedExpertMLPArgs& args) {
  return detail::workspace_query(kOp, [&](const detail::ArgCheck& c) {
    const detail::MoEShapes s = check_shared_mlp_shapes(c, args);
    shared_plan(c, args, s);  // a plan that cannot run the arguments throws here too
    return shared_mlp_bytes(s);
  });
}

MlpPlan plan_shared_expert_mlp(const SharedExpertMLPArgs& args) {
  const detail::ArgCheck c(kOp, detail::ArgCheck::Mode::kShapesOnly);
  return planned(check_shared_mlp_shapes(c, args), detail::current_gemm_device());
}

std::vector<MlpPlan> shared_expert_mlp_plan_candidates(const SharedExpertMLPArgs& args) {
  const detail::ArgCheck c(kOp, detail::ArgCheck::Mode::kShapesOnly);
  const detail::MoEShapes s = check_shared_mlp_shapes(c, args);
  return detail::shared_mlp_plan_candidates(s, s.F, s.quant, s.mlp, s.dtype,
                                            detail::current_gemm_device());
}

void shared_expert_mlp(const SharedExpertMLPArgs& args, cudaStream_t stream) {
  detail::ArgCheck c(kOp);
  detail::MoEShapes s = check_shared_mlp_shapes(c, args);
  detail::check_mlp_down(c, s, args, "hidden_states", args.hidden_states, /*experts=*/false);
  detail::check_output(c, "output", args.output, s, "hidden_states", args.hidden_states);
  const MlpPlan plan = shared_plan(c, args, s);
  detail::MoEShapes dense = s;
  dense.E = 0;  // the key names T, H and S
  detail::log_op_plan(kOp, dense, s.F, plan);
  const size_t needed = shared_mlp_bytes(s);
  c.workspace(args.workspace, needed);
  // Not in place: its dense paths (some one kernel for both projections) are not shown
  // safe with out == x.
  c.outputs_disjoint({{"output", args.output}},
                     {{"hidden_states", args.hidden_states},
                      {"w_gate_up", args.w_gate_up},
                      {"w_down", args.w_down},
                      {"gate_up_bias", args.gate_up_bias},
                      {"down_bias", args.down_bias},
                      {"quant.w_gate_up_scale", args.quant.w_gate_up_scale},
                      {"quant.w_down_scale", args.quant.w_down_scale},
                      {"quant.a_gate_up_scale", args.quant.a_gate_up_scale},
                      {"quant.a_down_scale", args.quant.a_down_scale}},
                     args.workspace);
  if (s.T == 0) return;
  c.launch_target(stream, "output", args.output);
  detail::WorkspaceCarver ws(args.workspace.data);
  const detail::SharedMlpBuffers b = carve_shared_mlp(s, ws);
  detail::run_composite(kOp, [&] {
    detail::SharedMlpWeights w;
    w.w_gate_up = args.w_gate_up.data;
    w.w_down = args.w_down.data;
    w.quant = s.quant;
    w.scales = detail::weight_scales(args.quant);
    w.mlp = s.mlp;
    w.biases = detail::mlp_biases(args.gate_up_bias, args.down_bias);
    detail::run_shared_mlp(plan, s, s.F, s.dtype, args.hidden_states.data, w, b, args.output.data,
                           stream, kOp);
  });
}

}  // namespace moekit
