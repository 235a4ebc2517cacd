// Input builders shared by the sweep's op files.
#include <algorithm>
#include <cmath>

#include "sweep_ops.h"

namespace moekit::sweep {

void fill_logits(Context& ctx, const SweepCase& c, const DevTensor& g) {
  if (c.levels > 0) {
    fill_levels(g.data, g.dtype, g.numel(), input_seed(c, 10), c.levels, ctx.stream());
  } else {
    fill_normal(g.data, g.dtype, g.numel(), input_seed(c, 10), 1.0f, ctx.stream());
  }
  const std::vector<float> skew = skew_bias(c);
  if (!skew.empty()) {
    const DevTensor b = ctx.upload(DType::kF32, {c.E}, skew.data());
    add_expert_bias(g.data, g.dtype, c.T, c.E, static_cast<const float*>(b.data), ctx.stream());
  }
}

DevTensor correction_bias(Context& ctx, const SweepCase& c) {
  if (!c.bias) return DevTensor{};
  DevTensor b = ctx.tensor(DType::kF32, {c.E});
  fill_normal(b.data, DType::kF32, c.E, input_seed(c, 11), 0.1f, ctx.stream());
  return b;
}

TopKParams topk_params(const SweepCase& c) {
  TopKParams p;
  p.top_k = static_cast<int>(c.K);
  p.renormalize = c.renormalize;
  p.scoring_func = c.sigmoid ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  p.num_expert_group = c.groups;
  p.topk_group = c.topk_group;
  p.routed_scaling_factor = static_cast<float>(c.scale_milli / 1000.0);
  return p;
}

DevTensor weights(Context& ctx, DType dt, std::vector<int64_t> shape, int64_t fan_in,
                  uint64_t seed) {
  DevTensor w = ctx.tensor(dt, std::move(shape));
  const double sd = 1.0 / std::sqrt(static_cast<double>(fan_in > 0 ? fan_in : 1));
  fill_normal(w.data, dt, w.numel(), seed, static_cast<float>(sd), ctx.stream());
  return w;
}

MlpBiases mlp_biases(Context& ctx, const SweepCase& c, int64_t E, int64_t F, DType gate_up,
                     DType down, int tag) {
  const auto bias = [&](DType dt, int64_t width, float sd, int seed_tag) {
    if (dt == DType::kUndefined) return DevTensor{};
    DevTensor b =
        ctx.tensor(dt, E > 0 ? std::vector<int64_t>{E, width} : std::vector<int64_t>{width});
    fill_normal(b.data, dt, b.numel(), input_seed(c, seed_tag), sd, ctx.stream());
    return b;
  };
  MlpBiases b;
  b.gate_up = bias(gate_up, gate_up_rows(c, F), c.act == Activation::kSwigluOai ? 3.0f : 1.0f, tag);
  b.down = bias(down, c.H, 0.5f, tag + 1);
  return b;
}

MlpWeights mlp_weights(Context& ctx, const SweepCase& c, QuantScheme q, int64_t E, int64_t F,
                       int tag) {
  const auto shape = [&](int64_t rows, int64_t cols) {
    return E > 0 ? std::vector<int64_t>{E, rows, cols} : std::vector<int64_t>{rows, cols};
  };
  const int64_t gu_rows = gate_up_rows(c, F);
  MlpWeights w;
  w.quant.scheme = q;
  if (q == QuantScheme::kNone) {
    w.gate_up = weights(ctx, c.dtype, shape(gu_rows, c.H), c.H, input_seed(c, tag));
    w.down = weights(ctx, c.dtype, shape(c.H, F), F, input_seed(c, tag + 1));
    return w;
  }
  const auto fp8 = [&](int64_t rows, int64_t cols, int seed_tag, DevTensor* scale) {
    DevTensor t = ctx.tensor(DType::kFP8E4M3, shape(rows, cols));
    fill_normal(t.data, t.dtype, t.numel(), input_seed(c, seed_tag), 1.0f, ctx.stream());
    std::vector<int64_t> ss;
    if (E > 0) ss.push_back(E);
    if (q == QuantScheme::kFp8PerTensor && E == 0) ss.push_back(1);
    if (q == QuantScheme::kFp8PerChannel) ss.push_back(rows);
    if (q == QuantScheme::kFp8Block128) {
      ss.push_back((rows + 127) / 128);
      ss.push_back((cols + 127) / 128);
    }
    *scale = ctx.tensor(DType::kF32, ss);
    const float s = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(cols, 1)));
    fill_uniform(static_cast<float*>(scale->data), scale->numel(), input_seed(c, seed_tag + 20),
                 0.5f * s, 1.5f * s, ctx.stream());
    return t;
  };
  w.gate_up = fp8(gu_rows, c.H, tag, &w.gate_up_scale);
  w.down = fp8(c.H, F, tag + 1, &w.down_scale);
  w.quant.w_gate_up_scale = w.gate_up_scale.view();
  w.quant.w_down_scale = w.down_scale.view();
  if (q == QuantScheme::kFp8PerTensor) {
    const auto act_scale = [&](float lo, float hi, int seed_tag) {
      DevTensor t = ctx.tensor(DType::kF32, {1});
      fill_uniform(static_cast<float*>(t.data), 1, input_seed(c, seed_tag), lo, hi, ctx.stream());
      return t;
    };
    if (c.static_act & 1) w.a_gate_up_scale = act_scale(4.0f / 448, 6.0f / 448, tag + 40);
    if (c.static_act & 2) w.a_down_scale = act_scale(8.0f / 448, 16.0f / 448, tag + 41);
    w.quant.a_gate_up_scale = w.a_gate_up_scale.view();
    w.quant.a_down_scale = w.a_down_scale.view();
  }
  return w;
}

WeightQuant mirror_quant(HostMirror& m, const WeightQuant& q) {
  WeightQuant h = q;
  h.w_gate_up_scale = m.in(q.w_gate_up_scale);
  h.w_down_scale = m.in(q.w_down_scale);
  h.a_gate_up_scale = m.in(q.a_gate_up_scale);
  h.a_down_scale = m.in(q.a_down_scale);
  return h;
}

reference::Fp8Activations reference_acts(QuantScheme q, bool gemm_path) {
  return q != QuantScheme::kNone && gemm_path ? reference::Fp8Activations::kQuantized
                                              : reference::Fp8Activations::kAsGiven;
}

bool reference_needs_all_rows(const SweepCase& c, QuantScheme q, reference::Fp8Activations acts) {
  return acts == reference::Fp8Activations::kQuantized && q == QuantScheme::kFp8PerTensor &&
         c.static_act != 3;
}

bool reference_amax_tie(const SweepCase& c, QuantScheme q, reference::Fp8Activations acts) {
  return acts == reference::Fp8Activations::kQuantized && q == QuantScheme::kFp8PerTensor &&
         (c.static_act & 2) == 0;
}

PermutedRows permuted_rows_of(const SweepCase& c) {
  PermutedRows p;
  const std::vector<int64_t> counts = expert_counts(c);
  if (c.masked) {
    p.rows = c.E * c.max_m;
    p.valid.assign(static_cast<size_t>(p.rows), 0);
    for (int64_t e = 0; e < c.E; ++e) {
      p.metadata.push_back(static_cast<int32_t>(counts[e]));
      for (int64_t m = 0; m < counts[e]; ++m) p.valid[e * c.max_m + m] = 1;
    }
  } else {
    p.rows = contiguous_rows(c, counts, &p.metadata);
    p.valid.assign(static_cast<size_t>(p.rows), 0);
    for (int64_t e = 0; e < c.E; ++e) {
      for (int64_t r = p.metadata[e] - counts[e]; r < p.metadata[e]; ++r) p.valid[r] = 1;
    }
  }
  for (int64_t r = 0; r < p.rows; ++r)
    if (p.valid[r]) p.members.push_back(r);
  return p;
}

}  // namespace moekit::sweep
