// The FP8 direct kernels (docs/moe.md "FP8 direct kernels"): the direct path's two stages with
// e4m3 weights, bf16 / f16 activations, the weights dequantized in registers and the sums in
// f32. The tile walk of the bf16 kernel (direct_tiles.cuh) with e4m3 weights and their
// scales as its two policies, reading half the weight bytes: a warp step covers 64 k, lane
// (g, q) loads 16 B (16 consecutive e4m3 k) of weight rows g and g+8 of each m-tile and 32 B
// (the same 16 k) of route g's input, and feeds them to four mma.m16n8k16. U steps are loaded
// before any is used (16*U B of weights per row per lane in flight).
//
// e4m3 -> bf16: core/e4m3_unpack.cuh (exact). e4m3 -> f16: the hardware's exact
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
#include "core/e4m3_unpack.cuh"
#include "core/pdl.cuh"
#include "moe/direct_routes.cuh"
#include "moe/direct_tiles.cuh"
#include "moe/moe_internal.h"
#include "moe/weight_quant.h"

namespace moekit::detail {
namespace {

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
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = e4m3x2_to_bf16x2<0>(words[i]);
    out[2 * i + 1] = e4m3x2_to_bf16x2<1>(words[i]);
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

// e4m3 weights for direct_tiles.cuh: a 16-byte load is 16 consecutive k.
template <class T>
struct E4m3Weights {
  using Elem = uint8_t;
  static constexpr int kPerLoad = 16;
  // Blocks of 4 warps, 4 an SM: a warp covers twice the k steps of an item that 8 warps
  // would, and an SM's other blocks stream while one reduces (docs/PERF.md, the direct
  // kernels' short per-warp reductions).
  static constexpr int kBlockThreads = 128;
  __device__ __forceinline__ static void to_pairs(const uint4& v, uint32_t (&out)[8]) {
    e4m3x16_to_pairs<T>(v, out);
  }
};

// The scales of an e4m3 weight set (moekit/quant.h): per tensor or per channel (kBlock false,
// `per_channel` tells) multiply the f32 sum once; 128 x 128 blocks (kBlock) multiply each
// step's partial sum (a step's 64 k and a tile's rows lie in one block: H and F are
// multiples of 128).
template <bool kGateUp, bool kBlock>
struct Fp8Scales {
  static constexpr bool kPerStep = kBlock;
  const float* scale;
  bool per_channel;
  int64_t rows_per_expert = 0, kblocks = 0, row_blocks = 0;  // begin()
  // kBlock: the scale row of the tile's 128-row block (gate/up: the gate's and the up's).
  static constexpr int kScaleRows = kGateUp ? 2 : 1;
  const float* block_scale[kScaleRows];

  __device__ __forceinline__ void begin(int64_t kdim, int64_t rows) {
    rows_per_expert = rows;
    kblocks = (kdim + 127) / 128;
    row_blocks = (rows + 127) / 128;
  }

  __device__ __forceinline__ void begin_tile(int e, int64_t n0, int64_t n_out) {
    const int64_t rb = row_blocks, kb = kblocks;  // locals: members here reorder an add
#pragma unroll
    for (int i = 0; i < kScaleRows; ++i) {
      const int64_t first_row = i == 1 ? n_out + n0 : n0;
      block_scale[i] = scale + (static_cast<int64_t>(e) * rb + first_row / 128) * kb;
    }
  }
  // Step s covers k [64 s, 64 s + 64): block s / 2 (steps past k are all zeros).
  __device__ __forceinline__ float step(int mt, int s, int nsteps) const {
    return s < nsteps ? __ldg(block_scale[kGateUp ? mt : 0] + s / 2) : 0.f;
  }
  __device__ __forceinline__ float row(int e, int64_t row) const {
    if constexpr (kBlock) {
      return 1.f;
    } else {
      return __ldg(scale + (per_channel ? static_cast<int64_t>(e) * rows_per_expert + row
                                        : static_cast<int64_t>(e)));
    }
  }
};

// direct_gemv_kernel (direct_tiles.cuh) with e4m3 weights: arguments (in, w, scale,
// per_channel, topk_ids, out, ...); out: act [R, F] (T) with kGateUp, else [R, H] in TOut (f32
// for the routed combine, T for a dense MLP's output).
template <class T, bool kGateUp, bool kBlock, class TOut, int MT, int U>
constexpr auto direct_fp8_kernel =
    direct::direct_gemv_kernel<T, E4m3Weights<T>, Fp8Scales<kGateUp, kBlock>, IdsOrDense, kGateUp,
                               MT, U, TOut, TOut, kGateUp ? direct::kPdlFirst : direct::kPdlSecond,
                               const float*, bool>;

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
      constexpr int threads = E4m3Weights<scalar_t>::kBlockThreads;
      const int64_t grid =
          persistent_grid(kernel, direct::max_direct_items(slots, R, tiles), threads);
      launch_pdl(kernel, dim3(static_cast<unsigned>(grid)), dim3(threads), 0, stream,
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
