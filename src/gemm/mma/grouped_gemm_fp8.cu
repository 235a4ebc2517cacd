// FP8 e4m3 grouped GEMM (masked or contiguous rows) with 128-wide block scales
// (DeepGEMM-style), config kFp8Decode.
//
// One pipeline stage holds 128 k = exactly one scale block. Each stage's mma.sync
// m16n8k32 partial sums go into a fresh f32 accumulator, which is then promoted
// into the running f32 accumulator with a_scale[row, kb] * b_scale[n/128, kb]:
// the scales apply per block, as the SPEC's formula does, and the tensor core's
// reduced-precision fp8 accumulation spans only 128 k. k == 0 (any scale mode, activation or
// output) is a fill of the empty sums' value.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "gemm/grouped_gemm_fp8.h"
#include "gemm/launch.h"
#include "gemm/mma/configs.cuh"
#include "gemm/mma/epilogue.cuh"
#include "gemm/mma/mainloop.cuh"
#include "gemm/mma/tile_scheduler.cuh"

namespace moekit::detail {
namespace gemm {
namespace {

struct Fp8Params {
  const void* a;
  const float* a_scale;
  const void* b;
  const float* b_scale;
  __nv_bfloat16* c;
  RowsDesc rows;
  int64_t n;
  int64_t k;  // elements = bytes
  int n_tiles;
  int k_blocks;  // ceil(k / 128)
  int n_blocks;  // ceil(n / 128)
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    grouped_gemm_fp8_kernel(const __grid_constant__ Fp8Params p) {
  static_assert(Cfg::BK_BYTES == 128 && 128 % Cfg::BN == 0, "a stage is one 128x128 scale block");
  extern __shared__ __align__(128) uint8_t smem[];
  TileCoord t;
  if (!find_tile<Cfg::THREADS>(p.rows, Cfg::BM, p.n_tiles, blockIdx.x, t)) return;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Cfg::WARPS_N, wn = warp % Cfg::WARPS_N;
  const int gid = lane >> 2;

  TileLoader<Cfg> loader;
  setup_loader_a(loader, p.a, p.k, t, /*b_evict_first=*/false);
  const char* b_group = static_cast<const char*>(p.b) + t.group * p.n * p.k;
#pragma unroll
  for (int i = 0; i < Cfg::B_ITERS; ++i) {
    const int64_t col =
        static_cast<int64_t>(t.n_tile) * Cfg::BN + loader.row_base + i * Cfg::ROW_STEP;
    loader.b_row[i] = col < p.n ? b_group + col * p.k : nullptr;
  }

  float acc[Cfg::MF][Cfg::NF][4];
  zero_accumulators<Cfg>(acc);

  const int valid_mf = valid_fragments<Cfg>(t.rows, wm);
  // Scale rows of this thread's accumulator rows (0 for rows past the group: their
  // a_scale entries are never read).
  const float* a_scale_row[Cfg::MF][2];
#pragma unroll
  for (int mf = 0; mf < Cfg::MF; ++mf)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * Cfg::WM + mf * 16 + gid + h * 8;
      a_scale_row[mf][h] = r < t.rows ? p.a_scale + (t.row0 + r) * p.k_blocks : nullptr;
    }
  const float* b_scale_row = p.b_scale + (static_cast<int64_t>(t.group) * p.n_blocks +
                                          static_cast<int64_t>(t.n_tile) * Cfg::BN / 128) *
                                             p.k_blocks;

  const uint32_t s_a0 = smem_addr(smem);
  const uint32_t s_b0 = s_a0 + Cfg::STAGES * Cfg::A_STAGE_BYTES;
  run_pipeline<Cfg>(
      p.k_blocks,
      [&](int stage, int kt) {
        loader.load(s_a0 + stage * Cfg::A_STAGE_BYTES, s_b0 + stage * Cfg::B_STAGE_BYTES, kt);
      },
      [&](int stage, int kt) {
        // Scales first: their loads are in flight while the tensor cores run.
        const float sb = __ldg(b_scale_row + kt);
        float sa[Cfg::MF][2];
#pragma unroll
        for (int mf = 0; mf < Cfg::MF; ++mf)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            sa[mf][h] = a_scale_row[mf][h] ? __ldg(a_scale_row[mf][h] + kt) : 0.f;
        float part[Cfg::MF][Cfg::NF][4];
        zero_accumulators<Cfg>(part);
        warp_mma_tile<Cfg, MmaE4M3>(s_a0 + stage * Cfg::A_STAGE_BYTES,
                                    s_b0 + stage * Cfg::B_STAGE_BYTES, part, wm, wn, lane,
                                    valid_mf);
#pragma unroll
        for (int mf = 0; mf < Cfg::MF; ++mf)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float s = sa[mf][h] * sb;
#pragma unroll
            for (int nf = 0; nf < Cfg::NF; ++nf) {
              acc[mf][nf][2 * h] = fmaf(s, part[mf][nf][2 * h], acc[mf][nf][2 * h]);
              acc[mf][nf][2 * h + 1] = fmaf(s, part[mf][nf][2 * h + 1], acc[mf][nf][2 * h + 1]);
            }
          }
      });

  store_tile<Cfg, __nv_bfloat16>(acc, p.c, p.n, t.row0, t.rows, t.n_tile, false, wm, wn, lane);
}

template <class Cfg>
void launch_fp8(const GroupedGemmFP8Problem& prob, cudaStream_t stream) {
  Fp8Params p{};
  p.a = prob.a;
  p.a_scale = prob.a_scale;
  p.b = prob.b;
  p.b_scale = prob.b_scale;
  p.c = static_cast<__nv_bfloat16*>(prob.c);
  // Block scales, no activation (gemm_fp8_plan_rejection); masked or contiguous rows (the
  // flattened row of a tile indexes a, a_scale and c alike).
  p.rows.mode = prob.contiguous ? kRowsContiguous : kRowsMasked;
  p.rows.num_groups = prob.num_groups;
  p.rows.meta = prob.layout_metadata;
  p.rows.alignment = prob.alignment;
  p.rows.total_rows = prob.contiguous ? prob.m : 0;
  p.rows.max_m = prob.contiguous ? 0 : prob.max_m;
  p.n = prob.n;
  p.k = prob.k;
  p.k_blocks = static_cast<int>((prob.k + 127) / 128);
  p.n_blocks = static_cast<int>((prob.n + 127) / 128);
  const int64_t n_tiles = (prob.n + Cfg::BN - 1) / Cfg::BN;
  const int64_t tiles = max_tiles(p.rows, Cfg::BM, static_cast<int>(n_tiles));
  if (tiles <= 0) return;
  if (tiles > INT_MAX) {
    throw Error("moekit::moe_grouped_gemm_fp8: problem too large for one launch (" +
                std::to_string(tiles) + " tiles)");
  }
  p.n_tiles = static_cast<int>(n_tiles);
  auto kernel = grouped_gemm_fp8_kernel<Cfg>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES);
  kernel<<<static_cast<unsigned>(tiles), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(p);
}

// k == 0: every row of every group is the empty sum's output, act(0) = 0 (silu(0) * 0 with
// silu_and_mul), as bf16 or as e4m3(0 / c_scale) (the SM90 epilogue's value * rcp(c_scale):
// +-0, or NaN for a zero or NaN scale); other rows untouched. Blocks (x, y) walk groups y,
// y + gridDim.y, ..., each group's elements from x, one per thread per step.
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
}  // namespace gemm

void launch_grouped_gemm_fp8(const GroupedGemmFP8Problem& problem, cudaStream_t stream) {
  if (problem.k == 0) {
    // Any scale mode, activation and output: no scale is read (gemm_fp8_plan_rejection).
    gemm::RowsDesc rows;
    rows.mode = problem.contiguous ? gemm::kRowsContiguous : gemm::kRowsMasked;
    rows.num_groups = problem.num_groups;
    rows.meta = problem.layout_metadata;
    rows.alignment = problem.alignment;
    rows.total_rows = problem.contiguous ? problem.m : 0;
    rows.max_m = problem.contiguous ? 0 : problem.max_m;
    const unsigned groups = static_cast<unsigned>(std::min(problem.num_groups, 65535));
    gemm::fill_empty_sums_kernel<<<dim3(8, groups), 256, 0, stream>>>(rows, problem.c,
                                                                      problem.c_scale, problem.n);
    return;
  }
  gemm::launch_fp8<gemm::Fp8DecodeConfig>(problem, stream);
}

}  // namespace moekit::detail
