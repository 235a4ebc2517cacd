// Kernels of the MoE compositions:
//  - the direct ("indexed") small-batch path: two persistent GEMV-like kernels that
//    read routes straight from topk_ids (no sort) and stream each active expert's
//    weights once with 16-byte loads, using mma.sync so up to 8 routes of an expert
//    share every weight load;
//  - the weighted combine back to token order (k order, f32, deterministic).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/device.h"
#include "core/dtype.cuh"
#include "moe/direct_routes.cuh"
#include "moe/moe_internal.h"

namespace moekit::detail {
namespace {

using namespace direct;  // NOLINT: the shared decode helpers (direct_routes.cuh)

// ---- the direct GEMV kernel ----
//
// Work item = (active expert slot, tile of output columns); blocks walk the items
// round-robin (persistent grid), so experts without routes cost nothing.
// A block's 8 warps split the reduction dimension; each warp multiplies 16*MT weight
// rows by up to 8 routes with mma.m16n8k16: lane (g = lane/4, q = lane%4) loads 16 B
// (8 consecutive k) of weight rows g and g+8 and of route g's input at the same k,
// and feeds them as the fragments' k slots {2q, 2q+1, 2q+8, 2q+9} (first mma) and the
// next four (second mma). Any k permutation shared by A and B leaves the dot product
// unchanged, so each thread's loads stay 16 B contiguous. Partial sums are reduced
// across warps in a fixed order (deterministic).
//
// kGateUp (stage 1): w [E, 2F, kdim=H]; a tile is 16 output columns n, i.e. gate rows
//   [n0, n0+16) (MT index 0) and up rows F + [n0, n0+16) (MT index 1); the input row of
//   route r is in[r / topk]; out = act [R, F] (T), silu(gate) * up.
// else (stage 2): w [E, H, kdim=F]; a tile is 16*MT rows; the input row of route r is
//   in[r]; out = down [R, H] f32.
template <class T, bool kGateUp, int MT, int U>
__global__ void __launch_bounds__(kThreads, 2)
    direct_gemv_kernel(const T* __restrict__ in, const T* __restrict__ w,
                       const int32_t* __restrict__ topk_ids, void* __restrict__ out, int R,
                       int topk, int E, int64_t n_out, int64_t kdim, int64_t tiles) {
  static_assert(!kGateUp || MT == 2, "a gate/up tile is one gate and one up m-tile");
  __shared__ DecodeSmem sm;
  __shared__ __align__(16) float red[kWarps][MT][32][4];

  decode_experts(RouteIds{topk_ids}, R, E, sm);
  const int64_t num_items = static_cast<int64_t>(sm.num_active) * tiles;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int kc = static_cast<int>(kdim / 8);  // 16-byte chunks per row
  const int nsteps = (kc + 3) / 4;            // a warp step covers 4 chunks (32 k)
  const int64_t rows_per_expert = kGateUp ? 2 * n_out : n_out;
  constexpr int kTileCols = kGateUp ? 16 : 16 * MT;

  int cached_expert = -1, m = 0;
  for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
    const int slot = static_cast<int>(item / tiles);
    const int64_t tile = item - static_cast<int64_t>(slot) * tiles;
    const int e = expert_of_slot(slot, E, sm);
    if (e != cached_expert) {  // block-uniform
      m = collect_routes(e, R, sm);
      cached_expert = e;
    }
    const int64_t n0 = tile * kTileCols;

    // This lane's weight rows (tile_rows), rows past n_out masked.
    const int64_t col0 = n0 + g;
    const T* wbase = w + (static_cast<int64_t>(e) * rows_per_expert + col0) * kdim;
    int32_t woff[MT][2];
    unsigned wmask;
    tile_rows<kGateUp, MT>(col0, n_out, kdim, woff, wmask);

    for (int c0 = 0; c0 < m; c0 += 8) {
      const int nr = min(8, m - c0);
      const T* xrow = nullptr;
      if (g < nr) {
        const int r = sm.routes[c0 + g];
        xrow = in + static_cast<int64_t>(kGateUp ? r / topk : r) * kdim;
      }
      float acc[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;

      for (int s0 = warp; s0 < nsteps; s0 += kWarps * U) {
        uint4 wv[U][MT][2];
        uint4 xv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int ch = (s0 + u * kWarps) * 4 + q;
          const bool in_k = ch < kc;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              wv[u][mt][half] = (in_k && (wmask >> (mt * 2 + half) & 1u))
                                    ? ld_stream(wbase + woff[mt][half] + ch * 8)
                                    : make_uint4(0u, 0u, 0u, 0u);
            }
          }
          xv[u] = (in_k && xrow != nullptr) ? __ldg(reinterpret_cast<const uint4*>(xrow + ch * 8))
                                            : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(acc[mt], wv[u][mt][0].x, wv[u][mt][1].x, wv[u][mt][0].y, wv[u][mt][1].y,
                         xv[u].x, xv[u].y);
            mma_16816<T>(acc[mt], wv[u][mt][0].z, wv[u][mt][1].z, wv[u][mt][0].w, wv[u][mt][1].w,
                         xv[u].z, xv[u].w);
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
          for (int ww = 0; ww < kWarps; ++ww) {
            gs += red[ww][0][ln][i];
            us += red[ww][1][ln][i];
          }
          const int rr = (ln >> 2) + (i >> 1) * 8;
          const int n = (ln & 3) * 2 + (i & 1);
          const int64_t col = n0 + rr;
          if (n < nr && col < n_out) {
            const int r = sm.routes[c0 + n];
            static_cast<T*>(out)[static_cast<int64_t>(r) * n_out + col] =
                from_float<T>(silu(gs) * us);
          }
        }
      } else {
        for (int idx = threadIdx.x; idx < MT * 128; idx += kThreads) {
          const int mt = idx >> 7, ln = (idx >> 2) & 31, i = idx & 3;
          float s = 0.f;
#pragma unroll
          for (int ww = 0; ww < kWarps; ++ww) s += red[ww][mt][ln][i];
          const int rr = mt * 16 + (ln >> 2) + (i >> 1) * 8;
          const int n = (ln & 3) * 2 + (i & 1);
          const int64_t col = n0 + rr;
          if (n < nr && col < n_out) {
            const int r = sm.routes[c0 + n];
            static_cast<float*>(out)[static_cast<int64_t>(r) * n_out + col] = s;
          }
        }
      }
      __syncthreads();  // red and sm.routes are reused by the next chunk / item
    }
  }
}

constexpr int kGateUpMT = 2, kGateUpU = 4;  // 32 weight rows per tile, 4 steps in flight
constexpr int kDownMT = 4, kDownU = 2;      // 64 weight rows per tile, 2 steps in flight

template <bool kGateUp>
void launch_direct(const MoEShapes& s, const void* in, const void* w, const int32_t* topk_ids,
                   void* out, cudaStream_t stream, const char* op) {
  const int64_t R = s.T * s.K;
  if (R == 0) return;
  const int64_t n_out = kGateUp ? s.F : s.H;
  const int64_t kdim = kGateUp ? s.H : s.F;
  const int64_t tile_cols = kGateUp ? 16 : 16 * kDownMT;
  const int64_t tiles = (n_out + tile_cols - 1) / tile_cols;
  const int64_t slots = std::min<int64_t>(s.E, R);
  MOEKIT_DISPATCH_HALF(s.dtype, op, [&] {
    auto kernel = kGateUp ? direct_gemv_kernel<scalar_t, true, kGateUpMT, kGateUpU>
                          : direct_gemv_kernel<scalar_t, false, kDownMT, kDownU>;
    const int64_t grid = persistent_grid(kernel, slots * tiles);
    kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(in), static_cast<const scalar_t*>(w), topk_ids, out,
        static_cast<int>(R), static_cast<int>(s.K), static_cast<int>(s.E), n_out, kdim, tiles);
  });
  check_launch(op);
}

// ---- combine ----

__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <class T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = to_float(e[j]);
}
template <class T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) e[j] = from_float<T>(v[j]);
  *reinterpret_cast<uint4*>(p) = raw;
}

constexpr int kCombineThreads = 128;

template <class TOut, class TRow>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const TRow* __restrict__ rows, int64_t num_rows,
                   const int32_t* __restrict__ inverse, const int32_t* __restrict__ topk_ids, int E,
                   const float* __restrict__ topk_weights, const float* __restrict__ addend,
                   TOut* __restrict__ out, int64_t T, int K, int64_t H) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x) * 8;
  if (c >= H) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int k = 0; k < K; ++k) {
      const int64_t r = t * K + k;
      int64_t row;
      if (inverse != nullptr) {
        row = inverse[r];
        if (row < 0 || row >= num_rows) continue;
      } else {
        const int id = topk_ids[r];
        if (id < 0 || id >= E) continue;
        row = r;
      }
      const float wt = topk_weights[r];
      float v[8];
      load8(rows + row * H + c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = fmaf(wt, v[j], acc[j]);
    }
    if (addend != nullptr) {
      float a[8];
      load8(addend + t * H + c, a);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += a[j];
    }
    store8(out + t * H + c, acc);
  }
}

}  // namespace

void launch_direct_gate_up(const MoEShapes& s, const void* hidden, const void* w_gate_up,
                           const int32_t* topk_ids, void* act, cudaStream_t stream) {
  launch_direct<true>(s, hidden, w_gate_up, topk_ids, act, stream, "indexed_expert_mlp");
}

void launch_direct_down(const MoEShapes& s, const void* act, const void* w_down,
                        const int32_t* topk_ids, float* down, cudaStream_t stream) {
  launch_direct<false>(s, act, w_down, topk_ids, down, stream, "indexed_expert_mlp");
}

void launch_combine(const CombineProblem& p, cudaStream_t stream) {
  if (p.T == 0 || p.H == 0) return;
  const dim3 grid(static_cast<unsigned>((p.H / 8 + kCombineThreads - 1) / kCombineThreads),
                  static_cast<unsigned>(std::min<int64_t>(p.T, 65535)));
  MOEKIT_DISPATCH_HALF(p.out_dtype, "moe_combine", [&] {
    if (p.rows_dtype == DType::kF32) {
      combine_kernel<scalar_t, float><<<grid, kCombineThreads, 0, stream>>>(
          static_cast<const float*>(p.rows), p.num_rows, p.inverse, p.topk_ids,
          static_cast<int>(p.E), p.topk_weights, p.addend, static_cast<scalar_t*>(p.out), p.T,
          static_cast<int>(p.K), p.H);
    } else if (p.rows_dtype == DType::kBF16 && p.out_dtype != DType::kBF16) {
      // The FP8 GEMMs' bf16 rows under an f16 output.
      combine_kernel<scalar_t, __nv_bfloat16><<<grid, kCombineThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(p.rows), p.num_rows, p.inverse, p.topk_ids,
          static_cast<int>(p.E), p.topk_weights, p.addend, static_cast<scalar_t*>(p.out), p.T,
          static_cast<int>(p.K), p.H);
    } else {
      combine_kernel<scalar_t, scalar_t><<<grid, kCombineThreads, 0, stream>>>(
          static_cast<const scalar_t*>(p.rows), p.num_rows, p.inverse, p.topk_ids,
          static_cast<int>(p.E), p.topk_weights, p.addend, static_cast<scalar_t*>(p.out), p.T,
          static_cast<int>(p.K), p.H);
    }
  });
  check_launch("moe_combine");
}

}  // namespace moekit::detail
