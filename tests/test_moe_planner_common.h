// Shared pieces of the planner tests: an H200 cluster-capacity model for the direct
// kernels and shape-only views.
#pragma once

#include <initializer_list>

#include "mlp/mlp_planner.h"
#include "moekit/tensor.h"

namespace moekit::planner_test {

// Co-resident clusters on an H200-like part: GPCs of 18, 18, 18, 18, 16, 16, 14 and 14 SMs,
// 2 CTAs per SM at 32 tokens and 3 at 8 (registers) or fewer by shared memory. It gives
// the occupancy that was measured where it decides: 30 clusters of 8 ranks of ds-v3's
// 32-token gate_up and 36 of 7 (docs/dense-mlp.md "Direct dense MLP"). On a GPU the
// planner asks the device (cudaOccupancyMaxActiveClusters).
inline int h200_clusters(int tn, int split, int smem) {
  const int gpcs[] = {18, 18, 18, 18, 16, 16, 14, 14};
  const int by_regs = tn == 32 ? 2 : 3;
  const int by_smem = 233472 / (smem + 1024);
  const int ctas = by_regs < by_smem ? by_regs : by_smem;
  int clusters = 0;
  for (int sms : gpcs) clusters += sms * ctas / split;
  return clusters;
}

inline detail::DirectCapacity h200_capacity(const detail::DenseMlpProblem& p) {
  const int tn = p.T <= 8 ? 8 : 32;
  const auto cap = [tn](int split, int smem) { return h200_clusters(tn, split, smem); };
  return {cap, cap};
}

// A view of a shape with no data (the size and plan queries read shapes only).
inline TensorView null_view(DType dt, std::initializer_list<int64_t> shape) {
  return make_view(nullptr, dt, shape);
}

}  // namespace moekit::planner_test
