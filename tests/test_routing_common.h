// Shared pieces of the FusedTopK tests (test_routing*.cpp): parameters, the reference run,
// and the check that the f32 kernel and the f64 reference must decide a row alike.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "moekit/reference.h"
#include "moekit/routing.h"
#include "reference/host_tensor.h"

namespace moekit::routetest {

constexpr ScoringFunc kSoftmax = ScoringFunc::kSoftmax;
constexpr ScoringFunc kSigmoid = ScoringFunc::kSigmoid;

inline TopKParams params(int k, ScoringFunc sf, bool renorm, int ng = 0, int tg = 0,
                         float scale = 1.f) {
  TopKParams p;
  p.top_k = k;
  p.scoring_func = sf;
  p.renormalize = renorm;
  p.num_expert_group = ng;
  p.topk_group = tg;
  p.routed_scaling_factor = scale;
  return p;
}

inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

struct TopKOut {
  HostTensor w, ids;
};

inline TopKOut run_reference(const HostTensor& g, const HostTensor* bias, const TopKParams& p) {
  const int64_t T = g.shape()[0];
  TopKOut o{HostTensor(DType::kF32, {T, p.top_k}), HostTensor(DType::kI32, {T, p.top_k})};
  FusedTopKArgs a;
  a.gating_output = g.view();
  if (bias) a.correction_bias = bias->view();
  a.params = p;
  a.topk_weights = o.w.view();
  a.topk_ids = o.ids.view();
  reference::fused_topk(a);
  return o;
}

// True when the row's decisions are unambiguous in f32: among the values that decide it
// (the group scores at the kept / dropped boundary, every adjacent pair among the top K+1
// sel values of the kept groups), no two distinct finite numbers closer than eps relative.
// Equal values are decided by the tie rule on both sides; NaN and +-Inf exactly (a NaN
// ranks above every number, NaNs tie among themselves: docs/routing-permute.md).
inline bool row_is_tie_free(const HostTensor& g, const HostTensor* bias, int64_t t,
                            const TopKParams& p, double eps = 1e-5) {
  const int E = static_cast<int>(g.shape()[1]);
  std::vector<double> score(E), sel(E);
  for (int e = 0; e < E; ++e) score[e] = g.at(t * E + e);
  if (p.scoring_func == ScoringFunc::kSoftmax) {
    double m = -INFINITY;
    bool nan = false;
    for (double v : score) nan |= std::isnan(v), m = std::max(m, v);
    double s = 0;
    for (double& v : score) s += (v = nan ? NAN : std::exp(v - m));
    for (double& v : score) v /= s;
  } else {
    for (double& v : score) v = sigmoid(v);
  }
  for (int e = 0; e < E; ++e) sel[e] = score[e] + (bias ? bias->at(e) : 0.0);
  const auto above = [](double a, double b) { return std::isnan(a) ? !std::isnan(b) : a > b; };
  const auto near = [&](double a, double b) {
    if (!std::isfinite(a) || !std::isfinite(b) || a == b) return false;
    return std::abs(a - b) <= eps * std::max(std::abs(a), std::abs(b));
  };
  std::vector<bool> allowed(E, true);
  if (p.num_expert_group > 0 && p.topk_group < p.num_expert_group) {
    const int ng = p.num_expert_group, G = E / ng;
    std::vector<double> gs(ng);
    for (int gi = 0; gi < ng; ++gi) {
      std::vector<double> v(sel.begin() + gi * G, sel.begin() + (gi + 1) * G);
      std::sort(v.begin(), v.end(), above);
      gs[gi] = (bias && G >= 2) ? v[0] + v[1] : v[0];
    }
    std::vector<int> order(ng);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return above(gs[a], gs[b]); });
    // Only the boundary between the last kept and the first dropped group decides.
    if (near(gs[order[p.topk_group - 1]], gs[order[p.topk_group]])) return false;
    std::vector<bool> kept(ng, false);
    for (int r = 0; r < p.topk_group; ++r) kept[order[r]] = true;
    for (int e = 0; e < E; ++e) allowed[e] = kept[e / G];
  }
  std::vector<double> v;
  for (int e = 0; e < E; ++e)
    if (allowed[e]) v.push_back(sel[e]);
  std::sort(v.begin(), v.end(), above);
  for (int r = 0; r < p.top_k && r + 1 < static_cast<int>(v.size()); ++r)
    if (near(v[r], v[r + 1])) return false;
  return true;
}

}  // namespace moekit::routetest
