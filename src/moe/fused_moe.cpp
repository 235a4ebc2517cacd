// FusedMoEExpertsFwd, IndexedExpertMLPFwd, FusedMoEFwd and FusedMoESharedExpertFwd:
// compositions of routing, permutation, grouped GEMMs and the direct small-batch
// kernels. See docs/moe.md for the workspace layouts and the path heuristics.
#include <algorithm>
#include <array>
#include <string>

#include "gemm/gemm_planner.h"
#include "moe/engine_inputs.h"
#include "moe/fp8_mlp.h"
#include "moe/layer_planner.h"
#include "moe/moe_internal.h"
#include "moe/moe_validate.h"
#include "moe/tuning_table.h"
#include "moekit/moe.h"
#include "moekit/permute.h"
#include "moekit/routing.h"
#include "permute/engine_ids.h"
#include "permute/permute_kernels.h"
#include "routing/fused_topk_kernel.h"
#include "routing/topk_params_check.h"

namespace moekit {
namespace detail {
namespace {

size_t elems_bytes(int64_t n, DType dtype) {
  return static_cast<size_t>(n) * dtype_size(dtype);
}

// Sub-buffers of the routed-experts workspace, in carving order.
struct RoutedBuffers {
  // direct path
  void* act = nullptr;    // [T*K, F] dtype, row = route
  float* down = nullptr;  // [T*K, H] f32, row = route
  // permuted path
  void* permuted = nullptr;  // [P, H] dtype (FP8: e4m3 rows); reused as the expert output
  void* perm_act = nullptr;  // [P, F] dtype
  int32_t* layout_metadata = nullptr;
  int32_t* inverse = nullptr;  // [T*K]
  Workspace pre_ws;
  void* tile_counters = nullptr;  // kExpertMlpCounterBytes
  float* pre = nullptr;           // general path: [P, general_pre_cols] f32
  Fp8MlpBuffers fp8;              // FP8 weights: the FP8 MLP's (instead of perm_act, counters)
};

PrePermuteArgs pre_permute_args(const MoEShapes& s, const void* hidden, const int32_t* ids,
                                const RoutedBuffers& b) {
  const int64_t P = sorted_rows(s);
  PrePermuteArgs a;
  a.hidden_states = make_view(hidden, s.dtype, {s.T, s.H});
  a.local_expert_ids = make_view(ids, DType::kI32, {s.T, s.K});
  a.num_local_experts = static_cast<int>(s.E);
  a.layout = PermutedLayout::contiguous(kSortedAlignment);
  a.permuted = make_view(b.permuted, s.dtype, {P, s.H});
  a.layout_metadata = make_view(b.layout_metadata, DType::kI32, {s.E});
  a.inverse_indices = make_view(b.inverse, DType::kI32, {s.T * s.K});
  a.workspace = b.pre_ws;
  return a;
}

RoutedBuffers carve_routed(const MoEShapes& s, RoutedPath routed, WorkspaceCarver& ws) {
  RoutedBuffers b;
  const int64_t R = s.T * s.K;
  if (routed == RoutedPath::kDirect) {
    b.act = ws.take(elems_bytes(R * s.F, s.dtype));
    b.down = static_cast<float*>(ws.take(elems_bytes(R * s.H, DType::kF32)));
    return b;
  }
  const int64_t P = sorted_rows(s);
  const bool fp8 = quantized(s.quant);
  // FP8: the e4m3 rows, then (once the gate/up GEMM has read them) the bf16 expert output.
  b.permuted = ws.take(elems_bytes(P * s.H, s.dtype));
  if (!fp8) b.perm_act = ws.take(elems_bytes(P * s.F, s.dtype));
  b.layout_metadata = static_cast<int32_t*>(ws.take(elems_bytes(s.E, DType::kI32)));
  b.inverse = static_cast<int32_t*>(ws.take(elems_bytes(R, DType::kI32)));
  const size_t pre_bytes = pre_permute_workspace_size(pre_permute_args(s, nullptr, nullptr, b));
  b.pre_ws.data = pre_bytes ? ws.take(pre_bytes) : nullptr;
  b.pre_ws.bytes = pre_bytes;
  if (fp8) {
    b.fp8 = carve_fp8_mlp(sorted_fp8_shapes(s), /*dense=*/false, ws);
    return b;
  }
  b.tile_counters = ws.take(kExpertMlpCounterBytes);
  b.pre = take_general_pre(ws, s.mlp, P, s.F, s.H, /*out_f32=*/false);
  return b;
}

// comb over num_rows rows (route r's row: inverse[r], or r itself without inverse).
void combine_rows(CombineProblem comb, DType rows_dtype, const void* rows, int64_t num_rows,
                  const int32_t* inverse, cudaStream_t stream) {
  comb.rows_dtype = rows_dtype;
  comb.rows = rows;
  comb.num_rows = num_rows;
  comb.inverse = inverse;
  launch_combine(comb, stream);
}

// The sorted path with FP8 weights: the FP8 pre-permute (rows quantized by the scheme), the
// FP8 MLP (fp8_mlp.h) into bf16 rows over the permuted input, the combine; or, with a
// weight-only plan, the bf16 pre-permute and the weight-only GEMMs.
void run_sorted_fp8(const RoutedExperts& p, const RoutedBuffers& b, CombineProblem comb,
                    cudaStream_t stream) {
  const MoEShapes& s = p.s;
  const Fp8MlpShapes fs = sorted_fp8_shapes(s);
  if (fp8_weight_only(p.experts)) {
    // The bf16 pre-permute; the weight-only GEMMs on its rows, the expert output over them.
    moe_pre_permute(pre_permute_args(s, p.hidden, p.topk_ids, b), stream);
    run_fp8_weight_only_mlp({fs, p.experts, nullptr, b.layout_metadata, p.w_gate_up, p.w_down,
                             p.scales, b.fp8, b.permuted},
                            b.permuted, stream);
    combine_rows(comb, DType::kBF16, b.permuted, fs.P, b.inverse, stream);
    return;
  }
  PrePermuteFp8Launch l;
  l.routes.hidden = p.hidden;
  l.routes.ids = p.topk_ids;
  l.routes.num_routes = static_cast<int>(s.T * s.K);
  l.routes.top_k = static_cast<int>(s.K);
  l.routes.num_experts = static_cast<int>(s.E);
  l.routes.alignment = kSortedAlignment;
  l.routes.permuted = b.permuted;
  l.routes.layout_metadata = b.layout_metadata;
  l.routes.inverse_indices = b.inverse;
  l.routes.workspace = b.pre_ws.data;
  l.dtype = s.dtype;
  l.num_tokens = s.T;
  l.hidden_size = s.H;
  l.mode = fp8_act_scales(s.quant);
  if (l.mode != Fp8ActScales::kPerTensor) {
    l.permuted_scales = b.fp8.in_scales;
  } else if (p.scales.a_gate_up != nullptr) {
    l.tensor_scale = p.scales.a_gate_up;
  } else {  // dynamic: max |x| over the T rows the routes read
    launch_fp8_tensor_scale(p.hidden, s.dtype, s.T, s.H, {}, b.fp8.amax, b.fp8.in_scales, stream);
    l.tensor_scale = b.fp8.in_scales;
  }
  launch_pre_permute_fp8(l, stream);
  // Into the permuted buffer: its e4m3 rows are dead once the gate/up GEMM has run.
  run_fp8_mlp({fs, p.experts, b.permuted, b.layout_metadata, p.w_gate_up, p.w_down, p.scales, b.fp8,
               b.permuted},
              stream);
  combine_rows(comb, DType::kBF16, b.permuted, fs.P, b.inverse, stream);
}

}  // namespace

size_t routed_experts_workspace_size(const MoEShapes& s, RoutedPath routed) {
  return carved_bytes(s, [&](WorkspaceCarver& ws) { carve_routed(s, routed, ws); });
}

void run_routed_experts(const RoutedExperts& p, WorkspaceCarver& ws, cudaStream_t stream) {
  const MoEShapes& s = p.s;
  if (s.T == 0) return;
  RoutedBuffers b = carve_routed(s, p.routed, ws);
  CombineProblem comb;
  comb.out_dtype = s.dtype;
  comb.topk_weights = p.topk_weights;
  comb.topk_ids = p.topk_ids;
  comb.E = s.E;
  comb.addend = p.addend;
  comb.out = p.output;
  comb.T = s.T;
  comb.K = s.K;
  comb.H = s.H;
  if (p.routed == RoutedPath::kDirect) {
    // Sort-free: stage 1 and 2 read the routes straight from topk_ids.
    if (quantized(s.quant)) {
      launch_direct_fp8_gate_up(s, p.hidden, p.w_gate_up, p.scales, p.topk_ids, b.act, stream,
                                "indexed_expert_mlp");
      launch_direct_fp8_down(s, b.act, p.w_down, p.scales, p.topk_ids, b.down, DType::kF32, stream,
                             "indexed_expert_mlp");
    } else {
      launch_direct_gate_up(s, p.hidden, p.w_gate_up, p.topk_ids, b.act, stream);
      launch_direct_down(s, b.act, p.w_down, p.topk_ids, b.down, stream);
    }
    combine_rows(comb, DType::kF32, b.down, s.T * s.K, nullptr, stream);
    return;
  }
  if (quantized(s.quant)) {
    run_sorted_fp8(p, b, comb, stream);
    return;
  }
  const PrePermuteArgs pre = pre_permute_args(s, p.hidden, p.topk_ids, b);
  moe_pre_permute(pre, stream);
  const int64_t P = pre.permuted.size(0);
  // The expert output overwrites the permuted input (dead after the first GEMM).
  ExpertMlpGemms g = sorted_expert_gemms(s, b.permuted, b.layout_metadata, b.perm_act, p.w_gate_up,
                                         p.w_down, b.tile_counters);
  g.pre = b.pre;
  g.biases = p.biases;
  run_expert_mlp_gemms(g, p.experts, stream);
  if (p.addend == nullptr) {
    PostPermuteArgs post;
    post.expert_output = make_view(b.permuted, s.dtype, {P, s.H});
    post.topk_weights = make_view(p.topk_weights, DType::kF32, {s.T, s.K});
    post.inverse_indices = make_view(b.inverse, DType::kI32, {s.T * s.K});
    post.out = make_view(p.output, s.dtype, {s.T, s.H});
    moe_post_permute(post, stream);
  } else {
    combine_rows(comb, s.dtype, b.permuted, P, b.inverse, stream);
  }
}

}  // namespace detail

namespace {

// The sorted path sorts routes with moe_pre_permute, which handles up to
// kPermuteMaxExperts experts; the direct path (small batches) up to kDirectMaxExperts.
// `could_be_direct`: the op has a direct path (all but fused_moe_experts).
void check_path_experts(const detail::ArgCheck& c, const detail::MoEShapes& s, bool direct,
                        bool could_be_direct, const TensorView& w_gate_up) {
  if (direct || s.E <= detail::kPermuteMaxExperts) return;
  const std::string limit =
      "at most " + detail::str(detail::kPermuteMaxExperts) + " experts (dim 0)";
  if (!could_be_direct) c.fail("w_gate_up", limit, w_gate_up.describe());
  if (s.E > detail::kDirectMaxExperts) {
    c.fail("w_gate_up", "at most " + detail::str(detail::kDirectMaxExperts) + " experts (dim 0)",
           w_gate_up.describe());
  }
  c.fail("w_gate_up",
         limit + " on the sorted path, which this call takes because " +
             detail::direct_path_rejection(s) + " (the direct path takes up to " +
             detail::str(detail::kDirectMaxExperts) +
             " experts at T <= " + detail::str(detail::direct_max_tokens(s)) +
             ", T*top_k <= " + detail::str(detail::kDirectMaxRoutes) + " and 2*F*H < 2^31)",
         w_gate_up.describe());
}

// The layer plan `given` (args.plan) checked against problem p, else (a layer op: `tuned`
// names it and its routing) a tuning table's entry for the shape and T that can run it,
// else the planner's.
struct TunedOp {
  const char* op;
  const TopKParams& routing;
};
LayerPlan layer_plan(const detail::ArgCheck& c, const LayerPlan* given,
                     const detail::LayerProblem& p, const TunedOp* tuned = nullptr) {
  const detail::GemmDevice device = detail::current_gemm_device();
  static const std::string fp8_paths =
      "FP8 weights on a path that runs them (the FP8 direct kernels: T <= " +
      detail::str(detail::kFp8DirectMaxTokens) +
      " (shared: " + detail::str(detail::kDirectMaxTokens) + ")" +
      ", T*top_k <= " + detail::str(detail::kDirectMaxRoutes) +
      ", E <= " + detail::str(detail::kDirectMaxExperts) +
      ", 2*F*H < 2^31 (shared: 2*S*H); else the FP8 GEMMs on an sm_90 device)";
  const char* fp8_weights = detail::quantized(p.s.quant)        ? "w_gate_up"
                            : detail::quantized(p.shared_quant) ? "shared_w_gate_up"
                                                                : nullptr;
  const auto planned = [&] {
    LayerPlan plan;
    // The tuning tables hold silu_and_mul layers' plans, bf16 / f16, with unquantized or FP8
    // weights (one scheme for the routed and the shared expert's).
    if (tuned != nullptr && !p.s.mlp.general() && !p.shared_mlp.general() &&
        (p.S == 0 || p.shared_quant == p.s.quant) && detail::tuning_tables_present() &&
        detail::tuned_layer_plan(detail::device_name(),
                                 detail::layer_tuning_shape(tuned->op, p.s, tuned->routing, p.S),
                                 p.s.T, device, &plan, &p))
      return plan;
    return detail::plan_layer(
        p, device,
        detail::shared_mlp_capacity(p.s, p.S, p.shared_quant, p.shared_mlp, DType::kF32, device));
  };
  return detail::resolve_plan(
      c, given,
      [&](const LayerPlan& plan) { return detail::layer_plan_rejection(plan, p, device); }, planned,
      fp8_weights, fp8_paths.c_str());
}

// ---- engine inputs (docs/moe.md, "Engine inputs") ----

// The passes a call's engine inputs need before the routed path; none on the default
// path (i32 local ids, no map, weights on the output), whose launches stay as they were.
//   ids: an expert map or i64 ids, translated into i32 local ids in workspace (the layer
//        ops never need it: their routing kernel writes local ids, FusedTopKLaunch);
//   scale: apply_router_weight_on_input, the scaled rows and unit weights in workspace.
struct EngineNeeds {
  bool ids = false;
  bool scale = false;
};
struct EngineBuffers {
  int32_t* ids = nullptr;         // [T*K] i32 local ids
  void* scaled = nullptr;         // [T, H] dtype
  float* unit_weights = nullptr;  // [T] f32 (K = 1)
};

EngineBuffers carve_engine(const detail::MoEShapes& s, EngineNeeds n, detail::WorkspaceCarver& ws) {
  EngineBuffers b;
  if (n.ids) b.ids = static_cast<int32_t*>(ws.take(detail::translated_ids_bytes(s.T * s.K)));
  if (n.scale) {
    b.scaled = ws.take(static_cast<size_t>(s.T * s.H) * dtype_size(s.dtype));
    b.unit_weights = static_cast<float*>(ws.take(static_cast<size_t>(s.T) * sizeof(float)));
  }
  return b;
}

size_t engine_bytes(const detail::MoEShapes& s, EngineNeeds n) {
  return detail::carved_bytes(s, [&](detail::WorkspaceCarver& ws) { carve_engine(s, n, ws); });
}

// apply_router_weight_on_input: p runs on the scaled rows with unit weights.
void scale_input_rows(const detail::MoEShapes& s, const EngineBuffers& b, detail::RoutedExperts& p,
                      cudaStream_t stream) {
  detail::RouterWeightOnInput r;
  r.dtype = s.dtype;
  r.x = p.hidden;
  r.weights = p.topk_weights;
  r.T = s.T;
  r.H = s.H;
  r.x_scaled = b.scaled;
  r.unit_weights = b.unit_weights;
  detail::launch_router_weight_on_input(r, stream);
  p.hidden = b.scaled;
  p.topk_weights = b.unit_weights;
}

// The routed experts of an op's arguments (FusedMoEExpertsArgs or FusedMoEArgs) by `plan`;
// the caller sets the routing (topk_weights, topk_ids) and the addend.
template <class Args>
detail::RoutedExperts routed_experts(const Args& a, const detail::MoEShapes& s,
                                     const LayerPlan& plan) {
  detail::RoutedExperts p;
  p.s = s;
  p.routed = plan.routed;
  p.experts = plan.experts;
  p.hidden = a.hidden_states.data;
  p.w_gate_up = a.w_gate_up.data;
  p.w_down = a.w_down.data;
  p.scales = detail::weight_scales(a.quant);
  p.biases = detail::mlp_biases(a.gate_up_bias, a.down_bias);
  p.output = a.output.data;
  return p;
}

// ---- FusedMoEExpertsFwd / IndexedExpertMLPFwd ----

detail::RoutedOp experts_op(bool allow_direct) {
  return allow_direct ? detail::RoutedOp::kIndexed : detail::RoutedOp::kSortedOnly;
}

// hidden_states, w_gate_up and topk_ids: what the workspace size and the plan depend on.
detail::MoEShapes check_experts_shapes(const detail::ArgCheck& c, const FusedMoEExpertsArgs& a) {
  detail::MoEShapes s =
      detail::check_mlp_inputs(c, a, "hidden_states", a.hidden_states, /*experts=*/true);
  detail::check_topk_ids(c, s, a.topk_ids);
  detail::check_expert_map(c, a.expert_map);
  detail::check_router_weight_on_input(c, a.apply_router_weight_on_input, s.K);
  detail::check_biases(c, s, "gate_up_bias", a.gate_up_bias, "down_bias", a.down_bias,
                       /*experts=*/true);
  return s;
}

EngineNeeds experts_needs(const FusedMoEExpertsArgs& a) {
  return {detail::ids_need_translation(a.topk_ids, a.expert_map), a.apply_router_weight_on_input};
}

size_t experts_bytes(const detail::MoEShapes& s, EngineNeeds needs, RoutedPath routed) {
  if (s.T == 0) return 0;
  return engine_bytes(s, needs) + detail::routed_experts_workspace_size(s, routed);
}

// The shapes, then the plan: args.plan (checked) or the planner's, whose path's expert
// limit is checked here (with the reason the call takes that path).
LayerPlan experts_plan(const detail::ArgCheck& c, const FusedMoEExpertsArgs& a, bool allow_direct,
                       detail::MoEShapes& s) {
  s = check_experts_shapes(c, a);
  const LayerPlan plan = layer_plan(c, a.plan, {s, experts_op(allow_direct), 0});
  if (a.plan == nullptr)
    check_path_experts(c, s, plan.routed == RoutedPath::kDirect, allow_direct, a.w_gate_up);
  return plan;
}

// FusedMoEExpertsFwd or IndexedExpertMLPFwd (allow_direct: the op has the direct path): the
// four entry points' bodies (MOEKIT_MOE_OP_ENTRY_POINTS).
struct ExpertsOp {
  const char* op;
  bool allow_direct;
  size_t workspace_size(const FusedMoEExpertsArgs& a) const;
  void run(const FusedMoEExpertsArgs& a, cudaStream_t stream) const;
  LayerPlan plan(const FusedMoEExpertsArgs& a) const;
  std::vector<LayerPlan> candidates(const FusedMoEExpertsArgs& a) const;
};

size_t ExpertsOp::workspace_size(const FusedMoEExpertsArgs& a) const {
  return detail::workspace_query(op, [&](const detail::ArgCheck& c) {
    detail::MoEShapes s;
    const LayerPlan plan = experts_plan(c, a, allow_direct, s);
    return experts_bytes(s, experts_needs(a), plan.routed);
  });
}

LayerPlan ExpertsOp::plan(const FusedMoEExpertsArgs& a) const {
  const detail::ArgCheck c(op, detail::ArgCheck::Mode::kShapesOnly);
  return layer_plan(c, nullptr, {check_experts_shapes(c, a), experts_op(allow_direct), 0});
}

std::vector<LayerPlan> ExpertsOp::candidates(const FusedMoEExpertsArgs& a) const {
  const detail::ArgCheck c(op, detail::ArgCheck::Mode::kShapesOnly);
  const detail::MoEShapes s = check_experts_shapes(c, a);
  return detail::layer_plan_candidates({s, experts_op(allow_direct), 0},
                                       detail::current_gemm_device());
}

void ExpertsOp::run(const FusedMoEExpertsArgs& a, cudaStream_t stream) const {
  detail::ArgCheck c(op);
  detail::MoEShapes s;
  const LayerPlan plan = experts_plan(c, a, allow_direct, s);
  detail::log_op_plan(op, s, 0, plan);
  detail::check_mlp_down(c, s, a, "hidden_states", a.hidden_states, /*experts=*/true);
  c.tensor("topk_weights", a.topk_weights, {DType::kF32}, {s.T, s.K});
  detail::check_output(c, "output", a.output, s, "hidden_states", a.hidden_states);
  const EngineNeeds needs = experts_needs(a);
  const size_t needed = experts_bytes(s, needs, plan.routed);
  c.workspace(a.workspace, needed);
  // In place (output == hidden_states) works: the hidden states are read by the first
  // kernel (the gather, the direct gate/up stage or the input scaling), the output
  // written by the last.
  using Arg = detail::ArgCheck::Arg;
  const Arg out{"output", a.output};
  const Arg in{"hidden_states", a.hidden_states};
  c.outputs_disjoint(
      {out},
      c.join(in, detail::weight_args(a), Arg{"topk_weights", a.topk_weights},
             Arg{"topk_ids", a.topk_ids}, detail::bias_args(a), Arg{"expert_map", a.expert_map}),
      a.workspace, &out, &in);
  if (s.T == 0) return;
  c.launch_target(stream, "output", a.output);
  detail::RoutedExperts p = routed_experts(a, s, plan);
  p.topk_weights = static_cast<const float*>(a.topk_weights.data);
  p.topk_ids = static_cast<const int32_t*>(a.topk_ids.data);
  detail::run_composite(op, [&] {
    detail::WorkspaceCarver ws(a.workspace.data);
    const EngineBuffers eb = carve_engine(s, needs, ws);
    if (needs.ids)  // map: global to local; i64 read as i64
      p.topk_ids = detail::translate_ids_into(a.topk_ids, a.expert_map, static_cast<int>(s.E),
                                              eb.ids, stream);
    if (needs.scale) scale_input_rows(s, eb, p, stream);
    detail::run_routed_experts(p, ws, stream);
  });
}

// ---- FusedMoEFwd / FusedMoESharedExpertFwd ----

struct LayerBuffers {
  float* topk_weights = nullptr;        // [T, K]
  int32_t* topk_ids = nullptr;          // [T, K]
  void* shared_act = nullptr;           // [T, S] dtype (shared expert only)
  float* shared_out = nullptr;          // [T, H] f32 (shared expert only)
  void* shared_scratch = nullptr;       // the shared MLP's stream-K scratch, if it takes that path
  float* shared_pre = nullptr;          // its general path's f32 pre-activations
  detail::SharedMlpBuffers shared_fp8;  // FP8 shared weights past the decode kernel
};

// The shared expert: its width S (0: none), its activation and biases, its weights' scheme.
struct SharedShape {
  int64_t S = 0;
  detail::MlpActivation mlp;
  QuantScheme quant = QuantScheme::kNone;
  bool static_act = false;  // MoEShapes::static_act of the shared expert's weights
};

// Topk buffers, then (apply_router_weight_on_input) the scaled rows, then (shared expert)
// its activation and f32 output, then the routed-experts buffers. An expert map needs
// no buffer: the routing kernel writes local ids.
LayerBuffers carve_layer(const detail::MoEShapes& s, const SharedShape& sh, EngineNeeds needs,
                         EngineBuffers& engine, detail::WorkspaceCarver& ws) {
  const int64_t S = sh.S;
  LayerBuffers b;
  b.topk_weights = static_cast<float*>(ws.take(static_cast<size_t>(s.T * s.K) * 4));
  b.topk_ids = static_cast<int32_t*>(ws.take(static_cast<size_t>(s.T * s.K) * 4));
  engine = carve_engine(s, needs, ws);
  if (S > 0) {
    b.shared_act = ws.take(static_cast<size_t>(s.T * S) * dtype_size(s.dtype));
    b.shared_out = static_cast<float*>(ws.take(static_cast<size_t>(s.T * s.H) * 4));
    b.shared_scratch = detail::take_dense_mlp_scratch(ws, s.dtype, s.T, s.H, S);
    b.shared_pre = detail::take_general_pre(ws, sh.mlp, s.T, S, s.H, /*out_f32=*/true);
    detail::carve_shared_fp8(s, S, sh.quant, DType::kF32, b.shared_fp8, ws);
  }
  return b;
}

EngineNeeds layer_needs(const FusedMoEArgs& a) {
  return {false, a.apply_router_weight_on_input};
}

size_t layer_workspace_size(const detail::MoEShapes& s, const SharedShape& sh, EngineNeeds needs,
                            RoutedPath routed) {
  return detail::carved_bytes(s, [&](detail::WorkspaceCarver& ws) {
    EngineBuffers engine;
    carve_layer(s, sh, needs, engine, ws);
    ws.take(detail::routed_experts_workspace_size(s, routed));
  });
}

// The experts the routing picks from: the global ones with an expert map, else the local.
int64_t routing_experts(const FusedMoEArgs& a, const detail::MoEShapes& s) {
  return a.expert_map.defined() ? a.expert_map.size(0) : s.E;
}

// hidden_states, w_gate_up, top_k and the engine inputs: what the routed layer's
// workspace size depends on.
detail::MoEShapes check_layer_shapes(const detail::ArgCheck& c, const FusedMoEArgs& a) {
  detail::MoEShapes s =
      detail::check_mlp_inputs(c, a, "hidden_states", a.hidden_states, /*experts=*/true);
  detail::check_expert_map(c, a.expert_map);
  detail::check_biases(c, s, "gate_up_bias", a.gate_up_bias, "down_bias", a.down_bias,
                       /*experts=*/true);
  const int K = a.params.top_k;
  const int64_t E = routing_experts(a, s);
  MOEKIT_REQUIRE(
      c, K >= 1 && K <= detail::kTopKMaxK && K <= E, "top_k",
      "1 to min(" + detail::str(detail::kTopKMaxK) + ", num_experts=" + detail::str(E) + ")",
      detail::str(K));
  s.K = K;
  detail::check_router_weight_on_input(c, a.apply_router_weight_on_input, s.K);
  MOEKIT_REQUIRE(c, s.T * s.K <= INT32_MAX, "hidden_states", "at most 2^31-1 routes (T*top_k)",
                 a.hidden_states.describe());
  // The routing's limit, below both paths' (so no path check).
  MOEKIT_REQUIRE(
      c, s.E <= detail::kTopKMaxExperts, "w_gate_up",
      "at most " + detail::str(detail::kTopKMaxExperts) + " experts (dim 0; the routing's limit)",
      a.w_gate_up.describe());
  return s;
}

// The shared expert (S = 0: none) from shared_w_gate_up [2S, H] ([S, H] for relu2), its
// optional biases and shared_quant's scheme, when given (with_down: shared_w_down and
// shared_quant's scales checked too).
SharedShape check_shared(const detail::ArgCheck& c, const detail::MoEShapes& s,
                         const FusedMoESharedExpertArgs& a, bool with_down = false) {
  SharedShape sh;
  if (!a.shared_w_gate_up.defined() && !(with_down && a.shared_w_down.defined())) {
    MOEKIT_REQUIRE(c, !a.shared_gate_up_bias.defined() && !a.shared_down_bias.defined(),
                   a.shared_gate_up_bias.defined() ? "shared_gate_up_bias" : "shared_down_bias",
                   "no shared-expert bias without the shared expert's weights", "a bias");
    MOEKIT_REQUIRE(c, !detail::quantized(a.shared_quant.scheme), "shared_quant",
                   "scheme none without shared weights",
                   std::string("scheme ") + quant_scheme_name(a.shared_quant.scheme));
    return sh;
  }
  detail::check_quant_scheme(c, "shared_quant.scheme", a.shared_quant.scheme);
  detail::MoEShapes shared = s;
  shared.mlp = detail::MlpActivation();
  shared.mlp.act = s.mlp.act;
  shared.quant = a.shared_quant.scheme;
  shared.static_act = detail::static_act_of(a.shared_quant);
  detail::check_gate_up(c, shared, "shared_w_gate_up", a.shared_w_gate_up, "hidden_states",
                        a.moe.hidden_states, /*experts=*/false);
  if (with_down)
    detail::check_down(c, shared, "shared_w_down", a.shared_w_down, "hidden_states",
                       a.moe.hidden_states, /*experts=*/false);
  detail::check_biases(c, shared, "shared_gate_up_bias", a.shared_gate_up_bias, "shared_down_bias",
                       a.shared_down_bias, /*experts=*/false);
  if (with_down)
    detail::check_quant_scales(c, shared, "shared_quant", a.shared_quant, /*experts=*/false);
  sh.S = shared.F;
  sh.mlp = shared.mlp;
  sh.quant = shared.quant;
  sh.static_act = shared.static_act;
  return sh;
}

detail::LayerProblem layer_problem_of(const detail::MoEShapes& s, const SharedShape& sh) {
  detail::LayerProblem p;
  p.s = s;
  p.op = detail::RoutedOp::kLayer;
  p.S = sh.S;
  p.shared_mlp = sh.mlp;
  p.shared_quant = sh.quant;
  p.shared_static_act = sh.static_act;
  return p;
}

size_t layer_workspace_query(const char* op, const FusedMoEArgs& a,
                             const FusedMoESharedExpertArgs* shared) {
  return detail::workspace_query(op, [&](const detail::ArgCheck& c) {
    const detail::MoEShapes s = check_layer_shapes(c, a);
    const SharedShape sh = shared ? check_shared(c, s, *shared) : SharedShape();
    const TunedOp tuned{op, a.params};
    const LayerPlan plan = layer_plan(c, a.plan, layer_problem_of(s, sh), &tuned);
    return layer_workspace_size(s, sh, layer_needs(a), plan.routed);
  });
}

detail::MoEShapes check_layer_args(const detail::ArgCheck& c, const FusedMoEArgs& a) {
  detail::MoEShapes s = check_layer_shapes(c, a);
  detail::check_mlp_down(c, s, a, "hidden_states", a.hidden_states, /*experts=*/true);
  if (a.expert_map.defined()) {
    c.tensor("gating_output", a.gating_output, {DType::kBF16, DType::kF16, DType::kF32},
             {s.T, detail::kAnyDim});
    MOEKIT_REQUIRE(c, a.gating_output.size(1) == a.expert_map.size(0), "gating_output",
                   "one column per global expert (expert_map has " +
                       detail::str(a.expert_map.size(0)) + " entries)",
                   a.gating_output.describe());
  } else {
    c.tensor("gating_output", a.gating_output, {DType::kBF16, DType::kF16, DType::kF32},
             {s.T, s.E});
  }
  // The routing checks of fused_topk, reported under this op's name.
  detail::check_routing_inputs(c, a.gating_output, a.correction_bias, a.params);
  detail::check_output(c, "output", a.output, s, "hidden_states", a.hidden_states);
  return s;
}

// The shared expert's weights, scales and biases in the layer's memory rule.
std::array<detail::ArgCheck::Arg, 8> shared_weight_args(const FusedMoESharedExpertArgs& sh) {
  return {{{"shared_w_gate_up", sh.shared_w_gate_up},
           {"shared_w_down", sh.shared_w_down},
           {"shared_quant.w_gate_up_scale", sh.shared_quant.w_gate_up_scale},
           {"shared_quant.w_down_scale", sh.shared_quant.w_down_scale},
           {"shared_quant.a_gate_up_scale", sh.shared_quant.a_gate_up_scale},
           {"shared_quant.a_down_scale", sh.shared_quant.a_down_scale},
           {"shared_gate_up_bias", sh.shared_gate_up_bias},
           {"shared_down_bias", sh.shared_down_bias}}};
}

// The layer's memory rule: output may be hidden_states itself (every kernel that reads
// the hidden states runs before the last one, which writes the output), else disjoint
// from every input and the workspace.
void check_layer_memory(const detail::ArgCheck& c, const FusedMoEArgs& a,
                        const FusedMoESharedExpertArgs* shared) {
  const FusedMoESharedExpertArgs none;
  const FusedMoESharedExpertArgs& sh = shared ? *shared : none;
  using Arg = detail::ArgCheck::Arg;
  const Arg out{"output", a.output};
  const Arg in{"hidden_states", a.hidden_states};
  c.outputs_disjoint(
      {out},
      c.join(in, Arg{"gating_output", a.gating_output}, Arg{"correction_bias", a.correction_bias},
             detail::weight_args(a), detail::bias_args(a), shared_weight_args(sh),
             Arg{"expert_map", a.expert_map}),
      a.workspace, &out, &in);
}

// Routing (the FusedTopK kernel into the workspace), optional shared MLP, routed experts.
void run_layer(const char* op, const FusedMoEArgs& a, const LayerPlan& plan,
               const detail::MoEShapes& s, const FusedMoESharedExpertArgs* shared,
               const SharedShape& sh, cudaStream_t stream) {
  detail::WorkspaceCarver ws(a.workspace.data);
  const EngineNeeds needs = layer_needs(a);
  EngineBuffers engine;
  LayerBuffers b = carve_layer(s, sh, needs, engine, ws);
  // The routing inputs were validated under the layer op's name (check_layer_args).
  detail::FusedTopKLaunch topk;
  topk.gating = a.gating_output.data;
  topk.dtype = a.gating_output.dtype;
  topk.bias = a.correction_bias.defined() ? a.correction_bias.ptr<const float>() : nullptr;
  topk.num_tokens = s.T;
  topk.num_experts = static_cast<int>(routing_experts(a, s));
  topk.params = a.params;
  topk.topk_weights = b.topk_weights;
  topk.topk_ids = b.topk_ids;
  if (a.expert_map.defined()) {  // the map applied where the ids are produced
    topk.expert_map = a.expert_map.ptr<const int32_t>();
    topk.num_local = static_cast<int>(s.E);
  }
  detail::launch_fused_topk(topk, stream);
  if (sh.S > 0) {
    // The shared expert's output stays f32 and is added in the routed combine, so
    // the layer output is rounded once.
    detail::SharedMlpWeights w;
    w.w_gate_up = shared->shared_w_gate_up.data;
    w.w_down = shared->shared_w_down.data;
    w.quant = sh.quant;
    w.scales = detail::weight_scales(shared->shared_quant);
    w.mlp = sh.mlp;
    w.biases = detail::mlp_biases(shared->shared_gate_up_bias, shared->shared_down_bias);
    detail::SharedMlpBuffers sb = b.shared_fp8;
    sb.act = b.shared_act;
    sb.scratch = b.shared_scratch;
    sb.pre = b.shared_pre;
    detail::run_shared_mlp(plan.shared, detail::shared_shapes(s, sh.static_act), sh.S, DType::kF32,
                           a.hidden_states.data, w, sb, b.shared_out, stream, op);
  }
  detail::RoutedExperts p = routed_experts(a, s, plan);
  p.topk_weights = b.topk_weights;
  p.topk_ids = b.topk_ids;
  p.addend = b.shared_out;
  // apply_router_weight_on_input: the input rows scaled by the top-1 weights (the shared
  // expert above read the unscaled x).
  if (needs.scale) scale_input_rows(s, engine, p, stream);
  detail::run_routed_experts(p, ws, stream);
}

detail::LayerProblem layer_problem(const char* op, const FusedMoEArgs& a,
                                   const FusedMoESharedExpertArgs* shared) {
  const detail::ArgCheck c(op, detail::ArgCheck::Mode::kShapesOnly);
  const detail::MoEShapes s = check_layer_shapes(c, a);
  return layer_problem_of(s, shared ? check_shared(c, s, *shared) : SharedShape());
}

// A layer op's arguments: the routed layer's, and the shared expert's (none: fused_moe).
const FusedMoEArgs& moe_args(const FusedMoEArgs& a) {
  return a;
}
const FusedMoEArgs& moe_args(const FusedMoESharedExpertArgs& a) {
  return a.moe;
}
const FusedMoESharedExpertArgs* shared_args(const FusedMoEArgs&) {
  return nullptr;
}
const FusedMoESharedExpertArgs* shared_args(const FusedMoESharedExpertArgs& a) {
  return &a;
}

// FusedMoEFwd or FusedMoESharedExpertFwd (Args: FusedMoEArgs or FusedMoESharedExpertArgs): the
// four entry points' bodies (MOEKIT_MOE_OP_ENTRY_POINTS).
struct LayerOp {
  const char* op;

  template <class Args>
  size_t workspace_size(const Args& args) const {
    return layer_workspace_query(op, moe_args(args), shared_args(args));
  }

  template <class Args>
  LayerPlan plan(const Args& args) const {
    const detail::ArgCheck c(op, detail::ArgCheck::Mode::kShapesOnly);
    const TunedOp tuned{op, moe_args(args).params};
    return layer_plan(c, nullptr, layer_problem(op, moe_args(args), shared_args(args)), &tuned);
  }

  template <class Args>
  std::vector<LayerPlan> candidates(const Args& args) const {
    return detail::layer_plan_candidates(layer_problem(op, moe_args(args), shared_args(args)),
                                         detail::current_gemm_device());
  }

  template <class Args>
  void run(const Args& args, cudaStream_t stream) const {
    const FusedMoEArgs& a = moe_args(args);
    const FusedMoESharedExpertArgs* shared = shared_args(args);
    detail::ArgCheck c(op);
    const detail::MoEShapes s = check_layer_args(c, a);
    // Both shared weights absent: no shared expert, the routed layer alone (a model whose
    // layer has none can call one entry point). One of the two alone is an error.
    const SharedShape sh = shared ? check_shared(c, s, *shared, /*with_down=*/true) : SharedShape();
    const TunedOp tuned{op, a.params};
    const LayerPlan plan = layer_plan(c, a.plan, layer_problem_of(s, sh), &tuned);
    detail::log_op_plan(op, s, sh.S, plan);
    const size_t needed = layer_workspace_size(s, sh, layer_needs(a), plan.routed);
    c.workspace(a.workspace, needed);
    check_layer_memory(c, a, shared);
    if (s.T == 0) return;
    c.launch_target(stream, "output", a.output);
    detail::run_composite(op, [&] { run_layer(op, a, plan, s, shared, sh, stream); });
  }
};

}  // namespace

// The four entry points of op NAME (moe.h: NAME_workspace_size, NAME, plan_NAME,
// NAME_plan_candidates) on ARGS, by OP's members.
#define MOEKIT_MOE_OP_ENTRY_POINTS(NAME, ARGS, OP)                  \
  size_t NAME##_workspace_size(const ARGS& args) {                  \
    return OP.workspace_size(args);                                 \
  }                                                                 \
  void NAME(const ARGS& args, cudaStream_t stream) {                \
    OP.run(args, stream);                                           \
  }                                                                 \
  LayerPlan plan_##NAME(const ARGS& args) {                         \
    return OP.plan(args);                                           \
  }                                                                 \
  std::vector<LayerPlan> NAME##_plan_candidates(const ARGS& args) { \
    return OP.candidates(args);                                     \
  }

MOEKIT_MOE_OP_ENTRY_POINTS(fused_moe_experts, FusedMoEExpertsArgs,
                           (ExpertsOp{"fused_moe_experts", /*allow_direct=*/false}))
MOEKIT_MOE_OP_ENTRY_POINTS(indexed_expert_mlp, IndexedExpertMLPArgs,
                           (ExpertsOp{"indexed_expert_mlp", /*allow_direct=*/true}))
MOEKIT_MOE_OP_ENTRY_POINTS(fused_moe, FusedMoEArgs, LayerOp{"fused_moe"})
MOEKIT_MOE_OP_ENTRY_POINTS(fused_moe_shared_expert, FusedMoESharedExpertArgs,
                           LayerOp{"fused_moe_shared_expert"})
#undef MOEKIT_MOE_OP_ENTRY_POINTS

}  // namespace moekit
