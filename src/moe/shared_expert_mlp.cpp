// SharedExpertMLPFwd: a dense gated MLP (src/mlp/dense_mlp.h runs it).
#include "mlp/dense_mlp.h"
#include "moe/moe_internal.h"
#include "moe/moe_validate.h"
#include "moekit/moe.h"

namespace moekit {

// ---- SharedExpertMLPFwd ----

namespace {

// hidden_states [T, H] and w_gate_up [2S, H]: what the workspace size depends on.
detail::MoEShapes check_shared_mlp_shapes(const detail::ArgCheck& c, const SharedExpertMLPArgs& a) {
  detail::MoEShapes s = detail::check_hidden(c, "hidden_states", a.hidden_states);
  detail::check_gate_up(c, s, "w_gate_up", a.w_gate_up, "hidden_states", a.hidden_states,
                        /*experts=*/false);
  return s;
}

// act [T, S] in the dtype, then the dense MLP's stream-K scratch (s.F = S).
size_t shared_mlp_bytes(const detail::MoEShapes& s) {
  if (s.T == 0) return 0;
  detail::WorkspaceCarver ws(nullptr);
  ws.take(static_cast<size_t>(s.T * s.F) * dtype_size(s.dtype));
  detail::take_dense_mlp_scratch(ws, s.dtype, s.T, s.H, s.F);
  return ws.bytes();
}

}  // namespace

size_t shared_expert_mlp_workspace_size(const SharedExpertMLPArgs& args) {
  return detail::workspace_query("shared_expert_mlp", [&](const detail::ArgCheck& c) {
    return shared_mlp_bytes(check_shared_mlp_shapes(c, args));
  });
}

void shared_expert_mlp(const SharedExpertMLPArgs& args, cudaStream_t stream) {
  detail::ArgCheck c("shared_expert_mlp");
  detail::MoEShapes s = check_shared_mlp_shapes(c, args);
  detail::check_down(c, s, "w_down", args.w_down, "hidden_states", args.hidden_states,
                     /*experts=*/false);
  detail::check_output(c, "output", args.output, s, "hidden_states", args.hidden_states);
  const size_t needed = shared_mlp_bytes(s);
  c.workspace(args.workspace, needed);
  // Not in place: its dense paths (some one kernel for both projections) are not shown
  // safe with out == x.
  c.outputs_disjoint({{"output", args.output}},
                     {{"hidden_states", args.hidden_states},
                      {"w_gate_up", args.w_gate_up},
                      {"w_down", args.w_down}},
                     args.workspace);
  if (s.T == 0) return;
  c.launch_target(stream, "output", args.output);
  detail::WorkspaceCarver ws(args.workspace.data);
  void* act = ws.take(static_cast<size_t>(s.T * s.F) * dtype_size(s.dtype));
  void* scratch = detail::take_dense_mlp_scratch(ws, s.dtype, s.T, s.H, s.F);
  detail::run_composite("shared_expert_mlp", [&] {
    detail::run_dense_mlp(s.dtype, args.hidden_states.data, s.T, s.H, s.F, args.w_gate_up.data,
                          args.w_down.data, act, args.output.data, s.dtype, scratch, stream);
  });
}

}  // namespace moekit
