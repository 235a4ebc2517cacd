// The consumer warpgroups of the SM90 bf16/f16 kernels (the unpaired and paired kernels and
// the MLP chain): the loop over the block's tile ids and one cooperative warpgroup's tile,
// the mainloop (mainloop.cuh) and the register epilogue (epilogue.cuh).
#pragma once

#include <cute/tensor.hpp>

#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/schedule.cuh"
#include "gemm/sm90/swap_tile.cuh"

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

// The consumer warpgroups of the unpaired and paired kernels and the MLP chain (two
// warpgroups stacked along M, each computing 64 x BN of the BM x BN tile): their registers
// and wgmma operands, then block = block_values() (the kernel's per-block values), then for
// each id < total from the block's tile channel (the producer's order),
// tile(id, wg, read, run, block) locates the tile and calls run(read, t, skip, k_tiles, c, n,
// silu, swapped) once: warpgroup wg's part of tile t over k_tiles pipeline stages from `read`,
// stored to c (n output columns, silu pairs) unless `skip`; with `swapped` (runs_swapped) both
// warpgroups' swapped tile instead (swap_tile.cuh).
//
// `read` is the kernel's own variable (the consumers' pipeline state, at stage 0 and phase
// 0), passed down as an argument, and the kernels' lambdas are always_inline: a lambda
// inlined late, one that captured `read`, or a kernel value loaded at another point changed
// the order of ptxas' input and so the kernels' machine code (when this loop was shared,
// every kernel's code sections compared equal to those of its own loop before). The
// swapped tiles (a runtime flag of the plan) add their code to the 256-wide kernels.
template <class Cfg, class Shared, class Pipeline, class State, class BlockFn, class TileFn>
__device__ __forceinline__ void consume_tiles(Shared& ss, Pipeline& pipeline, State& read,
                                              int total, int warp_group, BlockFn&& block_values,
                                              TileFn&& tile) {
  using namespace cute;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  cutlass::arch::warpgroup_reg_alloc<Cfg::CONSUMER_REGS>();
  const int ctid = threadIdx.x - 128;
  typename Cfg::TiledMma mma;
  auto thr = mma.get_thread_slice(ctid);
  Tensor sA = make_tensor(make_smem_ptr(ss.a), typename Cfg::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(ss.b), typename Cfg::SmemLayoutB{});
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, MMA_M, MMA_K, STAGES)
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));  // (MMA, MMA_N, MMA_K, STAGES)
  Tensor acc = partition_fragment_C(mma, make_shape(Int<BM>{}, Int<BN>{}));
  Tensor tCcC = thr.partition_C(make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{})));
  static_assert(decltype(size(acc))::value == BM * BN / Cfg::CONSUMER_THREADS,
                "accumulator fragment size");
  const auto block = block_values();
  const int wg = warp_group - 1;  // this warpgroup's tile rows: 64 wg .. 64 wg + 63
  const int q = threadIdx.x & 3;  // lane within the quad that shares a D row
  check_accumulator_layout(tCcC, wg, q);
  const auto run = [&](auto& read, const Tile& t, bool skip, int k_tiles, auto* c, int64_t n,
                       bool silu, bool swapped) __attribute__((always_inline)) {
    if (swapped) {
      run_swap_tile<Cfg>(ss.a, ss.b, pipeline, read, t, k_tiles, c, n, silu, ctid);
    } else {
      run_cooperative_tile<Cfg::BN, Cfg::B_BOX, Cfg::CLUSTER>(
          mma, tCrA, tCrB, acc, tCcC, pipeline, read, t, skip, k_tiles, c, n, silu, q, wg);
    }
  };
  int j = 0;
  for (int id = channel_get(ss.channel, j++); id < total; id = channel_get(ss.channel, j++)) {
    // Paired: this warpgroup's lagging warps catch up (mainloop.cuh).
    pair_warpgroup_sync<Cfg::CLUSTER>(wg);
    tile(id, wg, read, run, block);
  }
}

}  // namespace moekit::detail::gemm::sm90
