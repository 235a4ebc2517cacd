// The sweep's token-indexed MoE cases: FusedMoEExpertsFwd, IndexedExpertMLPFwd, FusedMoEFwd,
// FusedMoESharedExpertFwd and SharedExpertMLPFwd. Every output row must be written (the
// poison is NaN); sampled tokens are compared with the reference.
#include <algorithm>

#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/gpu_reference.h"
#include "sweep_ops.h"
#include "sweep_paths.h"
#include "sweep_run.h"

namespace moekit::sweep {
namespace {

// Whether a layer plan's routed experts run the FP8 GEMMs, which quantize their rows (the
// weight-only GEMMs, decode_persistent with e4m3 weights, keep them bf16).
bool sorted_on_fp8_gemms(const LayerPlan& plan) {
  return plan.routed == RoutedPath::kSorted && plan.experts.gate_up.kernel == GemmKernel::kFp8Sm90;
}

// The sorted path keeps each route's expert output in the op's dtype (bf16 on the FP8 GEMM
// path) before the weighted sum (docs/moe.md): both references round them likewise there
// (exact routes left a few elements of small outputs past the bf16 bound where the routes
// cancel, sweep cases 967 and 6104 at seed 1).
bool sorted_path(const Outcome& o) {
  return o.path.rfind("sorted", 0) == 0;
}

struct Experts {
  DevTensor hidden;
  MlpWeights w;  // w_gate_up, w_down and (FP8 weights) their scales
  MlpBiases bias;
};

// The routed experts' inputs: w_gate_up holds the activation's rows (F for relu2, 2F
// interleaved for swiglu_oai: random weights either way, the layout is how they are read).
Experts expert_inputs(Context& ctx, const SweepCase& c) {
  Experts x;
  x.hidden = ctx.tensor(c.dtype, {c.T, c.H});
  fill_normal(x.hidden.data, c.dtype, x.hidden.numel(), input_seed(c, 0), 1.0f, ctx.stream());
  x.w = mlp_weights(ctx, c, c.quant, c.E, c.N, 1);
  x.bias = mlp_biases(ctx, c, c.E, c.N, c.gate_up_bias, c.down_bias, 12);
  return x;
}

// How the reference is held: the tolerance's dtype (fp8 where a path quantized activations),
// whether it computes every row (a dynamic fp8_per_tensor scale spans them all), and whether
// the F-wide activation's dynamic per-tensor amax may sit on a bf16 tie (compare_amax_ties).
struct RefCheck {
  DType tol;
  bool all_rows = false;
  bool amax_tie = false;
};
RefCheck ref_check(const SweepCase& c, reference::Fp8Activations acts,
                   reference::Fp8Activations shared_acts = reference::Fp8Activations::kAsGiven) {
  RefCheck r{c.dtype};
  const bool quantized = acts == reference::Fp8Activations::kQuantized ||
                         shared_acts == reference::Fp8Activations::kQuantized;
  if (quantized) r.tol = DType::kFP8E4M3;
  r.all_rows = reference_needs_all_rows(c, c.quant, acts) ||
               reference_needs_all_rows(c, c.shared_quant, shared_acts);
  r.amax_tie =
      reference_amax_tie(c, c.quant, acts) || reference_amax_tie(c, c.shared_quant, shared_acts);
  return r;
}

// The CPU reference's second reading of quantized activations: their near-ties flipped.
reference::Fp8Activations ties_flipped(reference::Fp8Activations acts) {
  return acts == reference::Fp8Activations::kQuantized
             ? reference::Fp8Activations::kQuantizedTiesFlipped
             : acts;
}

// Compares sampled tokens of `out` with the CPU f64 reference (small cases; `cpu(mirror,
// flip_ties)`, retried with the quantized activations' near-ties flipped, compare_fp8_ties) or
// the f32 GPU reference over a device token mask (every token with rc.all_rows); `gpu(ref,
// mask, ulps)` with the activation amax's bf16 step (compare_amax_ties).
template <class Cpu, class Gpu>
void check_tokens(Context& ctx, Outcome& o, const SweepCase& c, const DevTensor& out,
                  const std::vector<int64_t>& tokens, const RefCheck& rc, Cpu&& cpu, Gpu&& gpu) {
  if (cpu_reference_fits(c)) {
    o.reference = "cpu-f64";
    const HostTensor got = gather(ctx, out, tokens);
    compare_fp8_ties(o, rc.tol == DType::kFP8E4M3, [&](bool flip_ties, Outcome& r) {
      HostMirror m(ctx);
      const HostTensor ref = cpu(m, flip_ties);
      compare_rows(r, "output", got, gather(ref, tokens), rc.tol);
    });
    return;
  }
  const DevTensor ref = ctx.tensor(out.dtype, out.shape);
  const uint8_t* mask = rc.all_rows ? nullptr : device_mask(ctx, row_mask(c.T, tokens));
  o.reference = "gpu-f32, " + std::to_string(tokens.size()) + " of " + std::to_string(c.T) +
                " rows" + (rc.all_rows ? " (all computed)" : "");
  compare_amax_ties(
      o, rc.amax_tie,
      [&](int ulps) {
        cuda_ok(cudaMemsetAsync(ref.data, 0xFF, ref.bytes(), ctx.stream()), "poison");
        gpu(ref, mask, ulps);
      },
      [&](Outcome& r) {
        compare_rows(r, "output", gather(ctx, out, tokens), gather(ctx, ref, tokens), rc.tol);
      });
}

void run_routed_experts(Context& ctx, const SweepCase& c, Outcome& o) {
  const Experts x = expert_inputs(ctx, c);
  const DevTensor w = ctx.tensor(DType::kF32, {c.T, c.K});
  fill_uniform(static_cast<float*>(w.data), w.numel(), input_seed(c, 3), 0.05f, 1.0f, ctx.stream());
  const std::vector<int32_t> ids_h = draw_topk_ids(c);
  const std::vector<int64_t> ids64_h(ids_h.begin(), ids_h.end());
  const DevTensor ids = c.ids64 ? ctx.upload(DType::kI64, {c.T, c.K}, ids64_h.data())
                                : ctx.upload(DType::kI32, {c.T, c.K}, ids_h.data());
  const std::vector<int32_t> map_h = draw_expert_map(c);
  const DevTensor map =
      map_h.empty() ? DevTensor{}
                    : ctx.upload(DType::kI32, {static_cast<int64_t>(map_h.size())}, map_h.data());
  const DevTensor out = ctx.tensor(c.dtype, {c.T, c.H});
  const bool indexed = c.op == Op::kIndexedExpertMlp;
  FusedMoEExpertsArgs args;
  args.hidden_states = x.hidden.view();
  args.w_gate_up = x.w.gate_up.view();
  args.w_down = x.w.down.view();
  args.quant = x.w.quant;
  args.topk_weights = w.view();
  args.topk_ids = ids.view();
  args.output = out.view();
  args.expert_map = map.view();
  args.apply_router_weight_on_input = c.on_input;
  args.activation = c.act;
  args.gate_up_bias = x.bias.gate_up.view();
  args.down_bias = x.bias.down.view();
  const LayerPlan planned = indexed ? plan_indexed_expert_mlp(args) : plan_fused_moe_experts(args);
  LayerPlan forced;
  if (forced_layer_plan(c.knobs, planned,
                        indexed ? indexed_expert_mlp_plan_candidates(args)
                                : fused_moe_experts_plan_candidates(args),
                        &forced))
    args.plan = &forced;
  const LayerPlan& run_plan = args.plan ? forced : planned;
  o.path = c.T == 0 ? "none" : to_string(run_plan);
  const reference::Fp8Activations acts = reference_acts(c.quant, sorted_on_fp8_gemms(run_plan));
  args.workspace = ctx.workspace(indexed ? indexed_expert_mlp_workspace_size(args)
                                         : fused_moe_experts_workspace_size(args));
  run_twice(
      ctx,
      {{&out},
       args.workspace,
       [&](cudaStream_t s) { indexed ? indexed_expert_mlp(args, s) : fused_moe_experts(args, s); }},
      o);
  scan_output(ctx, o, "output", out, nullptr);
  check_tokens(
      ctx, o, c, out, sample_range(c.T, kCheckRows), ref_check(c, acts),
      [&](HostMirror& m, bool flip_ties) {
        FusedMoEExpertsArgs r = args;
        r.hidden_states = m.in(args.hidden_states);
        r.w_gate_up = m.in(args.w_gate_up);
        r.w_down = m.in(args.w_down);
        r.quant = mirror_quant(m, args.quant);
        r.topk_weights = m.in(args.topk_weights);
        r.topk_ids = m.in(args.topk_ids);
        r.expert_map = m.in(args.expert_map);
        r.gate_up_bias = m.in(args.gate_up_bias);
        r.down_bias = m.in(args.down_bias);
        HostTensor* ref = nullptr;
        r.output = m.out(args.output, &ref);
        reference::fused_moe_experts(r, flip_ties ? ties_flipped(acts) : acts, sorted_path(o));
        return *ref;
      },
      [&](const DevTensor& ref, const uint8_t* mask, int ulps) {
        FusedMoEExpertsArgs r = args;
        r.output = ref.view();
        r.workspace = ctx.workspace(gpu_reference::fused_moe_experts_scratch_bytes(r));
        gpu_reference::fused_moe_experts(r, ctx.stream(), mask, sorted_path(o), {acts, ulps});
      });
}

// Sampled tokens whose routing is unambiguous (the others are counted, not compared).
std::vector<int64_t> unambiguous_tokens(Context& ctx, const SweepCase& c, const DevTensor& gating,
                                        const DevTensor& bias, Outcome& o) {
  const std::vector<int64_t> tokens = sample_range(c.T, kCheckRows);
  const HostTensor g = gather(ctx, gating, tokens);
  const HostTensor b = bias.defined() ? ctx.to_host(bias) : HostTensor();
  std::vector<int64_t> kept;
  std::vector<double> row(static_cast<size_t>(c.E));
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int64_t e = 0; e < c.E; ++e) row[e] = g.at(static_cast<int64_t>(i) * c.E + e);
    if (topk_row_unambiguous(row.data(), bias.defined() ? b.as<float>() : nullptr, c)) {
      kept.push_back(tokens[i]);
    } else {
      ++o.ambiguous_rows;
    }
  }
  return kept;
}

void run_layer(Context& ctx, const SweepCase& c, Outcome& o) {
  const Experts x = expert_inputs(ctx, c);
  // With an expert map the routing spans every rank's experts (rc.E), the weights this
  // rank's (c.E).
  const SweepCase rc = routing_case(c);
  const DevTensor gating = ctx.tensor(c.gating, {c.T, rc.E});
  fill_logits(ctx, rc, gating);
  const DevTensor bias = correction_bias(ctx, rc);
  const std::vector<int32_t> map_h = draw_expert_map(c);
  const DevTensor map =
      map_h.empty() ? DevTensor{}
                    : ctx.upload(DType::kI32, {static_cast<int64_t>(map_h.size())}, map_h.data());
  const bool shared = c.op == Op::kFusedMoeSharedExpert && c.S > 0;
  MlpWeights sw;
  MlpBiases sb;
  if (shared) {
    sw = mlp_weights(ctx, c, c.shared_quant, 0, c.S, 4);
    sb = mlp_biases(ctx, c, 0, c.S, c.shared_gate_up_bias, c.shared_down_bias, 14);
  }
  const DevTensor out = ctx.tensor(c.dtype, {c.T, c.H});
  FusedMoESharedExpertArgs args;
  FusedMoEArgs& m = args.moe;
  m.hidden_states = x.hidden.view();
  m.gating_output = gating.view();
  m.correction_bias = bias.view();
  m.params = topk_params(c);
  m.w_gate_up = x.w.gate_up.view();
  m.w_down = x.w.down.view();
  m.quant = x.w.quant;
  m.output = out.view();
  m.apply_router_weight_on_input = c.on_input;
  m.expert_map = map.view();
  m.activation = c.act;
  m.gate_up_bias = x.bias.gate_up.view();
  m.down_bias = x.bias.down.view();
  args.shared_w_gate_up = sw.gate_up.view();
  args.shared_w_down = sw.down.view();
  args.shared_quant = sw.quant;
  args.shared_gate_up_bias = sb.gate_up.view();
  args.shared_down_bias = sb.down.view();
  const bool layer = c.op == Op::kFusedMoe;
  const LayerPlan planned = layer ? plan_fused_moe(m) : plan_fused_moe_shared_expert(args);
  LayerPlan forced;
  if (forced_layer_plan(
          c.knobs, planned,
          layer ? fused_moe_plan_candidates(m) : fused_moe_shared_expert_plan_candidates(args),
          &forced))
    m.plan = &forced;
  const LayerPlan& run_plan = m.plan ? forced : planned;
  o.path = c.T == 0 ? "none" : to_string(run_plan);
  const reference::Fp8Activations acts = reference_acts(c.quant, sorted_on_fp8_gemms(run_plan));
  const reference::Fp8Activations shared_acts = reference_acts(
      c.shared_quant, run_plan.has_shared && run_plan.shared.path == MlpPath::kTwoGemms);
  m.workspace = ctx.workspace(layer ? fused_moe_workspace_size(m)
                                    : fused_moe_shared_expert_workspace_size(args));
  run_twice(ctx,
            {{&out},
             m.workspace,
             [&](cudaStream_t s) { layer ? fused_moe(m, s) : fused_moe_shared_expert(args, s); }},
            o);
  scan_output(ctx, o, "output", out, nullptr);
  check_tokens(
      ctx, o, c, out, unambiguous_tokens(ctx, rc, gating, bias, o), ref_check(c, acts, shared_acts),
      [&](HostMirror& h, bool flip_ties) {
        FusedMoESharedExpertArgs r = args;
        r.moe.hidden_states = h.in(m.hidden_states);
        r.moe.gating_output = h.in(m.gating_output);
        r.moe.correction_bias = h.in(m.correction_bias);
        r.moe.expert_map = h.in(m.expert_map);
        r.moe.w_gate_up = h.in(m.w_gate_up);
        r.moe.w_down = h.in(m.w_down);
        r.shared_w_gate_up = h.in(args.shared_w_gate_up);
        r.shared_w_down = h.in(args.shared_w_down);
        r.moe.quant = mirror_quant(h, m.quant);
        r.shared_quant = mirror_quant(h, args.shared_quant);
        r.moe.gate_up_bias = h.in(m.gate_up_bias);
        r.moe.down_bias = h.in(m.down_bias);
        r.shared_gate_up_bias = h.in(args.shared_gate_up_bias);
        r.shared_down_bias = h.in(args.shared_down_bias);
        HostTensor* ref = nullptr;
        r.moe.output = h.out(m.output, &ref);
        const reference::Fp8Activations a = flip_ties ? ties_flipped(acts) : acts;
        const reference::Fp8Activations sa = flip_ties ? ties_flipped(shared_acts) : shared_acts;
        shared ? reference::fused_moe_shared_expert(r, a, sa, sorted_path(o))
               : reference::fused_moe(r.moe, a, sorted_path(o));
        return *ref;
      },
      [&](const DevTensor& ref, const uint8_t* mask, int ulps) {
        FusedMoESharedExpertArgs r = args;
        r.moe.output = ref.view();
        if (shared) {
          r.moe.workspace = ctx.workspace(gpu_reference::fused_moe_shared_expert_scratch_bytes(r));
          gpu_reference::fused_moe_shared_expert(r, ctx.stream(), mask, sorted_path(o),
                                                 {acts, ulps}, {shared_acts, ulps});
        } else {
          r.moe.workspace = ctx.workspace(gpu_reference::fused_moe_scratch_bytes(r.moe));
          gpu_reference::fused_moe(r.moe, ctx.stream(), mask, sorted_path(o), {acts, ulps});
        }
      });
}

void run_shared_expert_mlp(Context& ctx, const SweepCase& c, Outcome& o) {
  const DevTensor hidden = ctx.tensor(c.dtype, {c.T, c.H});
  fill_normal(hidden.data, c.dtype, hidden.numel(), input_seed(c, 0), 1.0f, ctx.stream());
  const MlpWeights w = mlp_weights(ctx, c, c.quant, 0, c.N, 1);
  const MlpBiases bias = mlp_biases(ctx, c, 0, c.N, c.gate_up_bias, c.down_bias, 12);
  const DevTensor out = ctx.tensor(c.dtype, {c.T, c.H});
  SharedExpertMLPArgs args;
  args.hidden_states = hidden.view();
  args.w_gate_up = w.gate_up.view();
  args.w_down = w.down.view();
  args.quant = w.quant;
  args.output = out.view();
  args.activation = c.act;
  args.gate_up_bias = bias.gate_up.view();
  args.down_bias = bias.down.view();
  const MlpPlan planned = plan_shared_expert_mlp(args);
  MlpPlan forced;
  if (forced_dense_plan(c.knobs, planned, shared_expert_mlp_plan_candidates(args), &forced))
    args.plan = &forced;
  const MlpPlan& run_plan = args.plan ? forced : planned;
  o.path = c.T == 0 ? "none" : to_string(run_plan);
  const reference::Fp8Activations acts =
      reference_acts(c.quant, run_plan.path == MlpPath::kTwoGemms);
  args.workspace = ctx.workspace(shared_expert_mlp_workspace_size(args));
  run_twice(ctx, {{&out}, args.workspace, [&](cudaStream_t s) { shared_expert_mlp(args, s); }}, o);
  scan_output(ctx, o, "output", out, nullptr);
  check_tokens(
      ctx, o, c, out, sample_range(c.T, kCheckRows), ref_check(c, acts),
      [&](HostMirror& m, bool flip_ties) {
        SharedExpertMLPArgs r = args;
        r.hidden_states = m.in(args.hidden_states);
        r.w_gate_up = m.in(args.w_gate_up);
        r.w_down = m.in(args.w_down);
        r.quant = mirror_quant(m, args.quant);
        r.gate_up_bias = m.in(args.gate_up_bias);
        r.down_bias = m.in(args.down_bias);
        HostTensor* ref = nullptr;
        r.output = m.out(args.output, &ref);
        reference::shared_expert_mlp(r, flip_ties ? ties_flipped(acts) : acts);
        return *ref;
      },
      [&](const DevTensor& ref, const uint8_t* mask, int ulps) {
        SharedExpertMLPArgs r = args;
        r.output = ref.view();
        r.workspace = ctx.workspace(gpu_reference::shared_expert_mlp_scratch_bytes(r));
        gpu_reference::shared_expert_mlp(r, ctx.stream(), mask, {acts, ulps});
      });
}

}  // namespace

void run_moe_op(Context& ctx, const SweepCase& c, Outcome& o) {
  switch (c.op) {
    case Op::kFusedMoeExperts:
    case Op::kIndexedExpertMlp:
      return run_routed_experts(ctx, c, o);
    case Op::kFusedMoe:
    case Op::kFusedMoeSharedExpert:
      return run_layer(ctx, c, o);
    default:
      return run_shared_expert_mlp(ctx, c, o);
  }
}

}  // namespace moekit::sweep
