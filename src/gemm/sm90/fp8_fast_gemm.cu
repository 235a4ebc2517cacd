// The SM90 FP8 grouped GEMM's fast-accumulation form, plan `fp8_sm90 128x256` (docs/gemm.md
// "FP8 fast accumulation"): the bf16 engine of grouped_gemm.cuh (128 x 256 tiles, TMA into
// 128-byte-swizzled stages, wgmma from two consumer warpgroups, a persistent static or dynamic
// walk of the device-side tile schedule) on e4m3 operands, BK = 128 e4m3 (one swizzle atom, as the
// bf16 kernels' 64), the whole k summed in the wgmma accumulators and each output scaled once in
// the epilogue: a_scale(row) * b_scale(b row) (per channel: the token's and the weight row's;
// per tensor: one each). So per-tensor and per-channel scales only (constant along k; block
// scales change every 128 k: the same tiles with block scales are fp8_block256_gemm.cu) and a
// bf16 c.
//
// Why a second FP8 kernel: the 128 x 128 kernel (fp8_grouped_gemm.cu) promotes a fresh
// accumulator every 128 k, which holds a second 64 x 128 f32 fragment per warpgroup and
// caps its tile at 128 columns: each a block is read once per 128 output columns, each b
// block once per 128 rows, ~2x the operand bytes through the L2 of 256-wide tiles at
// T = 4096 (docs/PERF.md "FP8 layers at 4,096 tokens"). The price: the tensor cores keep
// ~13 mantissa bits of an e4m3 sum, so the rounding error grows with k instead of resetting
// every 128 k (CUTLASS's and vLLM's "fast accumulation"); the GPU tests bound its error. The
// planner picks it on contiguous groups of >= 256 rows on average (plan_gemm_fp8), else it is
// a candidate the tuning tables may pick.
#include <cuda_bf16.h>

#include "core/kernel_launch.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/sm90/fp8_amax.cuh"
#include "gemm/sm90/fp8_wide_params.cuh"
#include "gemm/sm90/grouped_gemm.cuh"

namespace moekit::detail::gemm::sm90 {
namespace {

using E4M3 = cutlass::float_e4m3_t;
using FastCfg = Config<E4M3, kPairNone, 256>;

// The output's scales (Fp8ScaleIndex: per channel a_row = 1, b_row = 1, b_group = b rows;
// per tensor all 0 but b_group = 1).
struct Fp8OutputScales {
  const float* a_scale;
  const float* b_scale;
  int64_t a_row, b_group, b_row;
  uint32_t* c_amax;  // max |c| (f32 bits) gathered here (fp8_amax.cuh); or nullptr
};

// The kernel's shared memory: the engine's, then per consumer warpgroup its tile's b scales
// (per channel), staged there once a tile so the epilogue waits on no global load.
template <class Cfg>
struct FastSharedStorage {
  SharedStorage<Cfg, E4M3> engine;
  float b_scales[2][Cfg::BN];  // [warpgroup][box * B_BOX + column in box]
};

// The scales of one tile a consumer thread loads before the tile's mainloop, so their
// latency hides behind its wgmmas (loaded after it, the per-channel epilogue waited ~6 us a
// tile on them: docs/PERF.md "Qwen3-30B FP8 at T = 4096"): its two rows' a scales and, per
// channel, box 0's and box 1's b scale of column `x` (this thread's index in its warpgroup),
// per tensor the group's one b scale. 0 for rows past the tile's count and columns past n
// (their outputs are never stored; their scales may lie past the tensors).
struct TileScales {
  float sa[2];
  float sb[2];
};

template <class Cfg, bool kPerChannel>
__device__ __forceinline__ TileScales load_tile_scales(const Fp8OutputScales& s, const Tile& t,
                                                       int n, bool silu, int wg) {
  static_assert(Cfg::B_BOX == 128, "one column a box for each of a warpgroup's 128 threads");
  TileScales v;
  const int row0 = 64 * wg + 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4;
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
    v.sa[h] = r < t.rows ? __ldg(s.a_scale + (t.c_row + r) * s.a_row) : 0.f;
  }
  const float* group = s.b_scale + static_cast<int64_t>(t.group) * s.b_group;
  if constexpr (kPerChannel) {
    const int x = threadIdx.x % 128;
    const int cols0 = n - t.n0, cols1 = silu ? cols0 : cols0 - Cfg::B_BOX;
    v.sb[0] = x < cols0 ? __ldg(group + static_cast<int64_t>(t.b_row0 + x) * s.b_row) : 0.f;
    v.sb[1] = x < cols1 ? __ldg(group + static_cast<int64_t>(t.b_row1 + x) * s.b_row) : 0.f;
  } else {
    v.sb[0] = __ldg(group);
    v.sb[1] = 0.f;
  }
  return v;
}

// acc(i) * a_scale(its row) * b_scale(its b row): the value store_accumulators stores. wgmma
// D layout (checked by check_accumulator_layout and store_accumulators): element
// i = e + 2 h + 4 j is row 64 wg + 16 (warp % 4) + lane / 4 + 8 h, column 8 j + 2 q + e;
// columns < B_BOX come from b box 0 (b rows from b_row0), the rest from box 1 (b_row1; with
// silu the up rows of the same output columns). Per channel the b scale is the warpgroup's
// staged one (zero past n); per tensor the group's, zero past n.
template <int B_BOX, bool kPerChannel>
struct ScaledAccumulator {
  float sa[2];       // this thread's two rows' a scales
  const float* sb;   // per channel: the staged scales of this thread's first column (2 q)
  float sb_tensor;   // per tensor: the group's scale
  int cols_left[2];  // per tensor: per box, its columns from 2 q that are output columns < n

  template <class Acc>
  __device__ __forceinline__ float operator()(const Acc& acc, int i) const {
    const int c = 8 * (i >> 2) + (i & 1);  // column - 2 q (folds: i is a constant)
    const int box = c < B_BOX ? 0 : 1;
    const int in_box = c - box * B_BOX;
    float s;
    if constexpr (kPerChannel) {
      s = sb[box * B_BOX + in_box];
    } else {
      s = in_box < cols_left[box] ? sb_tensor : 0.f;
    }
    return acc(i) * (sa[(i >> 1) & 1] * s);
  }
};

template <class Cfg, bool kPerChannel>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    sm90_fp8_fast_kernel(const __grid_constant__ Params<Cfg, E4M3> p,
                         const __grid_constant__ Fp8OutputScales scales) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& fs = *reinterpret_cast<FastSharedStorage<Cfg>*>(smem_raw);
  auto& ss = fs.engine;
  const int warp_group = threadIdx.x / 128;

  auto [pipeline, total, k_tiles, walk] = start_tile_loop<Cfg>(p, ss, warp_group);
  if (warp_group != 0) {
    // The consumers as consume_tiles' (consumer.cuh), with the scaled epilogue and no
    // swapped tiles.
    typename Cfg::PipelineState read;
    const int ctid = threadIdx.x - 128;
    typename Cfg::TiledMma mma;
    auto thr = mma.get_thread_slice(ctid);
    Tensor sA = make_tensor(make_smem_ptr(ss.a), typename Cfg::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(ss.b), typename Cfg::SmemLayoutB{});
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));
    Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
    Tensor acc = partition_fragment_C(mma, make_shape(Int<BM>{}, Int<BN>{}));
    Tensor tCcC = thr.partition_C(make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{})));
    static_assert(decltype(size<2>(tCrA))::value == Cfg::BK / 32, "wgmma k32 steps of e4m3");
    const int wg = warp_group - 1;
    const int q = threadIdx.x & 3;
    check_accumulator_layout(tCcC, wg, q);
    // The column ScaledAccumulator computes for element i (folds to constants; traps if
    // CuTe's layout ever differs).
    CUTE_UNROLL
    for (int i = 0; i < decltype(size(acc))::value; ++i)
      if (get<1>(tCcC(i)) != 8 * (i >> 2) + 2 * q + (i & 1)) __trap();
    auto* c = static_cast<__nv_bfloat16*>(p.c);
    const bool silu = p.silu != 0;
    float* staged = fs.b_scales[wg];
    AmaxObserver amax;
    int j = 0;
    for (int id = channel_get(ss.channel, j++); id < total; id = channel_get(ss.channel, j++)) {
      const Tile t = locate_tile<Cfg>(p, ss.tile_start, id, walk.rank);
      const bool skip = 64 * wg >= t.rows;  // the whole warpgroup alike
      TileScales ts{};
      if (!skip) ts = load_tile_scales<Cfg, kPerChannel>(scales, t, p.n, silu, wg);
      if (!consume_tile<1>(mma, tCrA, tCrB, acc, pipeline, read, k_tiles, skip, wg)) continue;
      ScaledAccumulator<Cfg::B_BOX, kPerChannel> value;
      value.sa[0] = ts.sa[0];
      value.sa[1] = ts.sa[1];
      if constexpr (kPerChannel) {
        // Barrier 2 + wg (this warpgroup's 128 threads; CUTLASS offsets the id past its
        // reserved ones): every thread is past the last tile's epilogue before the stores,
        // and every store lands before the epilogue reads.
        cutlass::arch::NamedBarrier::sync(128, 2 + wg);
        staged[threadIdx.x % 128] = ts.sb[0];
        staged[Cfg::B_BOX + threadIdx.x % 128] = ts.sb[1];
        cutlass::arch::NamedBarrier::sync(128, 2 + wg);
        value.sb = staged + 2 * q;
      } else {
        value.sb_tensor = ts.sb[0];
        value.cols_left[0] = p.n - t.n0 - 2 * q;
        value.cols_left[1] = silu ? value.cols_left[0] : value.cols_left[0] - Cfg::B_BOX;
      }
      store_accumulators<BN, Cfg::B_BOX>(acc, tCcC, t, c, p.n, silu, q, value, amax);
    }
    if (scales.c_amax != nullptr) publish_amax(amax.m, scales.c_amax);
  }
#endif
}

}  // namespace
}  // namespace moekit::detail::gemm::sm90

namespace moekit::detail {

void launch_grouped_gemm_sm90_fp8_fast(const GroupedGemmFP8Problem& prob, cudaStream_t stream) {
  using namespace gemm::sm90;
  using Cfg = FastCfg;
  const char* op = "moe_grouped_gemm_fp8";
  if (!sm90_fp8_supports(prob) || prob.scales == Fp8Scales::kBlock || prob.c_scale != nullptr) {
    throw Error(std::string("moekit::") + op +
                ": fp8_sm90 128x256 takes per-tensor or per-channel scales and a bf16 c");
  }
  Params<Cfg, E4M3> p;
  const int64_t tiles = wide_fp8_params<Cfg>(prob, op, stream, p);
  if (tiles <= 0) return;
  const bool silu = prob.activation == Activation::kSiluAndMul;
  const Fp8ScaleIndex si = fp8_scale_index(prob.scales, silu ? 2 * prob.n : prob.n, prob.k);
  const Fp8OutputScales scales{prob.a_scale, prob.b_scale, si.a_row,
                               si.b_group,   si.b_row,     prob.c_amax};
  if (prob.scales == Fp8Scales::kPerChannel) {
    launch_wide_fp8<Cfg, sm90_fp8_fast_kernel<Cfg, true>, FastSharedStorage<Cfg>>(tiles, p, scales,
                                                                                  stream);
  } else {
    launch_wide_fp8<Cfg, sm90_fp8_fast_kernel<Cfg, false>, FastSharedStorage<Cfg>>(tiles, p, scales,
                                                                                   stream);
  }
}

}  // namespace moekit::detail
