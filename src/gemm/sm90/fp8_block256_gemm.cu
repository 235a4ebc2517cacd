// The SM90 FP8 grouped GEMM with 128x128 block scales on 128 x 256 tiles, plan
// `fp8_sm90 128x256` with Fp8Scales::kBlock (docs/gemm.md "FP8 block scales on 128 x 256
// tiles"): the bf16 engine's producer, stages and tile schedule (grouped_gemm.cuh) on e4m3
// operands, as fp8_fast_gemm.cu, with a promotion every 128 k as fp8_grouped_gemm.cu.
//
// Why: the 128 x 128 kernel moves 32 KB of operands into shared memory for every 4.2 MFLOP;
// the FP8 layers at T = 4096 then run with the L2 -> SM traffic at its ceiling and the tensor
// pipe 35%-41% busy (docs/PERF.md "FP8 layers at 4,096 tokens"). A 128 x 256 tile moves 48 KB
// for 8.4 MFLOP, a quarter fewer bytes a FLOP. Its block scales change every 128 k, so each
// stage's sums must be promoted into f32 with their scale: a whole 64 x 256 wgmma fragment
// would be a second 128 registers a thread (the wider tiles tried before spilled, PERF.md).
// Here each stage's wgmmas run in four 64-column chunks, each into one 64 x 64 fragment (32
// registers), waited for and promoted before the next chunk: 128 + 32 accumulator registers.
// The other warpgroup's wgmmas fill the tensor pipe while one promotes. The price: a's stage
// is read from shared memory four times (once per chunk) instead of once.
#include <cuda_bf16.h>

#include "core/kernel_launch.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/sm90/fp8_amax.cuh"
#include "gemm/sm90/fp8_wide_params.cuh"
#include "gemm/sm90/grouped_gemm.cuh"

namespace moekit::detail::gemm::sm90 {
namespace {

using E4M3 = cutlass::float_e4m3_t;
using BlockCfg = Config<E4M3, kPairNone, 256>;

constexpr int kChunk = 64;  // output columns of one promoted wgmma batch
static_assert(BlockCfg::B_BOX == 128, "each b box is one 128-row scale block");

// A chunk's b rows [64 c, 64 c + 64) of every stage: rows stack along the stage's 128-byte
// swizzle atoms first (grouped_gemm.cuh), so the chunk is the stage's next 8 KB at offset
// 64 c rows with the same swizzle phase; stages BN rows apart.
template <class Cfg>
using ChunkSmemLayoutB = decltype(cute::append<3>(
    cute::tile_to_shape(typename Cfg::SmemAtom{},
                        cute::make_shape(cute::Int<kChunk>{}, cute::Int<Cfg::BK>{})),
    cute::Layout<cute::Int<Cfg::STAGES>, cute::Int<Cfg::BN * Cfg::BK>>{}));

// Two consumer warpgroups stacked along M, each 64 x 64 per chunk (wgmma 64x64x32 e4m3).
using ChunkMma = CooperativeTiledMma<E4M3, kChunk, BlockCfg::BK>;

struct BlockScales {
  const float* a_scale;  // [rows, KB]
  const float* b_scale;  // [G, ceil(b rows / 128), KB]
  Fp8ScaleIndex si;
  uint32_t* c_amax;       // max |c| (f32 bits) gathered here (fp8_amax.cuh); or nullptr
  float* c_group_scales;  // kGroupOut: the e4m3 c's scales, [rows, n / 128]
};

// Issues chunk C of stage `stage` into blk (fresh) as one wgmma batch, not waited for: the
// caller waits (warpgroup_wait) and promotes it while the next chunk's batch runs.
template <int C, class FragA, class Acc>
__device__ __forceinline__ void issue_chunk(ChunkMma& mma, FragA& tCrA, E4M3* smem_b, int ctid,
                                            Acc& blk, int stage) {
  using namespace cute;
  auto thr = mma.get_thread_slice(ctid);
  Tensor sB =
      make_tensor(make_smem_ptr(smem_b + C * kChunk * BlockCfg::BK), ChunkSmemLayoutB<BlockCfg>{});
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));  // (MMA, 1, MMA_K, STAGES)
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  issue_stage_wgmmas(mma, tCrA, tCrB, blk, stage);
}

// Waits until at most N wgmma batches are in flight; blk (the oldest's) is then complete.
template <int N, class Acc>
__device__ __forceinline__ void wait_chunk(Acc& blk) {
  cute::warpgroup_wait<N>();
  cute::warpgroup_fence_operand(blk);
}

// acc's elements of chunk C (i = e + 2 h + 4 j with column 8 j + 2 q + e: chunk C holds
// j = 8 C .. 8 C + 7, i = 32 C + blk's i) += blk * the scale of its row h and box C / 2.
template <int C, class Acc, class Blk>
__device__ __forceinline__ void promote(Acc& acc, const Blk& blk, const float (&s)[2][2]) {
  CUTE_UNROLL
  for (int i = 0; i < kChunk / 2; ++i) {
    acc(32 * C + i) = fmaf(blk(i), s[(i >> 1) & 1][C / 2], acc(32 * C + i));
  }
}

// kGroupOut: silu_and_mul into an e4m3 c quantized per row in groups of 128 (the tile's output
// columns), the down GEMM's a, with no bf16 pass between (store_silu_group_quantized).
template <bool kGroupOut>
__global__ void __launch_bounds__(BlockCfg::THREADS, 1)
    sm90_fp8_block256_kernel(const __grid_constant__ Params<BlockCfg, E4M3> p,
                             const __grid_constant__ BlockScales scales) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  using Cfg = BlockCfg;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<SharedStorage<Cfg, E4M3>*>(smem_raw);
  const int warp_group = threadIdx.x / 128;

  auto [pipeline, total, k_tiles, walk] = start_tile_loop<Cfg>(p, ss, warp_group);
  if (warp_group != 0) {
    typename Cfg::PipelineState read;
    const int ctid = threadIdx.x - 128;
    ChunkMma mma;
    auto thr = mma.get_thread_slice(ctid);
    Tensor sA = make_tensor(make_smem_ptr(ss.a), typename Cfg::SmemLayoutA{});
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, 1, MMA_K, STAGES)
    static_assert(decltype(size<2>(tCrA))::value == Cfg::BK / 32, "wgmma k32 steps of e4m3");
    // The tile's f32 sums, as the 256-wide kernels hold them (store_accumulators' layout).
    typename Cfg::TiledMma tile_mma;
    auto tile_thr = tile_mma.get_thread_slice(ctid);
    Tensor acc = partition_fragment_C(tile_mma, make_shape(Int<BM>{}, Int<BN>{}));
    Tensor tCcC = tile_thr.partition_C(make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{})));
    Tensor blk0 = partition_fragment_C(mma, make_shape(Int<BM>{}, Int<kChunk>{}));
    Tensor blk1 = partition_fragment_C(mma, make_shape(Int<BM>{}, Int<kChunk>{}));
    static_assert(decltype(size(blk0))::value == kChunk / 2, "a chunk's fragment: 32 values");
    const int wg = warp_group - 1;
    const int q = threadIdx.x & 3;
    check_accumulator_layout(tCcC, wg, q);
    // promote's map: blk element i is row (i >> 1) & 1 of this thread's two and column
    // 8 (i >> 2) + 2 q + (i & 1) of its chunk (traps if CuTe's layout ever differs).
    Tensor tCcB = thr.partition_C(make_identity_tensor(make_shape(Int<BM>{}, Int<kChunk>{})));
    CUTE_UNROLL
    for (int i = 0; i < decltype(size(blk0))::value; ++i) {
      if (get<0>(tCcB(i)) != get<0>(tCcC(i)) || get<1>(tCcB(i)) != get<1>(tCcC(i))) __trap();
    }
    const int row0 = 64 * wg + 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4;
    const Fp8ScaleIndex& si = scales.si;
    AmaxObserver amax;
    int j = 0;
    for (int id = channel_get(ss.channel, j++); id < total; id = channel_get(ss.channel, j++)) {
      const Tile t = locate_tile<Cfg>(p, ss.tile_start, id, walk.rank);
      if (64 * wg >= t.rows) {  // no valid row in this half (its a box was not loaded)
        skip_tile_stages<1>(pipeline, read, k_tiles, wg);
        continue;
      }
      // This thread's two rows' a scales (rows past the count: never stored, scale 0) and
      // the two b boxes' scale rows (box 1 past n: its columns are never stored).
      const float* sa_ptr[2];
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        sa_ptr[h] = r < t.rows ? scales.a_scale + (t.c_row + r) * si.a_row : nullptr;
      }
      const float* sb_group = scales.b_scale + static_cast<int64_t>(t.group) * si.b_group;
      const bool box1 = p.silu || t.n0 + Cfg::B_BOX < p.n;
      const float* sb_ptr[2] = {sb_group + (t.b_row0 / si.b_row_div) * si.b_row,
                                box1 ? sb_group + (t.b_row1 / si.b_row_div) * si.b_row : nullptr};
      // Scales one k block ahead (registers), as the 128 x 128 kernel.
      auto load_scales = [&](int kb, float(&v)[4]) {
        CUTE_UNROLL
        for (int x = 0; x < 2; ++x) v[x] = sb_ptr[x] ? __ldg(sb_ptr[x] + kb * si.b_kb) : 0.f;
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) v[2 + h] = sa_ptr[h] ? __ldg(sa_ptr[h] + kb * si.a_kb) : 0.f;
      };
      float next[4];
      load_scales(0, next);
      clear(acc);
      CUTE_NO_UNROLL
      for (int kb = 0; kb < k_tiles; ++kb) {
        // s[h][x]: a_scale[row h, kb] * b_scale[box x's block, kb]
        const float s[2][2] = {{next[2] * next[0], next[2] * next[1]},
                               {next[3] * next[0], next[3] * next[1]}};
        if (kb + 1 < k_tiles) load_scales(kb + 1, next);
        pipeline.consumer_wait(read);
        const int stage = read.index();
        // Two chunk fragments in turn: chunk c + 1's wgmmas run while chunk c is promoted.
        issue_chunk<0>(mma, tCrA, ss.b, ctid, blk0, stage);
        issue_chunk<1>(mma, tCrA, ss.b, ctid, blk1, stage);
        wait_chunk<1>(blk0);
        promote<0>(acc, blk0, s);
        issue_chunk<2>(mma, tCrA, ss.b, ctid, blk0, stage);
        wait_chunk<1>(blk1);
        promote<1>(acc, blk1, s);
        issue_chunk<3>(mma, tCrA, ss.b, ctid, blk1, stage);
        wait_chunk<1>(blk0);
        promote<2>(acc, blk0, s);
        wait_chunk<0>(blk1);
        pipeline.consumer_release(read);  // the stage's last wgmma has completed
        ++read;
        promote<3>(acc, blk1, s);
      }
      if constexpr (kGroupOut) {
        store_silu_group_quantized<BN, Cfg::B_BOX>(acc, tCcC, t, static_cast<__nv_fp8_e4m3*>(p.c),
                                                   p.n, q, scales.c_group_scales);
      } else {
        store_accumulators<BN, Cfg::B_BOX>(acc, tCcC, t, static_cast<__nv_bfloat16*>(p.c), p.n,
                                           p.silu != 0, q, AccumulatorValue{}, amax);
      }
    }
    if (scales.c_amax != nullptr) publish_amax(amax.m, scales.c_amax);
  }
#endif
}

}  // namespace
}  // namespace moekit::detail::gemm::sm90

namespace moekit::detail {

void launch_grouped_gemm_sm90_fp8_block256(const GroupedGemmFP8Problem& prob, cudaStream_t stream) {
  using namespace gemm::sm90;
  using Cfg = BlockCfg;
  const char* op = "moe_grouped_gemm_fp8";
  const bool silu = prob.activation == Activation::kSiluAndMul;
  const bool group_out = prob.c_group_scales != nullptr;
  if (!sm90_fp8_supports(prob) || prob.scales != Fp8Scales::kBlock || prob.c_scale != nullptr ||
      (silu && prob.n % Cfg::B_BOX != 0) || (group_out && (!silu || prob.c_amax != nullptr))) {
    throw Error(std::string("moekit::") + op +
                ": fp8_sm90 128x256 with block scales takes a bf16 c, or an e4m3 c with its "
                "group scales after silu_and_mul (and with silu_and_mul n % 128 == 0)");
  }
  Params<Cfg, E4M3> p;
  const int64_t tiles = wide_fp8_params<Cfg>(prob, op, stream, p);
  if (tiles <= 0) return;
  const BlockScales scales{prob.a_scale, prob.b_scale,
                           fp8_scale_index(prob.scales, silu ? 2 * prob.n : prob.n, prob.k),
                           prob.c_amax, prob.c_group_scales};
  if (group_out) {
    launch_wide_fp8<Cfg, sm90_fp8_block256_kernel<true>>(tiles, p, scales, stream);
  } else {
    launch_wide_fp8<Cfg, sm90_fp8_block256_kernel<false>>(tiles, p, scales, stream);
  }
}

}  // namespace moekit::detail
