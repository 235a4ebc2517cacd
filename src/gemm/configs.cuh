// The tile configurations of the grouped-GEMM kernels (docs/gemm.md explains them).
#pragma once

#include "gemm/tile_config.cuh"

namespace moekit::detail::gemm {

// bf16 / f16.
// Decode: few rows per group, so the kernel streams b: 32-row tiles (half of it skipped
// when a group has <= 16 rows), 128 b rows x 64 k per stage, 4 stages, 2 blocks per SM.
using DecodeConfig = TileConfig<32, 128, 128, 4, 1, 4, 2>;
// Prefill: 128x256 tiles, 8 warps of 64x64, 32 k per stage, 4 stages (96 KB).
using PrefillConfig = TileConfig<128, 256, 64, 4, 2, 4, 1>;
// Prefill variants under evaluation (docs/gemm.md): 128x128 with 4 warps of 64x64 and
// 2 blocks per SM; 64 k per stage (half the barriers); 64-row tiles (less waste on
// ragged groups).
using Prefill128Config = TileConfig<128, 128, 64, 4, 2, 2, 2>;
using PrefillDeepKConfig = TileConfig<128, 256, 128, 3, 2, 4, 1>;
using Prefill128DeepKConfig = TileConfig<128, 128, 128, 3, 2, 2, 2>;
using Prefill64Config = TileConfig<64, 256, 64, 4, 2, 4, 2>;

// fp8: one stage = 128 k = one scale block. BN = 128 so a tile sits in one b_scale block.
using Fp8DecodeConfig = TileConfig<32, 128, 128, 5, 1, 4, 2>;
using Fp8PrefillConfig = TileConfig<128, 128, 128, 4, 2, 4, 1>;

}  // namespace moekit::detail::gemm
