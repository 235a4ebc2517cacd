// Tile-count arithmetic of the SM90 grouped-GEMM config's device-side schedule
// (sm90_grouped_gemm.cuh), host/device so the CPU tests check it (tests/test_gemm.cpp).
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

// running (tiles of the groups before a chunk, <= bound) + an inclusive in-chunk sum,
// min'd with `bound`.
MOEKIT_SM90_HD int tile_prefix(int64_t running, int64_t inclusive, int bound) {
  const int64_t t = running + inclusive;
  return static_cast<int>(t < bound ? t : bound);
}

}  // namespace moekit::detail::gemm::sm90

#undef MOEKIT_SM90_HD
