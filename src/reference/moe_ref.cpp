// CPU references of the expert-MLP and whole-layer ops (SPEC.md), f64 accumulation.
//   MLP_e(x) = w_down[e] . round(silu(w_gate[e] . x) * (w_up[e] . x)); the F-wide
//   activation is rounded to the op's dtype, the final output once. Other activations and
//   the biases as docs/moe.md "Activations" defines them. FP8 weights enter dequantized
//   (float(w) * scale, moekit/quant.h); the activations as given (what the FP8 direct
//   kernels use) or, Fp8Activations::kQuantized, quantized as the FP8 GEMM paths do
//   (quantize_activations_e4m3 over the gate/up input and the F-wide activation).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/reference.h"
#include "reference/host_tensor.h"
#include "reference/route_ids_ref.h"

namespace moekit::reference {
namespace {

std::vector<double> optional_doubles(const TensorView& t) {
  return t.defined() ? to_doubles(t) : std::vector<double>();
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

double sigmoid(double z) {
  return 1.0 / (1.0 + std::exp(-z));
}

double activate(Activation act, double g, double u) {
  switch (act) {
    case Activation::kGeluTanhAndMul: {
      const double c = std::sqrt(2.0 / 3.14159265358979323846);
      return 0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * u;
    }
    case Activation::kGeluAndMul:
      return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0))) * u;
    case Activation::kRelu2:
      return g > 0 ? g * g : 0.0;
    case Activation::kSwigluOai: {
      const double gc = std::min(g, 7.0), uc = std::min(std::max(u, -7.0), 7.0);
      return gc * sigmoid(1.702 * gc) * (uc + 1.0);
    }
    default:
      return g * sigmoid(g) * u;
  }
}

// The rows of w_gate_up holding the gate and the up projection of column n.
int64_t gate_row(Activation act, int64_t n) {
  return act == Activation::kSwigluOai ? 2 * n : n;
}
int64_t up_row(Activation act, int64_t n, int64_t F) {
  return act == Activation::kSwigluOai ? 2 * n + 1 : F + n;
}

// One MLP of the op's activation: w_gate_up [2F (relu2: F), H] then w_down [H, F], with
// optional biases (null) of one expert (pointers into f64 copies); act_dtype: where the
// F-wide activation is rounded.
struct Mlp {
  Activation act;
  int64_t H, F;
  DType act_dtype;
};
// act[F] = round(activation(w_gate_up . x + bias)).
void gate_up_act(const Mlp& m, const double* x, const double* w_gate_up, const double* gate_up_bias,
                 double* act) {
  const int64_t H = m.H, F = m.F;
  const bool gated = m.act != Activation::kRelu2;
  for (int64_t n = 0; n < F; ++n) {
    const int64_t gr = gate_row(m.act, n), ur = up_row(m.act, n, F);
    const double* g_row = w_gate_up + gr * H;
    const double* u_row = w_gate_up + ur * H;
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += g_row[h] * x[h];
      if (gated) u += u_row[h] * x[h];
    }
    if (gate_up_bias) {
      g += gate_up_bias[gr];
      if (gated) u += gate_up_bias[ur];
    }
    act[n] = host::round_to(m.act_dtype, activate(m.act, g, u));
  }
}
// out[H] (not rounded) = w_down . act + bias.
void down_proj(const Mlp& m, const double* act, const double* w_down, const double* down_bias,
               double* out) {
  for (int64_t h = 0; h < m.H; ++h) {
    const double* d_row = w_down + h * m.F;
    double s = down_bias ? down_bias[h] : 0.0;
    for (int64_t n = 0; n < m.F; ++n) s += d_row[n] * act[n];
    out[h] = s;
  }
}

int64_t mlp_width(Activation act, int64_t gate_up_rows) {
  return act == Activation::kRelu2 ? gate_up_rows : gate_up_rows / 2;
}

// The pointer to expert e's row of a bias copy (null when absent).
const double* bias_row(const std::vector<double>& b, int64_t e, int64_t len) {
  return b.empty() ? nullptr : b.data() + e * len;
}

// x [rows, cols] quantized to e4m3 and back by `scheme` (quantize_activations_e4m3; a static
// per-tensor scale when given), what the FP8 GEMM paths multiply.
std::vector<double> fp8_round_trip(QuantScheme scheme, const std::vector<double>& x, int64_t rows,
                                   int64_t cols, const TensorView& static_scale) {
  std::vector<float> in(x.begin(), x.end()), out(x.size());
  quantize_activations_e4m3(scheme, make_view(in.data(), DType::kF32, {rows, cols}), static_scale,
                            make_view(out.data(), DType::kF32, {rows, cols}));
  return std::vector<double>(out.begin(), out.end());
}

// The scale group of element (r, c) under `scheme`: the tensor, the row, or the row's 128-column
// group.
int64_t scale_group(QuantScheme scheme, int64_t r, int64_t c, int64_t cols) {
  if (scheme == QuantScheme::kFp8PerTensor) return 0;
  if (scheme == QuantScheme::kFp8PerChannel) return r;
  return r * ((cols + 127) / 128) + c / 128;
}

// fp8_round_trip with every value near a rounding midpoint rounded the other way
// (Fp8Activations::kQuantizedTiesFlipped). Each value but its group's largest (which sets a
// dynamic scale: the scales stay as they are) is moved by 2^-12 of itself up and down; where
// either move changes its e4m3 value, it sits within 2^-12 of a midpoint and takes that value.
std::vector<double> fp8_round_trip_ties_flipped(QuantScheme scheme, const std::vector<double>& x,
                                                int64_t rows, int64_t cols,
                                                const TensorView& static_scale) {
  constexpr double kBand = 1.0 / 4096;
  const std::vector<double> base = fp8_round_trip(scheme, x, rows, cols, static_scale);
  if (scheme == QuantScheme::kNone) return base;
  const int64_t groups = scale_group(scheme, rows - 1, cols - 1, cols) + 1;
  std::vector<double> group_max(static_cast<size_t>(groups), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double& m = group_max[scale_group(scheme, r, c, cols)];
      m = std::max(m, std::fabs(x[r * cols + c]));
    }
  std::vector<double> up = x, down = x;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      if (std::fabs(x[i]) == group_max[scale_group(scheme, r, c, cols)]) continue;
      up[i] = x[i] * (1 + kBand);
      down[i] = x[i] * (1 - kBand);
    }
  const std::vector<double> hi = fp8_round_trip(scheme, up, rows, cols, static_scale);
  const std::vector<double> lo = fp8_round_trip(scheme, down, rows, cols, static_scale);
  std::vector<double> out = base;
  for (size_t i = 0; i < out.size(); ++i) {
    if (hi[i] != base[i]) {
      out[i] = hi[i];
    } else if (lo[i] != base[i]) {
      out[i] = lo[i];
    }
  }
  return out;
}

// A weight set in f64 (FP8 weights dequantized) with its optional biases.
struct MlpWeights {
  std::vector<double> wgu, wd, bgu, bd;
  int64_t R = 0;  // gate_up rows per expert
  MlpWeights(const TensorView& w_gate_up, const TensorView& w_down, const WeightQuant& q,
             const TensorView& gate_up_bias, const TensorView& down_bias)
      : wgu(weights(w_gate_up, q.w_gate_up_scale, q.scheme)),
        wd(weights(w_down, q.w_down_scale, q.scheme)),
        bgu(optional_doubles(gate_up_bias)),
        bd(optional_doubles(down_bias)),
        R(w_gate_up.size(-2)) {}
};

// Whether the activations are quantized: the FP8 GEMM paths' (a FP8 scheme asked so).
bool quantizes(Fp8Activations acts, const WeightQuant& q) {
  return (acts == Fp8Activations::kQuantized || acts == Fp8Activations::kQuantizedTiesFlipped) &&
         q.scheme != QuantScheme::kNone;
}

// y[i] (H values each) = MLP_{e[i]}(x[i]) for n rows; quantizing (quantizes(acts, q)): the
// F-wide activations of all n rows quantized together by q (a_down_scale when given), as the
// FP8 GEMM paths do, their near-ties flipped with kQuantizedTiesFlipped.
std::vector<double> mlp_rows(const Mlp& m, const MlpWeights& w, const std::vector<const double*>& x,
                             const std::vector<int64_t>& e, const WeightQuant& q,
                             Fp8Activations acts) {
  const int64_t n = static_cast<int64_t>(x.size()), H = m.H, F = m.F;
  const bool quantize = quantizes(acts, q);
  std::vector<double> act(static_cast<size_t>(n * F)), y(static_cast<size_t>(n * H));
  for (int64_t i = 0; i < n; ++i)
    gate_up_act(m, x[i], &w.wgu[e[i] * w.R * H], bias_row(w.bgu, e[i], w.R), &act[i * F]);
  if (quantize && n > 0) {
    act = acts == Fp8Activations::kQuantizedTiesFlipped
              ? fp8_round_trip_ties_flipped(q.scheme, act, n, F, q.a_down_scale)
              : fp8_round_trip(q.scheme, act, n, F, q.a_down_scale);
  }
  for (int64_t i = 0; i < n; ++i)
    down_proj(m, &act[i * F], &w.wd[e[i] * H * F], bias_row(w.bd, e[i], H), &y[i * H]);
  // Quantizing, the rows are the FP8 down GEMM's output, which it stores in bf16.
  if (quantize)
    for (double& v : y) v = host::round_to(DType::kBF16, v);
  return y;
}

// The MLP's rounding point: the op's dtype; when quantizing, the FP8 GEMMs' bf16 act, or f32
// with a static a_down_scale (the gate/up epilogue writes e4m3 straight from its f32 values).
Mlp mlp_of(Activation act, int64_t H, int64_t F, DType dtype, bool quantize, const WeightQuant& q) {
  if (!quantize) return Mlp{act, H, F, dtype};
  return Mlp{act, H, F, q.a_down_scale.defined() ? DType::kF32 : DType::kBF16};
}

// acc[t, h] (f64, not rounded) = sum over valid routes of w * MLP_id(x_t), the id read
// through the expert map when given; apply_router_weight_on_input (K = 1): MLP_id(x'_t)
// with x'_t = round(round(w) * x_t) (docs/moe.md, "Engine inputs"). Quantizing: x (after the
// scaling, all T rows) and the routes' activations quantized as the FP8 sorted path does.
std::vector<double> routed_sum(const FusedMoEExpertsArgs& args, Fp8Activations acts,
                               bool round_routes) {
  const int64_t T = args.hidden_states.size(0), H = args.hidden_states.size(1);
  const int64_t E = args.w_gate_up.size(0);
  const int64_t F = mlp_width(args.activation, args.w_gate_up.size(1));
  const int64_t K = args.topk_ids.ndim == 2 ? args.topk_ids.size(1) : 0;
  const DType dt = args.hidden_states.dtype;
  const bool quantize = quantizes(acts, args.quant);
  const Mlp m = mlp_of(args.activation, H, F, dt, quantize, args.quant);
  const MlpWeights w(args.w_gate_up, args.w_down, args.quant, args.gate_up_bias, args.down_bias);
  std::vector<double> x = to_doubles(args.hidden_states);
  const float* tw = static_cast<const float*>(args.topk_weights.data);
  if (args.apply_router_weight_on_input) {
    for (int64_t t = 0; t < T && K > 0; ++t) {
      const double w_rounded = host::round_to(dt, tw[t * K]);
      for (int64_t h = 0; h < H; ++h) x[t * H + h] = host::round_to(dt, w_rounded * x[t * H + h]);
    }
  }
  if (quantize && T > 0) x = fp8_round_trip(args.quant.scheme, x, T, H, args.quant.a_gate_up_scale);
  std::vector<const double*> rows;
  std::vector<int64_t> experts, routes;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      // -1, out-of-range ids and other ranks' experts mean "no route".
      const int64_t id = local_expert(args.topk_ids, t * K + k, args.expert_map, E);
      if (id < 0) continue;
      rows.push_back(&x[t * H]);
      experts.push_back(id);
      routes.push_back(t * K + k);
    }
  }
  std::vector<double> y = mlp_rows(m, w, rows, experts, args.quant, acts);
  if (round_routes) {  // the sorted path's stored rows
    const DType rows_dtype = quantize ? DType::kBF16 : dt;
    for (double& v : y) v = host::round_to(rows_dtype, v);
  }
  std::vector<double> acc(static_cast<size_t>(T * H), 0.0);
  for (size_t i = 0; i < routes.size(); ++i) {
    const int64_t t = routes[i] / K;
    const double wt = args.apply_router_weight_on_input ? 1.0 : tw[routes[i]];
    for (int64_t h = 0; h < H; ++h) acc[t * H + h] += wt * y[i * H + h];
  }
  return acc;
}

// SharedMLP(x_t) for every token, f64, not rounded.
std::vector<double> shared_sum(const TensorView& hidden, const TensorView& w_gate_up,
                               const TensorView& w_down, const WeightQuant& q, Activation act,
                               const TensorView& gate_up_bias, const TensorView& down_bias,
                               Fp8Activations acts) {
  const int64_t T = hidden.size(0), H = hidden.size(1);
  const bool quantize = quantizes(acts, q);
  const Mlp m = mlp_of(act, H, mlp_width(act, w_gate_up.size(0)), hidden.dtype, quantize, q);
  const MlpWeights w(w_gate_up, w_down, q, gate_up_bias, down_bias);
  std::vector<double> x = to_doubles(hidden);
  if (quantize && T > 0) x = fp8_round_trip(q.scheme, x, T, H, q.a_gate_up_scale);
  std::vector<const double*> rows(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rows[t] = &x[t * H];
  return mlp_rows(m, w, rows, std::vector<int64_t>(static_cast<size_t>(T), 0), q, acts);
}

void store_all(const TensorView& out, const std::vector<double>& v) {
  for (int64_t i = 0; i < out.numel(); ++i) host::store(out, i, v[i]);
}

}  // namespace

void moe_expert_mlp(const ExpertMLPArgs& args, Fp8Activations acts) {
  const int64_t P = args.expert_input.size(0), H = args.expert_input.size(1);
  const int64_t E = args.w_gate_up.size(0);
  const int64_t F = mlp_width(args.activation, args.w_gate_up.size(1));
  const int64_t A = args.layout.alignment > 0 ? args.layout.alignment : 1;
  const bool quantize = quantizes(acts, args.quant);
  const Mlp m = mlp_of(args.activation, H, F, args.expert_input.dtype, quantize, args.quant);
  const MlpWeights w(args.w_gate_up, args.w_down, args.quant, args.gate_up_bias, args.down_bias);
  const std::vector<double> x = to_doubles(args.expert_input);
  const int32_t* ends = static_cast<const int32_t*>(args.layout_metadata.data);
  // The rows in the groups (padding rows hold no data), gathered for the quantization.
  std::vector<int64_t> rows, experts;
  int64_t prev_end = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t start = (prev_end + A - 1) / A * A;
    for (int64_t r = start; r < ends[e] && r < P; ++r) {
      rows.push_back(r);
      experts.push_back(e);
    }
    prev_end = ends[e];
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<double> xin(static_cast<size_t>(n * H));
  for (int64_t i = 0; i < n; ++i) std::copy(&x[rows[i] * H], &x[rows[i] * H] + H, &xin[i * H]);
  if (quantize && n > 0)
    xin = fp8_round_trip(args.quant.scheme, xin, n, H, args.quant.a_gate_up_scale);
  std::vector<const double*> xs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xs[i] = &xin[i * H];
  const std::vector<double> y = mlp_rows(m, w, xs, experts, args.quant, acts);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h) host::store(args.expert_output, rows[i] * H + h, y[i * H + h]);
}

void fused_moe_experts(const FusedMoEExpertsArgs& args, Fp8Activations acts, bool round_routes) {
  store_all(args.output, routed_sum(args, acts, round_routes));
}

void indexed_expert_mlp(const IndexedExpertMLPArgs& args, Fp8Activations acts, bool round_routes) {
  fused_moe_experts(args, acts, round_routes);
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
  r.experts.activation = args.activation;
  r.experts.gate_up_bias = args.gate_up_bias;
  r.experts.down_bias = args.down_bias;
  r.experts.quant = args.quant;
  r.experts.topk_weights = topk.topk_weights;
  r.experts.topk_ids = topk.topk_ids;
  r.experts.output = args.output;
  r.experts.expert_map = args.expert_map;
  r.experts.apply_router_weight_on_input = args.apply_router_weight_on_input;
  return r;
}

}  // namespace

void fused_moe(const FusedMoEArgs& args, Fp8Activations acts, bool round_routes) {
  HostRouting r = route(args);
  fused_moe_experts(r.experts, acts, round_routes);
}

void fused_moe_shared_expert(const FusedMoESharedExpertArgs& args, Fp8Activations acts,
                             Fp8Activations shared_acts, bool round_routes) {
  if (!args.shared_w_gate_up.defined() && !args.shared_w_down.defined()) {
    fused_moe(args.moe, acts, round_routes);  // no shared expert: the routed layer alone
    return;
  }
  HostRouting r = route(args.moe);
  std::vector<double> acc = routed_sum(r.experts, acts, round_routes);
  std::vector<double> shared = shared_sum(
      args.moe.hidden_states, args.shared_w_gate_up, args.shared_w_down, args.shared_quant,
      args.moe.activation, args.shared_gate_up_bias, args.shared_down_bias, shared_acts);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += shared[i];
  store_all(args.moe.output, acc);
}

void shared_expert_mlp(const SharedExpertMLPArgs& args, Fp8Activations acts) {
  store_all(args.output, shared_sum(args.hidden_states, args.w_gate_up, args.w_down, args.quant,
                                    args.activation, args.gate_up_bias, args.down_bias, acts));
}

}  // namespace moekit::reference
