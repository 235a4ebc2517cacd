// CPU references of the expert-MLP and whole-layer ops (SPEC.md), f64 accumulation.
//   MLP_e(x) = w_down[e] . round(silu(w_gate[e] . x) * (w_up[e] . x)); the F-wide
//   activation is rounded to the op's dtype, the final output once.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/reference.h"
#include "reference/route_ids_ref.h"

namespace moekit::reference {
namespace {

std::vector<double> to_doubles(const TensorView& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = host::load(t, i);
  return v;
}

double silu(double z) {
  return z / (1.0 + std::exp(-z));
}

// One gated MLP: w_gate_up [2F, H] then w_down [H, F] (pointers into f64 copies).
// out[h] (not rounded) for one input row x[H].
void gated_mlp(const double* x, const double* w_gate_up, const double* w_down, int64_t H, int64_t F,
               DType act_dtype, double* out) {
  std::vector<double> act(static_cast<size_t>(F));
  for (int64_t n = 0; n < F; ++n) {
    const double* g_row = w_gate_up + n * H;
    const double* u_row = w_gate_up + (F + n) * H;
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += g_row[h] * x[h];
      u += u_row[h] * x[h];
    }
    act[n] = host::round_to(act_dtype, silu(g) * u);
  }
  for (int64_t h = 0; h < H; ++h) {
    const double* d_row = w_down + h * F;
    double s = 0;
    for (int64_t n = 0; n < F; ++n) s += d_row[n] * act[n];
    out[h] = s;
  }
}

// acc[t, h] (f64, not rounded) = sum over valid routes of w * MLP_id(x_t), the id read
// through the expert map when given; apply_router_weight_on_input (K = 1): MLP_id(x'_t)
// with x'_t = round(round(w) * x_t) (docs/moe.md, "Engine inputs").
std::vector<double> routed_sum(const FusedMoEExpertsArgs& args) {
  const int64_t T = args.hidden_states.size(0), H = args.hidden_states.size(1);
  const int64_t E = args.w_gate_up.size(0), F = args.w_gate_up.size(1) / 2;
  const int64_t K = args.topk_ids.ndim == 2 ? args.topk_ids.size(1) : 0;
  const DType dt = args.hidden_states.dtype;
  std::vector<double> x = to_doubles(args.hidden_states);
  std::vector<double> wgu = to_doubles(args.w_gate_up);
  std::vector<double> wd = to_doubles(args.w_down);
  const float* w = static_cast<const float*>(args.topk_weights.data);
  std::vector<double> acc(static_cast<size_t>(T * H), 0.0), y(static_cast<size_t>(H));
  std::vector<double> scaled(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      // -1, out-of-range ids and other ranks' experts mean "no route".
      const int64_t id = local_expert(args.topk_ids, t * K + k, args.expert_map, E);
      if (id < 0) continue;
      const double* xt = &x[t * H];
      double wt = w[t * K + k];
      if (args.apply_router_weight_on_input) {
        const double w_rounded = host::round_to(dt, wt);
        for (int64_t h = 0; h < H; ++h) scaled[h] = host::round_to(dt, w_rounded * xt[h]);
        xt = scaled.data();
        wt = 1.0;
      }
      gated_mlp(xt, &wgu[id * 2 * F * H], &wd[id * H * F], H, F, dt, y.data());
      for (int64_t h = 0; h < H; ++h) acc[t * H + h] += wt * y[h];
    }
  }
  return acc;
}

// SharedMLP(x_t) for every token, f64, not rounded.
std::vector<double> shared_sum(const TensorView& hidden, const TensorView& w_gate_up,
                               const TensorView& w_down) {
  const int64_t T = hidden.size(0), H = hidden.size(1), S = w_gate_up.size(0) / 2;
  std::vector<double> x = to_doubles(hidden);
  std::vector<double> wgu = to_doubles(w_gate_up);
  std::vector<double> wd = to_doubles(w_down);
  std::vector<double> out(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    gated_mlp(&x[t * H], wgu.data(), wd.data(), H, S, hidden.dtype, &out[t * H]);
  }
  return out;
}

void store_all(const TensorView& out, const std::vector<double>& v) {
  for (int64_t i = 0; i < out.numel(); ++i) host::store(out, i, v[i]);
}

}  // namespace

void moe_expert_mlp(const ExpertMLPArgs& args) {
  const int64_t P = args.expert_input.size(0), H = args.expert_input.size(1);
  const int64_t E = args.w_gate_up.size(0), F = args.w_gate_up.size(1) / 2;
  const int64_t A = args.layout.alignment > 0 ? args.layout.alignment : 1;
  std::vector<double> x = to_doubles(args.expert_input);
  std::vector<double> wgu = to_doubles(args.w_gate_up);
  std::vector<double> wd = to_doubles(args.w_down);
  const int32_t* ends = static_cast<const int32_t*>(args.layout_metadata.data);
  std::vector<double> y(static_cast<size_t>(H));
  int64_t prev_end = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t start = (prev_end + A - 1) / A * A;
    const int64_t end = ends[e];
    for (int64_t r = start; r < end && r < P; ++r) {
      gated_mlp(&x[r * H], &wgu[e * 2 * F * H], &wd[e * H * F], H, F, args.expert_input.dtype,
                y.data());
      for (int64_t h = 0; h < H; ++h) host::store(args.expert_output, r * H + h, y[h]);
    }
    prev_end = end;
  }
}

void fused_moe_experts(const FusedMoEExpertsArgs& args) {
  store_all(args.output, routed_sum(args));
}

void indexed_expert_mlp(const IndexedExpertMLPArgs& args) {
  fused_moe_experts(args);
}

namespace {

// The routing half of fused_moe: reference fused_topk into host buffers.
struct HostRouting {
  std::vector<float> weights;
  std::vector<int32_t> ids;
  FusedMoEExpertsArgs experts;
};

HostRouting route(const FusedMoEArgs& args) {
  const int64_t T = args.hidden_states.size(0);
  const int64_t K = args.params.top_k;
  HostRouting r;
  r.weights.assign(static_cast<size_t>(T * K), 0.0f);
  r.ids.assign(static_cast<size_t>(T * K), -1);
  FusedTopKArgs topk;
  topk.gating_output = args.gating_output;
  topk.correction_bias = args.correction_bias;
  topk.params = args.params;
  topk.topk_weights = make_view(r.weights.data(), DType::kF32, {T, K});
  topk.topk_ids = make_view(r.ids.data(), DType::kI32, {T, K});
  fused_topk(topk);
  r.experts.hidden_states = args.hidden_states;
  r.experts.w_gate_up = args.w_gate_up;
  r.experts.w_down = args.w_down;
  r.experts.topk_weights = topk.topk_weights;
  r.experts.topk_ids = topk.topk_ids;
  r.experts.output = args.output;
  r.experts.expert_map = args.expert_map;
  r.experts.apply_router_weight_on_input = args.apply_router_weight_on_input;
  return r;
}

}  // namespace

void fused_moe(const FusedMoEArgs& args) {
  HostRouting r = route(args);
  fused_moe_experts(r.experts);
}

void fused_moe_shared_expert(const FusedMoESharedExpertArgs& args) {
  if (!args.shared_w_gate_up.defined() && !args.shared_w_down.defined()) {
    fused_moe(args.moe);  // no shared expert: the routed layer alone
    return;
  }
  HostRouting r = route(args.moe);
  std::vector<double> acc = routed_sum(r.experts);
  std::vector<double> shared =
      shared_sum(args.moe.hidden_states, args.shared_w_gate_up, args.shared_w_down);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += shared[i];
  store_all(args.moe.output, acc);
}

void shared_expert_mlp(const SharedExpertMLPArgs& args) {
  store_all(args.output, shared_sum(args.hidden_states, args.w_gate_up, args.w_down));
}

}  // namespace moekit::reference
