// Split-K variant of the bf16/f16 grouped-GEMM kernel (kGemmConfigDecodeSplitK).
//
// A thread-block cluster of `split` CTAs computes one output tile: CTA rank s runs the
// mainloop over k slices [s*KT/split, (s+1)*KT/split), writes its f32 accumulators
// to its own shared memory, and after a cluster barrier each rank reduces a share
// of the tile's output fragments by reading the `split` partials (ranks 0, 1, ...,
// in that fixed order) through distributed shared memory, applies the epilogue and
// stores. Deterministic, no workspace, no atomics; a second cluster barrier keeps
// every CTA's shared memory alive until all remote reads are done.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "core/kernel_launch.h"
#include "gemm/common/cluster_launch.h"
#include "gemm/mma/grouped_gemm_kernel.cuh"
#include "gemm/mma/split_k.h"
#include "moekit/error.h"

namespace moekit::detail::gemm {

template <class Cfg, class In, class Out, class Mma>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    grouped_gemm_splitk_kernel(const __grid_constant__ GemmParams p, int split) {
  extern __shared__ __align__(128) uint8_t smem[];
  namespace cg = cooperative_groups;
  constexpr int kAccs = Cfg::MF * Cfg::NF * 4;
  static_assert(kAccs * Cfg::THREADS * 4 <= Cfg::SMEM_BYTES, "partials fit the stages");
  cg::cluster_group cluster = cg::this_cluster();
  // Every CTA of a cluster has the same tile (clusters are `split` consecutive blocks),
  // so a cluster exits or runs as a whole.
  TileCoord t;
  if (!find_tile<Cfg::THREADS>(p.rows, Cfg::BM, p.n_tiles, blockIdx.x / split, t)) return;
  const int rank = static_cast<int>(cluster.block_rank());
  const int kt_total = k_slices<Cfg, In>(p);
  const int kt_begin = static_cast<int>(static_cast<int64_t>(kt_total) * rank / split);
  const int kt_end = static_cast<int>(static_cast<int64_t>(kt_total) * (rank + 1) / split);

  float acc[Cfg::MF][Cfg::NF][4];
  tile_mainloop<Cfg, In, Mma>(p, t, smem, acc, kt_begin, kt_end);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Cfg::WARPS_N, wn = warp % Cfg::WARPS_N;
  // Partials: accumulator j of thread tid at part[j * THREADS + tid] (conflict-free).
  float* part = reinterpret_cast<float*>(smem);
  __syncthreads();  // every warp is done with the pipeline stages
#pragma unroll
  for (int mf = 0; mf < Cfg::MF; ++mf)
#pragma unroll
    for (int nf = 0; nf < Cfg::NF; ++nf)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        part[((mf * Cfg::NF + nf) * 4 + i) * Cfg::THREADS + tid] = acc[mf][nf][i];
  cluster.sync();

  // Output units of this thread: (mf, h, nf < out_frags), numbered densely; rank r
  // reduces and stores units u with u % split == r (the same layout as store_tile).
  const bool silu = p.silu != 0;
  const int gid = lane >> 2, tig = lane & 3;
  const int out_frags = silu ? Cfg::NF / 2 : Cfg::NF;
  const int64_t col_base = silu
                               ? static_cast<int64_t>(t.n_tile) * (Cfg::BN / 2) + wn * (Cfg::WN / 2)
                               : static_cast<int64_t>(t.n_tile) * Cfg::BN + wn * Cfg::WN;
  Out* c = static_cast<Out*>(p.c);
#pragma unroll
  for (int mf = 0; mf < Cfg::MF; ++mf) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * Cfg::WM + mf * 16 + gid + h * 8;
#pragma unroll
      for (int nf = 0; nf < Cfg::NF; ++nf) {
        if (nf >= out_frags) continue;
        const int u = (mf * 2 + h) * out_frags + nf;
        if (u % split != rank || r >= t.rows) continue;
        const int64_t col = col_base + nf * 8 + tig * 2;
        if (col >= p.n) continue;
        const int up = nf + Cfg::NF / 2 < Cfg::NF ? nf + Cfg::NF / 2 : nf;
        const int jx = ((mf * Cfg::NF + nf) * 4 + 2 * h) * Cfg::THREADS + tid;
        const int ju = ((mf * Cfg::NF + up) * 4 + 2 * h) * Cfg::THREADS + tid;
        float x = 0.f, y = 0.f, ux = 0.f, uy = 0.f;
        for (int s = 0; s < split; ++s) {
          const float* rp = cluster.map_shared_rank(part, s);
          x += rp[jx];
          y += rp[jx + Cfg::THREADS];
          if (silu) {
            ux += rp[ju];
            uy += rp[ju + Cfg::THREADS];
          }
        }
        if (silu) {
          x = detail::silu(x) * ux;
          y = detail::silu(y) * uy;
        }
        store_pair<Out>(c + (t.row0 + r) * p.n + col, x, y);
      }
    }
  }
  cluster.sync();  // no CTA exits while another still reads its partials
}

// Launches `split`-CTA clusters over an upper bound of tiles (no host sync), with the
// cluster-dimension attribute.
template <class Cfg, class In, class Out, class Mma>
void launch_grouped_gemm_splitk(GemmParams p, int split, cudaStream_t stream, const char* op) {
  const int64_t tiles = launch_tile_bound<Cfg>(p, op, split);
  if (tiles <= 0) return;
  constexpr void (*kernel)(GemmParams, int) = grouped_gemm_splitk_kernel<Cfg, In, Out, Mma>;
  raise_smem_limit<kernel>(Cfg::SMEM_BYTES);  // a refusal fails the launch (check_launch)
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t config =
      cluster_launch_config(tiles * split, Cfg::THREADS, Cfg::SMEM_BYTES, split, stream, attr);
  cudaLaunchKernelEx(&config, kernel, p, split);
}

}  // namespace moekit::detail::gemm
