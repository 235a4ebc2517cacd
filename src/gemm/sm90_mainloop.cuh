// Mainloop of one consumer warpgroup of the SM90 bf16/f16 grouped-GEMM kernels
// (config 2, sm90_grouped_gemm.cuh; config 6, sm90_pingpong.cuh).
#pragma once

#include <cute/tensor.hpp>

namespace moekit::detail::gemm::sm90 {

// Issues one tile's wgmmas over k_tiles >= 1 pipeline stages starting at `read`, keeping
// one wgmma batch in flight: stage kt's batch is issued before stage kt-1's shared memory
// is released. On return every batch is issued and all but the last have completed;
// `read` is one past the tile's stages, and the returned state is the tile's last stage,
// which the caller releases after warpgroup_wait<0>(). No branch around the wgmmas: one
// would make ptxas serialize them (C7518).
template <class Mma, class FragA, class FragB, class Acc, class Pipeline, class State>
__device__ __forceinline__ State issue_tile_wgmmas(Mma& mma, FragA& tCrA, FragB& tCrB, Acc& acc,
                                                   Pipeline& pipeline, State& read, int k_tiles) {
  using namespace cute;
  State release = read;
  pipeline.consumer_wait(read);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(tCrA); ++kb) {
    cute::gemm(mma, tCrA(_, _, kb, read.index()), tCrB(_, _, kb, read.index()), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
  ++read;
  CUTE_NO_UNROLL
  for (int kt = 1; kt < k_tiles; ++kt) {
    pipeline.consumer_wait(read);
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tCrA); ++kb) {
      cute::gemm(mma, tCrA(_, _, kb, read.index()), tCrB(_, _, kb, read.index()), acc);
    }
    warpgroup_commit_batch();
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc);
    pipeline.consumer_release(release);
    ++release;
    ++read;
  }
  return release;
}

}  // namespace moekit::detail::gemm::sm90
