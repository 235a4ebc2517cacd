// Input builders shared by the sweep's op files.
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
