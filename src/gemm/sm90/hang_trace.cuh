// Debug aid for the SM90 kernels' mbarrier pipelines: built with -DMOEKIT_SM90_HANG_TRACE,
// Sm90Pipeline<STAGES> waits with a deadline (~2 s of SM clock) and, past it, prints who
// waits on what (block, cluster rank, thread, which wait, stage, parity, the pipeline
// state's stage count, the barrier word), then stops waiting, so that the kernel ends
// and the host sees the prints instead of a hang. Later waits give up after ~1 ms once
// one has. Without the define Sm90Pipeline is cutlass::PipelineTmaAsync itself.
// Caveat: printf is a call, so ptxas serializes the kernel's wgmmas (C7510) and the
// timing changes; it did not catch the paired configs' hang (docs/gemm.md).
#pragma once

#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <cstdio>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

namespace moekit::detail::gemm::sm90 {

#ifndef MOEKIT_SM90_HANG_TRACE
template <int STAGES>
using Sm90Pipeline = cutlass::PipelineTmaAsync<STAGES>;
#else
static __device__ unsigned g_hang_prints;
static __device__ int g_hang_seen;

__device__ inline void hang_wait(void* bar, uint32_t phase, const char* what, uint32_t stage,
                                 uint32_t count) {
  auto* word = reinterpret_cast<uint64_t*>(bar);
  const long long t0 = clock64();
  while (!cutlass::arch::ClusterBarrier::try_wait(word, phase)) {
    const long long limit =
        *reinterpret_cast<volatile int*>(&g_hang_seen) ? (1ll << 21) : (1ll << 32);
    if (clock64() - t0 > limit) {
      g_hang_seen = 1;
      if (threadIdx.x % 128 == 0 && atomicAdd(&g_hang_prints, 1u) < 64u) {
        printf("HANG block %d rank %u thread %d: %s stage %u parity %u count %u word %016llx\n",
               blockIdx.x, cute::block_rank_in_cluster(), threadIdx.x, what, stage, phase, count,
               static_cast<unsigned long long>(*reinterpret_cast<volatile uint64_t*>(word)));
      }
      return;
    }
  }
}

template <int STAGES>
class Sm90Pipeline : public cutlass::PipelineTmaAsync<STAGES> {
  using Base = cutlass::PipelineTmaAsync<STAGES>;

 public:
  using typename Base::PipelineState;
  template <class ClusterShape>
  __device__ Sm90Pipeline(typename Base::SharedStorage& s, typename Base::Params p, ClusterShape c)
      : Base(s, p, c), full_(&s.full_barrier_[0]), empty_(&s.empty_barrier_[0]) {}

  __device__ void producer_acquire(PipelineState st) {
    hang_wait(&empty_[st.index()], st.phase(), "producer acquire", st.index(), st.count());
    Base::producer_acquire(st, {cutlass::BarrierStatus::WaitDone});
  }
  __device__ void consumer_wait(PipelineState st) {
    hang_wait(&full_[st.index()], st.phase(), "consumer wait", st.index(), st.count());
  }
  __device__ void producer_tail(PipelineState st) {
    for (int i = 0; i < STAGES; ++i, ++st) {
      hang_wait(&empty_[st.index()], st.phase(), "producer tail", st.index(), st.count());
    }
  }

 private:
  typename Base::FullBarrier* full_;
  typename Base::EmptyBarrier* empty_;
};
#endif

}  // namespace moekit::detail::gemm::sm90
