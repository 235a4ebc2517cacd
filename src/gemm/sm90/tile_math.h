// Tile-count arithmetic of the SM90 grouped-GEMM kernels' device-side schedule
// (grouped_gemm.cuh), host/device so the CPU tests check it (tests/test_gemm.cpp).
//
// The schedule's per-group tile counts and their running sum live in 32-bit shared
// memory. The host bounds the grid by max_tiles() (<= INT_MAX, checked), which bounds the
// tiles of well-formed metadata; non-monotonic contiguous ends (meaningless but allowed:
// the kernels only promise to stay inside the buffers) can make the groups overlap and
// their counts sum far past it. So counts and prefixes are computed in 64 bits and
// saturated at the bound: the grid never walks past it anyway.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MOEKIT_SM90_HD __host__ __device__ __forceinline__
#else
#define MOEKIT_SM90_HD inline
#endif

namespace moekit::detail::gemm::sm90 {

// Tiles of one group of `count` rows (count >= 0), min'd with `bound`.
MOEKIT_SM90_HD int tiles_of_group(int64_t count, int bm, int n_tiles, int bound) {
  const int64_t t = (count + bm - 1) / bm * n_tiles;
  return static_cast<int>(t < bound ? t : bound);
}

// Pair tiles of one group for the adaptive pairs (sm90_pairs, kPairAuto): its m-tiles two
// by two on each n-tile (b shared), and an odd last m-tile's n-tiles two by two (a
// shared; the last pair's second tile past n when n_tiles is odd); min'd with `bound`.
MOEKIT_SM90_HD int pair_tiles_of_group(int64_t count, int bm, int n_tiles, int bound) {
  const int64_t m_tiles = (count + bm - 1) / bm;
  const int64_t t = m_tiles / 2 * n_tiles + (m_tiles & 1) * ((n_tiles + 1) / 2);
  return static_cast<int>(t < bound ? t : bound);
}

// The tiles (not pairs) in the first `items` pair tiles of such a group (the MLP chain's
// count of a group's stored gate_up tiles; items < the group's pair tiles only when the
// schedule saturated at the host's bound): 2 per m-pair, 2 per n-pair but 1 for the last
// n-pair of an odd n-tile count.
MOEKIT_SM90_HD int real_tiles_of_pairs(int64_t count, int bm, int n_tiles, int items) {
  const int64_t m_tiles = (count + bm - 1) / bm;
  const int64_t m_items = m_tiles / 2 * n_tiles;
  if (items <= m_items) return 2 * items;
  const int64_t n_items = items - m_items;  // <= (n_tiles + 1) / 2
  const bool half_last = (n_tiles & 1) && n_items == (n_tiles + 1) / 2;
  return static_cast<int>(2 * items - (half_last ? 1 : 0));
}

// running (tiles of the groups before a chunk, <= bound) + an inclusive in-chunk sum,
// min'd with `bound`.
MOEKIT_SM90_HD int tile_prefix(int64_t running, int64_t inclusive, int bound) {
  const int64_t t = running + inclusive;
  return static_cast<int>(t < bound ? t : bound);
}

// sm90's tile width (b rows per tile: 256, 224 without silu, or 192) for a dense GEMM
// of m rows and n_out output columns (silu: a tile's output columns are half its b rows):
// the width whose tile waves take the least time, a wave's time taken as its tile width,
// where that is at least 5% less than 256's (smaller tiles also pay more epilogues and
// pipeline fills); ties go to the wider tile. kimi-k2's 512-token shared expert: gate_up
// (n_out 18432, silu) 576 tiles of 256 on 132 SMs fill 5 waves (4.36 full), 768 of 192
// fill 6 (6 x 192 = 0.9 x 5 x 256); down (n 7168) 112 tiles of 256 leave 20 SMs idle,
// 128 of 224 take 0.875 of the time.
inline int dense_tile_n(int64_t m, int64_t n_out, bool silu, int sms) {
  if (m <= 0 || n_out <= 0 || sms <= 0) return 256;
  const auto cost = [&](int64_t bn) {
    const int64_t cols = silu ? bn / 2 : bn;
    const int64_t tiles = (m + 127) / 128 * ((n_out + cols - 1) / cols);
    return (tiles + sms - 1) / sms * bn;
  };
  int best = 256;
  for (int bn : {224, 192}) {
    if (silu && bn == 224) continue;
    if (cost(bn) < cost(best)) best = bn;
  }
  return cost(best) * 100 <= cost(256) * 95 ? best : 256;
}

}  // namespace moekit::detail::gemm::sm90

#undef MOEKIT_SM90_HD
