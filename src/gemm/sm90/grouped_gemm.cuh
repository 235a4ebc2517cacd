// The SM90 (Hopper) bf16/f16 grouped-GEMM kernel: TMA loads into 128-byte-swizzled
// shared memory on an mbarrier pipeline (cutlass::PipelineTmaAsync), wgmma (CuTe GMMA
// atoms) from two consumer warpgroups, one producer warp, a persistent grid walking a
// device-side tile schedule built from the layout metadata (no host sync).
//
// The sm90 kernel: the GEMM planner picks it where rows per group are many (docs/gemm.md,
// "The SM90 engine").
//
// Design (docs/gemm.md has the rationale):
// - Block tile 128 x 256 x 64, 4 stages (48 KB each): a [128 x 64], b [256 x 64] as two
//   TMA boxes of 128 b rows (BN = 224 / 192: 112- / 96-row boxes, 5 stages; for dense
//   GEMMs whose 256-wide tiles leave a short last wave, tile_math.h dense_tile_n). kNone: the
//   boxes are b rows n0 .. n0+255 (256 output columns). kSiluAndMul: box 0 = 128 gate rows, box 1 =
//   the 128 up rows of the same output columns, so wgmma's accumulator holds gate column j and up
//   column j + 128 in the same thread (the wgmma D fragment spans every 8-column block of N), and
//   the epilogue pairs them in registers.
// - A is one TMA descriptor over the whole buffer, as (rows, k, L): contiguous / dense
//   (P or m, k, 1), masked (max_m, k, G). A tile starts at the group's first row
//   (any row, not a multiple of 128): the tile's trailing rows may belong to the next
//   group or to padding (loaded, their output rows discarded: wgmma rows are
//   independent) or lie past the buffer / slab (TMA zero-fills them). b is (b rows, k, G):
//   columns past n are zero-filled or belong to the up half (never stored).
// - The epilogue stores straight from the accumulators, predicated by the tile's valid
//   row count (rows of the next group / padding / past a masked count are never
//   written) and by column < n.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

// cute/tensor.hpp must come first (the atoms build on it).
// clang-format off
#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>
// clang-format on

#include "core/device.h"
#include "core/dtype.cuh"
#include "core/kernel_launch.h"
#include "gemm/common/cluster_launch.h"
#include "gemm/common/tma_desc.h"
#include "gemm/grouped_gemm.h"
#include "gemm/mma/epilogue.cuh"
#include "gemm/mma/tile_scheduler.cuh"
#include "gemm/sm90/consumer.cuh"  // consume_tiles
#include "gemm/sm90/device.h"
#include "gemm/sm90/epilogue.cuh"  // quad_transpose, store_4_blocks, store_accumulators
#include "gemm/sm90/mainloop.cuh"  // start_pipeline, produce_tiles, pair_exit_sync
#include "gemm/sm90/schedule.cuh"  // build_tile_schedule, Tile, locate_tile
#include "gemm/sm90/tile_math.h"
#include "moekit/error.h"

namespace moekit::detail::gemm::sm90 {

static_assert(kEvictNormal == static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL) &&
                  kEvictFirst == static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST),
              "mainloop.cuh's TMA cache policies are CuTe's");

// The TMA element type of T (bf16, f16; 8-bit types travel as bytes).
template <class T>
constexpr CUtensorMapDataType tma_dtype() {
  static_assert(sizeof(T) == 1 || std::is_same_v<T, cutlass::bfloat16_t> ||
                    std::is_same_v<T, cutlass::half_t>,
                "SM90 TMA element types: bf16, f16, 8-bit");
  if constexpr (std::is_same_v<T, cutlass::bfloat16_t>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if constexpr (std::is_same_v<T, cutlass::half_t>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return CU_TENSOR_MAP_DATA_TYPE_UINT8;
}

// One TMA descriptor over a (rows, k, l) row-major tensor, boxes of box_rows x BK, by
// moekit's encoder (tma_desc.h; a pair's multicast loads use the same descriptor).
template <class Cfg, class T>
CUtensorMap make_tma(const T* ptr, int64_t rows, int64_t k, int64_t l, int box_rows) {
  return encode_tma(tma_rows_args(tma_dtype<T>(), sizeof(T), ptr, rows, k, l, box_rows, Cfg::BK));
}

// The wgmmas of two consumer warpgroups stacked along M (sm90's and the FP8 kernel's
// BM = 128): each computes 64 x BN, one 64 x BN x k-step wgmma per k-step of BK, both
// operands K-major from shared memory.
template <class T, int BN, int BK>
using CooperativeTiledMma = decltype(cute::make_tiled_mma(
    cute::GMMA::ss_op_selector<T, T, float,
                               cute::Shape<cute::Int<64>, cute::Int<BN>, cute::Int<BK>>,
                               cute::GMMA::Major::K, cute::GMMA::Major::K>(),
    cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

// T: the CuTe element type (cutlass::bfloat16_t / cutlass::half_t; the GMMA selector
// keys on these, not on __nv_bfloat16 / __half).
// PAIR_ (schedule.cuh): kPairNone, or kPairAuto (the adaptive pairs: 2-CTA clusters, the
// shared operand's boxes multicast; a in two boxes of 64 rows).
// BN_: b rows per tile, 256, 224 or 192 (two boxes of BN_ / 2 rows; silu: BN_ / 2
// output columns, which the epilogue needs in whole 32-column groups: 224 takes no silu).
// 224 needs CuTe's extended wgmma shapes (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, defined
// in its own .cu only).
template <class T, int PAIR_ = kPairNone, int BN_ = 256>
struct Config {
  static_assert(BN_ == 256 || BN_ == 224 || BN_ == 192, "SM90 tile widths: 256, 224, 192");
  // BK: one 128-byte swizzle atom of k (64 bf16 / f16, 128 e4m3: fp8_fast_gemm.cu).
  static constexpr int BM = 128, BN = BN_, BK = 128 / static_cast<int>(sizeof(T));
  static constexpr int STAGES = BN == 256 ? 4 : 5;  // 48, 44 or 40 KB each
  static constexpr int B_BOX = BN / 2;              // b rows per TMA box (two boxes per stage)
  static constexpr int PAIR = PAIR_;
  static constexpr int CLUSTER = PAIR == kPairNone ? 1 : 2;
  // a rows per TMA box (kPairAuto: two boxes for its own a tile, one for a shared one)
  static constexpr int A_BOX = PAIR == kPairAuto ? BM / 2 : BM;
  static constexpr int MAX_GROUPS = 1024;
  static constexpr int THREADS = 384;  // warpgroup 0: producer; 1, 2: consumers
  static constexpr int CONSUMER_THREADS = 256;
  static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // 128*40 + 256*232 <= 64K
  static constexpr uint32_t STAGE_BYTES = (BM + BN) * BK * sizeof(T);

  // BK elements = 128 bytes: exactly one SW128 K-major atom wide.
  using SmemAtom = cute::GMMA::Layout_K_SW128_Atom<T>;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<BM>{}, cute::Int<BK>{}, cute::Int<STAGES>{})));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<BN>{}, cute::Int<BK>{}, cute::Int<STAGES>{})));
  // The TMA loads see a stage's bytes as boxes of A_BOX (B_BOX) rows stacked along rows
  // (box h of stage s = index (BM / A_BOX) s + h): atoms stack along rows first, so each
  // box is the next 8 / 16 KB with the same swizzle phase (a multiple of the 1 KB period).
  // Two consumer warpgroups stacked along M: each computes 64 x BN with one
  // 64xBNx16 wgmma per 16 k.
  using TiledMma = CooperativeTiledMma<T, BN, BK>;
  using Pipeline = cutlass::PipelineTmaAsync<STAGES>;
  using PipelineState = typename Pipeline::PipelineState;
};

template <class Cfg, class T>
struct SharedStorage {
  // The swizzled tiles need 1024-byte alignment: A sits at the start of dynamic smem
  // (the kernel declares no static smem), B after 64 KB.
  alignas(1024) T a[cute::cosize_v<typename Cfg::SmemLayoutA>];
  alignas(1024) T b[cute::cosize_v<typename Cfg::SmemLayoutB>];
  typename Cfg::Pipeline::SharedStorage pipeline;
  TileChannel channel;                  // tile ids, producer -> consumers
  PairMailbox mailbox;                  // paired: pair ids, rank 0 -> rank 1
  int tile_start[Cfg::MAX_GROUPS + 1];  // tiles before group g; [G] = total
};

template <class Cfg, class T>
struct Params {
  CUtensorMap tma_a;  // a as (a_rows, k, a_l), boxes of A_BOX x BK
  CUtensorMap tma_b;  // b as (b_rows, k, G), boxes of B_BOX x BK
  void* c;
  RowsDesc rows;
  int a_rows, a_l;  // A as (a_rows, k, a_l)
  int b_rows, b_l;  // b as (b_rows, k, G)
  int k;
  int n;  // output columns
  int n_tiles;
  int silu;
  int swap_tails;  // the plan's swap_tails: tiles of <= kSwapMaxRows rows run swapped
  int tile_bound;  // the host's upper bound of (pair) tiles (the grid walks at most this many)
  // nullptr = the static walk; else a zeroed counter the producers (paired: rank 0) take
  // tile ids from (the dynamic schedule, schedule.cuh next_tile_id).
  unsigned* tile_counter;
  int dynamic_waves;  // with a counter: trailing waves taken dynamically (always all: 1 << 20)
};

template <class Cfg, class T, class Out>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    sm90_grouped_gemm_kernel(const __grid_constant__ Params<Cfg, T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<SharedStorage<Cfg, T>*>(smem_raw);
  const int warp_group = threadIdx.x / 128;
  const int G = p.rows.num_groups;

  // Tile schedule (schedule.cuh): tile_start[G + 1] in shared memory.
  build_tile_schedule<Cfg::THREADS, Cfg::BM, Cfg::PAIR == kPairAuto>(p.rows, p.n_tiles,
                                                                     p.tile_bound, ss.tile_start);
  auto pipeline = start_pipeline<Cfg>(ss, warp_group);

  const int total = ss.tile_start[G];
  const int k_tiles = (p.k + Cfg::BK - 1) / Cfg::BK;
  const Walk walk = tile_walk<Cfg>();

  if (warp_group == 0) {
    // Producer: one thread issues every TMA load.
    cutlass::arch::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      produce_tiles<Cfg>(p, ss, pipeline, total, k_tiles, walk);
    }
  } else {
    // Consumers: two warpgroups, 64 rows each, of the 128 x BN tile.
    typename Cfg::PipelineState read;
    struct Output {
      Out* c;
      bool silu;
    };
    const auto output = [&]() __attribute__((always_inline)) {
      return Output{static_cast<Out*>(p.c), p.silu != 0};
    };
    const auto tile = [&](int id, int wg, auto& read, const auto& run, const auto& out)
        __attribute__((always_inline)) {
      const Tile t = locate_tile<Cfg>(p, ss.tile_start, id, walk.rank);
      // Nothing to store: no valid row in this warpgroup's half (a group's last tile with
      // <= 64 rows), or a pair's second n-tile past n.
      const bool skip = 64 * wg >= t.rows || (Cfg::PAIR == kPairAuto && t.n0 >= p.n);
      run(read, t, skip, k_tiles, out.c, p.n, out.silu,
          runs_swapped<Cfg>(p.swap_tails != 0, t, p.n));
    };
    consume_tiles<Cfg>(ss, pipeline, read, total, warp_group, output, tile);
  }
  pair_exit_sync<Cfg>();
#endif
}

// In: __nv_bfloat16 / __half (pointer type of the problem); T: the matching CuTe type.
// Callers route k == 0 elsewhere (a TMA descriptor needs a non-empty k extent).
// Fills the kernel parameters of config Cfg (BM, BN, B_BOX, MAX_GROUPS, the smem box
// layouts) and returns the host's upper bound of
// tiles (0: nothing to do, p untouched).
template <class Cfg, class T>
int64_t make_params(const GroupedGemmProblem& prob, const RowsDesc& rows, const char* op,
                    Params<Cfg, T>& p) {
  const bool silu = prob.activation == Activation::kSiluAndMul;
  const int64_t G = rows.mode == kRowsDense ? 1 : rows.num_groups;
  const int64_t a_rows = rows.mode == kRowsMasked ? rows.max_m : rows.total_rows;
  const int64_t a_l = rows.mode == kRowsMasked ? G : 1;
  const int64_t b_rows = silu ? 2 * prob.n : prob.n;
  const int64_t out_cols_per_tile = silu ? Cfg::B_BOX : Cfg::BN;
  const int64_t n_tiles = (prob.n + out_cols_per_tile - 1) / out_cols_per_tile;
  // An upper bound of the pair tiles too (pair_tiles_of_group <= tiles_of_group).
  const int64_t tiles = max_tiles(rows, Cfg::BM, static_cast<int>(n_tiles));
  if (tiles <= 0) return 0;
  if (G > Cfg::MAX_GROUPS) {
    throw Error(std::string("moekit::") + op + ": the SM90 GEMM config supports at most " +
                std::to_string(Cfg::MAX_GROUPS) + " groups, got " + std::to_string(G));
  }
  // TMA coordinates and the tile ids are 32-bit.
  if (a_rows > INT_MAX || b_rows > INT_MAX || prob.k > INT_MAX || tiles > INT_MAX ||
      a_rows * a_l > INT_MAX) {
    throw Error(std::string("moekit::") + op + ": problem too large for the SM90 GEMM config");
  }
  p.tma_a = make_tma<Cfg>(static_cast<const T*>(prob.a), a_rows, prob.k, a_l, Cfg::A_BOX);
  p.tma_b = make_tma<Cfg>(static_cast<const T*>(prob.b), b_rows, prob.k, G, Cfg::B_BOX);
  p.c = prob.c;
  p.rows = rows;
  p.rows.num_groups = static_cast<int>(G);
  p.a_rows = static_cast<int>(a_rows);
  p.a_l = static_cast<int>(a_l);
  p.b_rows = static_cast<int>(b_rows);
  p.b_l = static_cast<int>(G);
  p.k = static_cast<int>(prob.k);
  p.n = static_cast<int>(prob.n);
  p.n_tiles = static_cast<int>(n_tiles);
  p.silu = silu ? 1 : 0;
  p.swap_tails = prob.plan.swap_tails ? 1 : 0;
  p.tile_bound = static_cast<int>(tiles);
  p.tile_counter = nullptr;
  p.dynamic_waves = -1;
  return tiles;
}

// Co-resident 2-CTA clusters of Kernel (Cfg's block, kSmem bytes of shared memory) on
// the current device (co_resident_clusters); 0 when the limit or the query is refused.
template <class Cfg, auto Kernel, int kSmem>
int resident_clusters() {
  if (raise_smem_limit<Kernel>(kSmem) != cudaSuccess) return 0;
  return co_resident_clusters(reinterpret_cast<const void*>(Kernel), Cfg::CLUSTER, Cfg::THREADS,
                              kSmem);
}

// Launches the persistent kernel Kernel of Cfg over `tiles` (pair) tiles: one block per
// SM, or, for the paired configs, as many 2-CTA clusters as can be resident at once
// (resident_clusters, measured once per device into device_cached(slot): one slot per
// kernel family, whose kernels share their block and shared-memory sizes), at most `tiles`.
template <class Cfg, auto Kernel, int kSmem, class P>
void launch_persistent(const P& p, int64_t tiles, DeviceSlot slot, cudaStream_t stream,
                       const char* op) {
  raise_smem_limit<Kernel>(kSmem);  // a refusal fails the launch (check_launch)
  if constexpr (Cfg::CLUSTER == 1) {
    (void)slot;
    const int64_t sms = device_props().sms;
    const int64_t grid = tiles < sms ? tiles : sms;
    Kernel<<<static_cast<unsigned>(grid), Cfg::THREADS, kSmem, stream>>>(p);
  } else {
    const int clusters = device_cached(slot, resident_clusters<Cfg, Kernel, kSmem>);
    if (clusters <= 0) {
      throw Error(std::string("moekit::") + op +
                  ": the paired SM90 GEMM config cannot place its 2-CTA clusters on this device");
    }
    const int64_t grid_clusters = tiles < clusters ? tiles : clusters;
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = cluster_launch_config(grid_clusters * Cfg::CLUSTER, Cfg::THREADS,
                                                         kSmem, Cfg::CLUSTER, stream, attr);
    cudaLaunchKernelEx(&cfg, Kernel, p);
  }
}

template <class T, class Out, int PAIR = kPairNone, int BN = 256>
void launch(const GroupedGemmProblem& prob, const RowsDesc& rows, cudaStream_t stream,
            const char* op) {
  using Cfg = Config<T, PAIR, BN>;
  Params<Cfg, T> p;
  const int64_t tiles = make_params<Cfg, T>(prob, rows, op, p);
  if (tiles <= 0) return;
  static_assert(sizeof(SharedStorage<Cfg, T>) <= 227 * 1024, "SM90 shared memory per block");
  constexpr int kSmem = static_cast<int>(sizeof(SharedStorage<Cfg, T>));
  // Every paired kernel (the adaptive pairs, any dtype and output) shares one cluster-count
  // slot: the same block and shared memory.
  static_assert(
      PAIR == kPairNone ||
          kSmem ==
              sizeof(SharedStorage<Config<cutlass::bfloat16_t, kPairAuto>, cutlass::bfloat16_t>),
      "paired SM90 configs: one shared-memory size");
  // The plan's schedule: dynamic claims from the zeroed counter, else the static walk.
  // Paired: rank 0 claims, rank 1 receives (PairMailbox).
  unsigned* counter = prob.plan.schedule == GemmSchedule::kDynamic ? prob.tile_counter : nullptr;
  p.tile_counter = sm90_tile_counter(counter, stream, op, &p.dynamic_waves);
  // Persistent: one block per SM (at most as many as the tile upper bound).
  launch_persistent<Cfg, sm90_grouped_gemm_kernel<Cfg, T, Out>, kSmem>(
      p, tiles, kSlotSm90PairClusters, stream, op);
}

}  // namespace moekit::detail::gemm::sm90
