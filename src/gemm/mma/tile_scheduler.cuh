// Maps a block to its (group, m-tile, n-tile) from the layout metadata, on the
// device: the host launches an upper bound of tiles without reading the metadata
// (no sync), and blocks past the real tile count exit at once.
//
// Tile order: group-major; inside a group n-tile-major, m-tile fastest. Blocks that
// share one b tile (the m-tiles of a group) run side by side, so b, the big operand
// of an MoE GEMM, is read from DRAM about once; the n-tiles of a group follow,
// reusing that group's a rows from L2.
#pragma once

#include <cstdint>

namespace moekit::detail::gemm {

enum RowsMode : int { kRowsContiguous = 0, kRowsMasked = 1, kRowsDense = 2 };

// How the rows of a / c split into groups. Out-of-range metadata is clamped, so a
// group never reaches outside [0, total_rows) (contiguous) or [0, max_m) (masked).
struct RowsDesc {
  int mode = kRowsDense;
  int num_groups = 1;
  const int32_t* meta = nullptr;  // contiguous ends or masked counts
  int alignment = 1;
  int64_t total_rows = 0;  // contiguous: P; dense: m
  int64_t max_m = 0;       // masked
};

// Group g owns rows [first, first + count) of the flattened a / c row space.
__device__ __forceinline__ void group_rows(const RowsDesc& d, int g, int64_t& first,
                                           int64_t& count) {
  if (d.mode == kRowsContiguous) {
    const int64_t P = d.total_rows;
    int64_t prev_end = g == 0 ? 0 : min(max(static_cast<int64_t>(d.meta[g - 1]), int64_t{0}), P);
    int64_t start = (prev_end + d.alignment - 1) / d.alignment * d.alignment;
    start = min(start, P);
    int64_t end = min(max(static_cast<int64_t>(d.meta[g]), int64_t{0}), P);
    first = start;
    count = max(end - start, int64_t{0});
  } else if (d.mode == kRowsMasked) {
    first = static_cast<int64_t>(g) * d.max_m;
    count = min(max(static_cast<int64_t>(d.meta[g]), int64_t{0}), d.max_m);
  } else {
    first = 0;
    count = d.total_rows;
  }
}

struct TileCoord {
  int group;
  int64_t row0;  // first flattened row of the tile
  int rows;      // valid rows in the tile, 1..BM
  int n_tile;
};

// Block-wide: finds the tile with linear index `tile_id`; false when it is past the
// last tile (the whole block then exits). Scans the groups in chunks of THREADS
// with a warp-shuffle prefix sum, so any number of groups works.
template <int THREADS>
__device__ bool find_tile(const RowsDesc& d, int BM, int n_tiles, int64_t tile_id, TileCoord& out) {
  constexpr int WARPS = THREADS / 32;
  __shared__ int64_t s_warp_sum[WARPS];
  __shared__ int s_group;
  __shared__ int64_t s_base;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (d.num_groups <= 0) return false;
  if (tid == 0) s_group = -1;
  int64_t running = 0;  // tiles of the groups before this chunk
  for (int chunk = 0; chunk < d.num_groups; chunk += THREADS) {
    const int g = chunk + tid;
    int64_t tiles = 0;
    if (g < d.num_groups) {
      int64_t first, count;
      group_rows(d, g, first, count);
      tiles = (count + BM - 1) / BM * n_tiles;
    }
    int64_t incl = tiles;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      int64_t v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    if (lane == 31) s_warp_sum[warp] = incl;
    __syncthreads();
    int64_t before = running, total = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      if (w < warp) before += s_warp_sum[w];
      total += s_warp_sum[w];
    }
    const int64_t excl = before + incl - tiles;
    if (tiles > 0 && tile_id >= excl && tile_id < excl + tiles) {
      s_group = g;  // exactly one thread matches
      s_base = excl;
    }
    running += total;
    __syncthreads();  // publishes s_group; s_warp_sum is free for the next chunk
    if (s_group >= 0) break;
  }
  const int g = s_group;
  if (g < 0) return false;
  int64_t first, count;
  group_rows(d, g, first, count);
  const int64_t m_tiles = (count + BM - 1) / BM;
  const int64_t local = tile_id - s_base;
  const int64_t m_tile = local % m_tiles;
  out.group = g;
  out.n_tile = static_cast<int>(local / m_tiles);
  out.row0 = first + m_tile * BM;
  out.rows = static_cast<int>(min(static_cast<int64_t>(BM), count - m_tile * BM));
  return true;
}

// How many tiles to launch (an upper bound of the real count); the persistent kernel
// also caps its device-side count with it.
__host__ __device__ inline int64_t max_tiles(const RowsDesc& d, int BM, int n_tiles) {
  int64_t m_tiles = 0;
  if (d.mode == kRowsContiguous) {
    // Each group wastes at most one partial tile: sum ceil(c_g/BM) <= P/BM + G.
    m_tiles = (d.total_rows + BM - 1) / BM + d.num_groups;
  } else if (d.mode == kRowsMasked) {
    m_tiles = static_cast<int64_t>(d.num_groups) * ((d.max_m + BM - 1) / BM);
  } else {
    m_tiles = (d.total_rows + BM - 1) / BM;
  }
  return m_tiles * n_tiles;
}

}  // namespace moekit::detail::gemm
