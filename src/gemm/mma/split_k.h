// Split-K of the decode tiles (GemmKernel::kDecodeSplitK): when the decode tiles are
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

// The split (1..8), from the H200 sweep GemmTiming.DISABLED_DecodeSplitSweep (docs/gemm.md
// "Decode split-K"): the one with the least modelled time, waves x (k slices per CTA +
// kSplitCtaCost), where a wave is the clusters of that size that are co-resident at
// once. A split is fast while all its clusters fit at once and slow as soon as a few
// spill into a second wave (ds-v3-t32 gate_up, 32 tiles: split 7 21.9 us with 32
// co-resident 7-CTA clusters, split 8 31.6 us with 30); the per-CTA cost (launch,
// pipeline fill, the DSMEM reduction: ~12 slices of 128 B) makes kimi-k2-t1 gate_up
// (288 tiles, several waves at any split) pick 3 (137 us; 4: 141, 2: 147). Splits
// leave >= 6 k slices per CTA; 1 (no split) from two waves of unsplit tiles up.
// `clusters`: co-resident clusters per split (index 1..8; nullptr: sms x 2 / split,
// which is what the CPU tests see; GemmDevice::splitk_clusters).
constexpr int64_t kSplitCtaCost = 12;  // in 128-byte k slices
inline int choose_split_k(int64_t tiles, int64_t k_elems, int elem_bytes, int sms,
                          const int* clusters = nullptr) {
  const int64_t slots = static_cast<int64_t>(sms > 0 ? sms : 132) * kDecodeBlocksPerSm;
  if (tiles <= 0 || tiles >= 2 * slots) return 1;
  const int64_t k_tiles = (k_elems * elem_bytes + kDecodeBKBytes - 1) / kDecodeBKBytes;
  auto cap = [&](int s) -> int64_t {
    const int64_t c = clusters && clusters[s] > 0 ? clusters[s] : slots / s;
    return c > 0 ? c : 1;
  };
  int best = 1;
  int64_t best_cost = 0;
  for (int s = 1; s <= kMaxSplitK; ++s) {
    if (s > 1 && k_tiles / s < 6) break;
    const int64_t waves = (tiles + cap(s) - 1) / cap(s);
    // x s keeps the division exact: waves x (k_tiles / s + cost), scaled by s.
    const int64_t cost = waves * (k_tiles + kSplitCtaCost * s) * (840 / s);
    if (s == 1 || cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

// Split CTAs with this many 128-byte k slices or more run the 256-byte stream tiles
// (kDecodeStream's stages) instead of the decode tiles: kimi-k2-t1 down (k 18432, split 4:
// 72 slices) 68.1 vs 71.1 us; shorter slices measured even or slower.
constexpr int64_t kSplitStreamMinSlices = 64;
inline bool split_uses_stream_tiles(int64_t k_elems, int elem_bytes, int split) {
  const int64_t k_tiles = (k_elems * elem_bytes + kDecodeBKBytes - 1) / kDecodeBKBytes;
  return split >= 2 && k_tiles / split >= kSplitStreamMinSlices;
}

}  // namespace moekit::detail
