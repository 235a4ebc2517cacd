// FusedMoEExpertsFwd, IndexedExpertMLPFwd, FusedMoEFwd and FusedMoESharedExpertFwd:
// compositions of routing, permutation, grouped GEMMs and the direct small-batch
// kernels. See docs/moe.md for the workspace layouts and the path heuristics.
#include <algorithm>
#include <string>

#include "gemm/gemm_planner.h"
#include "moe/layer_planner.h"
#include "moe/moe_internal.h"
#include "moe/moe_validate.h"
#include "moe/tuning_table.h"
#include "moekit/moe.h"
#include "moekit/permute.h"
#include "moekit/routing.h"
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
  void* permuted = nullptr;  // [P, H] dtype; reused as the expert output
  void* perm_act = nullptr;  // [P, F] dtype
  int32_t* layout_metadata = nullptr;
  int32_t* inverse = nullptr;  // [T*K]
  Workspace pre_ws;
  void* tile_counters = nullptr;  // kExpertMlpCounterBytes
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
  b.permuted = ws.take(elems_bytes(P * s.H, s.dtype));
  b.perm_act = ws.take(elems_bytes(P * s.F, s.dtype));
  b.layout_metadata = static_cast<int32_t*>(ws.take(elems_bytes(s.E, DType::kI32)));
  b.inverse = static_cast<int32_t*>(ws.take(elems_bytes(R, DType::kI32)));
  const size_t pre_bytes = pre_permute_workspace_size(pre_permute_args(s, nullptr, nullptr, b));
  b.pre_ws.data = pre_bytes ? ws.take(pre_bytes) : nullptr;
  b.pre_ws.bytes = pre_bytes;
  b.tile_counters = ws.take(kExpertMlpCounterBytes);
  return b;
}

}  // namespace

size_t routed_experts_workspace_size(const MoEShapes& s, RoutedPath routed) {
  if (s.T == 0) return 0;
  WorkspaceCarver ws(nullptr);
  carve_routed(s, routed, ws);
  return ws.bytes();
}

// Carves the routed buffers from the carver's current position.
static void run_routed_carved(const RoutedExperts& p, WorkspaceCarver& ws, cudaStream_t stream) {
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
    comb.rows_dtype = DType::kF32;
    comb.rows = b.down;
    comb.num_rows = s.T * s.K;
    launch_combine(comb, stream);
    return;
  }
  // HOOK (issue 31, weight_quant.h): the contiguous FP8 grouped GEMMs run FP8 weights here.
  if (quantized(s.quant)) throw Error("moekit: internal: " + fp8_gemm_rejection());
  const PrePermuteArgs pre = pre_permute_args(s, p.hidden, p.topk_ids, b);
  moe_pre_permute(pre, stream);
  const int64_t P = pre.permuted.size(0);
  // The expert output overwrites the permuted input (dead after the first GEMM).
  run_expert_mlp_gemms(sorted_expert_gemms(s, b.permuted, b.layout_metadata, b.perm_act,
                                           p.w_gate_up, p.w_down, b.tile_counters),
                       p.experts, stream);
  if (p.addend == nullptr) {
    PostPermuteArgs post;
    post.expert_output = make_view(b.permuted, s.dtype, {P, s.H});
    post.topk_weights = make_view(p.topk_weights, DType::kF32, {s.T, s.K});
    post.inverse_indices = make_view(b.inverse, DType::kI32, {s.T * s.K});
    post.out = make_view(p.output, s.dtype, {s.T, s.H});
    moe_post_permute(post, stream);
  } else {
    comb.rows_dtype = s.dtype;
    comb.rows = b.permuted;
    comb.num_rows = P;
    comb.inverse = b.inverse;
    launch_combine(comb, stream);
  }
}

void run_routed_experts(const RoutedExperts& p, void* workspace, cudaStream_t stream) {
  WorkspaceCarver ws(workspace);
  run_routed_carved(p, ws, stream);
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
             " experts at T <= " + detail::str(detail::kDirectMaxTokens) +
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
  if (given != nullptr) {
    detail::check_plan(c, *given, detail::layer_plan_rejection(*given, p, device));
    return *given;
  }
  LayerPlan plan;
  if (tuned != nullptr && !detail::quantized(p.s.quant) && detail::tuning_tables_present() &&
      detail::tuned_layer_plan(detail::current_device_name(),
                               detail::layer_tuning_shape(tuned->op, p.s, tuned->routing, p.S),
                               p.s.T, device, &plan))
    return plan;
  detail::DirectCapacity capacity;
  if (p.S > 0 && !detail::quantized(p.shared_quant)) {
    capacity =
        detail::device_direct_capacity(detail::shared_mlp_problem(p.s, p.S, DType::kF32, device));
  }
  plan = detail::plan_layer(p, device, capacity);
  detail::check_quantized_plan(c, plan, p, device);
  return plan;
}

// ---- FusedMoEExpertsFwd / IndexedExpertMLPFwd ----

detail::RoutedOp experts_op(bool allow_direct) {
  return allow_direct ? detail::RoutedOp::kIndexed : detail::RoutedOp::kSortedOnly;
}

// hidden_states, w_gate_up and topk_ids: what the workspace size and the plan depend on.
detail::MoEShapes check_experts_shapes(const detail::ArgCheck& c, const FusedMoEExpertsArgs& a) {
  detail::MoEShapes s = detail::check_hidden(c, "hidden_states", a.hidden_states);
  s.quant = a.quant.scheme;
  detail::check_gate_up(c, s, "w_gate_up", a.w_gate_up, "hidden_states", a.hidden_states,
                        /*experts=*/true);
  detail::check_topk_ids(c, s, a.topk_ids);
  return s;
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

size_t experts_workspace_size(const char* op, const FusedMoEExpertsArgs& a, bool allow_direct) {
  return detail::workspace_query(op, [&](const detail::ArgCheck& c) {
    detail::MoEShapes s;
    const LayerPlan plan = experts_plan(c, a, allow_direct, s);
    return detail::routed_experts_workspace_size(s, plan.routed);
  });
}

LayerPlan plan_experts_op(const char* op, const FusedMoEExpertsArgs& a, bool allow_direct) {
  const detail::ArgCheck c(op, detail::ArgCheck::Mode::kShapesOnly);
  const detail::MoEShapes s = check_experts_shapes(c, a);
  const detail::LayerProblem p{s, experts_op(allow_direct), 0};
  const detail::GemmDevice device = detail::current_gemm_device();
  const LayerPlan plan = detail::plan_layer(p, device);
  detail::check_quantized_plan(c, plan, p, device);
  return plan;
}

std::vector<LayerPlan> experts_op_candidates(const char* op, const FusedMoEExpertsArgs& a,
                                             bool allow_direct) {
  const detail::ArgCheck c(op, detail::ArgCheck::Mode::kShapesOnly);
  const detail::MoEShapes s = check_experts_shapes(c, a);
  return detail::layer_plan_candidates({s, experts_op(allow_direct), 0},
                                       detail::current_gemm_device());
}

void run_experts_op(const char* op, const FusedMoEExpertsArgs& a, bool allow_direct,
                    cudaStream_t stream) {
  detail::ArgCheck c(op);
  detail::MoEShapes s;
  const LayerPlan plan = experts_plan(c, a, allow_direct, s);
  detail::log_op_plan(op, s, 0, plan);
  detail::check_down(c, s, "w_down", a.w_down, "hidden_states", a.hidden_states,
                     /*experts=*/true);
  detail::check_quant_scales(c, s, "quant", a.quant, /*experts=*/true);
  c.tensor("topk_weights", a.topk_weights, {DType::kF32}, {s.T, s.K});
  detail::check_output(c, "output", a.output, s, "hidden_states", a.hidden_states);
  const size_t needed = detail::routed_experts_workspace_size(s, plan.routed);
  c.workspace(a.workspace, needed);
  // In place (output == hidden_states) works: the hidden states are read by the first
  // kernel (the gather or the direct gate/up stage), the output written by the last.
  const detail::ArgCheck::Arg out{"output", a.output};
  const detail::ArgCheck::Arg in{"hidden_states", a.hidden_states};
  c.outputs_disjoint({out},
                     {in,
                      {"w_gate_up", a.w_gate_up},
                      {"w_down", a.w_down},
                      {"quant.w_gate_up_scale", a.quant.w_gate_up_scale},
                      {"quant.w_down_scale", a.quant.w_down_scale},
                      {"topk_weights", a.topk_weights},
                      {"topk_ids", a.topk_ids}},
                     a.workspace, &out, &in);
  if (s.T == 0) return;
  c.launch_target(stream, "output", a.output);
  detail::RoutedExperts p;
  p.s = s;
  p.routed = plan.routed;
  p.experts = plan.experts;
  p.hidden = a.hidden_states.data;
  p.w_gate_up = a.w_gate_up.data;
  p.w_down = a.w_down.data;
  p.scales = detail::weight_scales(a.quant);
  p.topk_weights = static_cast<const float*>(a.topk_weights.data);
  p.topk_ids = static_cast<const int32_t*>(a.topk_ids.data);
  p.output = a.output.data;
  detail::run_composite(op, [&] { detail::run_routed_experts(p, a.workspace.data, stream); });
}

constexpr const char* kExpertsOp = "fused_moe_experts";
constexpr const char* kIndexedOp = "indexed_expert_mlp";

}  // namespace

size_t fused_moe_experts_workspace_size(const FusedMoEExpertsArgs& args) {
  return experts_workspace_size(kExpertsOp, args, /*allow_direct=*/false);
}

void fused_moe_experts(const FusedMoEExpertsArgs& args, cudaStream_t stream) {
  run_experts_op(kExpertsOp, args, /*allow_direct=*/false, stream);
}

LayerPlan plan_fused_moe_experts(const FusedMoEExpertsArgs& args) {
  return plan_experts_op(kExpertsOp, args, /*allow_direct=*/false);
}

std::vector<LayerPlan> fused_moe_experts_plan_candidates(const FusedMoEExpertsArgs& args) {
  return experts_op_candidates(kExpertsOp, args, /*allow_direct=*/false);
}

size_t indexed_expert_mlp_workspace_size(const IndexedExpertMLPArgs& args) {
  return experts_workspace_size(kIndexedOp, args, /*allow_direct=*/true);
}

void indexed_expert_mlp(const IndexedExpertMLPArgs& args, cudaStream_t stream) {
  run_experts_op(kIndexedOp, args, /*allow_direct=*/true, stream);
}

LayerPlan plan_indexed_expert_mlp(const IndexedExpertMLPArgs& args) {
  return plan_experts_op(kIndexedOp, args, /*allow_direct=*/true);
}

std::vector<LayerPlan> indexed_expert_mlp_plan_candidates(const IndexedExpertMLPArgs& args) {
  return experts_op_candidates(kIndexedOp, args, /*allow_direct=*/true);
}

// ---- FusedMoEFwd / FusedMoESharedExpertFwd ----

namespace {

struct LayerBuffers {
  float* topk_weights = nullptr;   // [T, K]
  int32_t* topk_ids = nullptr;     // [T, K]
  void* shared_act = nullptr;      // [T, S] dtype (shared expert only)
  float* shared_out = nullptr;     // [T, H] f32 (shared expert only)
  void* shared_scratch = nullptr;  // the shared MLP's stream-K scratch, if it takes that path
};

// Topk buffers, then (shared expert) its activation and f32 output, then the
// routed-experts buffers.
LayerBuffers carve_layer(const detail::MoEShapes& s, int64_t S, detail::WorkspaceCarver& ws) {
  LayerBuffers b;
  b.topk_weights = static_cast<float*>(ws.take(static_cast<size_t>(s.T * s.K) * 4));
  b.topk_ids = static_cast<int32_t*>(ws.take(static_cast<size_t>(s.T * s.K) * 4));
  if (S > 0) {
    b.shared_act = ws.take(static_cast<size_t>(s.T * S) * dtype_size(s.dtype));
    b.shared_out = static_cast<float*>(ws.take(static_cast<size_t>(s.T * s.H) * 4));
    b.shared_scratch = detail::take_dense_mlp_scratch(ws, s.dtype, s.T, s.H, S);
  }
  return b;
}

size_t layer_workspace_size(const detail::MoEShapes& s, int64_t S, RoutedPath routed) {
  if (s.T == 0) return 0;
  detail::WorkspaceCarver ws(nullptr);
  carve_layer(s, S, ws);
  ws.take(detail::routed_experts_workspace_size(s, routed));
  return ws.bytes();
}

// hidden_states, w_gate_up and top_k: what the routed layer's workspace size depends on.
detail::MoEShapes check_layer_shapes(const detail::ArgCheck& c, const FusedMoEArgs& a) {
  detail::MoEShapes s = detail::check_hidden(c, "hidden_states", a.hidden_states);
  s.quant = a.quant.scheme;
  detail::check_gate_up(c, s, "w_gate_up", a.w_gate_up, "hidden_states", a.hidden_states,
                        /*experts=*/true);
  const int K = a.params.top_k;
  MOEKIT_REQUIRE(
      c, K >= 1 && K <= detail::kTopKMaxK && K <= s.E, "top_k",
      "1 to min(" + detail::str(detail::kTopKMaxK) + ", num_experts=" + detail::str(s.E) + ")",
      detail::str(K));
  s.K = K;
  MOEKIT_REQUIRE(c, s.T * s.K <= INT32_MAX, "hidden_states", "at most 2^31-1 routes (T*top_k)",
                 a.hidden_states.describe());
  // The routing's limit, below both paths' (so no path check).
  MOEKIT_REQUIRE(
      c, s.E <= detail::kTopKMaxExperts, "w_gate_up",
      "at most " + detail::str(detail::kTopKMaxExperts) + " experts (dim 0; the routing's limit)",
      a.w_gate_up.describe());
  return s;
}

// The shared expert's width S (0: none) from shared_w_gate_up [2S, H], when given.
int64_t check_shared_width(const detail::ArgCheck& c, const detail::MoEShapes& s,
                           const FusedMoESharedExpertArgs& a) {
  if (!a.shared_w_gate_up.defined()) return 0;
  detail::MoEShapes shared = s;
  shared.quant = a.shared_quant.scheme;
  detail::check_gate_up(c, shared, "shared_w_gate_up", a.shared_w_gate_up, "hidden_states",
                        a.moe.hidden_states, /*experts=*/false);
  return shared.F;
}

size_t layer_workspace_query(const char* op, const FusedMoEArgs& a,
                             const FusedMoESharedExpertArgs* shared) {
  return detail::workspace_query(op, [&](const detail::ArgCheck& c) {
    const detail::MoEShapes s = check_layer_shapes(c, a);
    const int64_t S = shared ? check_shared_width(c, s, *shared) : 0;
    const QuantScheme shared_quant = shared ? shared->shared_quant.scheme : QuantScheme::kNone;
    const TunedOp tuned{op, a.params};
    const LayerPlan plan =
        layer_plan(c, a.plan, {s, detail::RoutedOp::kLayer, S, shared_quant}, &tuned);
    return layer_workspace_size(s, S, plan.routed);
  });
}

detail::MoEShapes check_layer_args(const detail::ArgCheck& c, const FusedMoEArgs& a) {
  detail::MoEShapes s = check_layer_shapes(c, a);
  detail::check_down(c, s, "w_down", a.w_down, "hidden_states", a.hidden_states, /*experts=*/true);
  detail::check_quant_scales(c, s, "quant", a.quant, /*experts=*/true);
  c.tensor("gating_output", a.gating_output, {DType::kBF16, DType::kF16, DType::kF32}, {s.T, s.E});
  // The routing checks of fused_topk, reported under this op's name.
  detail::check_routing_inputs(c, a.gating_output, a.correction_bias, a.params);
  detail::check_output(c, "output", a.output, s, "hidden_states", a.hidden_states);
  return s;
}

// The layer's memory rule: output may be hidden_states itself (every kernel that reads
// the hidden states runs before the last one, which writes the output), else disjoint
// from every input and the workspace.
void check_layer_memory(const detail::ArgCheck& c, const FusedMoEArgs& a, const TensorView& s_gu,
                        const TensorView& s_down) {
  const detail::ArgCheck::Arg out{"output", a.output};
  const detail::ArgCheck::Arg in{"hidden_states", a.hidden_states};
  c.outputs_disjoint({out},
                     {in,
                      {"gating_output", a.gating_output},
                      {"correction_bias", a.correction_bias},
                      {"w_gate_up", a.w_gate_up},
                      {"w_down", a.w_down},
                      {"quant.w_gate_up_scale", a.quant.w_gate_up_scale},
                      {"quant.w_down_scale", a.quant.w_down_scale},
                      {"shared_w_gate_up", s_gu},
                      {"shared_w_down", s_down}},
                     a.workspace, &out, &in);
}

// Routing (the FusedTopK kernel into the workspace), optional shared MLP, routed experts.
void run_layer(const FusedMoEArgs& a, const LayerPlan& plan, const detail::MoEShapes& s,
               const TensorView* shared_gu, const TensorView* shared_down,
               const WeightQuant* shared_quant, int64_t S, cudaStream_t stream) {
  detail::WorkspaceCarver ws(a.workspace.data);
  LayerBuffers b = carve_layer(s, S, ws);
  // The routing inputs were validated under the layer op's name (check_layer_args).
  detail::FusedTopKLaunch topk;
  topk.gating = a.gating_output.data;
  topk.dtype = a.gating_output.dtype;
  topk.bias = a.correction_bias.defined() ? a.correction_bias.ptr<const float>() : nullptr;
  topk.num_tokens = s.T;
  topk.num_experts = static_cast<int>(s.E);
  topk.params = a.params;
  topk.topk_weights = b.topk_weights;
  topk.topk_ids = b.topk_ids;
  detail::launch_fused_topk(topk, stream);
  if (S > 0) {
    // The shared expert's output stays f32 and is added in the routed combine, so
    // the layer output is rounded once.
    detail::run_shared_mlp(plan.shared, s, S, shared_quant->scheme, DType::kF32,
                           a.hidden_states.data, shared_gu->data, shared_down->data,
                           detail::weight_scales(*shared_quant), b.shared_act, b.shared_out,
                           b.shared_scratch, stream, "fused_moe_shared_expert");
  }
  detail::RoutedExperts p;
  p.s = s;
  p.routed = plan.routed;
  p.experts = plan.experts;
  p.hidden = a.hidden_states.data;
  p.w_gate_up = a.w_gate_up.data;
  p.w_down = a.w_down.data;
  p.scales = detail::weight_scales(a.quant);
  p.topk_weights = b.topk_weights;
  p.topk_ids = b.topk_ids;
  p.addend = b.shared_out;
  p.output = a.output.data;
  detail::run_routed_carved(p, ws, stream);
}

}  // namespace

namespace {

constexpr const char* kLayerOp = "fused_moe";
constexpr const char* kSharedLayerOp = "fused_moe_shared_expert";

detail::LayerProblem layer_problem(const char* op, const FusedMoEArgs& a,
                                   const FusedMoESharedExpertArgs* shared) {
  const detail::ArgCheck c(op, detail::ArgCheck::Mode::kShapesOnly);
  const detail::MoEShapes s = check_layer_shapes(c, a);
  if (shared == nullptr) return {s, detail::RoutedOp::kLayer, 0};
  return {s, detail::RoutedOp::kLayer, check_shared_width(c, s, *shared),
          shared->shared_quant.scheme};
}

}  // namespace

size_t fused_moe_workspace_size(const FusedMoEArgs& args) {
  return layer_workspace_query(kLayerOp, args, nullptr);
}

LayerPlan plan_fused_moe(const FusedMoEArgs& args) {
  const detail::ArgCheck c(kLayerOp, detail::ArgCheck::Mode::kShapesOnly);
  const TunedOp tuned{kLayerOp, args.params};
  return layer_plan(c, nullptr, layer_problem(kLayerOp, args, nullptr), &tuned);
}

std::vector<LayerPlan> fused_moe_plan_candidates(const FusedMoEArgs& args) {
  return detail::layer_plan_candidates(layer_problem(kLayerOp, args, nullptr),
                                       detail::current_gemm_device());
}

void fused_moe(const FusedMoEArgs& args, cudaStream_t stream) {
  detail::ArgCheck c(kLayerOp);
  const detail::MoEShapes s = check_layer_args(c, args);
  const TunedOp tuned{kLayerOp, args.params};
  const LayerPlan plan = layer_plan(c, args.plan, {s, detail::RoutedOp::kLayer, 0}, &tuned);
  detail::log_op_plan(kLayerOp, s, 0, plan);
  const size_t needed = layer_workspace_size(s, 0, plan.routed);
  c.workspace(args.workspace, needed);
  check_layer_memory(c, args, TensorView{}, TensorView{});
  if (s.T == 0) return;
  c.launch_target(stream, "output", args.output);
  detail::run_composite(kLayerOp,
                        [&] { run_layer(args, plan, s, nullptr, nullptr, nullptr, 0, stream); });
}

size_t fused_moe_shared_expert_workspace_size(const FusedMoESharedExpertArgs& args) {
  return layer_workspace_query(kSharedLayerOp, args.moe, &args);
}

LayerPlan plan_fused_moe_shared_expert(const FusedMoESharedExpertArgs& args) {
  const detail::ArgCheck c(kSharedLayerOp, detail::ArgCheck::Mode::kShapesOnly);
  const TunedOp tuned{kSharedLayerOp, args.moe.params};
  return layer_plan(c, nullptr, layer_problem(kSharedLayerOp, args.moe, &args), &tuned);
}

std::vector<LayerPlan> fused_moe_shared_expert_plan_candidates(
    const FusedMoESharedExpertArgs& args) {
  return detail::layer_plan_candidates(layer_problem(kSharedLayerOp, args.moe, &args),
                                       detail::current_gemm_device());
}

void fused_moe_shared_expert(const FusedMoESharedExpertArgs& args, cudaStream_t stream) {
  detail::ArgCheck c(kSharedLayerOp);
  const detail::MoEShapes s = check_layer_args(c, args.moe);
  // Both shared weights absent: no shared expert, the routed layer alone (a model whose
  // layer has none can call one entry point). One of the two alone is an error.
  const bool has_shared = args.shared_w_gate_up.defined() || args.shared_w_down.defined();
  int64_t S = 0;
  if (has_shared) {
    detail::MoEShapes shared = s;
    shared.quant = args.shared_quant.scheme;
    detail::check_mlp_weights(c, shared, "shared_w_gate_up", args.shared_w_gate_up, "shared_w_down",
                              args.shared_w_down, "hidden_states", args.moe.hidden_states,
                              /*experts=*/false);
    detail::check_quant_scales(c, shared, "shared_quant", args.shared_quant, /*experts=*/false);
    S = shared.F;
  } else {
    MOEKIT_REQUIRE(c, !detail::quantized(args.shared_quant.scheme), "shared_quant",
                   "scheme none without shared weights",
                   std::string("scheme ") + quant_scheme_name(args.shared_quant.scheme));
  }
  const TunedOp tuned{kSharedLayerOp, args.moe.params};
  const LayerPlan plan = layer_plan(
      c, args.moe.plan, {s, detail::RoutedOp::kLayer, S, args.shared_quant.scheme}, &tuned);
  detail::log_op_plan(kSharedLayerOp, s, S, plan);
  const size_t needed = layer_workspace_size(s, S, plan.routed);
  c.workspace(args.moe.workspace, needed);
  check_layer_memory(c, args.moe, args.shared_w_gate_up, args.shared_w_down);
  if (s.T == 0) return;
  c.launch_target(stream, "output", args.moe.output);
  detail::run_composite(kSharedLayerOp, [&] {
    if (has_shared) {
      run_layer(args.moe, plan, s, &args.shared_w_gate_up, &args.shared_w_down, &args.shared_quant,
                S, stream);
    } else {
      run_layer(args.moe, plan, s, nullptr, nullptr, nullptr, 0, stream);
    }
  });
}

}  // namespace moekit
