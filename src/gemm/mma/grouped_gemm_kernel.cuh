// The bf16/f16 grouped-GEMM kernel: tile scheduler -> mainloop -> epilogue.
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <string>

#include "core/kernel_launch.h"
#include "gemm/mma/epilogue.cuh"
#include "gemm/mma/mainloop.cuh"
#include "gemm/mma/tile_scheduler.cuh"
#include "moekit/error.h"

namespace moekit::detail::gemm {

struct GemmParams {
  const void* a;
  const void* b;
  void* c;
  RowsDesc rows;
  int64_t n;  // output columns
  int64_t k;  // reduction length in elements
  int n_tiles;
  int silu;           // Activation::kSiluAndMul: b has 2n rows per group
  int b_evict_first;  // b (weight) loads marked L2 evict-first (gemm_b_evict_first)
  // e4m3 b (fp8_weight_tiles.cuh): b row j of group g is scaled by
  // b_scale[g * b_scale_group + j * b_scale_row] (per channel: 2n or n, 1; per tensor: 1, 0).
  const float* b_scale;
  int64_t b_scale_group;
  int64_t b_scale_row;
};

// Tile b row r (0..BN) of n-tile n_tile: its output column `col` and its row in the group's b
// (silu: per warp column block of WN b rows, WN/2 gate rows then the matching up rows, so
// one thread's fragments nf and nf + NF/2 hold the gate and up sums of the same outputs).
// P: GemmParams, or anything with its `silu` and `n`.
template <class Cfg, class P>
__device__ __forceinline__ void tile_b_row(const P& p, int n_tile, int r, int64_t& col,
                                           int64_t& b_row) {
  if (p.silu == 0) {
    col = static_cast<int64_t>(n_tile) * Cfg::BN + r;
    b_row = col;
    return;
  }
  const int w = r / Cfg::WN, rr = r % Cfg::WN, half = Cfg::WN / 2;
  col = static_cast<int64_t>(n_tile) * (Cfg::BN / 2) + w * half + (rr < half ? rr : rr - half);
  b_row = rr < half ? col : p.n + col;
}

// Points the loader of thread threadIdx.x at tile t's a rows and b rows (null: a row
// past the group or a column past n, zero-filled).
template <class Cfg, class In>
__device__ __forceinline__ void setup_loader(const GemmParams& p, const TileCoord& t,
                                             TileLoader<Cfg>& loader) {
  const int64_t k_bytes = p.k * static_cast<int64_t>(sizeof(In));
  setup_loader_a(loader, p.a, k_bytes, t, p.b_evict_first != 0);
  const int64_t b_group_rows = p.silu ? 2 * p.n : p.n;
  const char* b_group = static_cast<const char*>(p.b) + t.group * b_group_rows * k_bytes;
#pragma unroll
  for (int i = 0; i < Cfg::B_ITERS; ++i) {
    int64_t col, b_row;
    tile_b_row<Cfg>(p, t.n_tile, loader.row_base + i * Cfg::ROW_STEP, col, b_row);
    loader.b_row[i] = col < p.n ? b_group + b_row * k_bytes : nullptr;
  }
}

// One tile's mainloop over k-slices [kt_begin, kt_end) (of BK_BYTES each) into acc
// (zeroed here). Shared by the plain kernel (all of k) and the split-K kernel.
template <class Cfg, class In, class Mma>
__device__ __forceinline__ void tile_mainloop(const GemmParams& p, const TileCoord& t,
                                              uint8_t* smem, float (&acc)[Cfg::MF][Cfg::NF][4],
                                              int kt_begin, int kt_end) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Cfg::WARPS_N, wn = warp % Cfg::WARPS_N;

  TileLoader<Cfg> loader;
  setup_loader<Cfg, In>(p, t, loader);

  zero_accumulators<Cfg>(acc);

  const int valid_mf = valid_fragments<Cfg>(t.rows, wm);
  const uint32_t s_a0 = smem_addr(smem);
  const uint32_t s_b0 = s_a0 + Cfg::STAGES * Cfg::A_STAGE_BYTES;
  auto compute = [&](int stage, int) {
    warp_mma_tile<Cfg, Mma>(s_a0 + stage * Cfg::A_STAGE_BYTES, s_b0 + stage * Cfg::B_STAGE_BYTES,
                            acc, wm, wn, lane, valid_mf);
  };
  run_pipeline<Cfg>(
      kt_end - kt_begin,
      [&](int stage, int kt) {
        loader.load(s_a0 + stage * Cfg::A_STAGE_BYTES, s_b0 + stage * Cfg::B_STAGE_BYTES,
                    kt_begin + kt);
      },
      compute);
}

template <class Cfg, class In>
__device__ __forceinline__ int k_slices(const GemmParams& p) {
  const int64_t k_bytes = p.k * static_cast<int64_t>(sizeof(In));
  return static_cast<int>((k_bytes + Cfg::BK_BYTES - 1) / Cfg::BK_BYTES);
}

template <class Cfg, class In, class Out, class Mma>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    grouped_gemm_kernel(const __grid_constant__ GemmParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  TileCoord t;
  if (!find_tile<Cfg::THREADS>(p.rows, Cfg::BM, p.n_tiles, blockIdx.x, t)) return;
  float acc[Cfg::MF][Cfg::NF][4];
  tile_mainloop<Cfg, In, Mma>(p, t, smem, acc, 0, k_slices<Cfg, In>(p));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  store_tile<Cfg, Out>(acc, static_cast<Out*>(p.c), p.n, t.row0, t.rows, t.n_tile, p.silu != 0,
                       warp / Cfg::WARPS_N, warp % Cfg::WARPS_N, lane);
}

// The host's upper bound of Cfg's tiles for p (no sync on the metadata), with
// p.n_tiles set; <= 0: nothing to launch. Throws when tiles x split (the CTAs of a
// split-K launch) passes 32-bit ids.
template <class Cfg>
int64_t launch_tile_bound(GemmParams& p, const char* op, int split = 1) {
  const int64_t out_cols_per_tile = p.silu ? Cfg::BN / 2 : Cfg::BN;
  const int64_t n_tiles = (p.n + out_cols_per_tile - 1) / out_cols_per_tile;
  const int64_t tiles = max_tiles(p.rows, Cfg::BM, static_cast<int>(n_tiles));
  if (tiles <= 0) return 0;
  if (n_tiles > INT_MAX || tiles * split > INT_MAX) {
    throw Error(std::string("moekit::") + op + ": problem too large for one launch (" +
                std::to_string(tiles) + " tiles" +
                (split > 1 ? " x split " + std::to_string(split) : std::string()) + ")");
  }
  p.n_tiles = static_cast<int>(n_tiles);
  return tiles;
}

// Launches the kernel over an upper bound of tiles (no host sync on the metadata).
template <class Cfg, class In, class Out, class Mma>
void launch_grouped_gemm_kernel(GemmParams p, cudaStream_t stream, const char* op) {
  const int64_t tiles = launch_tile_bound<Cfg>(p, op);
  if (tiles <= 0) return;
  constexpr auto kernel = grouped_gemm_kernel<Cfg, In, Out, Mma>;
  raise_smem_limit<kernel>(Cfg::SMEM_BYTES);  // a refusal fails the launch (check_launch)
  kernel<<<static_cast<unsigned>(tiles), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(p);
}

}  // namespace moekit::detail::gemm
