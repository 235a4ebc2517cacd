// FP8 e4m3 grouped GEMM (masked or contiguous rows) with 128-wide block scales
// (DeepGEMM-style), config kFp8Decode.
//
// One pipeline stage holds 128 k = exactly one scale block. Each stage's mma.sync
// m16n8k32 partial sums go into a fresh f32 accumulator, which is then promoted
// into the running f32 accumulator with a_scale[row, kb] * b_scale[n/128, kb]:
// the scales apply per block, as the SPEC's formula does, and the tensor core's
// reduced-precision fp8 accumulation spans only 128 k.
#include <cuda_bf16.h>

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

}  // namespace
}  // namespace gemm

void launch_grouped_gemm_fp8(const GroupedGemmFP8Problem& problem, cudaStream_t stream) {
  gemm::launch_fp8<gemm::Fp8DecodeConfig>(problem, stream);
}

}  // namespace moekit::detail
