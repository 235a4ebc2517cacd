// The SM90 (Hopper) bf16/f16 grouped-GEMM kernel: TMA loads into 128-byte-swizzled
// shared memory on an mbarrier pipeline (cutlass::PipelineTmaAsync), wgmma (CuTe GMMA
// atoms) from two consumer warpgroups, one producer warp, a persistent grid walking a
// device-side tile schedule built from the layout metadata (no host sync).
//
// Passed the GPU tests on the H200 (2026-12-02); the heuristic picks it where rows
// per group are many (config 2, in place of the mma.sync prefill config 1).
//
// Design (docs/gemm.md has the rationale):
// - Block tile 128 x 256 x 64, 4 stages (48 KB each): a [128 x 64], b [256 x 64] as two
//   TMA boxes of 128 b rows (BN = 224 / 192: 112- / 96-row boxes, 5 stages; for dense
//   GEMMs whose 256-wide tiles leave a short last wave, sm90_tile_math.h dense_tile_n). kNone: the
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
#include <cstdlib>
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

#include <cudaTypedefs.h>

#include "core/device.h"
#include "core/dtype.cuh"
#include "gemm/grouped_gemm.h"
#include "gemm/mma/epilogue.cuh"
#include "gemm/mma/tile_scheduler.cuh"
#include "gemm/sm90/consumer.cuh"  // run_cooperative_tile
#include "gemm/sm90/device.h"
#include "gemm/sm90/epilogue.cuh"    // quad_transpose, store_4_blocks, store_accumulators
#include "gemm/sm90/hang_trace.cuh"  // Sm90Pipeline
#include "gemm/sm90/mainloop.cuh"    // produce_tiles, issue_tile_wgmmas
#include "gemm/sm90/schedule.cuh"    // build_tile_schedule, Tile, locate_tile
#include "gemm/sm90/tile_math.h"
#include "moekit/error.h"

namespace moekit::detail::gemm::sm90 {

// Tuning knobs, performance only (read once per process; docs/gemm.md has the H200
// measurements behind the defaults): MOEKIT_SM90_L2 = 128 | 256 (TMA L2 promotion
// bytes), MOEKIT_SM90_HINTS = 0 (normal) | 1 (a EVICT_LAST, b EVICT_FIRST) | 2 (b
// EVICT_FIRST) | 3 (b EVICT_FIRST on odd k stages only: the second 128 bytes of each
// promoted 256-byte line, its last read) | 4 (3 and a EVICT_LAST), MOEKIT_SM90_EPI = 0 (pair
// stores) | 1 (16-byte stores). -1 / unset: the default, which for L2 and HINTS depends on the rows
// layout (l2_bytes, cache_hints).
inline int env_knob(const char* name, int fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  return std::atoi(s);
}
struct Knobs {
  int l2 = env_knob("MOEKIT_SM90_L2", -1);
  int hints = env_knob("MOEKIT_SM90_HINTS", -1);
  int epi = env_knob("MOEKIT_SM90_EPI", 1);
};
inline const Knobs& knobs() {
  static const Knobs k;
  return k;
}
inline int l2_bytes(int mode) {
  (void)mode;
  return knobs().l2 == 128 || knobs().l2 == 256 ? knobs().l2 : 256;
}
// Grouped rows (a: the whole permuted activations, far larger than L2): b EVICT_FIRST on
// its odd k stages only (3): the even stage's 256-byte promoted line stays until its
// second half is read, then goes first, which keeps more of a (re-read by the group's
// n-tiles) in the L2; DRAM reads of ds-v3-prefill-mlp-up 16.44 -> 16.06 GB, 1-3% faster
// rows. EVICT_FIRST on every b stage (2) loses the promoted half line, an EVICT_LAST a
// (1, 4) crowds the L2 for no gain. Dense rows (one a of m rows reused by every n-tile):
// b EVICT_FIRST (2). (H200, docs/gemm.md; the FP8 kernel takes the masked default.)
inline int cache_hints(int mode) {
  if (knobs().hints >= 0 && knobs().hints <= 4) return knobs().hints;
  return mode == kRowsDense ? 2 : 3;
}
// The three TMA cache policies (TMA::CacheHintSm90 values) of a hints mode.
struct TmaHints {
  uint64_t a, b_even, b_odd;
};
inline TmaHints tma_hints(int hints) {
  using Hint = cute::TMA::CacheHintSm90;
  const auto v = [](Hint h) { return static_cast<uint64_t>(h); };
  return {v(hints == 1 || hints == 4 ? Hint::EVICT_LAST : Hint::EVICT_NORMAL),
          v(hints == 1 || hints == 2 ? Hint::EVICT_FIRST : Hint::EVICT_NORMAL),
          v(hints != 0 ? Hint::EVICT_FIRST : Hint::EVICT_NORMAL)};
}
// The L2 promotion launch() wants for the descriptors it is about to encode.
inline thread_local int g_l2_bytes = 256;

// Descriptors encoded by the specialization below on this thread (launch() checks it).
inline thread_local int g_encode_calls = 0;

}  // namespace moekit::detail::gemm::sm90

namespace cutlass {
// CuTe's make_tma_copy calls this (with exactly these argument types, deduced from its
// locals) to encode every TMA descriptor; this specialization only replaces the L2
// promotion, so that b rows are fetched from DRAM 256 bytes at a time (two k stages),
// as DeepGEMM does. It is used by this header's translation units only
// (grouped_gemm_sm90_*.cu); launch() checks that it was called.
template <>
inline CUresult call_cuTensorMapEncodeTiled<
    CUtensorMap*, CUtensorMapDataType, int, void*, uint64_t*, uint64_t*, uint32_t*, uint32_t*,
    CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill>(
    CUtensorMap* desc, CUtensorMapDataType format, int rank, void* addr, uint64_t* dims,
    uint64_t* strides, uint32_t* box, uint32_t* elem_strides, CUtensorMapInterleave interleave,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill oob) {
  ++moekit::detail::gemm::sm90::g_encode_calls;
  cudaDriverEntryPointQueryResult status;
  void* pfn = nullptr;
  const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pfn, 12000,
                                                           cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || !pfn) {
    cudaGetLastError();
    return CUDA_ERROR_UNKNOWN;
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(pfn)(
      desc, format, static_cast<cuuint32_t>(rank), addr, dims, strides, box, elem_strides,
      interleave, swizzle,
      moekit::detail::gemm::sm90::g_l2_bytes == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                    : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      oob);
}
}  // namespace cutlass

namespace moekit::detail::gemm::sm90 {

// T: the CuTe element type (cutlass::bfloat16_t / cutlass::half_t; the GMMA selector
// keys on these, not on __nv_bfloat16 / __half).
// PAIR_ (sm90_schedule.cuh): kPairNone = config 2; kPairN = config 7, 2-CTA clusters on
// n-tile pairs with the a box multicast (each CTA loads 64 of its 128 rows).
// BN_: b rows per tile, 256, 224 or 192 (two boxes of BN_ / 2 rows; silu: BN_ / 2
// output columns, which the epilogue needs in whole 32-column groups: 224 takes no silu).
// 224 needs CuTe's extended wgmma shapes (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, defined
// in its own .cu only).
template <class T, int PAIR_ = kPairNone, int BN_ = 256>
struct Config {
  static_assert(BN_ == 256 || BN_ == 224 || BN_ == 192, "SM90 tile widths: 256, 224, 192");
  static constexpr int BM = 128, BN = BN_, BK = 64;
  static constexpr int STAGES = BN == 256 ? 4 : 5;  // 48, 44 or 40 KB each
  static constexpr int B_BOX = BN / 2;              // b rows per TMA box (two boxes per stage)
  static constexpr int PAIR = PAIR_;
  static constexpr int CLUSTER = PAIR == kPairNone ? 1 : 2;
  // a rows per TMA box (kPairAuto: two boxes for its own a tile, one for a shared one)
  static constexpr int A_BOX = PAIR == kPairN || PAIR == kPairAuto ? BM / 2 : BM;
  static constexpr int MAX_GROUPS = 1024;
  static constexpr int THREADS = 384;  // warpgroup 0: producer; 1, 2: consumers
  static constexpr int CONSUMER_THREADS = 256;
  static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // 128*40 + 256*232 <= 64K
  static constexpr uint32_t STAGE_BYTES = (BM + BN) * BK * sizeof(T);

  // BK = 64 16-bit elements = 128 bytes: exactly one SW128 K-major atom wide.
  using SmemAtom = cute::GMMA::Layout_K_SW128_Atom<T>;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<BM>{}, cute::Int<BK>{}, cute::Int<STAGES>{})));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<BN>{}, cute::Int<BK>{}, cute::Int<STAGES>{})));
  // a's stage bytes as boxes of A_BOX rows (kPairN: box 2s + h = rows 64h.. of stage s;
  // 8 KB halves keep the 1 KB swizzle phase, as b's boxes below).
  using SmemLayoutABoxes =
      decltype(cute::tile_to_shape(SmemAtom{}, cute::make_shape(cute::Int<A_BOX>{}, cute::Int<BK>{},
                                                                cute::Int<BM / A_BOX * STAGES>{})));
  using TmaOpA = std::conditional_t<PAIR == kPairN || PAIR == kPairAuto,
                                    cute::SM90_TMA_LOAD_MULTICAST, cute::SM90_TMA_LOAD>;
  using TmaOpB = std::conditional_t<PAIR == kPairM || PAIR == kPairAuto,
                                    cute::SM90_TMA_LOAD_MULTICAST, cute::SM90_TMA_LOAD>;
  // The same b bytes seen as 2*STAGES boxes of 128 rows (box h of stage s = index 2s+h):
  // atoms stack along rows first, so rows 128..255 of a stage are the second 16 KB
  // with the same swizzle phase (16 KB is a multiple of the 1 KB swizzle period).
  using SmemLayoutBBoxes = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<B_BOX>{}, cute::Int<BK>{}, cute::Int<2 * STAGES>{})));
  // Two consumer warpgroups stacked along M: each computes 64 x BN with one
  // 64xBNx16 wgmma per 16 k.
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<T, T, float,
                                 cute::Shape<cute::Int<64>, cute::Int<BN>, cute::Int<BK>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
  using Pipeline = Sm90Pipeline<STAGES>;
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

// One TMA descriptor over a (rows, k, L) row-major 16-bit tensor, box = (box_rows, BK);
// Op: SM90_TMA_LOAD, or SM90_TMA_LOAD_MULTICAST for the operand a pair shares (the box
// is not split: each CTA of the pair loads whole boxes, multicast).
template <class Cfg, class T, class Op, class BoxLayout>
auto make_tma(const T* ptr, int rows, int k, int l, BoxLayout box) {
  using namespace cute;
  const int64_t row_stride = k, l_stride = static_cast<int64_t>(rows) * k;
  Tensor g = make_tensor(make_gmem_ptr(ptr), make_shape(rows, k, l),
                         make_stride(row_stride, _1{}, l_stride));
  return make_tma_copy(Op{}, g, box, make_shape(size<0>(box), size<1>(box)), _1{});
}

template <class Cfg, class T>
struct Params {
  using TmaA = decltype(make_tma<Cfg, T, typename Cfg::TmaOpA>(
      static_cast<const T*>(nullptr), 1, 8, 1,
      typename Cfg::SmemLayoutABoxes{}(cute::_, cute::_, 0)));
  using TmaB = decltype(make_tma<Cfg, T, typename Cfg::TmaOpB>(
      static_cast<const T*>(nullptr), 1, 8, 1,
      typename Cfg::SmemLayoutBBoxes{}(cute::_, cute::_, 0)));
  TmaA tma_a;
  TmaB tma_b;
  void* c;
  RowsDesc rows;
  int a_rows, a_l;  // A as (a_rows, k, a_l)
  int b_rows, b_l;  // b as (b_rows, k, G)
  int k;
  int n;  // output columns
  int n_tiles;
  int silu;
  int tile_bound;  // the host's upper bound of (pair) tiles (the grid walks at most this many)
  // TMA L2 cache hints (TMA::CacheHintSm90 values); b's odd k stages (bytes 128..255 of
  // each 256-byte line the L2 promotion fetched) take hint_b_odd.
  uint64_t hint_a, hint_b, hint_b_odd;
  // nullptr = the static walk; else a zeroed counter the producers (paired: rank 0) take
  // tile ids from (the dynamic schedule, sm90_schedule.cuh next_tile_id).
  unsigned* tile_counter;
  int dynamic_waves;  // with a counter: trailing waves taken dynamically (sm90_dynamic_waves)
};

// VEC_EPI: 1 = 16-byte stores of whole 8-column blocks after a quad transpose
// (store_4_blocks), 0 = the wgmma pairs stored as they are (4 / 8 bytes).
template <class Cfg, class T, class Out, int VEC_EPI>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    sm90_grouped_gemm_kernel(const __grid_constant__ Params<Cfg, T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  using Pipeline = typename Cfg::Pipeline;
  using PipelineState = typename Cfg::PipelineState;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<SharedStorage<Cfg, T>*>(smem_raw);
  const int warp_group = threadIdx.x / 128;
  const int G = p.rows.num_groups;

  // Tile schedule (sm90_schedule.cuh): tile_start[G + 1] in shared memory.
  build_tile_schedule<Cfg::THREADS, sched_bm<Cfg>(), Cfg::PAIR == kPairAuto>(
      p.rows, sched_n_tiles<Cfg>(p.n_tiles), p.tile_bound, ss.tile_start);
  // Both consumer warpgroups (8 warps) read every tile id; paired, rank 1's producer
  // receives the pair ids from rank 0's.
  if (threadIdx.x == 0) {
    channel_init(ss.channel, 8);
    if constexpr (Cfg::CLUSTER > 1) mailbox_init(ss.mailbox);
  }

  typename Pipeline::Params pp;
  pp.transaction_bytes = Cfg::STAGE_BYTES;
  pp.role =
      warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Cfg::CONSUMER_THREADS;
  // Warp 0 inits the barriers; with a pair, each consumer warpgroup's releases arrive on
  // both CTAs' empty barriers (the partner multicasts into this CTA's stages).
  Pipeline pipeline(ss.pipeline, pp, Shape<Int<Cfg::CLUSTER>, _1, _1>{});
  __syncthreads();  // barrier init and the tile schedule are visible to all
  if constexpr (Cfg::CLUSTER > 1) cute::cluster_sync();  // and to the partner CTA

  const int total = ss.tile_start[G];
  const int k_tiles = (p.k + BK - 1) / BK;
  const Walk walk = tile_walk<Cfg>();

  if (warp_group == 0) {
    // Producer: one thread issues every TMA load.
    cutlass::arch::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      produce_tiles<Cfg, 1, /*PAIR_CHANNEL=*/true>(p, ss, pipeline, total, k_tiles, walk);
    }
  } else {
    // Consumers: two warpgroups, 64 rows each, of the 128 x 256 tile.
    cutlass::arch::warpgroup_reg_alloc<Cfg::CONSUMER_REGS>();
    const int ctid = threadIdx.x - 128;
    typename Cfg::TiledMma mma;
    auto thr = mma.get_thread_slice(ctid);
    Tensor sA = make_tensor(make_smem_ptr(ss.a), typename Cfg::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(ss.b), typename Cfg::SmemLayoutB{});
    Tensor tCsA = thr.partition_A(sA);        // (MMA, MMA_M, MMA_K, STAGES)
    Tensor tCsB = thr.partition_B(sB);        // (MMA, MMA_N, MMA_K, STAGES)
    Tensor tCrA = thr.make_fragment_A(tCsA);  // smem descriptors
    Tensor tCrB = thr.make_fragment_B(tCsB);
    Tensor acc = partition_fragment_C(mma, make_shape(Int<BM>{}, Int<BN>{}));
    // Tile coordinates (row, col) of each accumulator element, for predication.
    Tensor tCcC = thr.partition_C(make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{})));
    constexpr int ACC = decltype(size(acc))::value;
    static_assert(ACC == BM * BN / Cfg::CONSUMER_THREADS, "accumulator fragment size");
    PipelineState read;  // stage 0, phase 0

    Out* c = static_cast<Out*>(p.c);
    const bool silu = p.silu != 0;
    const int wg = warp_group - 1;  // this warpgroup's tile rows: 64 wg .. 64 wg + 63
    const int q = threadIdx.x & 3;  // lane within the quad that shares a D row
    check_accumulator_layout(tCcC, wg, q);
    // Tile ids: the producer's channel.
    int j = 0;
    for (int id = channel_get(ss.channel, j++); id < total; id = channel_get(ss.channel, j++)) {
      // Paired: this warpgroup's lagging warps catch up (sm90_mainloop.cuh).
      pair_warpgroup_sync<Cfg::CLUSTER>(wg);
      const Tile t = locate_tile<Cfg>(p, ss.tile_start, id, walk.rank);
      // Nothing to store: no valid row in this warpgroup's half (a group's last tile with
      // <= 64 rows), or a pair's second n-tile past n.
      const bool skip =
          64 * wg >= t.rows || ((Cfg::PAIR == kPairN || Cfg::PAIR == kPairAuto) && t.n0 >= p.n);
      run_cooperative_tile<BN, Cfg::B_BOX, VEC_EPI, Cfg::CLUSTER>(
          mma, tCrA, tCrB, acc, tCcC, pipeline, read, t, skip, k_tiles, c, p.n, silu, q, wg);
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

// The launchers' SM count (device_props(); an H100 / H200's when unknown).
inline int device_sm_count() {
  return device_props().sms > 0 ? device_props().sms : 132;
}

// In: __nv_bfloat16 / __half (pointer type of the problem); T: the matching CuTe type.
// Callers route k == 0 elsewhere (a TMA descriptor needs a non-empty k extent).
// Fills the kernel parameters of config Cfg (BM, BN, B_BOX, MAX_GROUPS, the smem box
// layouts; shared with the ping-pong config 6) and returns the host's upper bound of
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
  // Paired configs count pair tiles (sm90_schedule.cuh).
  const int64_t tiles =
      max_tiles(rows, sched_bm<Cfg>(), sched_n_tiles<Cfg>(static_cast<int>(n_tiles)));
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
  const auto* a = static_cast<const T*>(prob.a);
  const int encodes = g_encode_calls;
  g_l2_bytes = l2_bytes(rows.mode);
  const auto* b = static_cast<const T*>(prob.b);
  p.tma_a = make_tma<Cfg, T, typename Cfg::TmaOpA>(
      a, static_cast<int>(a_rows), static_cast<int>(prob.k), static_cast<int>(a_l),
      typename Cfg::SmemLayoutABoxes{}(cute::_, cute::_, 0));
  p.tma_b = make_tma<Cfg, T, typename Cfg::TmaOpB>(
      b, static_cast<int>(b_rows), static_cast<int>(prob.k), static_cast<int>(G),
      typename Cfg::SmemLayoutBBoxes{}(cute::_, cute::_, 0));
  if (g_encode_calls != encodes + 2) {
    throw Error(std::string("moekit::") + op +
                ": internal: the SM90 TMA descriptors were not built by moekit's encoder");
  }
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
  p.tile_bound = static_cast<int>(tiles);
  // a rows are reused by every n-tile of their group, b (the weights) by at most the few
  // m-tiles of one group that run side by side: keep a, stream b.
  const TmaHints h = tma_hints(cache_hints(rows.mode));
  p.hint_a = h.a;
  p.hint_b = h.b_even;
  p.hint_b_odd = h.b_odd;
  p.tile_counter = nullptr;
  p.dynamic_waves = -1;
  return tiles;
}

// Launches a persistent kernel of Cfg over `tiles` (pair) tiles: one block per SM, or,
// for the paired configs, as many 2-CTA clusters as can be resident at once
// (cudaOccupancyMaxActiveClusters, queried once per device), at most `tiles`.
template <class Cfg, class P>
void launch_persistent(void (*kernel)(P), const P& p, int64_t tiles, int smem, cudaStream_t stream,
                       const char* op) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const int sms = device_sm_count();
  if constexpr (Cfg::CLUSTER == 1) {
    const int64_t grid = tiles < sms ? tiles : sms;
    kernel<<<static_cast<unsigned>(grid), Cfg::THREADS, smem, stream>>>(p);
  } else {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = Cfg::CLUSTER;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(sms / Cfg::CLUSTER * Cfg::CLUSTER));
    cfg.blockDim = dim3(Cfg::THREADS);
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    static int resident[64];  // per device: 0 = not yet queried (a benign race)
    int device = 0;
    cudaGetDevice(&device);
    int* slot = device >= 0 && device < 64 ? &resident[device] : nullptr;
    int clusters = slot ? *slot : 0;
    if (clusters <= 0) {
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
        cudaGetLastError();
        clusters = 0;
      }
      if (clusters <= 0) {
        throw Error(std::string("moekit::") + op +
                    ": the paired SM90 GEMM config cannot place its 2-CTA clusters on this device");
      }
      if (slot) *slot = clusters;
    }
    const int64_t grid_clusters = tiles < clusters ? tiles : clusters;
    cfg.gridDim = dim3(static_cast<unsigned>(grid_clusters * Cfg::CLUSTER));
    cudaLaunchKernelEx(&cfg, kernel, p);
  }
}

template <class T, class Out, int PAIR = kPairNone, int BN = 256>
void launch(const GroupedGemmProblem& prob, const RowsDesc& rows, cudaStream_t stream,
            const char* op) {
  using Cfg = Config<T, PAIR, BN>;
  Params<Cfg, T> p;
  const int64_t tiles = make_params<Cfg, T>(prob, rows, op, p);
  if (tiles <= 0) return;
  const Knobs& kn = knobs();
  static_assert(sizeof(SharedStorage<Cfg, T>) <= 227 * 1024, "SM90 shared memory per block");
  const int smem = static_cast<int>(sizeof(SharedStorage<Cfg, T>));
  void (*kernel)(Params<Cfg, T>) = sm90_grouped_gemm_kernel<Cfg, T, Out, 1>;
  // Paired, and BN < 256: the 16-byte epilogue only (MOEKIT_SM90_EPI does not apply).
  if constexpr (PAIR == kPairNone && BN == 256) {
    if (!kn.epi) kernel = sm90_grouped_gemm_kernel<Cfg, T, Out, 0>;
  }
  // The plan's schedule: dynamic claims from the zeroed counter, else the static walk.
  // Paired: rank 0 claims, rank 1 receives (PairMailbox).
  unsigned* counter = prob.plan.schedule == GemmSchedule::kDynamic ? prob.tile_counter : nullptr;
  p.tile_counter = sm90_tile_counter(counter, stream, op, &p.dynamic_waves);
  // Persistent: one block per SM (at most as many as the tile upper bound).
  launch_persistent<Cfg>(kernel, p, tiles, smem, stream, op);
}

}  // namespace moekit::detail::gemm::sm90
