// One cooperative consumer warpgroup's tile (the unpaired and paired kernels and the MLP
// chain): the mainloop (mainloop.cuh) and the register epilogue
// (epilogue.cuh).
#pragma once

#include <cute/tensor.hpp>

#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/schedule.cuh"

namespace moekit::detail::gemm::sm90 {

// Once per kernel: consumer warpgroup wg's first accumulator element is where the
// epilogue expects it (CuTe's 2 x 1 atom layout: warpgroup wg owns tile rows 64 wg ..
// 64 wg + 63, so its predication by row is right; lane q of a quad starts at column 2 q).
template <class Coords>
__device__ __forceinline__ void check_accumulator_layout(const Coords& tCcC, int wg, int q) {
  using namespace cute;
  if (get<0>(tCcC(0)) / 64 != wg || get<1>(tCcC(0)) != 2 * q) __trap();
}

// Warpgroup wg (0, 1) of the tile t: its wgmmas over k_tiles stages, then its 64 rows
// stored. With `skip` (no valid row in its half, or a pair's second tile that does not
// exist) it only keeps the pipeline in step and stores nothing.
template <int BN, int B_BOX, int CLUSTER, class Mma, class FragA, class FragB, class Acc,
          class Coords, class Pipeline, class State, class Out>
__device__ __forceinline__ void run_cooperative_tile(Mma& mma, FragA& tCrA, FragB& tCrB, Acc& acc,
                                                     const Coords& tCcC, Pipeline& pipeline,
                                                     State& read, const Tile& t, bool skip,
                                                     int k_tiles, Out* c, int64_t n, bool silu,
                                                     int q, int wg) {
  // Callers route k == 0 elsewhere. No clear(acc) for it either: an accumulator defined
  // by other instructions than wgmmas makes ptxas serialize them (C7515).
  if (k_tiles == 0) __trap();
  if (!consume_tile<CLUSTER>(mma, tCrA, tCrB, acc, pipeline, read, k_tiles, skip, wg)) return;
  // f32 -> (silu(gate) * up) -> one rounding -> predicated stores from the accumulators.
  store_accumulators<BN, B_BOX>(acc, tCcC, t, c, n, silu, q);
}

}  // namespace moekit::detail::gemm::sm90
