// Mainloop of the SM90 bf16/f16 grouped-GEMM kernels (grouped_gemm.cuh, mlp_chain.cuh):
// their pipeline's start and the paired exit, the producer thread's TMA loads and one
// consumer warpgroup's wgmmas (a stage's batch also the FP8 kernel's).
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include <cute/tensor.hpp>

#include "gemm/common/tma_ptx.cuh"
#include "gemm/sm90/schedule.cuh"

namespace moekit::detail::gemm::sm90 {

// TMA L2 cache policies (createpolicy encodings: CuTe's TMA::CacheHintSm90 values, which
// grouped_gemm.cuh checks) of the operands (docs/gemm.md, "L2 hints of b"):
// a normal; b EVICT_FIRST on its odd k stages (the second 128 bytes of each 256-byte line
// the L2 promotion fetched, its last read), which keeps more of a (re-read by the group's
// n-tiles) in the L2, and on every stage for dense rows (one a reused by every n-tile).
// Compile-time constants: no producer register holds them.
constexpr uint64_t kEvictNormal = 0x1000000000000000ull;
constexpr uint64_t kEvictFirst = 0x12F0000000000000ull;
__device__ __forceinline__ uint64_t b_policy(int k_stage, bool dense_rows) {
  return (k_stage & 1) || dense_rows ? kEvictFirst : kEvictNormal;
}

// One TMA box of `map` (tma_rows_args: coordinates (k, row, layer)) into `dst` on `bar`
// with the L2 policy `hint`: into this CTA only, or (MULTICAST) into the same offset of
// each CTA of the cluster in `mask`.
// The TMA pipeline's parameters for this thread: warpgroup 0 produces (thread 0 leads the
// barrier setup), the other warpgroups consume; a stage expects tx_bytes of TMA writes.
template <class Pipeline>
__device__ __forceinline__ typename Pipeline::Params pipeline_params(int warp_group,
                                                                     uint32_t tx_bytes,
                                                                     int consumer_threads) {
  typename Pipeline::Params pp;
  pp.transaction_bytes = tx_bytes;
  pp.role =
      warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = consumer_threads;
  return pp;
}

// The start of the bf16/f16 persistent kernels (grouped_gemm.cuh, mlp_chain.cuh), after the
// block built its tile schedule(s): thread 0 sets up the tile channel (both consumer
// warpgroups' 8 warps read every id) and, paired, the mailbox (rank 1's producer receives
// the pair ids from rank 0's); warp 0 inits the stage barriers (paired: each consumer
// warpgroup's releases arrive on both CTAs' empty barriers, as the partner multicasts into
// this CTA's stages). Returns once the barriers and the schedules are visible to the
// block and, paired, to the partner CTA.
template <class Cfg, class Shared>
__device__ __forceinline__ typename Cfg::Pipeline start_pipeline(Shared& ss, int warp_group) {
  using Pipeline = typename Cfg::Pipeline;
  if (threadIdx.x == 0) {
    channel_init(ss.channel, 8);
    if constexpr (Cfg::CLUSTER > 1) mailbox_init(ss.mailbox);
  }
  const auto pp = pipeline_params<Pipeline>(warp_group, Cfg::STAGE_BYTES, Cfg::CONSUMER_THREADS);
  Pipeline pipeline(ss.pipeline, pp, cute::Shape<cute::Int<Cfg::CLUSTER>, cute::_1, cute::_1>{});
  __syncthreads();
  if constexpr (Cfg::CLUSTER > 1) cute::cluster_sync();
  return pipeline;
}

template <bool MULTICAST>
__device__ __forceinline__ void load_box(void* dst, const CUtensorMap& map, uint64_t* bar,
                                         uint16_t mask, int k0, int row, int layer, uint64_t hint) {
  if constexpr (MULTICAST) {
    ptx90::tma_load_3d_multicast_hint(dst, &map, bar, mask, k0, row, layer, hint);
  } else {
    ptx90::tma_load_3d_hint(dst, &map, bar, k0, row, layer, hint);
  }
}

// The producer thread's loads of one tile `t`: k_tiles stages of the a box(es) (BM x BK
// rows from the tile's first a row) and two b boxes (B_BOX rows each, at the tile's two b
// row offsets), advancing `write`. Box i of a stage area is its i-th A_BOX x BK (B_BOX x BK)
// block (the SmemLayout*Boxes stack boxes along rows). The adaptive pairs (kPairAuto, 2-CTA
// clusters) load the shared operand's half that is theirs (`rank`), multicast to both CTAs:
// t.share == kPairN a rows [64 rank, + 64) of the tile (both CTAs have the same m-tile),
// kPairM b box `rank` (both have the same n-tile). Each CTA's full barrier still expects
// STAGE_BYTES: its own loads plus the partner's multicast half. before_stage(kt) runs before
// stage kt's acquire (the schedule claims its next tile there). Shared by the unpaired and
// paired kernels and the MLP chain.
template <class Cfg, class Params, class Shared, class Pipeline, class State, class BeforeStage>
__device__ __forceinline__ void load_tile_stages(const Params& p, Shared& ss, Pipeline& pipeline,
                                                 State& write, const Tile& t, int rank, int k_tiles,
                                                 BeforeStage&& before_stage) {
  constexpr int BK = Cfg::BK, A_BOX = Cfg::A_BOX, B_BOX = Cfg::B_BOX;
  static_assert(Cfg::PAIR == kPairNone || Cfg::PAIR == kPairAuto, "unpaired or adaptive pairs");
  constexpr bool kMulticast = Cfg::PAIR == kPairAuto;
  constexpr uint16_t kBoth = 0b11;  // multicast to both CTAs of the pair
  const uint16_t self = static_cast<uint16_t>(1u << rank);
  const auto a_box = [&](int i) { return ss.a + i * (A_BOX * BK); };
  const auto b_box = [&](int i) { return ss.b + i * (B_BOX * BK); };
  // kPairAuto: the tile's own a box(es) or its half of the shared one, per t.share.
  const int a_row = kMulticast && t.share == kPairN ? t.a_row + rank * A_BOX : t.a_row;
  const int b_row0 = kMulticast && t.share == kPairM && rank == 1 ? t.b_row1 : t.b_row0;
  for (int kt = 0; kt < k_tiles; ++kt) {
    before_stage(kt);
    pipeline.producer_acquire(write);  // waits for a free stage, expects STAGE_BYTES
    uint64_t* bar = pipeline.producer_get_barrier(write);
    const int s = write.index();
    const int k0 = kt * BK;
    const uint64_t hint_b = b_policy(kt, p.rows.mode == kRowsDense);
    const auto load_a = [&](int box, uint16_t mask, int row) {
      load_box<kMulticast>(a_box(box), p.tma_a, bar, mask, k0, row, t.a_l, kEvictNormal);
    };
    const auto load_b = [&](int box, uint16_t mask, int row) {
      load_box<kMulticast>(b_box(box), p.tma_b, bar, mask, k0, row, t.group, hint_b);
    };
    // Boxes past the tensor's edges are zero-filled and still count their full bytes.
    if constexpr (kMulticast) {
      // Multicast loads throughout: to both CTAs for the shared operand's half, to this CTA
      // only (mask 1 << rank) for its own operand.
      if (t.share == kPairN) {
        load_a(2 * s + rank, kBoth, a_row);
        load_b(2 * s, self, b_row0);
        load_b(2 * s + 1, self, t.b_row1);
      } else {
        load_a(2 * s, self, a_row);
        load_a(2 * s + 1, self, t.a_row + A_BOX);
        load_b(2 * s + rank, kBoth, b_row0);
      }
    } else {
      load_a(s, 0, a_row);
      load_b(2 * s, 0, b_row0);
      load_b(2 * s + 1, 0, t.b_row1);
    }
    ++write;
  }
}

// The next tile is claimed kClaimAhead stages before a tile's last load: the counter's
// round trip (several us behind a saturated L2) then overlaps the loads still to issue
// (docs/gemm.md, "Persistent grid and dynamic schedule").
constexpr int kClaimAhead = 16;
__device__ __forceinline__ int claim_stage(int k_tiles) {
  return k_tiles > kClaimAhead ? k_tiles - kClaimAhead : 0;
}

// The producer thread: for each of the block's tiles load_tile_stages, then waits until
// the consumers released every stage. The tile ids: the static walk (walk.first, +
// walk.stride, ...), or from the global counter when p.tile_counter is set
// (next_tile_id, claimed kClaimAhead stages before a tile's end). Each id is published to
// the block's consumers (the tile channel) before its loads, and after the last tile an id
// >= total ends their loop. Paired configs take their ids from the cluster's rank 0, which
// claims them and sends each to rank 1 (PairMailbox), so both CTAs load the same pair tiles.
template <class Cfg, class Params, class Shared, class Pipeline>
__device__ __forceinline__ void produce_tiles(const Params& p, Shared& ss, Pipeline& pipeline,
                                              int total, int k_tiles, Walk walk) {
  auto write = cutlass::make_producer_start_state<Pipeline>();
  constexpr bool kMailbox = Cfg::PAIR != kPairNone;
  int j = 0;  // the block's tile count so far (channel slot order)
  int m = 0;  // pair ids sent / received so far
  const int base = dynamic_base(total, walk.stride, p.tile_counter, p.dynamic_waves);
  const int claim_kt = claim_stage(k_tiles);
  // The id after `cur`: claimed (rank 0 also sends it to rank 1), or received (rank 1).
  const auto claim = [&](int cur) {
    if constexpr (kMailbox) {
      if (walk.rank == 1) return mailbox_recv(ss.mailbox, m++);
      const int n = next_tile_id(cur, walk.stride, p.tile_counter, base);
      mailbox_send(ss.mailbox, m++, n);
      return n;
    } else {
      return next_tile_id(cur, walk.stride, p.tile_counter, base);
    }
  };
  int id = walk.first;
  while (id < total) {
    channel_put(ss.channel, j++, id);
    const Tile t = locate_tile<Cfg>(p, ss.tile_start, id, walk.rank);
    int next = id + walk.stride;
    load_tile_stages<Cfg>(p, ss, pipeline, write, t, walk.rank, k_tiles, [&](int kt) {
      if (kt == claim_kt) next = claim(id);
    });
    if (k_tiles == 0) next = claim(id);
    id = next;
  }
  channel_put(ss.channel, j, total);
  pipeline.producer_tail(write);  // do not exit while consumers still read smem
}

// What an unpaired persistent kernel's consumers work with: the stage pipeline, the block's
// tile count, a tile's k stages and the block's tile walk.
template <class Cfg>
struct TileLoop {
  typename Cfg::Pipeline pipeline;
  int total;
  int k_tiles;
  Walk walk;
};

// The start the unpaired FP8 kernels on the bf16 engine share (fp8_fast_gemm.cu,
// fp8_block256_gemm.cu): the tile schedule, the pipeline and, on warpgroup 0, the whole
// producer (thread 0 issues every load; the warpgroup gives its registers to the
// consumers). Returns when warpgroup 0 is done; the consumers get their registers first.
template <class Cfg, class Params, class Shared>
__device__ __forceinline__ TileLoop<Cfg> start_tile_loop(const Params& p, Shared& ss,
                                                         int warp_group) {
  static_assert(Cfg::PAIR == kPairNone, "paired kernels start as grouped_gemm.cuh's");
  build_tile_schedule<Cfg::THREADS, Cfg::BM, false>(p.rows, p.n_tiles, p.tile_bound, ss.tile_start);
  TileLoop<Cfg> loop{start_pipeline<Cfg>(ss, warp_group), ss.tile_start[p.rows.num_groups],
                     (p.k + Cfg::BK - 1) / Cfg::BK, tile_walk<Cfg>()};
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      produce_tiles<Cfg>(p, ss, loop.pipeline, loop.total, loop.k_tiles, loop.walk);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Cfg::CONSUMER_REGS>();
  }
  return loop;
}

// Paired configs (2-CTA clusters): CUTLASS's PipelineTmaAsync then counts one release per
// consumer warpgroup (one signalling thread per destination CTA), not per thread, so a
// stage goes back to the producers when the signalling warp releases it, whatever the
// warpgroup's other warps are doing. A warpgroup that skips a tile's wgmmas (no valid row
// in its half, a pair's second tile past the group or past n) only waits and releases,
// with nothing (no wgmma's warpgroup-wide arrive) keeping its four warps in step: one
// still in the previous tile's epilogue (a slow path on some lanes) lets the others
// release stages it has not waited for, can fall a whole phase behind on a stage's
// barrier and then waits forever: paired kernels hung so when some warps lagged in the
// epilogue (docs/gemm.md, "`sm90_pairs`: adaptive pairs"). So the four warps meet (named
// barrier `wg`, 128 threads) at each tile's start and, when skipping, before each
// release. Unpaired configs count every consumer thread's release: nothing to do.
template <int CLUSTER>
__device__ __forceinline__ void pair_warpgroup_sync(int wg) {
  if constexpr (CLUSTER > 1) cutlass::arch::NamedBarrier::sync(128, wg);
}

// The end of a persistent kernel of Cfg: paired CTAs write into each other's shared memory
// (multicast stages, the pair mailbox's ids and remote arrives), so neither exits while the
// other may still do so.
template <class Cfg>
__device__ __forceinline__ void pair_exit_sync() {
  if constexpr (Cfg::CLUSTER > 1) {
    __syncwarp();
    cute::cluster_sync();
  }
}

// Waits for and releases a tile's k_tiles stages from `read` without reading them: a
// warpgroup with nothing to compute keeps the pipeline in step (paired: with its own warps
// too, pair_warpgroup_sync).
template <int CLUSTER, class Pipeline, class State>
__device__ __forceinline__ void skip_tile_stages(Pipeline& pipeline, State& read, int k_tiles,
                                                 int wg) {
  CUTE_NO_UNROLL
  for (int kt = 0; kt < k_tiles; ++kt) {
    pipeline.consumer_wait(read);
    pair_warpgroup_sync<CLUSTER>(wg);
    pipeline.consumer_release(read);
    ++read;
  }
}

// Issues one wgmma batch: the wgmmas of pipeline stage `stage` (its BK in k-steps of 16 or
// 32) into acc, each after the first accumulating (the caller sets mma.accumulate_ for the
// first), then commits the batch. The bf16 mainloop (issue_tile_wgmmas) and the FP8 kernel's
// block-scale loop share it.
template <class Mma, class FragA, class FragB, class Acc>
__device__ __forceinline__ void issue_stage_wgmmas(Mma& mma, FragA& tCrA, FragB& tCrB, Acc& acc,
                                                   int stage) {
  using namespace cute;
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(tCrA); ++kb) {
    cute::gemm(mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// Issues one tile's wgmmas over k_tiles >= 1 pipeline stages starting at `read`, keeping
// one wgmma batch in flight: stage kt's batch is issued before stage kt-1's shared memory
// is released. On return every batch is issued and all but the last have completed;
// `read` is one past the tile's stages, and the returned state is the tile's last stage,
// which the caller releases after warpgroup_wait<0>(). No branch around the wgmmas: one
// would make ptxas serialize them (C7518). One loop from the first stage (the first
// wgmma's ScaleOut::Zero set before it): with the first batch peeled off, ptxas copied the
// accumulators into the loop in the paired kernels and waited for that batch there (C7517).
template <class Mma, class FragA, class FragB, class Acc, class Pipeline, class State>
__device__ __forceinline__ State issue_tile_wgmmas(Mma& mma, FragA& tCrA, FragB& tCrB, Acc& acc,
                                                   Pipeline& pipeline, State& read, int k_tiles) {
  using namespace cute;
  State release = read;
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_NO_UNROLL
  for (int kt = 0; kt < k_tiles; ++kt) {
    pipeline.consumer_wait(read);
    issue_stage_wgmmas(mma, tCrA, tCrB, acc, read.index());
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc);
    if (kt > 0) {
      pipeline.consumer_release(release);
      ++release;
    }
    ++read;
  }
  return release;
}

// One cooperative consumer warpgroup's mainloop of a tile over k_tiles >= 1 stages (configs
// 2, 7, 10 and the MLP chain): with `skip` (no valid row in this warpgroup's half, or a
// pair's second tile that does not exist) it only waits for and releases the stages,
// keeping the pipeline in step while the other warpgroup has the tensor cores to itself
// (paired: in step with its own warps too, pair_warpgroup_sync); else it issues the tile's
// wgmmas and waits for them. Returns whether `acc` holds the tile (to be stored).
template <int CLUSTER, class Mma, class FragA, class FragB, class Acc, class Pipeline, class State>
__device__ __forceinline__ bool consume_tile(Mma& mma, FragA& tCrA, FragB& tCrB, Acc& acc,
                                             Pipeline& pipeline, State& read, int k_tiles,
                                             bool skip, int wg) {
  if (skip) {
    skip_tile_stages<CLUSTER>(pipeline, read, k_tiles, wg);
    return false;
  }
  const State release = issue_tile_wgmmas(mma, tCrA, tCrB, acc, pipeline, read, k_tiles);
  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(acc);
  pipeline.consumer_release(release);
  return true;
}

}  // namespace moekit::detail::gemm::sm90
