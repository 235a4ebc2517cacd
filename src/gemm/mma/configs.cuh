// The tile configurations of the grouped-GEMM kernels (docs/gemm.md explains them).
#pragma once

#include "gemm/mma/split_k.h"
#include "gemm/mma/tile_config.cuh"

namespace moekit::detail::gemm {

// bf16 / f16.
// Decode: few rows per group, so the kernel streams b: 32-row tiles (half of it skipped
// when a group has <= 16 rows), 128 b rows x 64 k per stage, 4 stages, 2 blocks per SM.
using DecodeConfig = TileConfig<32, 128, 128, 4, 1, 4, 2>;
static_assert(DecodeConfig::BM == kDecodeBM && DecodeConfig::BN == kDecodeBN &&
                  DecodeConfig::BK_BYTES == kDecodeBKBytes &&
                  DecodeConfig::MIN_BLOCKS == kDecodeBlocksPerSm,
              "split_k.h mirrors DecodeConfig");
// Decode stream (kDecodeStream, kDecodeStreamDeep): 256 bytes of k per stage, so each weight row is
// read in 256-byte bursts (two 128-byte segments back to back), faster than 128 on long k
// (docs/gemm.md, "Decode tiles and stream tiles").
using DecodeStreamConfig = TileConfig<32, 128, 256, 2, 1, 4, 2>;      // 80 KB, 2 blocks/SM
using DecodeStreamDeepConfig = TileConfig<32, 128, 256, 5, 1, 4, 1>;  // 200 KB, 1 block/SM
// Narrow stream (kDecodeStreamNarrow): 64 b rows per tile, 3 stages (72 KB), 3 blocks per SM, for
// small standalone GEMMs (under 4 waves of decode tiles, k <= 2048): twice kDecodeStream's
// tiles, and each CTA keeps two stages of loads in flight where kDecodeStream's keeps one.
using DecodeStreamNarrowConfig = TileConfig<32, 64, 256, 3, 1, 4, 3>;

}  // namespace moekit::detail::gemm
