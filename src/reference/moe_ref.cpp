// CPU references of the expert-MLP and whole-layer ops (SPEC.md), f64 accumulation.
//   MLP_e(x) = w_down[e] . round(silu(w_gate[e] . x) * (w_up[e] . x)); the F-wide
//   activation is rounded to the op's dtype, the final output once. FP8 weights enter
//   dequantized (float(w) * scale, moekit/quant.h); the activations as given (what the FP8
//   decode kernels use; quantize_activations_e4m3 gives the quantized ones).
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/reference.h"

namespace moekit::reference {
namespace {

std::vector<double> to_doubles(const TensorView& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = host::load(t, i);
  return v;
}

// The weights as the op uses them: w itself (no scheme), or dequant(w) = float(w) * scale
// with the scales of `q` (moekit/quant.h; `experts`: w has the E axis).
std::vector<double> weights(const TensorView& w, const TensorView& scale, QuantScheme scheme) {
  std::vector<double> v = to_doubles(w);
  if (scheme == QuantScheme::kNone) return v;
  const int64_t rows = w.size(-2), cols = w.size(-1);
  const int64_t E = w.numel() / (rows * cols);
  const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t n = 0; n < rows; ++n) {
      for (int64_t k = 0; k < cols; ++k) {
        int64_t si = e;  // per tensor
        if (scheme == QuantScheme::kFp8PerChannel) si = e * rows + n;
        if (scheme == QuantScheme::kFp8Block128) si = (e * rb + n / 128) * cb + k / 128;
        v[(e * rows + n) * cols + k] *= host::load(scale, si);
      }
    }
  }
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

// acc[t, h] (f64, not rounded) = sum over valid routes of w * MLP_id(x_t).
std::vector<double> routed_sum(const FusedMoEExpertsArgs& args) {
  const int64_t T = args.hidden_states.size(0), H = args.hidden_states.size(1);
  const int64_t E = args.w_gate_up.size(0), F = args.w_gate_up.size(1) / 2;
  const int64_t K = args.topk_ids.ndim == 2 ? args.topk_ids.size(1) : 0;
  const DType dt = args.hidden_states.dtype;
  std::vector<double> x = to_doubles(args.hidden_states);
  std::vector<double> wgu = weights(args.w_gate_up, args.quant.w_gate_up_scale, args.quant.scheme);
  std::vector<double> wd = weights(args.w_down, args.quant.w_down_scale, args.quant.scheme);
  const int32_t* ids = static_cast<const int32_t*>(args.topk_ids.data);
  const float* w = static_cast<const float*>(args.topk_weights.data);
  std::vector<double> acc(static_cast<size_t>(T * H), 0.0), y(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t id = ids[t * K + k];
      if (id < 0 || id >= E) continue;  // -1 (and out-of-range ids) mean "no route"
      gated_mlp(&x[t * H], &wgu[id * 2 * F * H], &wd[id * H * F], H, F, dt, y.data());
      const double wt = w[t * K + k];
      for (int64_t h = 0; h < H; ++h) acc[t * H + h] += wt * y[h];
    }
  }
  return acc;
}

// SharedMLP(x_t) for every token, f64, not rounded.
std::vector<double> shared_sum(const TensorView& hidden, const TensorView& w_gate_up,
                               const TensorView& w_down, const WeightQuant& q) {
  const int64_t T = hidden.size(0), H = hidden.size(1), S = w_gate_up.size(0) / 2;
  std::vector<double> x = to_doubles(hidden);
  std::vector<double> wgu = weights(w_gate_up, q.w_gate_up_scale, q.scheme);
  std::vector<double> wd = weights(w_down, q.w_down_scale, q.scheme);
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
  std::vector<double> wgu = weights(args.w_gate_up, args.quant.w_gate_up_scale, args.quant.scheme);
  std::vector<double> wd = weights(args.w_down, args.quant.w_down_scale, args.quant.scheme);
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
  r.experts.quant = args.quant;
  r.experts.topk_weights = topk.topk_weights;
  r.experts.topk_ids = topk.topk_ids;
  r.experts.output = args.output;
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
  std::vector<double> shared = shared_sum(args.moe.hidden_states, args.shared_w_gate_up,
                                          args.shared_w_down, args.shared_quant);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += shared[i];
  store_all(args.moe.output, acc);
}

void shared_expert_mlp(const SharedExpertMLPArgs& args) {
  store_all(args.output, shared_sum(args.hidden_states, args.w_gate_up, args.w_down, args.quant));
}

}  // namespace moekit::reference
