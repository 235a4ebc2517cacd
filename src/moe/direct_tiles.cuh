// The direct ("indexed") small-batch kernel, one template for bf16 / f16 weights
// (moe_kernels.cu) and e4m3 weights (moe_kernels_fp8.cu): what differs between them is the
// weights' load step (Weights) and their scales (Scales), two policies. (One kernel template,
// not a device function under two kernels: a function inlined into a kernel is optimized on
// its own first, and the kernels' machine code would differ from this single-level form.)
//
// Work item = (active expert slot, tile of output columns, chunk of 8 of the expert's routes:
// count_chunks); blocks walk the items round-robin (persistent grid), so experts without
// routes cost nothing, and the chunks of a tile run side by side on neighbouring blocks.
// A block's warps (8, or Weights::kBlockThreads / 32) split the reduction dimension; a warp step
// covers four 16-byte chunks of a weight row (Weights::kPerLoad k each). Lane (g = lane/4, q =
// lane%4) loads chunk q of weight rows g and g+8 of each m-tile and route g's input at the same k,
// and feeds them to mma.m16n8k16 as k slot pairs (2j, 2j+1): any k permutation shared by A and B
// leaves the dot product unchanged, so each thread's loads stay 16 B contiguous. U steps are loaded
// before any is used. Partial sums are reduced across warps in a fixed order
// (deterministic).
//
// kGateUp (stage 1): w [E, 2F, kdim=H]; a tile is 16 output columns n: gate rows
//   [n0, n0+16) (m-tile 0) and up rows F + [n0, n0+16) (m-tile 1); route r's input row is
//   in[r / topk]; out = act [R, F] (T), round(silu(gate) * up).
// else (stage 2): w [E, H, kdim=F]; a tile is 16*MT rows (MT m-tiles); route r's input row is
//   in[r]; out = [R, H] in TOut.
//
// Weights: `Elem` (the stored type), `kPerLoad` (weights per 16-byte load: 8 or 16) and
//   `to_pairs(uint4, uint32_t (&)[kPerLoad / 2])`: one load as pairs of the mma's element
//   type T, pair j = k 2j, 2j+1.
// Scales: built from the kernel's scale arguments; `kPerStep` (each step's partial sum is
//   scaled: 128 x 128 blocks), `begin(kdim, rows_per_expert)` (once), `begin_tile(e, n0,
//   n_out)`, `step(mt, s, nsteps)` (step s's scale of m-tile mt, with kPerStep) and
//   `row(e, row)` (the f32 sum's scale of weight row `row` of expert e).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.cuh"
#include "core/pdl.cuh"
#include "mlp/pdl_roles.h"
#include "moe/direct_routes.cuh"

namespace moekit::detail {
namespace direct {
namespace {  // NOLINT: internal linkage in each kernel unit, as direct_routes.cuh

using gemm::pdl_roles::kPdlFirst;   // NOLINT
using gemm::pdl_roles::kPdlNone;    // NOLINT
using gemm::pdl_roles::kPdlSecond;  // NOLINT

// Scales of weights that have none (bf16 / f16).
struct NoScales {
  static constexpr bool kPerStep = false;
  __device__ __forceinline__ void begin(int64_t, int64_t) {}
  __device__ __forceinline__ void begin_tile(int, int64_t, int64_t) {}
  __device__ __forceinline__ float step(int, int, int) const { return 1.f; }
  __device__ __forceinline__ float row(int, int64_t) const { return 1.f; }
};

// The direct kernel. `Ids{topk_ids}(r)` is route r's expert (decode_experts); `Scales
// scales{scale_args...}`: the scales' kernel arguments, between w and topk_ids (none for
// NoScales). out holds TOut; Out is its declared pointee, TOut or void (the bf16 / f16 kernels
// take a void* and cast at the store, as they did before the share: the same machine code).
// kPdl: the kernel's PDL role (mlp/pdl_roles.h; below), kPdlNone for a plain launch.
template <class T, class Weights, class Scales, class Ids, bool kGateUp, int MT, int U, class TOut,
          class Out, int kPdl, class... ScaleArgs>
__global__ void __launch_bounds__(BlockThreads<Weights>::value,
                                  2 * kThreads / BlockThreads<Weights>::value)
    direct_gemv_kernel(const T* __restrict__ in, const typename Weights::Elem* __restrict__ w,
                       ScaleArgs... scale_args, const int32_t* __restrict__ topk_ids,
                       Out* __restrict__ out, int R, int topk, int E, int64_t n_out, int64_t kdim,
                       int64_t tiles) {
  static_assert(!kGateUp || MT == 2, "a gate/up tile is one gate and one up m-tile");
  __shared__ DecodeSmem sm;
  constexpr int NT = BlockThreads<Weights>::value, NW = NT / 32;  // the block's threads, warps
  static_assert(NT >= 128, "the gate/up sums are finished by 128 threads");
  __shared__ __align__(16) float red[NW][MT][32][4];
  Scales scales{scale_args...};
  constexpr int kPerLoad = Weights::kPerLoad;
  constexpr int kInLoads = kPerLoad / 8;  // 16-byte loads of route input per weight load
  constexpr int kMmas = kPerLoad / 4;     // k16 mmas per weight load of two rows

  // PDL (kPdl, core/pdl.cuh): a gate/up kernel (kPdlFirst) waits before it reads topk_ids,
  // which the routing kernel before it may write. A down kernel (kPdlSecond) runs after such a
  // gate/up kernel, which waited for topk_ids before it let down launch: down decodes its routes
  // and sends the head of its first item's weight rows to L2 while gate/up ends, and waits only
  // before it reads act (gate/up's output). Both trigger once their routes are decoded.
  if constexpr (kPdl == kPdlFirst) pdl_wait();
  decode_experts<Ids, NT>(Ids{topk_ids}, R, E, sm);
  count_chunks<NT>(R, E, sm);
  const int64_t num_items = static_cast<int64_t>(sm.num_chunks) * tiles;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int kc = static_cast<int>(kdim / kPerLoad);  // 16-byte chunks per weight row
  const int nsteps = (kc + 3) / 4;                   // a warp step covers 4 chunks
  const int64_t rows_per_expert = kGateUp ? 2 * n_out : n_out;
  constexpr int kTileCols = kGateUp ? 16 : 16 * MT;
  if constexpr (kPdl == kPdlSecond) {
    if (blockIdx.x < num_items) {  // block-uniform
      const ItemPlace at = locate_item(blockIdx.x, tiles, sm);
      const int64_t row = static_cast<int64_t>(at.tile) * kTileCols + threadIdx.x;
      const int e = expert_of_slot(at.slot, E, sm);
      // The k the block's warps load first (NW warps, U steps of 64 k each).
      const int64_t first_k = static_cast<int64_t>(NW) * U * 4 * kPerLoad;
      const int64_t head = kdim < first_k ? kdim : first_k;
      if (threadIdx.x < kTileCols && row < n_out)
        gemm::bulk_prefetch_l2(w + (static_cast<int64_t>(e) * rows_per_expert + row) * kdim,
                               static_cast<int>(head * sizeof(typename Weights::Elem)));
    }
    pdl_wait();
  }
  if constexpr (kPdl != kPdlNone) pdl_trigger();
  scales.begin(kdim, rows_per_expert);

  int cached_expert = -1, m = 0;
  for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
    const ItemPlace at = locate_item(item, tiles, sm);
    const int e = expert_of_slot(at.slot, E, sm);
    if (e != cached_expert) {  // block-uniform
      m = collect_routes<NT>(e, R, sm);
      cached_expert = e;
    }
    const int64_t n0 = static_cast<int64_t>(at.tile) * kTileCols;

    // This lane's weight rows (tile_rows), rows past n_out masked.
    const int64_t col0 = n0 + g;
    const typename Weights::Elem* wbase =
        w + (static_cast<int64_t>(e) * rows_per_expert + col0) * kdim;
    int32_t woff[MT][2];
    unsigned wmask;
    tile_rows<kGateUp, MT>(col0, n_out, kdim, woff, wmask);
    scales.begin_tile(e, n0, n_out);

    {
      const int c0 = 8 * at.chunk;  // this item's routes: [c0, c0 + nr) of the expert's m
      const int nr = min(8, m - c0);
      const T* xrow = nullptr;
      if (g < nr) {
        const int r = sm.routes[c0 + g];
        xrow = in + static_cast<int64_t>(kGateUp ? r / topk : r) * kdim;
      }
      float acc[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;

      for (int s0 = warp; s0 < nsteps; s0 += NW * U) {
        uint4 wv[U][MT][2];
        uint4 xv[U][kInLoads];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int ch = (s0 + u * NW) * 4 + q;
          const bool in_k = ch < kc;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              wv[u][mt][half] = (in_k && (wmask >> (mt * 2 + half) & 1u))
                                    ? ld_stream(wbase + woff[mt][half] + ch * kPerLoad)
                                    : make_uint4(0u, 0u, 0u, 0u);
            }
          }
#pragma unroll
          for (int j = 0; j < kInLoads; ++j) {
            xv[u][j] = (in_k && xrow != nullptr)
                           ? __ldg(reinterpret_cast<const uint4*>(xrow + ch * kPerLoad + j * 8))
                           : make_uint4(0u, 0u, 0u, 0u);
          }
        }
        // Block scales of the U steps, loaded with the weights (their latency off the mma chain).
        constexpr int kScaleRows = Scales::kPerStep ? (kGateUp ? 2 : 1) : 1;
        float sc[U][kScaleRows];
        if constexpr (Scales::kPerStep) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int i = 0; i < kScaleRows; ++i) sc[u][i] = scales.step(i, s0 + u * NW, nsteps);
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          uint32_t xw[kPerLoad / 2];
#pragma unroll
          for (int j = 0; j < kInLoads; ++j) {
            xw[4 * j] = xv[u][j].x, xw[4 * j + 1] = xv[u][j].y;
            xw[4 * j + 2] = xv[u][j].z, xw[4 * j + 3] = xv[u][j].w;
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            uint32_t a0[kPerLoad / 2], a1[kPerLoad / 2];
            Weights::to_pairs(wv[u][mt][0], a0);
            Weights::to_pairs(wv[u][mt][1], a1);
            float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int p = 0; p < kMmas; ++p)
              mma_16816<T>(Scales::kPerStep ? part : acc[mt], a0[2 * p], a1[2 * p], a0[2 * p + 1],
                           a1[2 * p + 1], xw[2 * p], xw[2 * p + 1]);
            if constexpr (Scales::kPerStep) {
              const float scale = sc[u][kGateUp ? mt : 0];
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[mt][i] = fmaf(part[i], scale, acc[mt][i]);
            }
          }
        }
      }

#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        *reinterpret_cast<float4*>(&red[warp][mt][lane][0]) =
            make_float4(acc[mt][0], acc[mt][1], acc[mt][2], acc[mt][3]);
      }
      __syncthreads();
      // Accumulator element i of lane ln: row (ln/4) + 8*(i/2) of the m-tile, route
      // column n = 2*(ln%4) + i%2 of the chunk.
      if constexpr (kGateUp) {
        if (threadIdx.x < 128) {
          const int ln = threadIdx.x >> 2, i = threadIdx.x & 3;
          float gs = 0.f, us = 0.f;
#pragma unroll
          for (int ww = 0; ww < NW; ++ww) {
            gs += red[ww][0][ln][i];
            us += red[ww][1][ln][i];
          }
          const int rr = (ln >> 2) + (i >> 1) * 8;
          const int n = (ln & 3) * 2 + (i & 1);
          const int64_t col = n0 + rr;
          if (n < nr && col < n_out) {
            gs *= scales.row(e, col);
            us *= scales.row(e, n_out + col);
            const int r = sm.routes[c0 + n];
            static_cast<TOut*>(out)[static_cast<int64_t>(r) * n_out + col] =
                from_float<TOut>(silu(gs) * us);
          }
        }
      } else {
        for (int idx = threadIdx.x; idx < MT * 128; idx += NT) {
          const int mt = idx >> 7, ln = (idx >> 2) & 31, i = idx & 3;
          float s = 0.f;
#pragma unroll
          for (int ww = 0; ww < NW; ++ww) s += red[ww][mt][ln][i];
          const int rr = mt * 16 + (ln >> 2) + (i >> 1) * 8;
          const int n = (ln & 3) * 2 + (i & 1);
          const int64_t col = n0 + rr;
          if (n < nr && col < n_out) {
            const int r = sm.routes[c0 + n];
            static_cast<TOut*>(out)[static_cast<int64_t>(r) * n_out + col] =
                from_float<TOut>(s * scales.row(e, col));
          }
        }
      }
      __syncthreads();  // red and sm.routes are reused by the next chunk / item
    }
  }
}

}  // namespace
}  // namespace direct
}  // namespace moekit::detail
