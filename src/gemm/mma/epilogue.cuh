// Grouped-GEMM epilogue: f32 accumulators -> optional silu_and_mul -> one rounding
// to the output dtype -> direct global stores. Only valid rows and columns are
// written (padding rows and masked-out rows keep whatever they held).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.cuh"
#include "gemm/mma/tile_config.cuh"

namespace moekit::detail::gemm {

template <class Out>
__device__ __forceinline__ void store_pair(Out* p, float x, float y);
template <>
__device__ __forceinline__ void store_pair<float>(float* p, float x, float y) {
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
template <>
__device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
template <>
__device__ __forceinline__ void store_pair<__half>(__half* p, float x, float y) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}

// Accumulator fragment (mf, nf) of a thread holds tile rows wm*WM + mf*16 + lane/4
// (+8 for elements 2, 3) and columns (lane%4)*2, +1 of its 8-column block.
//
// kNone: b tile row r is output column n_tile*BN + r.
// silu:  the loader put, in each warp's WN b rows, WN/2 gate rows then the WN/2 up
//        rows of the same output columns, so fragment nf (gate) and nf + NF/2 (up)
//        of one thread hold the same output elements.
template <class Cfg, class Out>
__device__ __forceinline__ void store_tile(const float (&acc)[Cfg::MF][Cfg::NF][4], Out* c,
                                           int64_t n, int64_t row0, int rows, int n_tile, bool silu,
                                           int wm, int wn, int lane) {
  const int gid = lane >> 2, tig = lane & 3;
  const int out_frags = silu ? Cfg::NF / 2 : Cfg::NF;
  const int64_t col_base = silu ? static_cast<int64_t>(n_tile) * (Cfg::BN / 2) + wn * (Cfg::WN / 2)
                                : static_cast<int64_t>(n_tile) * Cfg::BN + wn * Cfg::WN;
#pragma unroll
  for (int mf = 0; mf < Cfg::MF; ++mf) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * Cfg::WM + mf * 16 + gid + h * 8;
      if (r >= rows) continue;
      Out* c_row = c + (row0 + r) * n;
#pragma unroll
      for (int nf = 0; nf < Cfg::NF; ++nf) {
        if (nf >= out_frags) continue;
        const int64_t col = col_base + nf * 8 + tig * 2;
        if (col >= n) continue;  // n % 8 == 0: a fragment is wholly in or out
        float x = acc[mf][nf][2 * h], y = acc[mf][nf][2 * h + 1];
        if (silu) {
          // nf + NF/2 is only read when nf < NF/2; the min keeps the index static.
          const int up = nf + Cfg::NF / 2 < Cfg::NF ? nf + Cfg::NF / 2 : nf;
          x = detail::silu(x) * acc[mf][up][2 * h];
          y = detail::silu(y) * acc[mf][up][2 * h + 1];
        }
        store_pair<Out>(c_row + col, x, y);
      }
    }
  }
}

}  // namespace moekit::detail::gemm
