// Persistent decode GEMM (decode_persistent, docs/gemm.md "Persistent decode tiles"): the
// decode_stream tiles (32 x 128, 256 bytes of k per stage) on a grid of at most 2 CTAs
// per SM, each walking tiles blockIdx.x, + gridDim.x, ... The group table (first tile,
// first row, row count per group) is built once per CTA in shared memory, and the cp.async
// pipeline runs over the CTA's k slices of all its tiles as one stream, so the next
// tile's first loads are in flight while the current tile's epilogue stores. decode_stream
// launches one CTA per tile and pays a CTA start, a scan of every group and a pipeline
// fill per tile (ds-v3 decode down: 14336 tiles of 512 KB of weights, 93-94% of the
// read rate).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <string>

#include "core/kernel_launch.h"
#include "gemm/mma/epilogue.cuh"
#include "gemm/mma/grouped_gemm_kernel.cuh"
#include "gemm/mma/mainloop.cuh"
#include "gemm/mma/tile_scheduler.cuh"
#include "moekit/error.h"

namespace moekit::detail::gemm {

// Groups the shared-memory table holds; more groups take decode_stream (the planner decides).
constexpr int kPersistentMaxGroups = kGemmPersistentMaxGroups;

struct PersistentGroupTable {
  int64_t first[kPersistentMaxGroups];       // first flattened row of each group
  int count[kPersistentMaxGroups];           // valid rows of each group
  int tile_start[kPersistentMaxGroups + 1];  // first tile id of each group; [G] = total
};

// What the persistent kernel runs a tile with (Tiles): the 16-bit tiles below, or e4m3 b
// (fp8_weight_tiles.cuh). Cfg (the tile and warp shape, the stages), the stage layout, the
// loader, one stage's mma and the epilogue.
template <class Cfg_, class In, class Out, class Mma>
struct Mma16Tiles {
  using Cfg = Cfg_;
  using Loader = TileLoader<Cfg>;
  static constexpr int A_STAGE_BYTES = Cfg::A_STAGE_BYTES;
  static constexpr int B_STAGE_BYTES = Cfg::B_STAGE_BYTES;
  static constexpr int SMEM_BYTES = Cfg::SMEM_BYTES;

  __device__ __forceinline__ static int k_slices(const GemmParams& p) {
    return gemm::k_slices<Cfg, In>(p);
  }
  __device__ __forceinline__ static void setup(const GemmParams& p, const TileCoord& t,
                                               Loader& loader) {
    setup_loader<Cfg, In>(p, t, loader);
  }
  struct Epilogue {};  // nothing read ahead for the epilogue
  __device__ __forceinline__ static void begin(const GemmParams&, const TileCoord&, int, int,
                                               Epilogue&) {}
  __device__ __forceinline__ static void mma(uint32_t s_a, uint32_t s_b,
                                             float (&acc)[Cfg::MF][Cfg::NF][4], int wm, int wn,
                                             int lane, int valid_mf) {
    warp_mma_tile<Cfg, Mma>(s_a, s_b, acc, wm, wn, lane, valid_mf);
  }
  __device__ __forceinline__ static void store(const GemmParams& p, const TileCoord& t,
                                               float (&acc)[Cfg::MF][Cfg::NF][4], int wm, int wn,
                                               int lane, const Epilogue&) {
    store_tile<Cfg, Out>(acc, static_cast<Out*>(p.c), p.n, t.row0, t.rows, t.n_tile, p.silu != 0,
                         wm, wn, lane);
  }
};

template <class Tiles>
constexpr int persistent_smem_bytes() {
  return Tiles::SMEM_BYTES + static_cast<int>(sizeof(PersistentGroupTable));
}

// Block-wide: fills the table for p.rows (tiles per group = ceil(count / BM) * n_tiles)
// and returns the total tile count, summed in 64 bits and capped at the host's launch
// bound (max_tiles <= INT_MAX): clamped out-of-range contiguous ends can make groups
// overlap, and then their tile counts add up past it (as in schedule.cuh).
template <class Cfg>
__device__ int build_group_table(const GemmParams& p, PersistentGroupTable& tab) {
  __shared__ int64_t s_warp_sum[Cfg::THREADS / 32];
  __shared__ int64_t s_running;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int groups = p.rows.num_groups;
  const int64_t bound = max_tiles(p.rows, Cfg::BM, p.n_tiles);
  if (tid == 0) s_running = 0;
  __syncthreads();
  for (int chunk = 0; chunk < groups; chunk += Cfg::THREADS) {
    const int g = chunk + tid;
    int64_t tiles = 0;
    if (g < groups) {
      int64_t first, count;
      group_rows(p.rows, g, first, count);
      tab.first[g] = first;
      tab.count[g] = static_cast<int>(count);
      tiles = (count + Cfg::BM - 1) / Cfg::BM * p.n_tiles;
    }
    int64_t incl = tiles;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int64_t v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    if (lane == 31) s_warp_sum[warp] = incl;
    __syncthreads();
    int64_t before = s_running, total = 0;
#pragma unroll
    for (int w = 0; w < Cfg::THREADS / 32; ++w) {
      if (w < warp) before += s_warp_sum[w];
      total += s_warp_sum[w];
    }
    if (g < groups) tab.tile_start[g] = static_cast<int>(min(before + incl - tiles, bound));
    __syncthreads();  // every thread has read s_running and s_warp_sum
    if (tid == 0) s_running += total;
    __syncthreads();
  }
  if (tid == 0) tab.tile_start[groups] = static_cast<int>(min(s_running, bound));
  __syncthreads();
  return tab.tile_start[groups];
}

// The coordinates of tile `tile` (< the table's total).
template <class Cfg>
__device__ __forceinline__ TileCoord locate(const PersistentGroupTable& tab, int groups,
                                            int n_tiles, int tile) {
  // The last group whose first tile is <= tile: empty groups share their first tile id
  // with the next group, so it is the non-empty one that holds the tile.
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tab.tile_start[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int count = tab.count[lo];
  const int m_tiles = (count + Cfg::BM - 1) / Cfg::BM;
  const int local = tile - tab.tile_start[lo];
  const int m_tile = local % m_tiles;
  TileCoord t;
  t.group = lo;
  t.n_tile = local / m_tiles;
  t.row0 = tab.first[lo] + static_cast<int64_t>(m_tile) * Cfg::BM;
  t.rows = min(Cfg::BM, count - m_tile * Cfg::BM);
  return t;
}

template <class Tiles>
__global__ void __launch_bounds__(Tiles::Cfg::THREADS, Tiles::Cfg::MIN_BLOCKS)
    grouped_gemm_persistent_kernel(const __grid_constant__ GemmParams p) {
  using Cfg = typename Tiles::Cfg;
  extern __shared__ __align__(128) uint8_t smem[];
  auto& tab = *reinterpret_cast<PersistentGroupTable*>(smem + Tiles::SMEM_BYTES);
  const int total = build_group_table<Cfg>(p, tab);
  const int start = static_cast<int>(blockIdx.x), stride = static_cast<int>(gridDim.x);
  if (start >= total) return;
  const int my_tiles = (total - start + stride - 1) / stride;
  const int kt_count = Tiles::k_slices(p);  // >= 1: the host sends k == 0 elsewhere
  const int64_t slices = static_cast<int64_t>(my_tiles) * kt_count;  // may pass 2^31

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / Cfg::WARPS_N, wn = warp % Cfg::WARPS_N;
  const int groups = p.rows.num_groups;
  const uint32_t s_a0 = smem_addr(smem);
  const uint32_t s_b0 = s_a0 + Cfg::STAGES * Tiles::A_STAGE_BYTES;

  // The load side runs STAGES - 1 slices ahead of the compute side, possibly a tile ahead.
  typename Tiles::Loader loader;
  int load_tile = -1;
  // Tile ids stay below total <= INT_MAX, so start + i * stride fits an int.
  const auto load = [&](int stage, int64_t s) {
    const int i = static_cast<int>(s / kt_count);
    if (i != load_tile) {
      load_tile = i;
      Tiles::setup(p, locate<Cfg>(tab, groups, p.n_tiles, start + i * stride), loader);
    }
    loader.load(s_a0 + stage * Tiles::A_STAGE_BYTES, s_b0 + stage * Tiles::B_STAGE_BYTES,
                static_cast<int>(s - static_cast<int64_t>(i) * kt_count));
  };

  float acc[Cfg::MF][Cfg::NF][4];
  typename Tiles::Epilogue epilogue;
  TileCoord t{};
  int valid_mf = 0;
#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < slices) load(s, s);
    cp_async_commit();
  }
  for (int64_t s = 0; s < slices; ++s) {
    const int kt = static_cast<int>(s % kt_count);
    if (kt == 0) {
      t = locate<Cfg>(tab, groups, p.n_tiles, start + static_cast<int>(s / kt_count) * stride);
      valid_mf = valid_fragments<Cfg>(t.rows, wm);
      zero_accumulators<Cfg>(acc);
      // Before the wait below: what the epilogue reads loads under the tile's mainloop.
      Tiles::begin(p, t, wn, lane, epilogue);
    }
    cp_async_wait<Cfg::STAGES - 2>();
    __syncthreads();  // slice s visible; every warp is done with the stage refilled below
    const int64_t next = s + Cfg::STAGES - 1;
    if (next < slices) load(static_cast<int>(next % Cfg::STAGES), next);
    cp_async_commit();
    const int stage = static_cast<int>(s % Cfg::STAGES);
    Tiles::mma(s_a0 + stage * Tiles::A_STAGE_BYTES, s_b0 + stage * Tiles::B_STAGE_BYTES, acc, wm,
               wn, lane, valid_mf);
    if (kt == kt_count - 1) Tiles::store(p, t, acc, wm, wn, lane, epilogue);
  }
  cp_async_wait<0>();
}

// Launches min(MIN_BLOCKS CTAs per SM, the tile bound) persistent CTAs. k > 0 and
// num_groups <= kPersistentMaxGroups (the caller checks).
template <class Tiles>
void launch_grouped_gemm_persistent(GemmParams p, int sms, cudaStream_t stream, const char* op) {
  using Cfg = typename Tiles::Cfg;
  const int64_t tiles = launch_tile_bound<Cfg>(p, op);
  if (tiles <= 0) return;
  const int64_t grid = std::min<int64_t>(tiles, static_cast<int64_t>(sms) * Cfg::MIN_BLOCKS);
  constexpr auto kernel = grouped_gemm_persistent_kernel<Tiles>;
  constexpr int smem = persistent_smem_bytes<Tiles>();
  raise_smem_limit<kernel>(smem);  // a refusal fails the launch (check_launch)
  kernel<<<static_cast<unsigned>(grid), Cfg::THREADS, smem, stream>>>(p);
}

}  // namespace moekit::detail::gemm
