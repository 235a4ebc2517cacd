// Both GEMMs of an expert MLP (gate_up with silu_and_mul into act, then down) in one
// persistent launch of sm90's tiles, or of sm90_pairs' pair tiles on 2-CTA clusters
// (grouped_gemm.cuh; rank 0 claims each pair id and hands it to rank 1 through the
// mailbox, and waits for the last receipt before it exits): tile ids [0, total0) are
// gate_up's, [total0, total0 + total1) down's, claimed in increasing order from a counter
// (sm90's dynamic schedule, schedule.cuh, from the first tile on). A down tile of
// group g reads act rows that group g's gate_up tiles write, so its producer waits, before
// the tile's first load, until a per-group counter says every gate_up tile of g is stored.
// Down's tiles of the first groups then start while the last gate_up tiles are still
// running: no tail and no launch between the two GEMMs (docs/gemm.md "SM90 expert-MLP
// chain").
//
// Memory order: a gate_up tile's 256 consumer threads store, meet on a named barrier, and
// one of them publishes (fence.acq_rel.gpu, then a relaxed add: a release); the waiting
// producer reads the counter with ld.acquire.gpu and then orders its TMA (async proxy)
// reads after the generic-proxy stores with fence.proxy.async.global.
//
// No deadlock, whatever else runs on the GPU: every tile id, a block's first included,
// comes from the launch's counter (ids in increasing order), so a tile is only ever held
// by a running block; a down tile waits only on gate_up tiles, whose ids are lower, so
// they are all held by running blocks, and gate_up tiles never wait. (A static first
// tile, blockIdx.x, could belong to a block not yet resident while the resident blocks
// spin: two chains on two streams could then wait on each other.) A wait past
// kChainWaitNs (broken metadata, a bug) traps instead of hanging.
#pragma once

#include "gemm/mma/launch.cuh"  // rows_desc
#include "gemm/sm90/grouped_gemm.cuh"

namespace moekit::detail::gemm::sm90 {

template <class Cfg, class T>
struct ChainParams {
  Params<Cfg, T> up;       // gate_up: silu_and_mul, out = act
  Params<Cfg, T> down;     // down: a = act
  int total_bound;         // up.tile_bound + down.tile_bound
  unsigned* tile_counter;  // zeroed: every tile id is claimed from it
  unsigned* up_done;       // [G], zeroed: gate_up tiles of group g stored
};

template <class Cfg, class T>
struct ChainSharedStorage {
  SharedStorage<Cfg, T> s;                   // stages, pipeline, channel, gate_up's tile_start
  int down_tile_start[Cfg::MAX_GROUPS + 1];  // down's
};

constexpr long long kChainWaitNs = 2000000000LL;  // 2 s

__device__ __forceinline__ long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Producer thread, before a down tile's loads: waits until `need` gate_up tiles of the group
// are stored, then orders the coming TMA reads of act after those stores.
__device__ __forceinline__ void wait_up_done(const unsigned* done, unsigned need) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(done) : "memory");
  if (v < need) {
    const long long start = global_ns();
    do {
      __nanosleep(64);
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(done) : "memory");
      // No printf here: a call in the kernel makes ptxas serialize its wgmmas (C7510).
      if (v < need && global_ns() - start > kChainWaitNs) __trap();
    } while (v < need);
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// One consumer thread, after all 256 have stored a gate_up tile (named barrier): release.
__device__ __forceinline__ void publish_up_done(unsigned* done) {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(done) : "memory");
}

// Named barrier of the 256 consumer threads (ids 0 and 1 are pair_warpgroup_sync's).
constexpr int kChainConsumerBarrier = 2;

template <class Cfg, class T, class Out>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    sm90_mlp_chain_kernel(const __grid_constant__ ChainParams<Cfg, T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Pipeline = typename Cfg::Pipeline;
  constexpr int BM = Cfg::BM, BK = Cfg::BK;
  static_assert((Cfg::PAIR == kPairNone || Cfg::PAIR == kPairAuto) && Cfg::BN == 256,
                "the chain runs sm90's or sm90_pairs' 256-wide tiles");
  constexpr bool kAuto = Cfg::PAIR == kPairAuto;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& cs = *reinterpret_cast<ChainSharedStorage<Cfg, T>*>(smem_raw);
  auto& ss = cs.s;
  const int warp_group = threadIdx.x / 128;
  const int G = p.up.rows.num_groups;

  // Both GEMMs' schedules (same rows, their own n-tile counts and bounds).
  // sm90_pairs: pair tiles; rank 0 of each 2-CTA cluster claims the ids, rank 1 receives them.
  build_tile_schedule<Cfg::THREADS, BM, kAuto>(p.up.rows, p.up.n_tiles, p.up.tile_bound,
                                               ss.tile_start);
  build_tile_schedule<Cfg::THREADS, BM, kAuto>(p.down.rows, p.down.n_tiles, p.down.tile_bound,
                                               cs.down_tile_start);
  auto pipeline = start_pipeline<Cfg>(ss, warp_group);
  const int rank = tile_walk<Cfg>().rank;

  const int total0 = ss.tile_start[G];
  const int total = total0 + cs.down_tile_start[G];
  const int up_k_tiles = (p.up.k + BK - 1) / BK;
  const int down_k_tiles = (p.down.k + BK - 1) / BK;

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      auto write = cutlass::make_producer_start_state<Pipeline>();
      int j = 0, m = 0;
      // The next (pair) tile id: from the counter; paired, rank 0 claims and sends it.
      const auto claim = [&]() {
        if constexpr (kAuto) {
          if (rank == 1) return mailbox_recv(ss.mailbox, m++);
          const int n = static_cast<int>(atomicAdd(p.tile_counter, 1u));
          mailbox_send(ss.mailbox, m++, n);
          return n;
        } else {
          return static_cast<int>(atomicAdd(p.tile_counter, 1u));
        }
      };
      int id = claim();
      while (id < total) {
        channel_put(ss.channel, j++, id);
        const bool down = id >= total0;
        const Params<Cfg, T>& g = down ? p.down : p.up;
        const Tile t = locate_tile<Cfg>(g, down ? cs.down_tile_start : ss.tile_start,
                                        down ? id - total0 : id, rank);
        if (down) {
          // gate_up tiles of the group that are stored (paired: real tiles, not pairs).
          const int items = ss.tile_start[t.group + 1] - ss.tile_start[t.group];
          int need = items;
          if constexpr (kAuto) {
            int64_t first, count;
            group_rows(p.up.rows, t.group, first, count);
            need = real_tiles_of_pairs(count, BM, p.up.n_tiles, items);
          }
          wait_up_done(p.up_done + t.group, static_cast<unsigned>(need));
        }
        const int k_tiles = down ? down_k_tiles : up_k_tiles;
        const int claim_kt = claim_stage(k_tiles);
        int next = total;
        load_tile_stages<Cfg>(g, ss, pipeline, write, t, rank, k_tiles, [&](int kt) {
          if (kt == claim_kt) next = claim();
        });
        if (k_tiles == 0) next = claim();
        id = next;
      }
      channel_put(ss.channel, j++, total);
      if constexpr (kAuto) {
        if (rank == 0) mailbox_wait_receipt(ss.mailbox, m - 1);  // the exit hazard
      }
      pipeline.producer_tail(write);
    }
  } else {
    // Consumers: as sm90's (grouped_gemm.cuh), plus the gate_up tiles' publish.
    typename Cfg::PipelineState read;
    const auto tile = [&](int id, int wg, auto& read, const auto& run, int)
        __attribute__((always_inline)) {
      const bool down = id >= total0;
      const Params<Cfg, T>& g = down ? p.down : p.up;
      const Tile t = locate_tile<Cfg>(g, down ? cs.down_tile_start : ss.tile_start,
                                      down ? id - total0 : id, rank);
      const int k_tiles = down ? down_k_tiles : up_k_tiles;
      // No valid row in this warpgroup's half, or a pair's second n-tile past n: the
      // pipeline kept in step, nothing stored (nor, for gate_up, counted).
      const bool none = kAuto && t.n0 >= g.n;
      run(read, t, 64 * wg >= t.rows || none, k_tiles, static_cast<Out*>(g.c), g.n, g.silu != 0,
          runs_swapped<Cfg>(g.swap_tails != 0, t, g.n));
      if (!down && !none) {
        cutlass::arch::NamedBarrier::sync(Cfg::CONSUMER_THREADS, kChainConsumerBarrier);
        if (threadIdx.x == 128) publish_up_done(p.up_done + t.group);  // consumer thread 0
      }
    };
    const auto no_block_values = [] { return 0; };
    consume_tiles<Cfg>(ss, pipeline, read, total, warp_group, no_block_values, tile);
  }
  pair_exit_sync<Cfg>();
#endif
}

// Launches the chain of `up` (contiguous rows, silu_and_mul, out = act) and `down` (a =
// act, same rows and groups) on `stream`. The caller checked mlp_gemms_plan_rejection.
template <class T, class Out, int PAIR>
void launch_mlp_chain(const GroupedGemmProblem& up, const GroupedGemmProblem& down, void* scratch,
                      cudaStream_t stream, const char* op) {
  using Cfg = Config<T, PAIR, 256>;
  ChainParams<Cfg, T> p;
  const RowsDesc rows = rows_desc(up);
  const int64_t bound0 = make_params<Cfg, T>(up, rows, op, p.up);
  const int64_t bound1 = make_params<Cfg, T>(down, rows, op, p.down);
  if (bound0 <= 0 || bound1 <= 0) {
    throw Error(std::string("moekit::") + op + ": internal: an MLP chain GEMM launches nothing");
  }
  if (bound0 + bound1 > INT_MAX) {
    throw Error(std::string("moekit::") + op + ": problem too large for the SM90 MLP chain");
  }
  // Scratch (kSm90MlpChainScratchBytes): the dynamic schedule's counter, then one done
  // counter per group, zeroed together.
  if (rows.num_groups * sizeof(unsigned) + 256 > kSm90MlpChainScratchBytes) {
    throw Error(std::string("moekit::") + op + ": internal: too many groups for the MLP chain");
  }
  p.total_bound = static_cast<int>(bound0 + bound1);
  const cudaError_t err =
      cudaMemsetAsync(scratch, 0, 256 + rows.num_groups * sizeof(unsigned), stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(
        std::string("moekit::") + op +
        ": zeroing the MLP chain's counters in the workspace failed: " + cudaGetErrorString(err));
  }
  p.tile_counter = static_cast<unsigned*>(scratch);
  p.up_done = reinterpret_cast<unsigned*>(static_cast<char*>(scratch) + 256);
  static_assert(sizeof(ChainSharedStorage<Cfg, T>) <= 227 * 1024, "SM90 shared memory per block");
  constexpr int kSmem = static_cast<int>(sizeof(ChainSharedStorage<Cfg, T>));
  launch_persistent<Cfg, sm90_mlp_chain_kernel<Cfg, T, Out>, kSmem>(
      p, p.total_bound, kSlotSm90ChainPairClusters, stream, op);
}

}  // namespace moekit::detail::gemm::sm90
