// Swapped tail tiles of the SM90 bf16/f16 kernels (grouped_gemm.cuh, mlp_chain.cuh; the
// plan's `swap_tails`): a tile with few valid rows computed as its transpose.
//
// Why: wgmma's M is 64 rows per warpgroup, so a tile computes its rows in halves of 64; a
// group's last tile with r valid rows costs the tensor time of ceil(r / 64) * 64 rows. On
// routed prefill counts (each expert's count different) that is 12-25% more tensor work
// than the rows need at 128-256 rows per expert (docs/gemm.md, "Swapped tail tiles").
// wgmma's N is any multiple of 8, so the transposed product D^T = W X^T, the tile's 256
// weight rows as M and its r <= 32 valid rows as N (16 or 32), does the MACs of 16 or 32
// rows where the normal tile does 64 (one warpgroup's half; the other skips); its small-N
// wgmmas are bound by shared-memory reads instead, so the tail's mainloop is expected
// ~1.6x (N = 16) / ~1.3x (N = 32) faster, not 4x / 2x. From 33 rows on it would not gain.
//
// Include after cute/atom/mma_traits_sm90_gmma.hpp (grouped_gemm.cuh's include order).
//
// Nothing changes for the producer: the stage holds the tile's a rows (128) and b rows
// (256) as for a normal tile. Both consumer warpgroups issue, per 16 k, two
// wgmma 64xNx16: warpgroup wg takes weight rows 64 wg .. 64 wg + 63 and 128 + 64 wg ..
// 128 + 64 wg + 63 (CuTe's 2 x 1 atom layout repeated over M = 256) against the first N a
// rows. With silu_and_mul (b box 0 = 128 gate rows, box 1 = the up rows of the same output
// columns) a thread thus holds gate (c, x) and up (c, x) in the same registers of its two M
// blocks, and the epilogue pairs them there. The epilogue stores D^T transposed: 2- or
// 4-byte stores of one output column per element (a warp's store covers 8 adjacent columns
// of 4 rows), predicated by row < r and column < n.
#pragma once

#include <cute/tensor.hpp>

#include "core/dtype.cuh"
#include "gemm/sm90/mainloop.cuh"  // issue_tile_wgmmas
#include "gemm/sm90/schedule.cuh"  // Tile

namespace moekit::detail::gemm::sm90 {

// Tiles with at most this many valid rows run swapped (the widest N below).
constexpr int kSwapMaxRows = 32;

// The swapped product's N for r valid rows (1 <= r <= kSwapMaxRows).
__host__ __device__ constexpr int swap_tile_n(int rows) {
  return rows <= 16 ? 16 : 32;
}

// Cfg's a stages seen as their first N rows: the same swizzled atoms (8 rows x 128 bytes,
// stacked along rows first) and the same stage stride as Cfg::SmemLayoutA, so GMMA
// descriptors of this view address the rows the producer loaded.
template <class Cfg, int N>
using SwapSmemLayoutX = decltype(cute::append<3>(
    cute::tile_to_shape(typename Cfg::SmemAtom{},
                        cute::make_shape(cute::Int<N>{}, cute::Int<Cfg::BK>{})),
    cute::Layout<cute::Int<Cfg::STAGES>, cute::Int<Cfg::BM * Cfg::BK>>{}));

// Two consumer warpgroups over M = 256 weight rows: each issues 64xNx16 wgmmas on two M
// blocks 128 rows apart.
template <class T, int N, int BK>
using SwapTiledMma = decltype(cute::make_tiled_mma(
    cute::GMMA::ss_op_selector<T, T, float, cute::Shape<cute::Int<64>, cute::Int<N>, cute::Int<BK>>,
                               cute::GMMA::Major::K, cute::GMMA::Major::K>(),
    cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

// Stores the swapped accumulators of tile t: element (w, x) is output row x, column
// t.n0 + w (silu: w < B_BOX, gate; its up partner is the element of the next M block,
// B_BOX weight rows further, at index i + ACC / 2).
template <int B_BOX, class Out, class Acc, class Coords>
__device__ __forceinline__ void store_swapped(const Acc& acc, const Coords& tCcC, const Tile& t,
                                              Out* c, int64_t n, bool silu) {
  using namespace cute;
  constexpr int ACC = decltype(size(acc))::value;
  const auto put = [&](int i, float v) {
    const int x = get<1>(tCcC(i));
    const int64_t col = t.n0 + get<0>(tCcC(i));
    if (x < t.rows && col < n) c[(t.c_row + x) * n + col] = from_float<Out>(v);
  };
  if (silu) {
    CUTE_UNROLL
    for (int i = 0; i < ACC / 2; ++i) {
      // The pairing rests on CuTe's fragment order (M blocks outermost): trap if it differs.
      if (get<0>(tCcC(i + ACC / 2)) != get<0>(tCcC(i)) + B_BOX ||
          get<1>(tCcC(i + ACC / 2)) != get<1>(tCcC(i))) {
        __trap();
      }
      put(i, detail::silu(acc(i)) * acc(i + ACC / 2));
    }
  } else {
    CUTE_UNROLL
    for (int i = 0; i < ACC; ++i) put(i, acc(i));
  }
}

// One swapped tile of N columns (both consumer warpgroups; ctid = consumer thread 0..255):
// its wgmmas over the k_tiles stages from `read` (released as they are consumed), then
// its stores. Its N accumulators per thread sit beside the normal tile's 128: at N = 96
// they no longer fit (ptxas serializes every wgmma of the kernel, C7512; as a view of the
// normal tile's registers too, C7511), at N = 64 the chain kernel spills; N <= 32 does not.
template <class Cfg, int N, class T, class Out, class Pipeline, class State>
__device__ __forceinline__ void run_swap_tile_n(T* smem_a, T* smem_b, Pipeline& pipeline,
                                                State& read, const Tile& t, int k_tiles, Out* c,
                                                int64_t n, bool silu, int ctid) {
  using namespace cute;
  static_assert(Cfg::BN == 256 && Cfg::B_BOX == 128, "swapped tiles: 256 weight rows as M");
  SwapTiledMma<T, N, Cfg::BK> mma;
  auto thr = mma.get_thread_slice(ctid);
  Tensor sW = make_tensor(make_smem_ptr(smem_b), typename Cfg::SmemLayoutB{});  // (256, BK, S)
  Tensor sX = make_tensor(make_smem_ptr(smem_a), SwapSmemLayoutX<Cfg, N>{});    // (N, BK, S)
  Tensor tCrW = thr.make_fragment_A(thr.partition_A(sW));
  Tensor tCrX = thr.make_fragment_B(thr.partition_B(sX));
  Tensor acc = partition_fragment_C(mma, make_shape(Int<Cfg::BN>{}, Int<N>{}));
  Tensor tCcC = thr.partition_C(make_identity_tensor(make_shape(Int<Cfg::BN>{}, Int<N>{})));
  const State release = issue_tile_wgmmas(mma, tCrW, tCrX, acc, pipeline, read, k_tiles);
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  pipeline.consumer_release(release);
  store_swapped<Cfg::B_BOX>(acc, tCcC, t, c, n, silu);
}

// Tile t (1 <= t.rows <= kSwapMaxRows) swapped, N by its rows.
template <class Cfg, class T, class Out, class Pipeline, class State>
__device__ __forceinline__ void run_swap_tile(T* smem_a, T* smem_b, Pipeline& pipeline, State& read,
                                              const Tile& t, int k_tiles, Out* c, int64_t n,
                                              bool silu, int ctid) {
  if (k_tiles == 0) __trap();  // callers route k == 0 elsewhere (as run_cooperative_tile)
  if constexpr (Cfg::BN != 256) {
    __trap();  // runs_swapped is false for narrower tiles
  } else {
    switch (swap_tile_n(t.rows)) {
      case 16:
        run_swap_tile_n<Cfg, 16>(smem_a, smem_b, pipeline, read, t, k_tiles, c, n, silu, ctid);
        break;
      default:
        run_swap_tile_n<Cfg, 32>(smem_a, smem_b, pipeline, read, t, k_tiles, c, n, silu, ctid);
        break;
    }
  }
}

// Whether tile t runs swapped: the plan asks for it, the tile has 1..kSwapMaxRows rows
// and something to store (not a pair's tile past n), and the config has 256-wide tiles.
template <class Cfg>
__device__ __forceinline__ bool runs_swapped(bool swap_tails, const Tile& t, int64_t n) {
  if constexpr (Cfg::BN != 256) {
    return false;
  } else {
    return swap_tails && t.rows > 0 && t.rows <= kSwapMaxRows && t.n0 < n;
  }
}

}  // namespace moekit::detail::gemm::sm90
