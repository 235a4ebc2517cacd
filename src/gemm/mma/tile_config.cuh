// Compile-time tile shape of a grouped-GEMM kernel and its shared-memory layout.
//
// Everything is counted in bytes of k: one mma k-step is 32 bytes = two 16-byte
// chunks (16 elements of the 16-bit inputs).
#pragma once

#include <cstdint>

namespace moekit::detail::gemm {

template <int BM_, int BN_, int BK_BYTES_, int STAGES_, int WARPS_M_, int WARPS_N_, int MIN_BLOCKS_>
struct TileConfig {
  static constexpr int BM = BM_;              // rows of a (and c) per tile
  static constexpr int BN = BN_;              // rows of b per tile (= c columns, or 2x with silu)
  static constexpr int BK_BYTES = BK_BYTES_;  // bytes of k per pipeline stage
  static constexpr int STAGES = STAGES_;
  static constexpr int WARPS_M = WARPS_M_;
  static constexpr int WARPS_N = WARPS_N_;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;  // __launch_bounds__ blocks per SM
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int WM = BM / WARPS_M;  // warp tile rows
  static constexpr int WN = BN / WARPS_N;  // warp tile b rows
  static constexpr int MF = WM / 16;       // 16-row mma fragments per warp
  static constexpr int NF = WN / 8;        // 8-column mma fragments per warp
  static constexpr int CHUNKS = BK_BYTES / 16;
  static constexpr int KSTEPS = BK_BYTES / 32;
  static constexpr int A_STAGE_BYTES = BM * BK_BYTES;
  static constexpr int B_STAGE_BYTES = BN * BK_BYTES;
  static constexpr int SMEM_BYTES = STAGES * (A_STAGE_BYTES + B_STAGE_BYTES);
  // The loader gives each thread one fixed chunk column and rows spaced ROW_STEP apart.
  static constexpr int ROW_STEP = THREADS / CHUNKS;
  static constexpr int A_ITERS = BM / ROW_STEP;
  static constexpr int B_ITERS = BN / ROW_STEP;

  static_assert(BK_BYTES == 64 || BK_BYTES == 128 || BK_BYTES == 256,
                "swizzle handles 64-, 128- or 256-byte rows");
  static_assert(BM % (WARPS_M * 16) == 0 && BN % (WARPS_N * 16) == 0, "warp tiling");
  static_assert(NF % 2 == 0, "one ldmatrix.x4 loads two n fragments");
  static_assert(THREADS % CHUNKS == 0 && BM % ROW_STEP == 0 && BN % ROW_STEP == 0,
                "loader covers the tile exactly");
  static_assert(STAGES >= 2, "pipeline depth");
};

// Byte offset of 16-byte chunk `chunk` of tile row `row`, XOR-swizzled so that the
// 8 row addresses of one ldmatrix phase (8 consecutive rows, same logical chunk)
// hit 8 distinct 16-byte bank groups: conflict-free without padding.
template <int BK_BYTES>
__device__ __forceinline__ uint32_t swizzle_offset(int row, int chunk) {
  if constexpr (BK_BYTES >= 128) {
    // 128 bytes: each row one full line; 256: 8 rows at one logical chunk still land
    // in 8 distinct 16-byte bank groups ((chunk ^ row) mod 8 differs).
    return row * BK_BYTES + ((chunk ^ (row & 7)) << 4);
  } else {
    // Two 64-byte rows share a 128-byte line: vary the chunk with row/2.
    return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
  }
}

}  // namespace moekit::detail::gemm
