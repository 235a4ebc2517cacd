// MoEExpertMLPFwd: two grouped GEMMs (gate/up with the silu_and_mul epilogue into a
// workspace activation buffer, then down), as two launches or one chained SM90 launch
// (plan_mlp_gemms decides); other activations and biases: plain GEMMs around the
// activation kernel (docs/moe.md "Activations").
#include <algorithm>
#include <string>
#include <utility>

#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm.h"
#include "moe/fp8_mlp.h"
#include "moe/layer_planner.h"
#include "moe/moe_internal.h"
#include "moe/moe_validate.h"
#include "moekit/moe.h"

namespace moekit {
namespace detail {
// The two GEMM problems of `g`. Without counters (planning only) a stand-in address marks
// them given: the ops always carve them, and the plan depends only on whether they are.
std::pair<GroupedGemmProblem, GroupedGemmProblem> expert_mlp_problems(const ExpertMlpGemms& g) {
  static_assert(kExpertMlpCounterBytes == 2 * kTileCounterBytes + kSm90MlpChainScratchBytes,
                "one counter per GEMM, then the chain's scratch");
  static unsigned stand_in[2];
  GroupedGemmProblem up;
  up.in_dtype = g.dtype;
  up.out_dtype = g.dtype;  // the activation is rounded to the op's dtype (SPEC)
  up.a = g.in;
  up.b = g.w_gate_up;
  up.c = g.act;
  up.num_groups = static_cast<int>(g.E);
  up.n = g.F;
  up.k = g.H;
  up.activation = Activation::kSiluAndMul;
  up.rows = GemmRows::kContiguous;
  up.layout_metadata = g.layout_metadata;
  up.alignment = g.alignment;
  up.m = g.P;
  up.routed_counts = g.routed_counts;
  char* counters = static_cast<char*>(g.counters);
  up.tile_counter = counters ? reinterpret_cast<unsigned*>(counters) : &stand_in[0];

  GroupedGemmProblem down = up;
  down.a = g.act;
  down.b = g.w_down;
  down.c = g.out;
  down.n = g.H;
  down.k = g.F;
  down.activation = Activation::kNone;
  down.tile_counter =
      counters ? reinterpret_cast<unsigned*>(counters + kTileCounterBytes) : &stand_in[1];
  if (g.mlp.general()) {
    // Plain GEMMs around the activation kernel: f32 pre-activations, then down (f32 when
    // its bias follows).
    up.activation = Activation::kNone;
    up.out_dtype = DType::kF32;
    up.c = g.pre;
    up.n = gate_up_rows(g.mlp.act, g.F);
    if (g.mlp.down_bias) {
      down.out_dtype = DType::kF32;
      down.c = g.pre;
    }
  }
  return {up, down};
}

std::string expert_mlp_general_rejection(const MlpPlan& plan, const MlpActivation& mlp) {
  if (!mlp.general() || plan.path != MlpPath::kChain) return {};
  return std::string("the chain runs silu_and_mul without biases, not ") +
         activation_name(mlp.act) + (mlp.gate_up_bias || mlp.down_bias ? " with biases" : "") +
         " (two GEMMs around the activation kernel)";
}

MlpPlan plan_expert_mlp_gemms(const ExpertMlpGemms& g, const GemmDevice& device) {
  const auto [up, down] = expert_mlp_problems(g);
  return plan_mlp_gemms(up, down, device);
}

std::vector<MlpPlan> expert_mlp_gemms_plan_candidates(const ExpertMlpGemms& g,
                                                      const GemmDevice& device) {
  const auto [up, down] = expert_mlp_problems(g);
  return mlp_gemms_plan_candidates(up, down, device);
}

void run_expert_mlp_gemms(const ExpertMlpGemms& g, const MlpPlan& plan, cudaStream_t stream,
                          const char* op) {
  if (!g.counters) throw Error("moekit::moe_expert_mlp: internal: no counters carved");
  auto [up, down] = expert_mlp_problems(g);
  if (!g.mlp.general()) {
    run_mlp_gemms(plan, up, down, static_cast<char*>(g.counters) + 2 * kTileCounterBytes, stream,
                  op);
    return;
  }
  std::string why = expert_mlp_general_rejection(plan, g.mlp);
  if (why.empty()) why = mlp_gemms_plan_rejection(plan, up, down, current_gemm_device());
  if (!why.empty()) {
    throw Error(std::string("moekit::") + op + ": plan \"" + to_string(plan) +
                "\" cannot run these arguments: " + why);
  }
  up.plan = plan.gate_up;
  down.plan = plan.down;
  ActivationLaunch act;  // each row's expert from the layout's ends
  act.dtype = g.dtype;
  act.act = g.mlp.act;
  act.in = g.pre;
  act.rows = g.P;
  act.cols = g.F;
  act.ends = g.layout_metadata;
  act.E = static_cast<int>(g.E);
  act.alignment = g.alignment;
  act.out = g.act;
  act.out_dtype = g.dtype;
  run_general_mlp(up, down, act, g.biases, g.H, g.out, g.dtype, stream, op);
}

}  // namespace detail

namespace {

// The grouped GEMMs' limit on groups (the SM90 kernels' group table; moe_grouped_gemm's).
constexpr int64_t kExpertMlpMaxExperts = 1024;

// expert_input [P, H] and w_gate_up [E, 2F, H]: what the workspace size depends on.
detail::MoEShapes check_expert_mlp_shapes(const detail::ArgCheck& c, const ExpertMLPArgs& a) {
  detail::MoEShapes s =
      detail::check_mlp_inputs(c, a, "expert_input", a.expert_input, /*experts=*/true);
  MOEKIT_REQUIRE(c, s.E <= kExpertMlpMaxExperts, "w_gate_up",
                 "at most " + detail::str(kExpertMlpMaxExperts) + " experts (dim 0)",
                 a.w_gate_up.describe());
  detail::check_biases(c, s, "gate_up_bias", a.gate_up_bias, "down_bias", a.down_bias,
                       /*experts=*/true);
  // The FP8 GEMMs write bf16 rows, straight into expert_output (its padding rows untouched).
  MOEKIT_REQUIRE(c, !detail::quantized(s.quant) || s.dtype == DType::kBF16, "expert_input",
                 std::string("bf16 with FP8 weights (quant.scheme ") + quant_scheme_name(s.quant) +
                     ": the FP8 GEMMs write bf16 rows)",
                 a.expert_input.describe());
  return s;
}

// The workspace's buffers, in carving order: act [P, F] in the dtype (P = s.T), the GEMMs'
// tile counters, then (general path) the f32 pre-activations.
struct ExpertMlpBuffers {
  void* act = nullptr;
  void* counters = nullptr;
  float* pre = nullptr;
  void* q_in = nullptr;       // FP8 weights: the e4m3 input rows [P, H]
  detail::Fp8MlpBuffers fp8;  // and the FP8 MLP's buffers (instead of the above)
};
// The FP8 MLP (FP8 weights) of P = s.T rows in the groups of a's layout (s.static_act: a's
// static scale, set by check_mlp_inputs; a == nullptr: the sizes alone, which depend on
// neither).
detail::Fp8MlpShapes fp8_shapes(const detail::MoEShapes& s, const ExpertMLPArgs* a) {
  return detail::fp8_mlp_shapes(s, s.T, s.E, s.F, s.quant,
                                a != nullptr ? std::max(a->layout.alignment, 1) : 1);
}
ExpertMlpBuffers carve_expert_mlp(const detail::MoEShapes& s, detail::WorkspaceCarver& ws) {
  ExpertMlpBuffers b;
  if (detail::quantized(s.quant)) {
    b.q_in = ws.take(static_cast<size_t>(s.T * s.H));
    b.fp8 = detail::carve_fp8_mlp(fp8_shapes(s, nullptr), /*dense=*/false, ws);
    return b;
  }
  b.act = ws.take(static_cast<size_t>(s.T * s.F) * dtype_size(s.dtype));
  b.counters = ws.take(detail::kExpertMlpCounterBytes);
  b.pre = detail::take_general_pre(ws, s.mlp, s.T, s.F, s.H, /*out_f32=*/false);
  return b;
}

size_t expert_mlp_bytes(const detail::MoEShapes& s) {
  return detail::carved_bytes(s, [&](detail::WorkspaceCarver& ws) { carve_expert_mlp(s, ws); });
}

// The GEMMs of `args` (validated shapes `s`), without their workspace buffers.
detail::ExpertMlpGemms expert_mlp_gemms(const ExpertMLPArgs& args, const detail::MoEShapes& s) {
  detail::ExpertMlpGemms g;
  g.dtype = s.dtype;
  g.in = args.expert_input.data;
  g.P = s.T;
  g.E = s.E;
  g.H = s.H;
  g.F = s.F;
  g.layout_metadata = static_cast<const int32_t*>(args.layout_metadata.data);
  g.alignment = args.layout.alignment;
  g.w_gate_up = args.w_gate_up.data;
  g.w_down = args.w_down.data;
  g.out = args.expert_output.data;
  g.mlp = s.mlp;
  g.biases = detail::mlp_biases(args.gate_up_bias, args.down_bias);
  return g;
}

// `given` (checked) or the FP8 planner's plan, which must run f (an sm_90 device).
MlpPlan fp8_plan(const detail::ArgCheck& c, const MlpPlan* given, const detail::Fp8MlpShapes& f,
                 const detail::GemmDevice& device) {
  return detail::resolve_plan(
      c, given,
      [&](const MlpPlan& plan) { return detail::fp8_mlp_plan_rejection(plan, f, device); },
      [&] { return detail::plan_fp8_mlp(f, device); }, "w_gate_up",
      "FP8 weights on the FP8 GEMMs (an sm_90 device)");
}

// The FP8 run: the input rows quantized (in place works: expert_input is read first), the
// FP8 MLP into expert_output.
void run_fp8_expert_mlp(const ExpertMLPArgs& args, const detail::Fp8MlpShapes& f,
                        const MlpPlan& plan, const ExpertMlpBuffers& b, cudaStream_t stream) {
  const auto* ends = static_cast<const int32_t*>(args.layout_metadata.data);
  const detail::WeightScales scales = detail::weight_scales(args.quant);
  detail::quantize_fp8_input(f, args.expert_input.data, scales.a_gate_up, {ends, f.E, f.alignment},
                             b.fp8, b.q_in, stream);
  detail::run_fp8_mlp({f, plan, b.q_in, ends, args.w_gate_up.data, args.w_down.data, scales, b.fp8,
                       args.expert_output.data},
                      stream);
}

}  // namespace

size_t expert_mlp_workspace_size(const ExpertMLPArgs& args) {
  return detail::workspace_query("moe_expert_mlp", [&](const detail::ArgCheck& c) {
    return expert_mlp_bytes(check_expert_mlp_shapes(c, args));
  });
}

void moe_expert_mlp(const ExpertMLPArgs& args, cudaStream_t stream) {
  detail::ArgCheck c("moe_expert_mlp");
  detail::MoEShapes s = check_expert_mlp_shapes(c, args);
  const int64_t P = s.T;
  detail::check_mlp_down(c, s, args, "expert_input", args.expert_input, /*experts=*/true);
  c.tensor("layout_metadata", args.layout_metadata, {DType::kI32}, {s.E});
  MOEKIT_REQUIRE(c, args.layout.kind == PermutedLayout::Kind::kContiguous, "layout",
                 "a contiguous(alignment) layout", "masked");
  MOEKIT_REQUIRE(c, args.layout.alignment >= 1, "layout", "alignment >= 1",
                 "alignment " + detail::str(args.layout.alignment));
  c.tensor("expert_output", args.expert_output, {DType::kBF16, DType::kF16}, {P, s.H}, 16);
  c.same_dtype("expert_output", args.expert_output, "expert_input", args.expert_input);
  const size_t needed = expert_mlp_bytes(s);
  c.workspace(args.workspace, needed);
  // In place (expert_output == expert_input) works: a group's input rows are dead once
  // its gate/up GEMM tiles have run, before any down tile of the group stores.
  using Arg = detail::ArgCheck::Arg;
  const Arg out{"expert_output", args.expert_output};
  const Arg in{"expert_input", args.expert_input};
  c.outputs_disjoint({out},
                     c.join(in, Arg{"layout_metadata", args.layout_metadata},
                            detail::weight_args(args), detail::bias_args(args)),
                     args.workspace, &out, &in);
  const detail::GemmDevice device = detail::current_gemm_device();
  if (detail::quantized(s.quant)) {
    const detail::Fp8MlpShapes f = fp8_shapes(s, &args);
    const MlpPlan plan = fp8_plan(c, args.plan, f, device);
    detail::log_op_plan("moe_expert_mlp", s, 0, plan);
    if (P == 0) return;
    c.launch_target(stream, "expert_output", args.expert_output);
    detail::WorkspaceCarver ws(args.workspace.data);
    const ExpertMlpBuffers b = carve_expert_mlp(s, ws);
    detail::run_composite("moe_expert_mlp", [&] { run_fp8_expert_mlp(args, f, plan, b, stream); });
    return;
  }
  if (args.plan != nullptr)
    detail::check_plan(c, *args.plan, detail::expert_mlp_general_rejection(*args.plan, s.mlp));
  if (P == 0) return;
  c.launch_target(stream, "expert_output", args.expert_output);

  detail::WorkspaceCarver ws(args.workspace.data);
  detail::ExpertMlpGemms g = expert_mlp_gemms(args, s);
  const ExpertMlpBuffers b = carve_expert_mlp(s, ws);
  g.act = b.act;
  g.counters = b.counters;
  g.pre = b.pre;
  const MlpPlan plan = args.plan ? *args.plan : detail::plan_expert_mlp_gemms(g, device);
  detail::log_op_plan("moe_expert_mlp", s, 0, plan);
  detail::run_composite("moe_expert_mlp", [&] { detail::run_expert_mlp_gemms(g, plan, stream); });
}

MlpPlan plan_expert_mlp(const ExpertMLPArgs& args) {
  detail::ArgCheck c("moe_expert_mlp");
  const detail::MoEShapes s = check_expert_mlp_shapes(c, args);
  if (detail::quantized(s.quant)) {
    return fp8_plan(c, nullptr, fp8_shapes(s, &args), detail::current_gemm_device());
  }
  return detail::plan_expert_mlp_gemms(expert_mlp_gemms(args, s), detail::current_gemm_device());
}

std::vector<MlpPlan> expert_mlp_plan_candidates(const ExpertMLPArgs& args) {
  detail::ArgCheck c("moe_expert_mlp");
  const detail::MoEShapes s = check_expert_mlp_shapes(c, args);
  if (detail::quantized(s.quant))
    return detail::fp8_mlp_plan_candidates(fp8_shapes(s, &args), detail::current_gemm_device());
  return detail::expert_mlp_gemms_plan_candidates(expert_mlp_gemms(args, s),
                                                  detail::current_gemm_device());
}

}  // namespace moekit
