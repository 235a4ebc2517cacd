// The SM90 (Hopper) bf16/f16 grouped-GEMM kernel, ping-pong variant (config 6,
// kGemmConfigSm90Pingpong): one producer warp loading for two consumer warpgroups that
// each own a whole 64 x 256 tile and take turns on the tensor cores, so that one
// warpgroup's epilogue runs while the other's mainloop keeps the tensor cores (and, through
// the freed stages, the TMA loads) busy. The shape of CUTLASS's
// KernelTmaWarpSpecializedPingpong, composed of CuTe pieces as config 2 is
// (grouped_gemm.cuh, whose descriptors, parameters, schedule and epilogue it shares).
//
// Never picked (config 2's dynamic walk wins its rows; docs/gemm.md, "SM90 ping-pong").
// Config 8 is its paired variant (2-CTA clusters on m-tile pairs,
// b multicast). docs/gemm.md, "SM90 ping-pong" and "Paired SM90 configs".
//
// Design:
// - Tile 64 x 256 x 64 per consumer warpgroup: one wgmma 64x256x16 per 16 k (the widest
//   wgmma: the least shared-memory operand traffic per FLOP), the same per-thread
//   accumulator layout (128 f32) as a config-2 consumer, so the silu pairing (box 0 =
//   128 gate rows, box 1 = the 128 up rows of the same output columns) and the epilogue
//   (store_accumulators) are config 2's. 64-row tiles also halve the rows a ragged
//   group's last tile wastes.
// - 5 stages of 40 KB (a 64 x 64 + b 256 x 64, 128-byte swizzle) on one
//   cutlass::PipelineTmaAsync; the producer thread fills them in tile order, so the
//   stages of consecutive tiles alternate between the consumers: each consumer skips the
//   other's k_tiles stages (PipelineState::advance), as CUTLASS's ping-pong does.
// - Tile ids blockIdx.x + j * gridDim.x (the device-side schedule of config 2,
//   schedule.cuh); tile j of a block goes to consumer j % 2.
// - cutlass::OrderedSequenceBarrier<1, 2>: a consumer issues its tile's wgmmas only
//   after the other one has issued all of its previous tile's (mainloops in tile order,
//   never interleaved on the tensor cores); the epilogues are not ordered (global stores
//   straight from registers, no shared buffer), so consumer A's epilogue overlaps
//   consumer B's mainloop.
#pragma once

#include "gemm/sm90/grouped_gemm.cuh"  // make_tma, Params, make_params, launch_persistent

namespace moekit::detail::gemm::sm90 {

// PAIR_ (schedule.cuh): kPairNone = config 6; kPairM = config 8, 2-CTA clusters on
// m-tile pairs of one n-tile with the b boxes multicast (each CTA loads one of the two).
template <class T, int PAIR_ = kPairNone>
struct PingpongConfig {
  static constexpr int BM = 64, BN = 256, BK = 64, STAGES = 5;
  static constexpr int B_BOX = 128;  // b rows per TMA box (two boxes per stage)
  static constexpr int PAIR = PAIR_;
  static constexpr int CLUSTER = PAIR == kPairNone ? 1 : 2;
  static constexpr int A_BOX = BM;  // a rows per TMA box
  static constexpr int MAX_GROUPS = 1024;
  static constexpr int THREADS = 384;  // warpgroup 0: producer; 1, 2: consumers
  static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // 128*40 + 256*232 <= 64K
  static constexpr uint32_t STAGE_BYTES = (BM + BN) * BK * sizeof(T);

  using SmemAtom = cute::GMMA::Layout_K_SW128_Atom<T>;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<BM>{}, cute::Int<BK>{}, cute::Int<STAGES>{})));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<BN>{}, cute::Int<BK>{}, cute::Int<STAGES>{})));
  // b's stage bytes as 2*STAGES boxes of 128 rows (as config 2: 16 KB boxes keep the
  // swizzle phase).
  using SmemLayoutBBoxes = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<B_BOX>{}, cute::Int<BK>{}, cute::Int<2 * STAGES>{})));
  // One consumer warpgroup computes the whole 64 x 256 tile.
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<T, T, float,
                                 cute::Shape<cute::Int<BM>, cute::Int<BN>, cute::Int<BK>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>{}));
  using Pipeline = cutlass::PipelineTmaAsync<STAGES>;
  using PipelineState = typename Pipeline::PipelineState;
  using OrderBarrier = cutlass::OrderedSequenceBarrier<1, 2>;
};

template <class Cfg, class T>
struct PingpongSharedStorage {
  // A at the start of dynamic smem (1024-byte aligned: no static smem), B after 40 KB.
  alignas(1024) T a[cute::cosize_v<typename Cfg::SmemLayoutA>];
  alignas(1024) T b[cute::cosize_v<typename Cfg::SmemLayoutB>];
  typename Cfg::Pipeline::SharedStorage pipeline;
  typename Cfg::OrderBarrier::SharedStorage order;
  TileChannel channel;                  // tile ids, producer -> consumers (unpaired)
  int tile_start[Cfg::MAX_GROUPS + 1];  // tiles before group g; [G] = total
};

template <class Cfg, class T, class Out>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    sm90_pingpong_gemm_kernel(const __grid_constant__ Params<Cfg, T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  using Pipeline = typename Cfg::Pipeline;
  using PipelineState = typename Cfg::PipelineState;
  using OrderBarrier = typename Cfg::OrderBarrier;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<PingpongSharedStorage<Cfg, T>*>(smem_raw);
  const int warp_group = threadIdx.x / 128;

  build_tile_schedule<Cfg::THREADS, sched_bm<Cfg>()>(p.rows, sched_n_tiles<Cfg>(p.n_tiles),
                                                     p.tile_bound, ss.tile_start);
  // Each tile id is read by the one consumer warpgroup (4 warps) that computes it.
  if (Cfg::PAIR == kPairNone && threadIdx.x == 0) channel_init(ss.channel, 4);

  typename Pipeline::Params pp;
  pp.transaction_bytes = Cfg::STAGE_BYTES;
  pp.role =
      warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = 128;  // each stage is read by one consumer warpgroup
  // Warp 0 inits the barriers; with a pair, a consumer's releases arrive on both CTAs'
  // empty barriers (the partner multicasts into this CTA's stages).
  Pipeline pipeline(ss.pipeline, pp, Shape<Int<Cfg::CLUSTER>, _1, _1>{});
  typename OrderBarrier::Params op;
  op.group_id = warp_group == 2 ? 1 : 0;  // the producer never uses it
  op.group_size = 128;
  OrderBarrier order(ss.order, op);  // warp 0 inits; consumer 0 holds the first turn
  __syncthreads();                   // barrier init and the tile schedule are visible to all
  if constexpr (Cfg::CLUSTER > 1) cute::cluster_sync();  // and to the partner CTA

  const int total = ss.tile_start[p.rows.num_groups];
  const int k_tiles = (p.k + BK - 1) / BK;
  const Walk walk = tile_walk<Cfg>();

  if (warp_group == 0) {
    // Producer: one thread issues every TMA load, tiles in order (both consumers').
    cutlass::arch::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      produce_tiles<Cfg, 2>(p, ss, pipeline, total, k_tiles, walk);
    }
  } else {
    // Consumers: warpgroup 1 + w takes the block's tiles j with j % 2 == w, whole.
    cutlass::arch::warpgroup_reg_alloc<Cfg::CONSUMER_REGS>();
    const int w = warp_group - 1;
    const int ctid = threadIdx.x - 128 * warp_group;
    typename Cfg::TiledMma mma;
    auto thr = mma.get_thread_slice(ctid);
    Tensor sA = make_tensor(make_smem_ptr(ss.a), typename Cfg::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(ss.b), typename Cfg::SmemLayoutB{});
    Tensor tCsA = thr.partition_A(sA);        // (MMA, MMA_M, MMA_K, STAGES)
    Tensor tCsB = thr.partition_B(sB);        // (MMA, MMA_N, MMA_K, STAGES)
    Tensor tCrA = thr.make_fragment_A(tCsA);  // smem descriptors
    Tensor tCrB = thr.make_fragment_B(tCsB);
    Tensor acc = partition_fragment_C(mma, make_shape(Int<BM>{}, Int<BN>{}));
    Tensor tCcC = thr.partition_C(make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{})));
    static_assert(decltype(size(acc))::value == BM * BN / 128, "accumulator fragment size");
    // The producer filled consumer 0's first tile's stages first: consumer 1 starts after.
    PipelineState read;  // stage 0, phase 0
    if (w == 1) read.advance(k_tiles);

    Out* c = static_cast<Out*>(p.c);
    const bool silu = p.silu != 0;
    const int q = threadIdx.x & 3;  // lane within the quad that shares a D row
    if (get<0>(tCcC(0)) >= BM || get<1>(tCcC(0)) != 2 * q) __trap();
    // Tile ids: the producer's channel (unpaired; the block's tiles j = w, w + 2, ...),
    // or the static walk (paired).
    constexpr bool kChannel = Cfg::PAIR == kPairNone;
    int j = w;
    for (int id = kChannel ? channel_get(ss.channel, j) : walk.first + w * walk.stride; id < total;
         id = kChannel ? channel_get(ss.channel, j += 2) : id + 2 * walk.stride) {
      pair_warpgroup_sync<Cfg::CLUSTER>(w);  // lagging warps catch up (mainloop.cuh)
      const Tile t = locate_tile<Cfg>(p, ss.tile_start, id, walk.rank);
      // Our turn on the tensor cores: the other consumer has issued its previous tile.
      order.wait();
      if (Cfg::PAIR == kPairM && t.rows <= 0) {
        // A pair's second m-tile past the group: keep the stages (which the partner
        // shares) and the turn order in step, no wgmma, nothing stored.
        CUTE_NO_UNROLL
        for (int kt = 0; kt < k_tiles; ++kt) {
          pipeline.consumer_wait(read);
          pair_warpgroup_sync<Cfg::CLUSTER>(w);
          pipeline.consumer_release(read);
          ++read;
        }
        order.arrive();
        read.advance(k_tiles);
        continue;
      }
      // k_tiles >= 1: the host routes k == 0 elsewhere (mainloop.cuh).
      const PipelineState release =
          issue_tile_wgmmas(mma, tCrA, tCrB, acc, pipeline, read, k_tiles);
      // All of this tile's wgmmas are issued: the other consumer's mainloop may start
      // (it queues behind ours on the tensor cores) while we drain and store.
      order.arrive();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
      pipeline.consumer_release(release);
      read.advance(k_tiles);  // skip the other consumer's tile

      // Epilogue (epilogue.cuh, as config 2): f32 -> (silu(gate) * up) -> one
      // rounding -> 16-byte predicated stores straight from the accumulators.
      store_accumulators<BN, Cfg::B_BOX>(acc, tCcC, t, c, p.n, silu, q);
    }
  }
  // Paired CTAs write into each other's shared memory (multicast stages, the pair
  // mailbox's ids and remote arrives): neither exits while the other may still do so.
  if constexpr (Cfg::CLUSTER > 1) {
    __syncwarp();
    cute::cluster_sync();
  }
#endif
}

// In: the CuTe element type (cutlass::bfloat16_t / cutlass::half_t); k > 0 (callers
// route k == 0 elsewhere, as for config 2). Config 2's TMA cache policies (b_policy).
template <class T, class Out, int PAIR = kPairNone>
void launch_pingpong(const GroupedGemmProblem& prob, const RowsDesc& rows, cudaStream_t stream,
                     const char* op) {
  using Cfg = PingpongConfig<T, PAIR>;
  if (prob.k <= 0) {
    throw Error(std::string("moekit::") + op + ": internal: SM90 ping-pong config with k == 0");
  }
  Params<Cfg, T> p;
  const int64_t tiles = make_params<Cfg, T>(prob, rows, op, p);
  if (tiles <= 0) return;
  static_assert(sizeof(PingpongSharedStorage<Cfg, T>) <= 227 * 1024, "shared memory");
  constexpr int kSmem = static_cast<int>(sizeof(PingpongSharedStorage<Cfg, T>));
  if constexpr (PAIR == kPairNone) {
    unsigned* counter = tiles > device_props().sms ? prob.tile_counter : nullptr;
    p.tile_counter = sm90_tile_counter(counter, /*pingpong=*/true, rows.mode == kRowsDense, stream,
                                       op, &p.dynamic_waves);
  }
  // Persistent: one block (or pair) per SM (pair), at most as many as the tile upper
  // bound; a block with a single tile leaves its second consumer idle.
  launch_persistent<Cfg, sm90_pingpong_gemm_kernel<Cfg, T, Out>, kSmem>(
      p, tiles, kSlotSm90PingpongPairClusters, stream, op);
}

// The paired configs' dispatch (7: config 2's tiles on n-tile pairs; 8: the ping-pong
// tiles on m-tile pairs) for one input type: T the CuTe type, In the matching CUDA type
// (the output type when out_dtype is not f32). Instantiated per input dtype in
// grouped_gemm_sm90_pair_{bf16,f16}.cu.
template <class T, class In>
void launch_paired(const GroupedGemmProblem& prob, int config, const RowsDesc& rows,
                   cudaStream_t stream, const char* op) {
  const bool f32 = prob.out_dtype == DType::kF32;
  if (config == kGemmConfigSm90PairN) {
    f32 ? launch<T, float, kPairN>(prob, rows, stream, op)
        : launch<T, In, kPairN>(prob, rows, stream, op);
  } else if (config == kGemmConfigSm90PairM) {
    f32 ? launch<T, float, kPairM>(prob, rows, stream, op)
        : launch<T, In, kPairM>(prob, rows, stream, op);
  } else if (config == kGemmConfigSm90PairAuto) {
    f32 ? launch<T, float, kPairAuto>(prob, rows, stream, op)
        : launch<T, In, kPairAuto>(prob, rows, stream, op);
  } else if (f32) {
    launch_pingpong<T, float, kPairM>(prob, rows, stream, op);
  } else {
    launch_pingpong<T, In, kPairM>(prob, rows, stream, op);
  }
}

}  // namespace moekit::detail::gemm::sm90
