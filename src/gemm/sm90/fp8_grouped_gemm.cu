// The SM90 (Hopper) FP8 grouped GEMM, config kFp8Sm90 (MoEGroupedGemmFP8Fwd: e4m3 x e4m3,
// bf16 out; masked or contiguous rows; block, per-channel or per-tensor scales; optional
// silu_and_mul). DeepGEMM-style design, own code. k == 0 (no TMA extent) runs
// fill_empty_sums_kernel instead, in every mode.
//
// The FP8 planner's plan except where fp8_sm90 128x256 takes the problem (docs/gemm.md, "FP8
// SM90"); tests/test_gemm_gpu.cpp (Fp8EveryCandidateMatchesReference,
// Fp8EveryLayoutScaleModeAndActivationMatchesReference) checks it against the reference.
//
// - Block tile 128 x 128 x 128: BK = 128 k = one scale block per pipeline stage.
//   a [128 x 128] as two TMA boxes of 64 rows, b [128 x 128] as two boxes of 64 rows
//   (kNone: b rows n0 .. n0+127; kSiluAndMul: 64 gate rows and the 64 up rows of the same
//   64 output columns, so the accumulator holds gate column j and up column j + 64 in one
//   thread, as the bf16 kernels pair them), 128-byte swizzled (128 fp8 = one SW128 atom
//   wide), 6 stages (32 KB each) on a cutlass::PipelineTmaAsync. A stage expects b's 16 KB
//   plus the a boxes its tile loads: 16-row boxes for tiles of up to 48 valid rows (a decode
//   tile of a few rows fetches b + 16 a rows per stage), else one 64-row box, or two for
//   more than 64 rows.
// - Warpgroup 0: one producer thread (TMA). Warpgroups 1, 2: consumers, 64 tile rows
//   each (wgmma m64n128k32 e4m3, both operands from shared memory). A consumer with
//   no valid row in its half only waits / releases the stages.
// - kBlockScales (Fp8Scales::kBlock): per stage 4 wgmmas into a fresh f32 block accumulator,
//   then promotion acc += blk * a_scale[row, kb] * b_scale[box's 128-row block, kb] (each b
//   box lies in one scale block: kNone's boxes share n0's, kSiluAndMul needs n % 64 == 0), as
//   the SPEC's formula; the tensor core's reduced-precision fp8 accumulation spans only
//   128 k. Scales are loaded (L1/L2) one stage ahead. Per-channel / per-tensor scales are
//   constant along k: the same promotion without scales (acc += blk), and the epilogue
//   scales once. The tensor cores keep about 13 mantissa bits of an fp8 sum (the FP22
//   accumulator DeepSeek-V3 3.5.2 and DeepGEMM describe): accumulating the whole k there
//   (CUTLASS's "fast accumulation") gave e4m3 outputs ~3% off one ulp at k = 7552.
// - Persistent grid over a device-side tile schedule of the masked counts or contiguous
//   ends (schedule.cuh; no host sync; empty groups have no tiles): group-major, then
//   n-tile, m-tile fastest. Walked statically, or (plan `dynamic`, a tile counter given)
//   claimed in id order, so a group's m-tiles that read one b tile run side by side and
//   b streams from DRAM about once (docs/gemm.md "FP8 SM90").
// - a is (max_m, k, G) masked, (P, k, 1) contiguous: rows past the slab / buffer are
//   zero-filled by TMA, rows past the group's count are loaded (their output rows are never
//   stored: wgmma rows are independent). b is (b rows, k, G): rows past the end and k past
//   the end are zero-filled. Stores (epilogue.cuh store_accumulators): 16-byte bf16 blocks
//   (8-byte e4m3 blocks for an FP8 c with its given scale, which the scales fold in) for
//   rows < count and columns < n (n % 8 == 0).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "core/kernel_launch.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/sm90/fp8_amax.cuh"
#include "gemm/sm90/fp8_rows.cuh"
#include "gemm/sm90/grouped_gemm.cuh"  // make_tma, b_policy, issue_stage_wgmmas, store_accumulators

namespace moekit::detail::gemm::sm90fp8 {

using namespace moekit::detail::gemm::sm90;
using E4M3 = cutlass::float_e4m3_t;

struct Cfg {
  static constexpr int BM = 128, BN = 128, BK = 128, STAGES = 6;
  static constexpr int A_BOX = 64;    // a rows per TMA box (one per consumer warpgroup)
  static constexpr int A_SMALL = 16;  // a rows per small box (tiles of <= 3 x 16 rows)
  static constexpr int B_BOX = 64;    // b rows per TMA box (locate_tile; silu: output columns)
  static constexpr int PAIR = kPairNone;
  static constexpr int MAX_GROUPS = 1024;
  static constexpr int THREADS = 384;  // warpgroup 0: producer; 1, 2: consumers
  static constexpr int CONSUMER_THREADS = 256;
  static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
  static constexpr uint32_t A_BOX_BYTES = A_BOX * BK;      // 8 KB
  static constexpr uint32_t B_BYTES = BN * BK;             // 16 KB
  static constexpr uint32_t A_SMALL_BYTES = A_SMALL * BK;  // 2 KB
  static constexpr uint32_t BASE_TX_BYTES = B_BYTES;       // b; each stage adds its a boxes' bytes

  using SmemAtom = cute::GMMA::Layout_K_SW128_Atom<E4M3>;  // 8 rows x 128 bytes
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<BM>{}, cute::Int<BK>{}, cute::Int<STAGES>{})));
  // The same bytes as 2*STAGES boxes of 64 rows (box h of stage s = index 2s+h): atoms
  // stack along rows first and BK is one atom wide, so rows 64..127 of a stage are its
  // second 8 KB, with the same swizzle phase (8 KB is a multiple of the 1 KB period).
  // a and b stages have one layout (BM == BN, A_BOX == B_BOX): one check covers both.
  using SmemLayoutABoxes = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::make_shape(cute::Int<A_BOX>{}, cute::Int<BK>{}, cute::Int<2 * STAGES>{})));
  // ... and as 8*STAGES small boxes of 16 rows (2 KB each, also a multiple of the period).
  using SmemLayoutASmall = decltype(cute::tile_to_shape(
      SmemAtom{},
      cute::make_shape(cute::Int<A_SMALL>{}, cute::Int<BK>{}, cute::Int<BM / A_SMALL * STAGES>{})));
  using SmemLayoutB = SmemLayoutA;
  static_assert(BM == BN && A_BOX == B_BOX, "a and b stages share one box layout");
  // Two consumer warpgroups stacked along M, each 64 x 128 (wgmma 64x128x32 e4m3).
  using TiledMma = CooperativeTiledMma<E4M3, BN, BK>;
  using Pipeline = cutlass::PipelineTmaAsync<STAGES>;
  using PipelineState = typename Pipeline::PipelineState;
};

struct Fp8Storage {
  alignas(1024) E4M3 a[cute::cosize_v<Cfg::SmemLayoutA>];
  alignas(1024) E4M3 b[cute::cosize_v<Cfg::SmemLayoutB>];
  typename Cfg::Pipeline::SharedStorage pipeline;
  TileChannel channel;                  // tile ids, producer -> consumers (schedule.cuh)
  int tile_start[Cfg::MAX_GROUPS + 1];  // tiles before group g; [G] = total
  // Per consumer warpgroup, its tile's column scales (per channel / per tensor: b scale times
  // the output factor, 0 past n), staged once a tile so the epilogue waits on no load.
  float col_scales[2][Cfg::BN];
};
static_assert(sizeof(Fp8Storage) <= 227 * 1024, "shared memory");

struct Fp8Params {
  CUtensorMap tma_a;     // a as (a_rows, k, a_l), boxes of A_BOX x BK
  CUtensorMap tma_a16;   // the same, boxes of A_SMALL x BK
  CUtensorMap tma_b;     // b as (b_rows, k, G), boxes of B_BOX x BK
  const float* a_scale;  // Fp8ScaleIndex si
  const float* b_scale;
  Fp8ScaleIndex si;
  void* c;               // [rows, n] bf16, or e4m3 with c_scale
  const float* c_scale;  // e4m3 c: its given scale ([1]); nullptr: bf16 c
  uint32_t* c_amax;      // bf16 c: max |c| (f32 bits) gathered here (fp8_amax.cuh); or nullptr
  RowsDesc rows;         // masked counts (clamped to [0, max_m]) or contiguous ends
  int n, k;
  int silu;               // for locate_tile: b_row1 = n + n0, 64 output columns per tile
  int k_blocks, n_tiles;  // n_tiles: ceil(n / 128), silu ceil(n / 64)
  int tile_bound;         // the host's upper bound of tiles
  // nullptr: the static walk; else a zeroed counter the producer claims tile ids from
  // (the dynamic schedule, schedule.cuh next_tile_id), dynamic_waves as the bf16 kernels'.
  unsigned* tile_counter;
  int dynamic_waves;
};

// The b rows of accumulator column col (0..127) of tile t: box 0 holds columns 0..63 (b rows
// from t.b_row0), box 1 columns 64..127 (from t.b_row1): n0 + col without silu, the gate
// and up rows of output column n0 + col % 64 with it.
__device__ __forceinline__ int b_row_of(const Tile& t, int col) {
  return col < Cfg::B_BOX ? t.b_row0 + col : t.b_row1 + col - Cfg::B_BOX;
}

// One pipeline stage's wgmmas into a fresh blk, completed, and the stage released (`read`
// advanced): the caller promotes blk into its f32 accumulators.
template <class Mma, class FragA, class FragB, class Acc, class Pipeline, class State>
__device__ __forceinline__ void stage_into(Mma& mma, FragA& tCrA, FragB& tCrB, Acc& blk,
                                           Pipeline& pipeline, State& read) {
  pipeline.consumer_wait(read);
  mma.accumulate_ = cute::GMMA::ScaleOut::Zero;
  issue_stage_wgmmas(mma, tCrA, tCrB, blk, read.index());
  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(blk);
  pipeline.consumer_release(read);
  ++read;
}

// The output's factor of accumulator columns 0..63 ([0]) and 64..127 ([1]): 1 for a bf16 c;
// 1 / c_scale for an e4m3 c (c = e4m3(value / c_scale)), on the up half alone with silu
// (silu(gate) * up / c_scale). Folded into the scales, so the epilogue stays one rounding.
__device__ __forceinline__ void output_factors(const Fp8Params& p, float (&f)[2]) {
  const float inv = p.c_scale ? __frcp_rn(__ldg(p.c_scale)) : 1.f;
  f[0] = p.silu ? 1.f : inv;
  f[1] = inv;
}

// Stores the tile's accumulators (scaled) as bf16 or e4m3 (epilogue.cuh); a bf16 c's values
// are shown to `amax`.
template <class Acc, class Coords>
__device__ __forceinline__ void store_fp8_tile(const Fp8Params& p, const Acc& acc,
                                               const Coords& tCcC, const Tile& t, int q,
                                               AmaxObserver& amax) {
  if (p.c_scale) {
    store_accumulators<Cfg::BN, Cfg::B_BOX>(acc, tCcC, t, static_cast<__nv_fp8_e4m3*>(p.c), p.n,
                                            p.silu != 0, q);
  } else {
    store_accumulators<Cfg::BN, Cfg::B_BOX>(acc, tCcC, t, static_cast<__nv_bfloat16*>(p.c), p.n,
                                            p.silu != 0, q, AccumulatorValue{}, amax);
  }
}

// Whether accumulator column col of tile t is an output column < n (else its b row may lie
// past b, and its scale past b_scale).
__device__ __forceinline__ bool column_in_range(const Fp8Params& p, const Tile& t, int col) {
  return (p.silu ? t.n0 + col % Cfg::B_BOX : t.n0 + col) < p.n;
}

template <bool kBlockScales>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    sm90_fp8_grouped_gemm_kernel(const __grid_constant__ Fp8Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  using Pipeline = Cfg::Pipeline;
  using PipelineState = Cfg::PipelineState;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<Fp8Storage*>(smem_raw);
  const int warp_group = threadIdx.x / 128;
  const int G = p.rows.num_groups;

  // Tile schedule from the device counts / ends (no host sync): schedule.cuh.
  build_tile_schedule<Cfg::THREADS, BM>(p.rows, p.n_tiles, p.tile_bound, ss.tile_start);

  if (threadIdx.x == 0) channel_init(ss.channel, 8);  // both consumer warpgroups read every id
  const auto pp = pipeline_params<Pipeline>(warp_group, Cfg::BASE_TX_BYTES, Cfg::CONSUMER_THREADS);
  Pipeline pipeline(ss.pipeline, pp, Shape<_1, _1, _1>{});
  __syncthreads();  // barriers and the schedule are visible to all

  const int total = ss.tile_start[G];
  const int k_blocks = p.k_blocks;

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      PipelineState write = cutlass::make_producer_start_state<Pipeline>();
      // Tile ids: the static walk, or claimed from the counter kClaimAhead stages before a
      // tile's last load (next_tile_id), each handed to the consumers before its loads.
      const int stride = static_cast<int>(gridDim.x);
      const int base = dynamic_base(total, stride, p.tile_counter, p.dynamic_waves);
      const int claim_kb = claim_stage(k_blocks);
      int j = 0;
      for (int id = blockIdx.x, next = 0; id < total; id = next) {
        channel_put(ss.channel, j++, id);
        if (k_blocks == 0) next = next_tile_id(id, stride, p.tile_counter, base);
        const Tile t = locate_tile<Cfg>(p, ss.tile_start, id);
        // a rows of the tile: up to 48 valid rows in 16-row boxes, else one or two 64-row
        // boxes (a decode tile of a few rows loads 16 a rows per stage, not 128). Rows of the
        // stage no box writes hold an earlier stage's bytes: their outputs are never stored.
        const int a_small =
            t.rows <= 3 * Cfg::A_SMALL ? (t.rows + Cfg::A_SMALL - 1) / Cfg::A_SMALL : 0;
        const int a_big = a_small ? 0 : (t.rows > Cfg::A_BOX ? 2 : 1);
        const uint32_t a_bytes = a_small ? a_small * Cfg::A_SMALL_BYTES : a_big * Cfg::A_BOX_BYTES;
        for (int kb = 0; kb < k_blocks; ++kb) {
          pipeline.producer_acquire(write);  // expects BASE_TX_BYTES
          // Before any copy of the stage is issued, so its phase cannot complete early.
          pipeline.producer_expect_transaction(write, a_bytes);
          uint64_t* bar = pipeline.producer_get_barrier(write);
          const int s = write.index();
          const int k0 = kb * BK;
          // Boxes stacked along rows (sm90_fp8_layout_mismatch checks the offsets).
          E4M3* a_box = ss.a + 2 * s * (Cfg::A_BOX * BK);
          E4M3* b_box = ss.b + 2 * s * (Cfg::B_BOX * BK);
          // sm90's policies for grouped rows (docs/gemm.md, "FP8 SM90").
          const uint64_t hint_b = b_policy(kb, /*dense_rows=*/false);
          ptx90::tma_load_3d_hint(b_box, &p.tma_b, bar, k0, t.b_row0, t.group, hint_b);
          ptx90::tma_load_3d_hint(b_box + Cfg::B_BOX * BK, &p.tma_b, bar, k0, t.b_row1, t.group,
                                  hint_b);
          for (int i = 0; i < a_small; ++i) {
            ptx90::tma_load_3d_hint(a_box + i * (Cfg::A_SMALL * BK), &p.tma_a16, bar, k0,
                                    t.a_row + i * Cfg::A_SMALL, t.a_l, kEvictNormal);
          }
          for (int i = 0; i < a_big; ++i) {
            ptx90::tma_load_3d_hint(a_box + i * (Cfg::A_BOX * BK), &p.tma_a, bar, k0,
                                    t.a_row + i * Cfg::A_BOX, t.a_l, kEvictNormal);
          }
          ++write;
          if (kb == claim_kb) next = next_tile_id(id, stride, p.tile_counter, base);
        }
      }
      channel_put(ss.channel, j, total);
      pipeline.producer_tail(write);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Cfg::CONSUMER_REGS>();
    const int ctid = threadIdx.x - 128;
    Cfg::TiledMma mma;
    auto thr = mma.get_thread_slice(ctid);
    Tensor sA = make_tensor(make_smem_ptr(ss.a), Cfg::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(ss.b), Cfg::SmemLayoutB{});
    Tensor tCsA = thr.partition_A(sA);
    Tensor tCsB = thr.partition_B(sB);
    Tensor tCrA = thr.make_fragment_A(tCsA);
    Tensor tCrB = thr.make_fragment_B(tCsB);
    Tensor acc = partition_fragment_C(mma, make_shape(Int<BM>{}, Int<BN>{}));
    Tensor tCcC = thr.partition_C(make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{})));
    constexpr int ACC = decltype(size(acc))::value;
    static_assert(ACC == BM * BN / Cfg::CONSUMER_THREADS, "accumulator fragment size");
    static_assert(decltype(size<2>(tCrA))::value == BK / 32, "4 wgmma k-steps per stage");

    // wgmma D layout: element i = e + 2 h + 4 j is row r(h) = wg_row0 + 16 (warp % 4) +
    // lane / 4 + 8 h, column 8 j + 2 q + e. Checked once (a CuTe layout change traps).
    const int wg = warp_group - 1;
    const int wg_row0 = wg * 64;
    const int tid = static_cast<int>(threadIdx.x);
    const int q = tid & 3;
    const int row_h[2] = {wg_row0 + 16 * ((tid / 32) % 4) + (tid % 32) / 4,
                          wg_row0 + 16 * ((tid / 32) % 4) + (tid % 32) / 4 + 8};
    CUTE_UNROLL
    for (int i = 0; i < ACC; ++i) {
      if (get<0>(tCcC(i)) != row_h[(i >> 1) & 1] ||
          get<1>(tCcC(i)) != 8 * (i >> 2) + 2 * q + (i & 1)) {
        __trap();
      }
    }
    const Fp8ScaleIndex& si = p.si;
    // One stage's wgmmas (128 k) accumulate here, then promote into acc in f32.
    Tensor blk = partition_fragment_C(mma, make_shape(Int<BM>{}, Int<BN>{}));
    float out_f[2];  // output factors of accumulator columns 0..63, 64..127
    output_factors(p, out_f);
    AmaxObserver amax;  // this thread's max |c| (bf16 c with c_amax)

    PipelineState read;
    int j = 0;
    for (int id = channel_get(ss.channel, j++); id < total; id = channel_get(ss.channel, j++)) {
      const Tile t = locate_tile<Cfg>(p, ss.tile_start, id);
      // No valid row in this half (its a box was not even loaded): only keep in step.
      const bool skip = wg_row0 >= t.rows;
      // Scale rows of this thread's two accumulator rows (t.c_row: the flattened first row,
      // as a_scale indexes rows); rows past the count are never read (not stored).
      const float* sa_ptr[2];
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        sa_ptr[h] = row_h[h] < t.rows ? p.a_scale + (t.c_row + row_h[h]) * si.a_row : nullptr;
      }
      const float* sb_group = p.b_scale + static_cast<int64_t>(t.group) * si.b_group;
      if (skip) {
        skip_tile_stages<1>(pipeline, read, k_blocks, wg);
        continue;
      }
      clear(acc);
      if constexpr (kBlockScales) {
        // The two b boxes' scale rows (each box lies in one 128-row block).
        const float* sb_ptr[2] = {sb_group + (t.b_row0 / si.b_row_div) * si.b_row,
                                  sb_group + (t.b_row1 / si.b_row_div) * si.b_row};
        // Scales one k block ahead (registers): their L2 / DRAM latency is hidden behind a
        // whole stage instead of stalling the promotion.
        auto load_scales = [&](int kb, float(&s)[4]) {
          CUTE_UNROLL
          for (int x = 0; x < 2; ++x) s[x] = __ldg(sb_ptr[x] + kb * si.b_kb);
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) s[2 + h] = sa_ptr[h] ? __ldg(sa_ptr[h] + kb * si.a_kb) : 0.f;
        };
        float next[4];
        load_scales(0, next);
        CUTE_NO_UNROLL
        for (int kb = 0; kb < k_blocks; ++kb) {
          // s[h][x]: a_scale[row h, kb] * b_scale[box x's block, kb]
          // (and the output's factor of the box's columns)
          const float s[2][2] = {{next[2] * next[0] * out_f[0], next[2] * next[1] * out_f[1]},
                                 {next[3] * next[0] * out_f[0], next[3] * next[1] * out_f[1]}};
          if (kb + 1 < k_blocks) load_scales(kb + 1, next);

          stage_into(mma, tCrA, tCrB, blk, pipeline, read);
          // Columns 0..63 (i < ACC / 2) come from b box 0, 64..127 from box 1.
          CUTE_UNROLL
          for (int i = 0; i < ACC; ++i) {
            acc(i) = fmaf(blk(i), s[(i >> 1) & 1][i >= ACC / 2], acc(i));
          }
        }
        store_fp8_tile(p, acc, tCcC, t, q, amax);
      } else {
        // The scales are loaded before the mainloop (their latency behind its wgmmas): this
        // thread's two rows' a scales, and column `tid % 128`'s scale, which the
        // warpgroup stages in shared memory for every thread's epilogue.
        static_assert(Cfg::BN == 128, "one column a thread of the warpgroup");
        float sa[2];
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) sa[h] = sa_ptr[h] ? __ldg(sa_ptr[h]) : 0.f;
        const int x = tid % 128;
        const float sx = column_in_range(p, t, x)
                             ? __ldg(sb_group + static_cast<int64_t>(b_row_of(t, x)) * si.b_row) *
                                   out_f[x >= Cfg::B_BOX]
                             : 0.f;
        CUTE_NO_UNROLL
        for (int kb = 0; kb < k_blocks; ++kb) {
          stage_into(mma, tCrA, tCrB, blk, pipeline, read);
          CUTE_UNROLL
          for (int i = 0; i < ACC; ++i) acc(i) += blk(i);
        }
        // Barrier 2 + wg (this warpgroup's 128 threads; CUTLASS offsets the id past its
        // reserved ones): every thread is past the last tile's epilogue before the store,
        // and every store lands before the reads.
        float* staged = ss.col_scales[wg];
        cutlass::arch::NamedBarrier::sync(128, 2 + wg);
        staged[x] = sx;
        cutlass::arch::NamedBarrier::sync(128, 2 + wg);
        // One scale per (row, b row) after the whole k.
        CUTE_UNROLL
        for (int j = 0; j < ACC / 4; ++j) {
          CUTE_UNROLL
          for (int e = 0; e < 2; ++e) {
            const float sb = staged[8 * j + 2 * q + e];
            CUTE_UNROLL
            for (int h = 0; h < 2; ++h) acc(4 * j + 2 * h + e) *= sa[h] * sb;
          }
        }
        store_fp8_tile(p, acc, tCcC, t, q, amax);
      }
    }
    if (p.c_amax != nullptr) publish_amax(amax.m, p.c_amax);
  }
#endif
}

}  // namespace moekit::detail::gemm::sm90fp8

namespace moekit::detail::gemm {
namespace {

// k == 0: every row of every group is the empty sum's output, act(0) = 0 (silu(0) * 0 with
// silu_and_mul), as bf16 or as e4m3(0 / c_scale) (the SM90 epilogue's value * rcp(c_scale):
// +-0, or NaN where rcp(c_scale) is not finite: a zero, NaN or a denormal scale under 2^-128);
// other rows untouched. Blocks (x, y) walk groups y, y + gridDim.y, ..., each group's
// elements from x, one per thread per step.
__global__ void fill_empty_sums_kernel(RowsDesc rows, void* c, const float* c_scale, int64_t n) {
  const uint8_t e4m3 = c_scale ? static_cast<uint8_t>(__nv_cvt_float_to_fp8(
                                     0.f * __frcp_rn(__ldg(c_scale)), __NV_SATFINITE, __NV_E4M3))
                               : 0;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int g = blockIdx.y; g < rows.num_groups; g += gridDim.y) {
    int64_t first, count;
    group_rows(rows, g, first, count);
    const int64_t elems = count * n;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < elems; i += step) {
      if (c_scale) {
        static_cast<uint8_t*>(c)[first * n + i] = e4m3;
      } else {
        static_cast<__nv_bfloat16*>(c)[first * n + i] = __float2bfloat16_rn(0.f);
      }
    }
  }
}

}  // namespace

RowsDesc fp8_rows(const GroupedGemmFP8Problem& prob) {
  RowsDesc rows;
  rows.mode = prob.contiguous ? kRowsContiguous : kRowsMasked;
  rows.num_groups = prob.num_groups;
  rows.meta = prob.layout_metadata;
  rows.alignment = prob.alignment;
  rows.total_rows = prob.contiguous ? prob.m : 0;
  rows.max_m = prob.contiguous ? 0 : prob.max_m;
  return rows;
}

}  // namespace moekit::detail::gemm

namespace moekit::detail {

// Host check of the layout facts the kernel relies on (tests/test_gemm.cpp runs it on
// the CPU): the a (and b: the same layout) stage seen as two 64-row TMA boxes is byte
// for byte the 128-row wgmma operand, box i starting i A_BOX x BK elements in (as the producer
// addresses it), and thread ctid's accumulator element i is row wg_row0 + 16 (warp % 4)
// + lane / 4 + 8 h, column 8 j + 2 q + e (i = e + 2 h + 4 j), as the promotion and the
// epilogue index it.
std::string sm90_fp8_layout_mismatch() {
  using namespace cute;
  using gemm::sm90fp8::Cfg;
  const Cfg::SmemLayoutA a{};
  const Cfg::SmemLayoutABoxes boxes{};
  const Cfg::SmemLayoutASmall small{};
  constexpr int kSmallPerStage = Cfg::BM / Cfg::A_SMALL;
  for (int s = 0; s < Cfg::STAGES; ++s)
    for (int r = 0; r < Cfg::BM; ++r)
      for (int k = 0; k < Cfg::BK; ++k) {
        const int box = 2 * s + r / Cfg::A_BOX;
        const int sbox = kSmallPerStage * s + r / Cfg::A_SMALL;
        const int x = a(r, k, s), y = boxes(r % Cfg::A_BOX, k, box);
        const int z = small(r % Cfg::A_SMALL, k, sbox);
        if (x != y || boxes(0, 0, box) != box * Cfg::A_BOX * Cfg::BK || x != z ||
            small(0, 0, sbox) != sbox * Cfg::A_SMALL * Cfg::BK) {
          return "a smem: stage " + std::to_string(s) + " row " + std::to_string(r) + " k " +
                 std::to_string(k) + ": wgmma offset " + std::to_string(x) + ", TMA box offsets " +
                 std::to_string(y) + " (64 rows), " + std::to_string(z) + " (16 rows)";
        }
      }
  Cfg::TiledMma mma;
  for (int ctid = 0; ctid < Cfg::CONSUMER_THREADS; ++ctid) {
    auto thr = mma.get_thread_slice(ctid);
    Tensor c = thr.partition_C(make_identity_tensor(make_shape(Int<Cfg::BM>{}, Int<Cfg::BN>{})));
    const int wg_row0 = ctid / 128 * 64, q = ctid & 3;
    if (size(c) != Cfg::BM * Cfg::BN / Cfg::CONSUMER_THREADS) return "accumulator size";
    for (int i = 0; i < size(c); ++i) {
      const int row = wg_row0 + 16 * ((ctid / 32) % 4) + (ctid % 32) / 4 + 8 * ((i >> 1) & 1);
      const int col = 8 * (i >> 2) + 2 * q + (i & 1);
      if (get<0>(c(i)) != row || get<1>(c(i)) != col) {
        return "accumulator: thread " + std::to_string(ctid) + " element " + std::to_string(i) +
               " is (" + std::to_string(int(get<0>(c(i)))) + ", " +
               std::to_string(int(get<1>(c(i)))) + "), expected (" + std::to_string(row) + ", " +
               std::to_string(col) + ")";
      }
    }
  }
  return "";
}

bool sm90_fp8_supports(const GroupedGemmFP8Problem& prob) {
  using gemm::sm90fp8::Cfg;
  const bool silu = prob.activation == Activation::kSiluAndMul;
  const int64_t b_rows = silu ? 2 * prob.n : prob.n;
  const int64_t a_rows = prob.contiguous ? prob.m : prob.max_m;
  // TMA needs a non-empty k extent; coordinates and tile ids are 32-bit.
  return prob.k > 0 && prob.num_groups <= Cfg::MAX_GROUPS && prob.k <= INT_MAX &&
         b_rows <= INT_MAX && a_rows <= INT_MAX && fp8_total_rows(prob) <= INT_MAX;
}

void launch_grouped_gemm_sm90_fp8(const GroupedGemmFP8Problem& prob, cudaStream_t stream) {
  using namespace gemm::sm90fp8;
  const char* op = "moe_grouped_gemm_fp8";
  if (!sm90_fp8_supports(prob)) {
    throw Error(std::string("moekit::") + op + ": problem outside the SM90 FP8 config's limits");
  }
  const bool silu = prob.activation == Activation::kSiluAndMul;
  const int64_t G = prob.num_groups;
  const int64_t b_rows = silu ? 2 * prob.n : prob.n;
  const int64_t out_cols = silu ? Cfg::B_BOX : Cfg::BN;  // output columns per tile
  const int64_t n_tiles = (prob.n + out_cols - 1) / out_cols;
  Fp8Params p;
  p.rows = gemm::fp8_rows(prob);
  const int64_t tiles = gemm::max_tiles(p.rows, Cfg::BM, static_cast<int>(n_tiles));
  if (tiles <= 0) return;
  if (tiles > INT_MAX) {
    throw Error(std::string("moekit::") + op + ": problem too large for the SM90 FP8 config");
  }
  // a as (max_m, k, G) masked, (P, k, 1) contiguous (locate_tile's a_row / a_l).
  const int64_t a_rows = prob.contiguous ? prob.m : prob.max_m;
  const int64_t a_l = prob.contiguous ? 1 : G;
  p.tma_a = make_tma<Cfg>(static_cast<const E4M3*>(prob.a), a_rows, prob.k, a_l, Cfg::A_BOX);
  p.tma_a16 = make_tma<Cfg>(static_cast<const E4M3*>(prob.a), a_rows, prob.k, a_l, Cfg::A_SMALL);
  p.tma_b = make_tma<Cfg>(static_cast<const E4M3*>(prob.b), b_rows, prob.k, G, Cfg::B_BOX);
  p.a_scale = prob.a_scale;
  p.b_scale = prob.b_scale;
  p.si = fp8_scale_index(prob.scales, b_rows, prob.k);
  p.c = prob.c;
  p.c_scale = prob.c_scale;
  p.c_amax = prob.c_amax;
  if (prob.c_amax != nullptr && prob.c_scale != nullptr)
    throw Error(std::string("moekit::") + op + ": internal: c_amax goes with a bf16 c");
  p.n = static_cast<int>(prob.n);
  p.k = static_cast<int>(prob.k);
  p.silu = silu ? 1 : 0;
  p.k_blocks = static_cast<int>((prob.k + Cfg::BK - 1) / Cfg::BK);
  p.n_tiles = static_cast<int>(n_tiles);
  p.tile_bound = static_cast<int>(tiles);
  // The plan's schedule: dynamic claims from the zeroed counter, else the static walk.
  unsigned* counter = prob.plan.schedule == GemmSchedule::kDynamic ? prob.tile_counter : nullptr;
  p.tile_counter = sm90_tile_counter(counter, stream, op, &p.dynamic_waves);
  const int smem = static_cast<int>(sizeof(Fp8Storage));
  // Both promote every 128 k; block scales there, per-channel / per-tensor ones once at the end.
  const bool block_scales = prob.scales == Fp8Scales::kBlock;
  auto kernel =
      block_scales ? sm90_fp8_grouped_gemm_kernel<true> : sm90_fp8_grouped_gemm_kernel<false>;
  // A refusal fails the launch (check_launch).
  if (block_scales) {
    raise_smem_limit<sm90_fp8_grouped_gemm_kernel<true>>(smem);
  } else {
    raise_smem_limit<sm90_fp8_grouped_gemm_kernel<false>>(smem);
  }
  const int64_t sms = device_props().sms;
  const int64_t grid = tiles < sms ? tiles : sms;
  kernel<<<static_cast<unsigned>(grid), Cfg::THREADS, smem, stream>>>(p);
}

void launch_fp8_empty_sums(const GroupedGemmFP8Problem& problem, cudaStream_t stream) {
  const unsigned groups = static_cast<unsigned>(std::min(problem.num_groups, 65535));
  gemm::fill_empty_sums_kernel<<<dim3(8, groups), 256, 0, stream>>>(
      gemm::fp8_rows(problem), problem.c, problem.c_scale, problem.n);
}

}  // namespace moekit::detail
