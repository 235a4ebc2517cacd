// Split-K for the decode config (kGemmConfigDecodeSplitK): when the decode tiles are
// too few to fill the SMs (a dense MLP at T <= 48, a few experts), each output tile
// is computed by a thread-block cluster of S CTAs, each over 1/S of k, and reduced in
// a fixed order through distributed shared memory (deterministic, no workspace, no
// atomics). Host-side choice of S (docs/gemm.md "Decode split-K").
#pragma once

#include <cstdint>

#include "gemm/grouped_gemm.h"

namespace moekit::detail {

// Mirrors DecodeConfig (configs.cuh static_asserts the match).
constexpr int kDecodeBM = 32;
constexpr int kDecodeBN = 128;       // b rows per tile (64 output columns with silu)
constexpr int kDecodeBKBytes = 128;  // bytes of k per pipeline stage
constexpr int kDecodeBlocksPerSm = 2;
constexpr int kMaxSplitK = 8;  // the portable cluster size

// Upper bound of the decode config's output tiles (as the launch counts them).
inline int64_t decode_tiles_upper(const GroupedGemmProblem& p) {
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t out_cols = p.activation == Activation::kSiluAndMul ? kDecodeBN / 2 : kDecodeBN;
  const int64_t n_tiles = cdiv(p.n, out_cols);
  int64_t m_tiles = 0;
  switch (p.rows) {
    case GemmRows::kContiguous:
      m_tiles = cdiv(p.m, kDecodeBM) + p.num_groups;
      break;
    case GemmRows::kMasked:
      m_tiles = static_cast<int64_t>(p.num_groups) * cdiv(p.max_m, kDecodeBM);
      break;
    case GemmRows::kDense:
      m_tiles = cdiv(p.m, kDecodeBM);
      break;
  }
  return m_tiles * n_tiles;
}

// Co-resident clusters of the split-K kernel per cluster size on the current device
// (cudaOccupancyMaxActiveClusters, queried once per process): table[s] for s = 1..8,
// or nullptr when unknown (no GPU). Clusters live inside one GPC, so the count for 8
// can be below slots / 8 (grouped_gemm_bf16.cu).
const int* splitk_cluster_capacity_table();

// The split (1, 2, 4 or 8): the largest that keeps >= 6 k slices per CTA and at most
// 2.5 waves of CTAs (a wave: sms x 2 resident CTAs); 1 (no split) from two waves of
// tiles up. Fitted to H200 measurements (docs/gemm.md "Decode split-K"): each CTA
// costs a few microseconds (launch, pipeline fill, cluster reduction), so long k
// slices and few waves win over evenly filled waves of short CTAs.
// A split whose clusters overflow the co-resident ones into a mostly empty tail wave
// (tiles < 60% of waves x capacity, more than one wave) is skipped: ds-v3-t32 gate_up
// (32 tiles) measured 4 > 8 by ~6.7 us while glm45-t32 (24 tiles) gained from 8, the
// suspected cause being fewer than 32 co-resident 8-CTA clusters (GPC packing).
// `clusters`: co-resident clusters per split (index 1..8), nullptr: sms x 2 / split.
inline int choose_split_k(int64_t tiles, int64_t k_elems, int elem_bytes, int sms,
                          const int* clusters = nullptr) {
  const int64_t slots = static_cast<int64_t>(sms > 0 ? sms : 132) * kDecodeBlocksPerSm;
  if (tiles <= 0 || tiles >= 2 * slots) return 1;
  const int64_t k_tiles = (k_elems * elem_bytes + kDecodeBKBytes - 1) / kDecodeBKBytes;
  int best = 1;
  for (int s = 2; s <= kMaxSplitK; s *= 2) {
    if (tiles * s * 2 > slots * 5 || k_tiles / s < 6) continue;
    const int64_t cap = clusters && clusters[s] > 0 ? clusters[s] : slots / s;
    const int64_t waves = (tiles + cap - 1) / cap;
    if (waves > 1 && tiles * 10 < waves * cap * 6) continue;  // mostly empty tail wave
    best = s;
  }
  return best;
}

// problem.split_k (clamped to 1..8: any cluster size up to the portable 8 works, the
// kernel splits k slices evenly over any count) if set, else the heuristic's split.
// `clusters` as for choose_split_k (the engine passes splitk_cluster_capacity_table()).
inline int decode_split_k(const GroupedGemmProblem& p, int sms, const int* clusters = nullptr) {
  if (p.split_k > 0) return p.split_k < kMaxSplitK ? p.split_k : kMaxSplitK;
  return choose_split_k(decode_tiles_upper(p), p.k, 2, sms, clusters);
}

}  // namespace moekit::detail
