// The grouped-GEMM mainloop: a cp.async multi-stage global->shared pipeline
// (TileLoader + run_pipeline) feeding ldmatrix + mma.sync warp tiles (warp_mma_tile).
#pragma once

#include <cstdint>

#include "gemm/common/ptx.cuh"
#include "gemm/mma/tile_config.cuh"
#include "gemm/mma/tile_scheduler.cuh"  // TileCoord

namespace moekit::detail::gemm {

// Copies one k-slice of the a tile (BM rows) and the b tile (BN rows) into a
// pipeline stage. Each thread owns one 16-byte chunk column and A_ITERS + B_ITERS
// rows; a null row pointer (row past the group, column past n) and chunks past k
// are zero-filled, so padding rows are never read and tails need no special case.
template <class Cfg>
struct TileLoader {
  const char* a_row[Cfg::A_ITERS];
  const char* b_row[Cfg::B_ITERS];
  const char* fallback;  // a valid address for zero-fill copies (nothing is read)
  int64_t k_bytes;
  int chunk;
  int row_base;
  bool b_hint = false;  // b copies carry b_policy (L2 evict-first for streamed weights)
  uint64_t b_policy = 0;

  __device__ __forceinline__ void load(uint32_t s_a, uint32_t s_b, int kt) const {
    load_a(s_a, kt);
    load_b(s_b, kt);
  }

  __device__ __forceinline__ void load_a(uint32_t s_a, int kt) const {
    load_rows(s_a, a_row, kt, /*hint=*/false);
  }

  __device__ __forceinline__ void load_b(uint32_t s_b, int kt) const {
    load_rows(s_b, b_row, kt, b_hint);
  }

  // The chunks of k-slice kt of `rows` (this thread's rows of a or b) into the stage at s,
  // with b_policy when `hint`.
  template <int ITERS>
  __device__ __forceinline__ void load_rows(uint32_t s, const char* const (&rows)[ITERS], int kt,
                                            bool hint) const {
    const int64_t kofs = static_cast<int64_t>(kt) * Cfg::BK_BYTES + chunk * 16;
    const bool k_ok = kofs < k_bytes;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int row = row_base + i * Cfg::ROW_STEP;
      const bool ok = k_ok && rows[i] != nullptr;
      const uint32_t dst = s + swizzle_offset<Cfg::BK_BYTES>(row, chunk);
      if (hint) {
        cp_async_16_hint(dst, ok ? rows[i] + kofs : fallback, ok, b_policy);
      } else {
        cp_async_16(dst, ok ? rows[i] + kofs : fallback, ok);
      }
    }
  }
};

// Sets up the loader of thread threadIdx.x for tile t: its chunk and first row, b's L2
// policy (evict-first with b_evict_first) and the rows of a (rows of k_bytes from a; null past
// the tile's valid rows: zero-filled). The caller points the b rows.
template <class Cfg>
__device__ __forceinline__ void setup_loader_a(TileLoader<Cfg>& loader, const void* a,
                                               int64_t k_bytes, const TileCoord& t,
                                               bool b_evict_first) {
  const int tid = threadIdx.x;
  loader.fallback = static_cast<const char*>(a);
  loader.k_bytes = k_bytes;
  loader.chunk = tid % Cfg::CHUNKS;
  loader.row_base = tid / Cfg::CHUNKS;
  if (b_evict_first) {
    loader.b_hint = true;
    loader.b_policy = l2_evict_first_policy();
  }
#pragma unroll
  for (int i = 0; i < Cfg::A_ITERS; ++i) {
    const int r = loader.row_base + i * Cfg::ROW_STEP;
    loader.a_row[i] = r < t.rows ? static_cast<const char*>(a) + (t.row0 + r) * k_bytes : nullptr;
  }
}

// Classic multistage loop: STAGES-1 slices in flight while one is consumed.
// load(stage, kt) issues the copies of k-slice kt; compute(stage, kt) consumes it.
template <class Cfg, class LoadFn, class ComputeFn>
__device__ __forceinline__ void run_pipeline(int k_tiles, LoadFn&& load, ComputeFn&& compute) {
#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < k_tiles) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    // Slice kt has landed once at most STAGES-2 newer groups are pending.
    cp_async_wait<Cfg::STAGES - 2>();
    // Makes slice kt visible to every warp, and ends every warp's reads of the
    // stage consumed at kt-1, which the load below overwrites.
    __syncthreads();
    const int next = kt + Cfg::STAGES - 1;
    if (next < k_tiles) load(next % Cfg::STAGES, next);
    cp_async_commit();
    compute(kt % Cfg::STAGES, kt);
  }
  cp_async_wait<0>();
}

// acc[mf][nf] += A(rows wm*WM + mf*16 ..) . B(rows wn*WN + nf*8 ..)^T over one stage.
// Fragments mf >= valid_mf hold only rows past the group: skipped (warp-uniform), so
// a mostly empty tile costs loads but little tensor-core time.
template <class Cfg, class Mma>
__device__ __forceinline__ void warp_mma_tile(uint32_t s_a, uint32_t s_b,
                                              float (&acc)[Cfg::MF][Cfg::NF][4], int wm, int wn,
                                              int lane, int valid_mf) {
#pragma unroll
  for (int ks = 0; ks < Cfg::KSTEPS; ++ks) {
    uint32_t af[Cfg::MF][4];
    uint32_t bf[Cfg::NF][2];
#pragma unroll
    for (int mf = 0; mf < Cfg::MF; ++mf) {
      if (mf < valid_mf) {
        // Matrices: rows 0-7 / 8-15 (lanes 0-15) x chunk 0 / 1 (lanes 0-15 / 16-31).
        const int row = wm * Cfg::WM + mf * 16 + (lane & 15);
        ldmatrix_x4(af[mf], s_a + swizzle_offset<Cfg::BK_BYTES>(row, ks * 2 + (lane >> 4)));
      }
    }
#pragma unroll
    for (int nf2 = 0; nf2 < Cfg::NF / 2; ++nf2) {
      // Matrices: (n 0-7, chunk 0), (n 0-7, chunk 1), (n 8-15, chunk 0), (n 8-15, chunk 1)
      // = b0, b1 of fragment 2*nf2 and b0, b1 of fragment 2*nf2+1.
      const int row = wn * Cfg::WN + nf2 * 16 + (lane & 7) + ((lane >> 4) << 3);
      uint32_t r[4];
      ldmatrix_x4(r, s_b + swizzle_offset<Cfg::BK_BYTES>(row, ks * 2 + ((lane >> 3) & 1)));
      bf[2 * nf2][0] = r[0];
      bf[2 * nf2][1] = r[1];
      bf[2 * nf2 + 1][0] = r[2];
      bf[2 * nf2 + 1][1] = r[3];
    }
#pragma unroll
    for (int mf = 0; mf < Cfg::MF; ++mf) {
      if (mf < valid_mf) {
#pragma unroll
        for (int nf = 0; nf < Cfg::NF; ++nf) Mma::mma(acc[mf][nf], af[mf], bf[nf]);
      }
    }
  }
}

// acc = 0 (a tile's or a stage's accumulators).
template <class Cfg>
__device__ __forceinline__ void zero_accumulators(float (&acc)[Cfg::MF][Cfg::NF][4]) {
#pragma unroll
  for (int mf = 0; mf < Cfg::MF; ++mf)
#pragma unroll
    for (int nf = 0; nf < Cfg::NF; ++nf)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mf][nf][i] = 0.f;
}

// Fragments of warp row wm that hold at least one of the tile's `rows` valid rows.
template <class Cfg>
__device__ __forceinline__ int valid_fragments(int rows, int wm) {
  const int rem = rows - wm * Cfg::WM;
  return rem <= 0 ? 0 : min(Cfg::MF, (rem + 15) / 16);
}

}  // namespace moekit::detail::gemm
