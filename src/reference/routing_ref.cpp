// CPU reference of FusedTopKFwd, in f64, written from SPEC.md.
// Ties (equal sel, or equal group scores) go to the lower id / group index. A NaN sel or
// group score ranks above every number (as torch.topk ranks NaN; NaNs tie among themselves),
// so a NaN is picked first and its NaN weight reaches the output (docs/routing-permute.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/reference.h"

namespace moekit::reference {
namespace {

// a before b in a descending order where NaN ranks above every number.
bool ranks_above(double a, double b) {
  return std::isnan(a) ? !std::isnan(b) : a > b;
}

}  // namespace

void fused_topk(const FusedTopKArgs& args) {
  const TensorView& g = args.gating_output;
  const int64_t T = g.size(0);
  const int E = static_cast<int>(g.size(1));
  const TopKParams& p = args.params;
  const int K = p.top_k;
  const bool has_bias = args.correction_bias.defined();
  float* out_w = args.topk_weights.ptr<float>();
  int32_t* out_ids = args.topk_ids.ptr<int32_t>();

  std::vector<double> score(E), sel(E);
  std::vector<int> order(E);
  for (int64_t t = 0; t < T; ++t) {
    // 1. scores.
    for (int e = 0; e < E; ++e) score[e] = host::load(g, t * E + e);
    if (p.scoring_func == ScoringFunc::kSoftmax) {
      const double m = *std::max_element(score.begin(), score.end());
      double sum = 0;
      for (double& s : score) {
        s = std::exp(s - m);
        sum += s;
      }
      for (double& s : score) s /= sum;
    } else {
      for (double& s : score) s = 1.0 / (1.0 + std::exp(-s));
    }
    // 2. sel.
    for (int e = 0; e < E; ++e)
      sel[e] = score[e] + (has_bias ? host::load(args.correction_bias, e) : 0.0);
    // 3. grouping.
    std::vector<bool> allowed(E, true);
    if (p.num_expert_group > 0 && p.topk_group < p.num_expert_group) {
      const int ng = p.num_expert_group, G = E / ng;
      std::vector<double> gscore(ng);
      for (int gi = 0; gi < ng; ++gi) {
        std::vector<double> v(sel.begin() + gi * G, sel.begin() + (gi + 1) * G);
        std::sort(v.begin(), v.end(), ranks_above);
        gscore[gi] = (has_bias && G >= 2) ? v[0] + v[1] : v[0];
      }
      std::vector<int> gorder(ng);
      std::iota(gorder.begin(), gorder.end(), 0);
      std::stable_sort(gorder.begin(), gorder.end(),
                       [&](int a, int b) { return ranks_above(gscore[a], gscore[b]); });
      std::vector<bool> kept(ng, false);
      for (int r = 0; r < p.topk_group; ++r) kept[gorder[r]] = true;
      for (int e = 0; e < E; ++e) allowed[e] = kept[e / G];
    }
    // 4. top-k by sel, descending, lower id first on ties (stable sort over ascending ids).
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (allowed[a] != allowed[b]) return static_cast<bool>(allowed[a]);
      return ranks_above(sel[a], sel[b]);
    });
    // 5. weights.
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += score[order[k]];
    for (int k = 0; k < K; ++k) {
      double w = score[order[k]];
      if (p.renormalize) w /= sum;
      w *= p.routed_scaling_factor;
      out_w[t * K + k] = static_cast<float>(w);
      out_ids[t * K + k] = order[k];
    }
  }
}

}  // namespace moekit::reference
