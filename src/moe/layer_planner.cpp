// The layer planner: the routed path rules of docs/moe.md ("fused_moe", "indexed_expert_mlp").
#include "moe/layer_planner.h"

#include "gemm/gemm_planner.h"
#include "mlp/dense_mlp.h"
#include "moe/fp8_mlp.h"
#include "moe/moe_validate.h"
#include "permute/permute_kernels.h"

namespace moekit::detail {
namespace {

// The layer ops take the direct path for small batches with few routes per expert: past
// them the sorted path wins (docs/moe.md "fused_moe"; the tuning runs of the seed models on
// the H200 and the H100): from T = 48 on large layers (E = 160-384, 5%-18%), and from ~5
// routes an expert on 16-expert layers (the direct path's 8-route chunks re-read each weight
// tile). Qwen3-30B sorts from T ~ 10 already (3%-6%), which this rule leaves.
constexpr int64_t kDirectMaxRoutesPerExpert = 4;
constexpr int64_t kDirectRuleMaxTokens = 32;

// FP8 weights take the direct path (the FP8 direct kernels) wherever it can run to T = 64
// (indexed_expert_mlp and the layers alike).
// Past 64 tokens (to kFp8DirectMaxTokens) only where it won the H200 A/B (results/h200/ab.md,
// 2026-12-07: 0.56x-0.93x of the sorted FP8 GEMMs at T = 72-128 on six layers with F = 128-768):
// per-tensor / per-channel scales, F <= 768 (the sorted path's down GEMM has few k steps a
// tile, so its tiles' fixed costs dominate) and <= 8 routes an expert on average (one 8-route
// chunk, each weight tile streamed about once). DeepSeek-V3's block-scaled layer (F = 2048)
// ran 1.13x-1.41x slower there on the direct path. Else the sorted path's FP8 GEMMs
// (fp8_mlp.h).
constexpr int64_t kFp8DirectMaxRoutesPerExpert = 8;
constexpr int64_t kFp8DirectMaxF = 768;

bool fp8_takes_direct(const MoEShapes& s) {
  if (s.T <= kDirectMaxTokens) return true;
  return s.quant != QuantScheme::kFp8Block128 && s.F <= kFp8DirectMaxF &&
         s.T * s.K <= kFp8DirectMaxRoutesPerExpert * s.E;
}

// FP8 weights past the direct path with per-channel / per-tensor scales, F <= 128 and <= 16
// routes an expert on average: the weight-only GEMMs (bf16 rows, decode_persistent's e4m3
// tiles, 32 x 256; fp8_mlp.h). H100 A/Bs (results/h100/ab.md, 2026-12-07): on 32 x 128 tiles
// 0.60x-0.76x of the FP8 GEMMs' time on the decoding PR's F = 128 layers (E = 257 at
// T = 192-512, E = 513 at T = 192-1024), whose FP8 down GEMM runs one 128-k step a 128 x 128
// tile, and 32 x 256 tiles 0.75x-0.81x of 32 x 128 there; past 16 routes an expert 1.08x-1.5x
// (E = 257 at T = 1024-2048; E = 513 at T = 4096), though E = 513 at T = 2048 (32) won 0.96x.
// At F = 192 (hunyuan3: 1.30x-1.37x, 1.5 tiles of 256 a gate/up row pair) and F = 384-512
// (0.93x-1.44x, one count won) they lost or tied.
constexpr int64_t kFp8WeightOnlyMaxF = 128;
constexpr int64_t kFp8WeightOnlyMaxRoutesPerExpert = 16;
// Between 64 and 128 tokens the same GEMMs beat the FP8 direct kernels from ~2 routes an
// expert (H100, same A/B: E = 257, F = 128 at T = 96 / 128, 3.0 / 4.0 routes, 0.90x / 0.81x
// of direct; E = 513 at T = 96, 1.5 routes, 0.99x).
constexpr int64_t kFp8WeightOnlyOverDirectMinRoutes = 2;

bool fp8_takes_weight_only(const MoEShapes& s) {
  return s.quant != QuantScheme::kFp8Block128 && s.F <= kFp8WeightOnlyMaxF &&
         s.T * s.K <= kFp8WeightOnlyMaxRoutesPerExpert * s.E;
}

bool fp8_weight_only_runs(const MoEShapes& s, const GemmDevice& device) {
  return fp8_takes_weight_only(s) &&
         fp8_mlp_plan_rejection(fp8_weight_only_plan(), sorted_fp8_shapes(s), device).empty();
}

// The sorted path's expert MLP with FP8 weights: the weight-only GEMMs by the rule above where
// they can run, else the FP8 GEMMs.
MlpPlan plan_sorted_fp8(const MoEShapes& s, const GemmDevice& device) {
  if (fp8_weight_only_runs(s, device)) return fp8_weight_only_plan();
  return plan_fp8_mlp(sorted_fp8_shapes(s), device);
}

// Past 64 tokens the weight-only GEMMs where they beat the direct kernels (above).
bool fp8_weight_only_beats_direct(const MoEShapes& s, const GemmDevice& device) {
  return quantized(s.quant) && s.T > kDirectMaxTokens &&
         s.T * s.K >= kFp8WeightOnlyOverDirectMinRoutes * s.E && fp8_weight_only_runs(s, device);
}

bool takes_direct(const LayerProblem& p) {
  switch (p.op) {
    case RoutedOp::kSortedOnly:
      return false;
    case RoutedOp::kIndexed:
      return direct_path_eligible(p.s) && (!quantized(p.s.quant) || fp8_takes_direct(p.s));
    case RoutedOp::kLayer:
      return direct_path_eligible(p.s) &&
             (quantized(p.s.quant) ? fp8_takes_direct(p.s)
                                   : (p.s.T <= kDirectRuleMaxTokens &&
                                      p.s.T * p.s.K <= kDirectMaxRoutesPerExpert * p.s.E));
  }
  return false;
}

// The sorted path's expert-MLP GEMMs for planning: the planners compare the pointers (which
// buffers alias), never read them; without counters, stand-ins mark them given.
ExpertMlpGemms planning_gemms(const MoEShapes& s) {
  static char permuted, meta, act, weights;
  return sorted_expert_gemms(s, &permuted, reinterpret_cast<const int32_t*>(&meta), &act, &weights,
                             &weights, nullptr);
}

std::string direct_rejection(const LayerProblem& p);

std::string sorted_rejection(const LayerPlan& plan, const LayerProblem& p,
                             const GemmDevice& device) {
  if (p.s.E > kPermuteMaxExperts)
    return "the sorted path takes at most " + str(kPermuteMaxExperts) + " experts, not " +
           str(p.s.E);
  if (quantized(p.s.quant)) {
    const std::string why = fp8_mlp_plan_rejection(plan.experts, sorted_fp8_shapes(p.s), device);
    return why.empty() ? why : "the FP8 expert MLP: " + why;
  }
  const auto [up, down] = expert_mlp_problems(planning_gemms(p.s));
  std::string why = expert_mlp_general_rejection(plan.experts, p.s.mlp);
  if (why.empty()) why = mlp_gemms_plan_rejection(plan.experts, up, down, device);
  return why.empty() ? why : "the expert MLP: " + why;
}

std::string direct_rejection(const LayerProblem& p) {
  if (p.op == RoutedOp::kSortedOnly)
    return "fused_moe_experts and moe_expert_mlp run only the sorted path";
  const std::string why = direct_path_rejection(p.s);
  return why.empty() ? why : "the direct path cannot run " + why;
}

}  // namespace

std::string direct_path_rejection(const MoEShapes& s) {
  if (s.mlp.general())
    return std::string("activation ") + activation_name(s.mlp.act) +
           (s.mlp.gate_up_bias || s.mlp.down_bias ? " with biases" : "") +
           " (the direct kernels run silu_and_mul without biases)";
  if (s.T > direct_max_tokens(s)) return "T = " + str(s.T) + " > " + str(direct_max_tokens(s));
  if (s.T * s.K > kDirectMaxRoutes)
    return "T*top_k = " + str(s.T * s.K) + " > " + str(kDirectMaxRoutes);
  if (s.E > kDirectMaxExperts) return "E = " + str(s.E) + " > " + str(kDirectMaxExperts);
  if (!direct_weight_offsets_fit(s.F, s.H)) return "2*F*H = " + str(2 * s.F * s.H) + " >= 2^31";
  return {};
}

std::string shape_key(const MoEShapes& s, int64_t S) {
  std::string key = std::string(dtype_name(s.dtype)) + " T=" + str(s.T) + " H=" + str(s.H);
  if (s.E > 0) key += " E=" + str(s.E) + " F=" + str(s.F) + " K=" + str(s.K);
  if (S > 0) key += " S=" + str(S);
  if (s.mlp.general()) {
    key += std::string(" act=") + activation_name(s.mlp.act);
    if (s.mlp.gate_up_bias || s.mlp.down_bias) key += " bias";
  }
  if (quantized(s.quant)) key += std::string(" w=") + quant_scheme_name(s.quant);
  return key;
}

int64_t sorted_rows(const MoEShapes& s) {
  return permuted_rows(s.T, static_cast<int>(s.K), static_cast<int>(s.E), kSortedAlignment);
}

DenseMlpProblem shared_mlp_problem(const MoEShapes& s, int64_t S, DType out_dtype,
                                   const GemmDevice& device, const MlpActivation& mlp) {
  DenseMlpProblem p;
  p.mlp = mlp;
  p.dtype = s.dtype;
  p.out_dtype = out_dtype;
  p.T = s.T;
  p.H = s.H;
  p.S = S;
  p.streamk_scratch = dense_mlp_scratch_bytes(s.dtype, s.T, s.H, S, device.props) > 0;
  return p;
}

ExpertMlpGemms sorted_expert_gemms(const MoEShapes& s, void* permuted,
                                   const int32_t* layout_metadata, void* act, const void* w_gate_up,
                                   const void* w_down, void* tile_counters) {
  ExpertMlpGemms g;
  g.dtype = s.dtype;
  g.in = permuted;
  g.P = sorted_rows(s);
  g.E = s.E;
  g.H = s.H;
  g.F = s.F;
  g.layout_metadata = layout_metadata;
  g.alignment = kSortedAlignment;
  g.w_gate_up = w_gate_up;
  g.w_down = w_down;
  g.act = act;
  g.out = permuted;
  g.routed_counts = true;  // ragged, skewed counts from top-k routing
  g.counters = tile_counters;
  g.mlp = s.mlp;  // the caller sets the general path's pre buffer and biases
  return g;
}

MlpPlan fp8_dense_mlp_plan() {
  MlpPlan m;
  m.path = MlpPath::kDirect;
  m.split_gate_up = 1;
  m.split_down = 1;
  return m;
}

std::string fp8_dense_direct_rejection(int64_t T, int64_t H, int64_t S) {
  if (T > kDirectMaxTokens) return "T = " + str(T) + " > " + str(kDirectMaxTokens);
  if (!direct_weight_offsets_fit(S, H))
    return "2*S*H = " + str(2 * S * H) + " >= 2^31: its weight offsets are 32-bit";
  return {};
}

bool fp8_dense_uses_gemm(int64_t T, int64_t H, int64_t S) {
  return !fp8_dense_direct_rejection(T, H, S).empty();
}

Fp8MlpShapes fp8_mlp_shapes(const MoEShapes& s, int64_t P, int64_t E, int64_t F, QuantScheme scheme,
                            int alignment) {
  Fp8MlpShapes f;
  f.dtype = s.dtype;
  f.P = P;
  f.E = E;
  f.H = s.H;
  f.F = F;
  f.scheme = scheme;
  f.static_act = s.static_act;
  f.alignment = alignment;
  return f;
}

Fp8MlpShapes dense_fp8_shapes(const MoEShapes& s, int64_t S, QuantScheme quant) {
  return fp8_mlp_shapes(s, s.T, 1, S, quant, 1);
}

Fp8MlpShapes sorted_fp8_shapes(const MoEShapes& s) {
  Fp8MlpShapes f = fp8_mlp_shapes(s, sorted_rows(s), s.E, s.F, s.quant, kSortedAlignment);
  f.weight_only_ok = true;
  return f;
}

MlpPlan plan_fp8_dense_mlp(const MoEShapes& s, int64_t S, QuantScheme quant,
                           const GemmDevice& device) {
  if (!fp8_dense_uses_gemm(s.T, s.H, S)) return fp8_dense_mlp_plan();
  return plan_fp8_mlp(dense_fp8_shapes(s, S, quant), device);
}

std::vector<MlpPlan> fp8_dense_mlp_plan_candidates(const MoEShapes& s, int64_t S, QuantScheme quant,
                                                   const GemmDevice& device) {
  if (!fp8_dense_uses_gemm(s.T, s.H, S)) return {fp8_dense_mlp_plan()};
  return fp8_mlp_plan_candidates(dense_fp8_shapes(s, S, quant), device);
}

std::string fp8_dense_mlp_plan_rejection(const MlpPlan& plan, const MoEShapes& s, int64_t S,
                                         QuantScheme quant, const GemmDevice& device) {
  const std::string past_direct = fp8_dense_direct_rejection(s.T, s.H, S);
  if (past_direct.empty()) {
    if (plan != fp8_dense_mlp_plan())
      return "FP8 weights at T <= " + str(kDirectMaxTokens) + " and 2*S*H < 2^31" +
             " run on the FP8 direct kernel, plan " + to_string(fp8_dense_mlp_plan());
    return {};
  }
  const std::string why = fp8_mlp_plan_rejection(plan, dense_fp8_shapes(s, S, quant), device);
  return why.empty() ? why : "FP8 weights past the FP8 direct kernel (" + past_direct + "): " + why;
}

MlpPlan plan_shared_mlp(const MoEShapes& s, int64_t S, QuantScheme quant, const MlpActivation& mlp,
                        DType out_dtype, const GemmDevice& device, const DirectCapacity& capacity) {
  if (quantized(quant)) return plan_fp8_dense_mlp(s, S, quant, device);
  return plan_dense_mlp(shared_mlp_problem(s, S, out_dtype, device, mlp), device, capacity);
}

std::vector<MlpPlan> shared_mlp_plan_candidates(const MoEShapes& s, int64_t S, QuantScheme quant,
                                                const MlpActivation& mlp, DType out_dtype,
                                                const GemmDevice& device) {
  if (quantized(quant)) return fp8_dense_mlp_plan_candidates(s, S, quant, device);
  return dense_mlp_plan_candidates(shared_mlp_problem(s, S, out_dtype, device, mlp), device);
}

std::string shared_mlp_plan_rejection(const MlpPlan& plan, const MoEShapes& s, int64_t S,
                                      QuantScheme quant, const MlpActivation& mlp, DType out_dtype,
                                      const GemmDevice& device) {
  if (quantized(quant)) return fp8_dense_mlp_plan_rejection(plan, s, S, quant, device);
  return dense_mlp_plan_rejection(plan, shared_mlp_problem(s, S, out_dtype, device, mlp), device);
}

DirectCapacity shared_mlp_capacity(const MoEShapes& s, int64_t S, QuantScheme quant,
                                   const MlpActivation& mlp, DType out_dtype,
                                   const GemmDevice& device) {
  if (S == 0 || quantized(quant)) return {};
  return device_direct_capacity(shared_mlp_problem(s, S, out_dtype, device, mlp));
}

void run_shared_mlp(const MlpPlan& plan, const MoEShapes& s, int64_t S, DType out_dtype,
                    const void* x, const SharedMlpWeights& w, const SharedMlpBuffers& b, void* out,
                    cudaStream_t stream, const char* op) {
  if (!quantized(w.quant)) {
    run_dense_mlp(plan, shared_mlp_problem(s, S, out_dtype, current_gemm_device(), w.mlp), x,
                  w.w_gate_up, w.w_down, b.act, out, b.scratch, stream, w.biases, b.pre, op);
    return;
  }
  if (plan.path == MlpPath::kTwoGemms) {  // past the decode kernel: the FP8 GEMMs, 1 group
    const Fp8MlpShapes fs = dense_fp8_shapes(s, S, w.quant);
    quantize_fp8_input(fs, x, w.scales.a_gate_up, {}, b.fp8, b.q_in, stream);
    void* bf16_out = out_dtype == DType::kBF16 ? out : b.out_bf16;
    run_fp8_mlp({fs, plan, b.q_in, nullptr, w.w_gate_up, w.w_down, w.scales, b.fp8, bf16_out},
                stream);
    if (out_dtype != DType::kBF16) launch_cast_bf16(b.out_bf16, s.T * s.H, out, out_dtype, stream);
    return;
  }
  MoEShapes d;  // the dense form: T routes of one expert (silu_and_mul, no biases: validated)
  d.dtype = s.dtype;
  d.T = s.T;
  d.H = s.H;
  d.E = 1;
  d.F = S;
  d.K = 1;
  d.quant = w.quant;
  launch_direct_fp8_gate_up(d, x, w.w_gate_up, w.scales, nullptr, b.act, stream, op);
  launch_direct_fp8_down(d, b.act, w.w_down, w.scales, nullptr, out, out_dtype, stream, op);
}

void carve_shared_fp8(const MoEShapes& s, int64_t S, QuantScheme quant, DType out_dtype,
                      SharedMlpBuffers& b, WorkspaceCarver& ws) {
  if (!quantized(quant) || !fp8_dense_uses_gemm(s.T, s.H, S)) return;
  b.q_in = ws.take(static_cast<size_t>(s.T * s.H));
  b.fp8 = carve_fp8_mlp(dense_fp8_shapes(s, S, quant), /*dense=*/true, ws);
  if (out_dtype != DType::kBF16) b.out_bf16 = ws.take(static_cast<size_t>(s.T * s.H) * 2);
}

LayerPlan plan_layer(const LayerProblem& p, const GemmDevice& device,
                     const DirectCapacity& shared_capacity) {
  LayerPlan plan;
  if (takes_direct(p) && !fp8_weight_only_beats_direct(p.s, device)) {
    plan.routed = RoutedPath::kDirect;
  } else {
    plan.routed = RoutedPath::kSorted;
    plan.experts = quantized(p.s.quant) ? plan_sorted_fp8(p.s, device)
                                        : plan_expert_mlp_gemms(planning_gemms(p.s), device);
    // FP8 weights where the sorted path's FP8 GEMMs cannot run (they need sm_90): the direct
    // kernels wherever they can, rather than a refusal.
    if (quantized(p.s.quant) && p.op != RoutedOp::kSortedOnly && direct_path_eligible(p.s) &&
        !fp8_mlp_plan_rejection(plan.experts, sorted_fp8_shapes(p.s), device).empty()) {
      plan.routed = RoutedPath::kDirect;
      plan.experts = MlpPlan();
    }
  }
  plan.has_shared = p.S > 0;
  if (plan.has_shared)
    plan.shared = plan_shared_mlp(shared_shapes(p.s, p.shared_static_act), p.S, p.shared_quant,
                                  p.shared_mlp, DType::kF32, device, shared_capacity);
  return plan;
}

std::vector<LayerPlan> layer_plan_candidates(const LayerProblem& p, const GemmDevice& device) {
  // Each part varied with the others as planned (the routed path with its expert MLP, then
  // the shared expert's plan): a sum of the parts' candidates, not their product.
  const LayerPlan planned = plan_layer(p, device);
  std::vector<LayerPlan> out;
  const auto add = [&out](const LayerPlan& plan) {
    for (const LayerPlan& o : out)
      if (o == plan) return;
    out.push_back(plan);
  };
  if (direct_rejection(p).empty()) {
    LayerPlan direct = planned;
    direct.routed = RoutedPath::kDirect;
    direct.experts = MlpPlan();
    add(direct);
  }
  if (p.s.E <= kPermuteMaxExperts) {
    for (const MlpPlan& m : quantized(p.s.quant)
                                ? fp8_mlp_plan_candidates(sorted_fp8_shapes(p.s), device)
                                : expert_mlp_gemms_plan_candidates(planning_gemms(p.s), device)) {
      LayerPlan sorted = planned;
      sorted.routed = RoutedPath::kSorted;
      sorted.experts = m;
      add(sorted);
    }
  }
  if (p.S == 0) return out;
  const size_t routed = out.size();
  for (const MlpPlan& shared :
       shared_mlp_plan_candidates(shared_shapes(p.s, p.shared_static_act), p.S, p.shared_quant,
                                  p.shared_mlp, DType::kF32, device)) {
    for (size_t i = 0; i < routed; ++i) {
      if (out[i].routed != planned.routed || out[i].experts != planned.experts) continue;
      LayerPlan plan = out[i];
      plan.shared = shared;
      add(plan);
    }
  }
  return out;
}

std::string layer_plan_rejection(const LayerPlan& plan, const LayerProblem& p,
                                 const GemmDevice& device) {
  const std::string routed =
      plan.routed == RoutedPath::kDirect ? direct_rejection(p) : sorted_rejection(plan, p, device);
  if (!routed.empty()) return routed;
  if (plan.has_shared != (p.S > 0))
    return p.S > 0 ? "the layer has a shared expert: the plan needs its MLP"
                   : "the layer has no shared expert";
  if (!plan.has_shared) return {};
  const std::string shared =
      shared_mlp_plan_rejection(plan.shared, shared_shapes(p.s, p.shared_static_act), p.S,
                                p.shared_quant, p.shared_mlp, DType::kF32, device);
  return shared.empty() ? shared : "the shared expert: " + shared;
}

}  // namespace moekit::detail
