// FP8-weight decoding (docs/moe.md "FP8-weight decoding"): the direct path's two stages with
// e4m3 weights, bf16 / f16 activations, the weights dequantized in registers and the sums in
// f32. The same work split and route decoding as the bf16 kernel (moe_kernels.cu,
// direct_routes.cuh), reading half the weight bytes:
//
// Work item = (active expert slot, tile of output columns), walked round-robin by a
// persistent grid. A warp step covers 64 k: lane (g, q) loads 16 B (16 consecutive e4m3 k)
// of weight rows g and g+8 of each m-tile and 32 B (the same 16 k) of route g's input, and
// feeds them to four mma.m16n8k16 as k slot pairs (2j, 2j+1) of the 16: any k permutation
// shared by A and B leaves the dot product unchanged. U steps are loaded before any is used
// (16*U B of weights per row per lane in flight).
//
// e4m3 -> bf16, exact: a byte s.eeee.mmm placed as the bf16 bits s.0000eeee.mmm0000 is the
// e4m3 value times 2^-120 (normal and subnormal alike: bf16's exponent bias is 120 more),
// then one bf16x2 multiply by 2^120 restores it. e4m3 -> f16: the hardware's exact
// cvt.rn.f16x2.e4m3x2. Scales: per tensor (one per expert matrix) and per channel (one per
// weight row) multiply the f32 sum once; 128 x 128 blocks multiply each step's partial sum
// (a step's 64 k and a tile's rows lie in one block: H and F are multiples of 128).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "core/check.h"
#include "core/device.h"
#include "core/dtype.cuh"
#include "moe/direct_routes.cuh"
#include "moe/moe_internal.h"
#include "moe/weight_quant.h"

namespace moekit::detail {
namespace {

using direct::kThreads;
using direct::kWarps;
using direct::persistent_grid;

// Route r's expert: topk_ids[r], or expert 0 in the dense form (topk_ids == nullptr: the
// shared expert, route r = token r).
struct IdsOrDense {
  const int32_t* __restrict__ ids;
  __device__ __forceinline__ int operator()(int r) const { return ids != nullptr ? ids[r] : 0; }
};

// 16 e4m3 weights (one 16-byte load) as 8 pairs of the mma's element type, pair j = k 2j, 2j+1.
template <class T>
__device__ __forceinline__ void e4m3x16_to_pairs(const uint4& v, uint32_t (&out)[8]);

template <>
__device__ __forceinline__ void e4m3x16_to_pairs<__nv_bfloat16>(const uint4& v,
                                                                uint32_t (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  const __nv_bfloat162 two120 = __floats2bfloat162_rn(0x1p120f, 0x1p120f);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // bytes 2h, 2h+1 into the high byte of each 16-bit half
      const uint32_t t = __byte_perm(words[i], 0u, h == 0 ? 0x1404u : 0x3424u);
      const uint32_t bits = (t & 0x80008000u) | ((t & 0x7F007F00u) >> 4);
      __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&bits);
      b = __hmul2(b, two120);
      out[2 * i + h] = *reinterpret_cast<const uint32_t*>(&b);
    }
  }
}

template <>
__device__ __forceinline__ void e4m3x16_to_pairs<__half>(const uint4& v, uint32_t (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint16_t lo = static_cast<uint16_t>(words[i] & 0xFFFFu);
    const uint16_t hi = static_cast<uint16_t>(words[i] >> 16);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out[2 * i]) : "h"(lo));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out[2 * i + 1]) : "h"(hi));
  }
}

// kGateUp (stage 1): w [E, 2F, kdim=H] e4m3; a tile is 16 output columns n: gate rows
//   [n0, n0+16) (m-tile 0) and up rows F + [n0, n0+16) (m-tile 1); route r's input row is
//   in[r / topk]; out = act [R, F] (T), round(silu(gate) * up).
// else (stage 2): w [E, H, kdim=F]; a tile is 16*MT rows (MT m-tiles); route r's input row is
//   in[r]; out = [R, H] in TOut (f32 for the routed combine, T for a dense MLP's output).
// scale: the scheme's scales of this weight set (moekit/quant.h), scheme = per tensor or
// per channel (kBlock: 128 x 128 blocks).
template <class T, bool kGateUp, bool kBlock, class TOut, int MT, int U>
__global__ void __launch_bounds__(kThreads, 2)
    direct_fp8_kernel(const T* __restrict__ in, const uint8_t* __restrict__ w,
                      const float* __restrict__ scale, bool per_channel,
                      const int32_t* __restrict__ topk_ids, TOut* __restrict__ out, int R, int topk,
                      int E, int64_t n_out, int64_t kdim, int64_t tiles) {
  static_assert(!kGateUp || MT == 2, "a gate/up tile is one gate and one up m-tile");
  __shared__ direct::DecodeSmem sm;
  __shared__ __align__(16) float red[kWarps][MT][32][4];

  direct::decode_experts(IdsOrDense{topk_ids}, R, E, sm);
  const int64_t num_items = static_cast<int64_t>(sm.num_active) * tiles;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int kc = static_cast<int>(kdim / 16);  // 16-byte chunks per weight row
  const int nsteps = (kc + 3) / 4;             // a warp step covers 4 chunks (64 k)
  const int64_t rows_per_expert = kGateUp ? 2 * n_out : n_out;
  const int64_t kblocks = (kdim + 127) / 128;
  const int64_t row_blocks = (rows_per_expert + 127) / 128;
  constexpr int kTileCols = kGateUp ? 16 : 16 * MT;

  int cached_expert = -1, m = 0;
  for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
    const int slot = static_cast<int>(item / tiles);
    const int64_t tile = item - static_cast<int64_t>(slot) * tiles;
    const int e = direct::expert_of_slot(slot, E, sm);
    if (e != cached_expert) {  // block-uniform
      m = direct::collect_routes(e, R, sm);
      cached_expert = e;
    }
    const int64_t n0 = tile * kTileCols;

    // This lane's weight rows (direct::tile_rows), rows past n_out masked.
    const int64_t col0 = n0 + g;
    const uint8_t* wbase = w + (static_cast<int64_t>(e) * rows_per_expert + col0) * kdim;
    int32_t woff[MT][2];
    unsigned wmask;
    direct::tile_rows<kGateUp, MT>(col0, n_out, kdim, woff, wmask);
    // kBlock: the scale row of the tile's 128-row block (gate/up: the gate's and the up's;
    // a tile never straddles a block: H and F are multiples of 128).
    constexpr int kScaleRows = kGateUp ? 2 : 1;
    const float* block_scale[kScaleRows];
#pragma unroll
    for (int i = 0; i < kScaleRows; ++i) {
      const int64_t first_row = i == 1 ? n_out + n0 : n0;
      block_scale[i] = scale + (static_cast<int64_t>(e) * row_blocks + first_row / 128) * kblocks;
    }

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
        uint4 xv[U][2];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int ch = (s0 + u * kWarps) * 4 + q;
          const bool in_k = ch < kc;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              wv[u][mt][half] = (in_k && (wmask >> (mt * 2 + half) & 1u))
                                    ? direct::ld_stream(wbase + woff[mt][half] + ch * 16)
                                    : make_uint4(0u, 0u, 0u, 0u);
            }
          }
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            xv[u][j] = (in_k && xrow != nullptr)
                           ? __ldg(reinterpret_cast<const uint4*>(xrow + ch * 16 + j * 8))
                           : make_uint4(0u, 0u, 0u, 0u);
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const uint32_t xw[8] = {xv[u][0].x, xv[u][0].y, xv[u][0].z, xv[u][0].w,
                                  xv[u][1].x, xv[u][1].y, xv[u][1].z, xv[u][1].w};
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            uint32_t a0[8], a1[8];
            e4m3x16_to_pairs<T>(wv[u][mt][0], a0);
            e4m3x16_to_pairs<T>(wv[u][mt][1], a1);
            float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int p = 0; p < 4; ++p)
              direct::mma_16816<T>(kBlock ? part : acc[mt], a0[2 * p], a1[2 * p], a0[2 * p + 1],
                                   a1[2 * p + 1], xw[2 * p], xw[2 * p + 1]);
            if constexpr (kBlock) {
              // Step s covers k [64 s, 64 s + 64): block s / 2 (steps past k are all zeros).
              const int s = s0 + u * kWarps;
              const float sc = s < nsteps ? __ldg(block_scale[kGateUp ? mt : 0] + s / 2) : 0.f;
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[mt][i] = fmaf(part[i], sc, acc[mt][i]);
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
      // The scale of weight row `row` of expert e (per tensor / per channel; 1 for blocks).
      const auto row_scale = [&](int64_t row) {
        if constexpr (kBlock) {
          return 1.f;
        } else {
          return __ldg(scale + (per_channel ? static_cast<int64_t>(e) * rows_per_expert + row
                                            : static_cast<int64_t>(e)));
        }
      };
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
            gs *= row_scale(col);
            us *= row_scale(n_out + col);
            const int r = sm.routes[c0 + n];
            out[static_cast<int64_t>(r) * n_out + col] = from_float<TOut>(silu(gs) * us);
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
            out[static_cast<int64_t>(r) * n_out + col] = from_float<TOut>(s * row_scale(col));
          }
        }
      }
      __syncthreads();  // red and sm.routes are reused by the next chunk / item
    }
  }
}

// Tiles and steps in flight (warp steps of 64 k loaded before any is used): gate/up 16
// columns (16 gate + 16 up rows), 3 steps; down 64 rows, 2 steps: 12 and 16 weight loads of
// 16 B per lane in flight, within 128 registers without spills (ptxas -v); f16 with block
// scales takes one down step (two spill).
constexpr int kGateUpMT = 2, kGateUpSteps = 3;
constexpr int kDownMT = 4;
template <class T, bool kBlock>
constexpr int kDownSteps = std::is_same_v<T, __half>&& kBlock ? 1 : 2;

struct Fp8Stage {
  const void* in;
  const void* w;
  const float* scale;
  const int32_t* topk_ids;
  void* out;
  DType out_dtype;
};

template <bool kGateUp>
void launch_fp8(const MoEShapes& s, QuantScheme scheme, const Fp8Stage& st, cudaStream_t stream,
                const char* op) {
  const int64_t R = st.topk_ids != nullptr ? s.T * s.K : s.T;
  if (R == 0) return;
  const int64_t n_out = kGateUp ? s.F : s.H;
  const int64_t kdim = kGateUp ? s.H : s.F;
  const int64_t tile_cols = kGateUp ? 16 : 16 * kDownMT;
  const int64_t tiles = (n_out + tile_cols - 1) / tile_cols;
  const int64_t slots = std::min<int64_t>(st.topk_ids != nullptr ? s.E : 1, R);
  const bool block = scheme == QuantScheme::kFp8Block128;
  const bool per_channel = scheme == QuantScheme::kFp8PerChannel;
  const int topk = st.topk_ids != nullptr ? static_cast<int>(s.K) : 1;
  const int E = st.topk_ids != nullptr ? static_cast<int>(s.E) : 1;
  MOEKIT_DISPATCH_HALF(s.dtype, op, [&] {
    const auto go = [&](auto kernel, auto* out) {
      const int64_t grid = persistent_grid(kernel, slots * tiles);
      kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
          static_cast<const scalar_t*>(st.in), static_cast<const uint8_t*>(st.w), st.scale,
          per_channel, st.topk_ids, out, static_cast<int>(R), topk, E, n_out, kdim, tiles);
    };
    if constexpr (kGateUp) {
      scalar_t* out = static_cast<scalar_t*>(st.out);
      if (block)
        go(direct_fp8_kernel<scalar_t, true, true, scalar_t, kGateUpMT, kGateUpSteps>, out);
      else
        go(direct_fp8_kernel<scalar_t, true, false, scalar_t, kGateUpMT, kGateUpSteps>, out);
    } else if (st.out_dtype == DType::kF32) {
      float* out = static_cast<float*>(st.out);
      if (block)
        go(direct_fp8_kernel<scalar_t, false, true, float, kDownMT, kDownSteps<scalar_t, true>>,
           out);
      else
        go(direct_fp8_kernel<scalar_t, false, false, float, kDownMT, kDownSteps<scalar_t, false>>,
           out);
    } else {
      scalar_t* out = static_cast<scalar_t*>(st.out);
      if (block)
        go(direct_fp8_kernel<scalar_t, false, true, scalar_t, kDownMT, kDownSteps<scalar_t, true>>,
           out);
      else
        go(direct_fp8_kernel<scalar_t, false, false, scalar_t, kDownMT,
                             kDownSteps<scalar_t, false>>,
           out);
    }
  });
  check_launch(op);
}

}  // namespace

void launch_direct_fp8_gate_up(const MoEShapes& s, const void* hidden, const void* w_gate_up,
                               const WeightScales& scales, const int32_t* topk_ids, void* act,
                               cudaStream_t stream, const char* op) {
  launch_fp8<true>(s, scales.scheme, {hidden, w_gate_up, scales.gate_up, topk_ids, act, s.dtype},
                   stream, op);
}

void launch_direct_fp8_down(const MoEShapes& s, const void* act, const void* w_down,
                            const WeightScales& scales, const int32_t* topk_ids, void* down,
                            DType down_dtype, cudaStream_t stream, const char* op) {
  launch_fp8<false>(s, scales.scheme, {act, w_down, scales.down, topk_ids, down, down_dtype},
                    stream, op);
}

}  // namespace moekit::detail
