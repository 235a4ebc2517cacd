// Epilogue of the SM90 grouped-GEMM kernels (grouped_gemm.cuh, mlp_chain.cuh, the FP8
// kernel): one consumer warpgroup's 64 x BN wgmma accumulators -> (silu(gate) * up) -> one
// rounding (bf16, f16, f32, or e4m3 for the FP8 kernel's FP8 output) -> predicated global
// stores straight from registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cute/tensor.hpp>

#include "core/dtype.cuh"
#include "core/fp8_scale.h"
#include "gemm/mma/epilogue.cuh"
#include "gemm/sm90/schedule.cuh"

namespace moekit::detail::gemm::sm90 {

// 4 x 4 transpose of 32-bit words across the 4 lanes of a quad (lane & 3 = q): on
// return x[j] holds what lane j held in x[q] (two butterfly stages, 4 shuffles).
__device__ __forceinline__ void quad_transpose(uint32_t (&x)[4], int q) {
  const bool b0 = (q & 1) != 0, b1 = (q & 2) != 0;
  {  // 2 x 2 blocks: swap the off-diagonal elements with lane q ^ 1
    const uint32_t r0 = __shfl_xor_sync(0xffffffffu, b0 ? x[0] : x[1], 1);
    const uint32_t r1 = __shfl_xor_sync(0xffffffffu, b0 ? x[2] : x[3], 1);
    if (b0) {
      x[0] = r0;
      x[2] = r1;
    } else {
      x[1] = r0;
      x[3] = r1;
    }
  }
  {  // swap the off-diagonal 2 x 2 blocks with lane q ^ 2
    const uint32_t r0 = __shfl_xor_sync(0xffffffffu, b1 ? x[0] : x[2], 2);
    const uint32_t r1 = __shfl_xor_sync(0xffffffffu, b1 ? x[1] : x[3], 2);
    if (b1) {
      x[0] = r0;
      x[1] = r1;
    } else {
      x[2] = r0;
      x[3] = r1;
    }
  }
}

using detail::pack2;  // bf16 / f16 (core/dtype.cuh), beside the e4m3 one below

// e4m3 x 2 (saturated, rounded to nearest even) in the low 16 bits, x in the low byte.
__device__ __forceinline__ uint32_t pack2(float x, float y, __nv_fp8_e4m3*) {
  return __nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3);
}

// Stores 4 adjacent 8-column blocks of one row, held as wgmma D pairs: lane q of the
// quad holds columns 2q, 2q + 1 of each block (v[j] = block j); after the transpose lane
// q writes block q whole (16 bytes of 16-bit output, 32 of f32, 8 of e4m3) at `dst` + 8 q.
template <class Out>
__device__ __forceinline__ void store_4_blocks(Out* dst, const float (&vx)[4], const float (&vy)[4],
                                               int q, bool store) {
  if constexpr (sizeof(Out) == 1) {
    uint32_t x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = pack2(vx[j], vy[j], static_cast<Out*>(nullptr));
    quad_transpose(x, q);
    if (store)
      *reinterpret_cast<uint2*>(dst + 8 * q) = make_uint2(x[0] | x[1] << 16, x[2] | x[3] << 16);
  } else if constexpr (sizeof(Out) == 4) {
    uint32_t x[4], y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[j] = __float_as_uint(vx[j]);
      y[j] = __float_as_uint(vy[j]);
    }
    quad_transpose(x, q);
    quad_transpose(y, q);
    if (store) {
      float4* d = reinterpret_cast<float4*>(dst + 8 * q);
      d[0] = make_float4(__uint_as_float(x[0]), __uint_as_float(y[0]), __uint_as_float(x[1]),
                         __uint_as_float(y[1]));
      d[1] = make_float4(__uint_as_float(x[2]), __uint_as_float(y[2]), __uint_as_float(x[3]),
                         __uint_as_float(y[3]));
    }
  } else {
    uint32_t x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = pack2(vx[j], vy[j], static_cast<Out*>(nullptr));
    quad_transpose(x, q);
    if (store) *reinterpret_cast<uint4*>(dst + 8 * q) = make_uint4(x[0], x[1], x[2], x[3]);
  }
}

// The accumulators' values as stored: acc(i) itself (the bf16 / f16 kernels), or scaled
// (fp8_fast_gemm.cu's whole-k e4m3 sums).
struct AccumulatorValue {
  template <class Acc>
  __device__ __forceinline__ float operator()(const Acc& acc, int i) const {
    return acc(i);
  }
};

// What the stored values are shown to: nothing (the bf16 / f16 kernels), or an observer of
// every stored value (the FP8 kernels' max |c|, fp8_amax.cuh).
struct NoObserver {
  __device__ __forceinline__ void operator()(float, bool) {}
};

// Stores one consumer warpgroup's accumulators `acc` of tile t (tCcC: the tile
// coordinates (row, col) of each element; q = lane & 3), each as value(acc, i). BN:
// accumulator columns (silu: B_BOX gate | B_BOX up). Rows >= t.rows and columns >= n are not
// written; observe(v, stored) sees each output value v (before its rounding) and whether it is
// stored. 16-byte stores of whole 8-column blocks after a quad transpose (store_4_blocks):
// docs/gemm.md says why.
template <int BN, int B_BOX, class Out, class Acc, class Coords, class Value = AccumulatorValue,
          class Observer = NoObserver>
__device__ __forceinline__ void store_accumulators(const Acc& acc, const Coords& tCcC,
                                                   const Tile& t, Out* c, int64_t n, bool silu,
                                                   int q, const Value& value_of = Value{},
                                                   Observer&& observe = Observer{}) {
  using namespace cute;
  constexpr int ACC = decltype(size(acc))::value;
  // Epilogue: f32 -> (silu(gate) * up) -> one rounding -> predicated stores.
  // Elements i, i+1 (i even) are adjacent columns; with silu, element i + ACC/2 is
  // column + 128 of the same row (wgmma D layout: index = e + 2*h + 4*(col/8)); the
  // checks below fold to constants and trap if CuTe's layout ever differs.
  // Groups of 4 8-column blocks (16 accumulator elements) per row half h: element
  // 16 J + 4 j + 2 h + e is column 32 J + 8 j + 2 q + e of row r(h). The quad's 4
  // lanes transpose their pairs so each stores one whole block (16 bytes).
  constexpr int OUT_COLS = BN;  // accumulator columns (silu: gate | up halves)
  constexpr int GROUPS = OUT_COLS / 32;
  auto epi = [&](auto value, auto groups) {
    CUTE_UNROLL
    for (int J = 0; J < decltype(groups)::value; ++J) {
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int i0 = 16 * J + 2 * h;
        const int r = get<0>(tCcC(i0)), col0 = get<1>(tCcC(i0));
        float vx[4], vy[4];
        CUTE_UNROLL
        for (int j = 0; j < 4; ++j) {
          const int i = i0 + 4 * j;
          if (get<0>(tCcC(i)) != r || get<1>(tCcC(i)) != col0 + 8 * j || get<0>(tCcC(i + 1)) != r ||
              get<1>(tCcC(i + 1)) != col0 + 8 * j + 1) {
            __trap();
          }
          vx[j] = value(i);
          vy[j] = value(i + 1);
          // This lane's values of block j: output columns n0 + col0 + 8 j (+ 1), whole
          // blocks (n % 8 == 0).
          const bool stored = r < t.rows && t.n0 + col0 + 8 * j < n;
          observe(vx[j], stored);
          observe(vy[j], stored);
        }
        // This lane's block after the transpose starts at column 32 J + 8 q.
        const int64_t out_col = t.n0 + 32 * J + 8 * q;
        const bool ok = r < t.rows && out_col < n;  // n % 8 == 0: blocks whole
        store_4_blocks<Out>(c + (t.c_row + r) * n + t.n0 + 32 * J, vx, vy, q, ok);
      }
    }
  };
  if constexpr (B_BOX % 32 != 0) {
    // Tiles whose half is not whole 4-block groups (224 b rows) take no silu (the host
    // routes silu GEMMs to 256 / 192).
    if (silu) __trap();
    epi([&](int i) { return value_of(acc, i); }, Int<GROUPS>{});
  } else if (silu) {
    static_assert(ACC / 2 == 16 * (B_BOX / 32), "silu halves");
    epi(
        [&](int i) {
          if (get<1>(tCcC(i + ACC / 2)) != get<1>(tCcC(i)) + B_BOX ||
              get<0>(tCcC(i + ACC / 2)) != get<0>(tCcC(i))) {
            __trap();
          }
          return detail::silu(value_of(acc, i)) * value_of(acc, i + ACC / 2);
        },
        Int<B_BOX / 32>{});
  } else {
    epi([&](int i) { return value_of(acc, i); }, Int<GROUPS>{});
  }
}

// store_accumulators' silu_and_mul form for an e4m3 c quantized per row in groups of 128
// output columns (GroupedGemmFP8Problem::c_group_scales): B_BOX = 128, so a tile's output
// columns are one whole group and its scale needs no other tile. Each row's scale is
// fp8_dynamic_scale of max |silu(gate) * up| over the group (the quad's four lanes hold the
// row's 128 values, 32 each), the values stored as e4m3(v * (1 / scale)) and the scale at
// scales[row * n / 128 + n0 / 128]: quantize_fp8.h's formula on the f32 values (the unfused
// path rounds them to bf16 first). Rows >= t.rows are not written; n % 128 == 0. The values
// overwrite acc's gate half (its last use): a second array of them would spill.
template <int BN, int B_BOX, class Acc, class Coords>
__device__ __forceinline__ void store_silu_group_quantized(Acc& acc, const Coords& tCcC,
                                                           const Tile& t, __nv_fp8_e4m3* c,
                                                           int64_t n, int q, float* scales) {
  using namespace cute;
  constexpr int ACC = decltype(size(acc))::value;
  constexpr int GROUPS = B_BOX / 32;  // 4-block groups of a row's output columns
  static_assert(B_BOX == 128 && BN == 2 * B_BOX && ACC / 2 == 16 * GROUPS, "one 128-group a tile");
  CUTE_UNROLL
  for (int h = 0; h < 2; ++h) {
    const int r = get<0>(tCcC(2 * h)), col0 = get<1>(tCcC(2 * h));
    // Element i = 16 J + 4 j + 2 h + e: column col0 + 32 J + 8 j + e of row r (col0 = 2 q;
    // checked relative to element 2 h, as in store_accumulators, so the checks fold), its up
    // value B_BOX columns on at element i + ACC / 2.
    float m = 0.f;
    CUTE_UNROLL
    for (int J = 0; J < GROUPS; ++J) {
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {
        CUTE_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int i = 16 * J + 4 * j + 2 * h + e;
          if (get<0>(tCcC(i)) != r || get<1>(tCcC(i)) != col0 + 32 * J + 8 * j + e ||
              get<0>(tCcC(i + ACC / 2)) != r ||
              get<1>(tCcC(i + ACC / 2)) != get<1>(tCcC(i)) + B_BOX) {
            __trap();
          }
          acc(i) = detail::silu(acc(i)) * acc(i + ACC / 2);
          m = fmaxf(m, fabsf(acc(i)));
        }
      }
    }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float scale = fp8_dynamic_scale(m);
    // v * (1 / scale), not v / scale: with a division a value the layers ran 1.6%-3.1% slower
    // than a bf16 act plus a quantize pass (H100); e4m3's rounding of the two differs only
    // within an f32 ulp of its midpoints.
    const float inv = __frcp_rn(scale);
    const bool ok = r < t.rows;
    __nv_fp8_e4m3* row = c + (t.c_row + r) * n + t.n0;
    CUTE_UNROLL
    for (int J = 0; J < GROUPS; ++J) {
      float vx[4], vy[4];
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {
        vx[j] = acc(16 * J + 4 * j + 2 * h) * inv;
        vy[j] = acc(16 * J + 4 * j + 2 * h + 1) * inv;
      }
      store_4_blocks<__nv_fp8_e4m3>(row + 32 * J, vx, vy, q, ok);
    }
    if (ok && q == 0) scales[(t.c_row + r) * (n / 128) + t.n0 / 128] = scale;
  }
}

}  // namespace moekit::detail::gemm::sm90
