// Weight-only FP8 tiles of the persistent decode GEMM (docs/gemm.md "Weight-only FP8 decode
// tiles"): bf16 a rows, e4m3 b (weights) with per-channel or per-tensor scales, f32 sums,
// bf16 c. The decode_persistent tile (32 rows x 128 b rows, 4 warps side by side) with b read
// as one byte an element, so a tile's weight bytes are half the bf16 tile's; the weights are
// unpacked to bf16 in registers and the scales multiply the sums once in the epilogue.
//
// A stage holds 128 k: a 32 x 256 bytes, b 128 x 128 bytes, three stages (72 KB; with the
// group table two CTAs an SM). One mma.m16n8k16 k step takes 16 k. ldmatrix gives lane
// (g, c) the four b bytes k = 4c .. 4c+3 of b row g of each 8-row matrix, where the mma wants
// k = 2c, 2c+1 (b0) and 2c+8, 2c+9 (b1). The sum over k does not depend on the order of k,
// so each k step runs with its k permuted the same way for both operands: mma slots 2c, 2c+1,
// 2c+8, 2c+9 take k 4c .. 4c+3. Then b0 and b1 are the first and second byte pair of the
// lane's word, and a lane reads k 4c .. 4c+3 of its a rows g and g+8 as one 8-byte load each.
// a's swizzle (chunk ^ 2 * (row % 4)) puts those 8-byte loads of a half warp (rows g = 0..3,
// two 16-byte chunks each) on 32 distinct banks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "core/e4m3_unpack.cuh"
#include "gemm/common/ptx.cuh"
#include "gemm/mma/epilogue.cuh"
#include "gemm/mma/grouped_gemm_kernel.cuh"
#include "gemm/mma/mainloop.cuh"
#include "gemm/mma/tile_config.cuh"
#include "gemm/mma/tile_scheduler.cuh"

namespace moekit::detail::gemm {

// 256 bytes of a's k (128 k) a stage, 4 warps side by side, 2 CTAs an SM. TileConfig's b stage
// (BN * BK_BYTES) is the 16-bit one: Fp8WeightTiles sizes its own.
// 32 x 128 tiles, 3 stages (72 KB).
using Fp8WeightConfig = TileConfig<32, 128, 256, 3, 1, 4, 2>;
// 32 x 256 tiles, 2 stages (80 KB): a tile's fixed work (group search, loader setup,
// epilogue) over twice the weight bytes, as the bf16 tile's 32 KB of b a stage.
using Fp8WeightWideConfig = TileConfig<32, 256, 256, 2, 1, 4, 2>;

// Copies one stage: a's 16-byte chunks (16 a stage row, 8 elements) and b's (8 a row, 16
// elements). Rows past the group or columns past n (null) and chunks past k are zero-filled.
template <class Cfg_>
struct Fp8WeightLoader {
  using Cfg = Cfg_;
  static constexpr int A_CHUNKS = Cfg::BK_BYTES / 16;      // 16
  static constexpr int B_CHUNKS = Cfg::BK_BYTES / 2 / 16;  // 8
  static constexpr int A_STEP = Cfg::THREADS / A_CHUNKS;   // 8 rows
  static constexpr int B_STEP = Cfg::THREADS / B_CHUNKS;   // 16 rows
  static constexpr int A_ITERS = Cfg::BM / A_STEP;         // 4
  static constexpr int B_ITERS = Cfg::BN / B_STEP;         // 8 (16 at BN 256)
  const char* a_row[A_ITERS];
  // b's rows are found again at each stage from the tile (tile_b_row): B_ITERS pointers held
  // over the mainloop would cost 2 * B_ITERS registers (the 32 x 256 tiles spilled).
  const char* b_group;  // the tile's group's b
  int64_t n;            // GemmParams' n and silu, for tile_b_row
  int silu;
  int n_tile;
  const char* fallback;  // a valid address for zero-fill copies (nothing is read)
  int64_t a_k_bytes, b_k_bytes;
  int a_chunk, a_row_base, b_chunk, b_row_base;
  bool b_hint = false;
  uint64_t b_policy = 0;

  __device__ __forceinline__ void load(uint32_t s_a, uint32_t s_b, int kt) const {
    const int64_t a_ofs = static_cast<int64_t>(kt) * Cfg::BK_BYTES + a_chunk * 16;
    const bool a_ok = a_ofs < a_k_bytes;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      const int row = a_row_base + i * A_STEP;
      const bool ok = a_ok && a_row[i] != nullptr;
      cp_async_16(s_a + a_offset(row, a_chunk), ok ? a_row[i] + a_ofs : fallback, ok);
    }
    const int64_t b_ofs = static_cast<int64_t>(kt) * (Cfg::BK_BYTES / 2) + b_chunk * 16;
    const bool b_ok = b_ofs < b_k_bytes;
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      const int row = b_row_base + i * B_STEP;
      int64_t col, b_row;
      tile_b_row<Cfg>(*this, n_tile, row, col, b_row);
      const bool ok = b_ok && col < n;
      const char* src = ok ? b_group + b_row * b_k_bytes + b_ofs : fallback;
      const uint32_t dst = s_b + swizzle_offset<Cfg::BK_BYTES / 2>(row, b_chunk);
      if (b_hint) {
        cp_async_16_hint(dst, src, ok, b_policy);
      } else {
        cp_async_16(dst, src, ok);
      }
    }
  }

  // a's stage layout: 256-byte rows, chunk c of row r at chunk c ^ 2 * (r % 4).
  __device__ __forceinline__ static uint32_t a_offset(int row, int chunk) {
    return row * Cfg::BK_BYTES + ((chunk ^ ((row & 3) << 1)) << 4);
  }
};

template <class Cfg_>
struct Fp8WeightTiles {
  using Cfg = Cfg_;
  using Loader = Fp8WeightLoader<Cfg>;
  static constexpr int A_STAGE_BYTES = Cfg::BM * Cfg::BK_BYTES;
  static constexpr int B_STAGE_BYTES = Cfg::BN * Cfg::BK_BYTES / 2;
  static constexpr int SMEM_BYTES = Cfg::STAGES * (A_STAGE_BYTES + B_STAGE_BYTES);
  static_assert(Cfg::WARPS_M == 1 && Cfg::NF % 4 == 0,
                "an ldmatrix.x4 holds four n fragments of a k step");

  __device__ __forceinline__ static int k_slices(const GemmParams& p) {
    return static_cast<int>((p.k + Cfg::BK_BYTES / 2 - 1) / (Cfg::BK_BYTES / 2));
  }

  __device__ __forceinline__ static void setup(const GemmParams& p, const TileCoord& t, Loader& l) {
    const int tid = threadIdx.x;
    l.fallback = static_cast<const char*>(p.a);
    l.a_k_bytes = p.k * 2;
    l.b_k_bytes = p.k;
    l.a_chunk = tid % Loader::A_CHUNKS;
    l.a_row_base = tid / Loader::A_CHUNKS;
    l.b_chunk = tid % Loader::B_CHUNKS;
    l.b_row_base = tid / Loader::B_CHUNKS;
    if (p.b_evict_first) {
      l.b_hint = true;
      l.b_policy = l2_evict_first_policy();
    }
#pragma unroll
    for (int i = 0; i < Loader::A_ITERS; ++i) {
      const int r = l.a_row_base + i * Loader::A_STEP;
      l.a_row[i] =
          r < t.rows ? static_cast<const char*>(p.a) + (t.row0 + r) * l.a_k_bytes : nullptr;
    }
    const int64_t b_group_rows = p.silu ? 2 * p.n : p.n;
    l.b_group = static_cast<const char*>(p.b) + t.group * b_group_rows * p.k;
    l.n = p.n;
    l.silu = p.silu;
    l.n_tile = t.n_tile;
  }

  // acc[mf][nf] += a(rows mf*16 ..) . b(rows wn*32 + nf*8 ..)^T over one stage's 8 k steps.
  __device__ __forceinline__ static void mma(uint32_t s_a, uint32_t s_b,
                                             float (&acc)[Cfg::MF][Cfg::NF][4], int, int wn,
                                             int lane, int valid_mf) {
    const int g = lane >> 2, c = lane & 3;
    // Matrix j of load q (lanes 8j..8j+7 give its rows) = n fragment 4q + j: b rows
    // wn*WN + 32q + 8j + 0..7.
    const int b_row = wn * Cfg::WN + (lane >> 3) * 8 + (lane & 7);
#pragma unroll
    for (int ks = 0; ks < Cfg::KSTEPS; ++ks) {
      uint32_t bf[Cfg::NF][2];
#pragma unroll
      for (int q = 0; q < Cfg::NF / 4; ++q) {
        uint32_t words[4];
        ldmatrix_x4(words, s_b + swizzle_offset<Cfg::BK_BYTES / 2>(b_row + 32 * q, ks));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          bf[4 * q + j][0] = e4m3x2_to_bf16x2<0>(words[j]);
          bf[4 * q + j][1] = e4m3x2_to_bf16x2<1>(words[j]);
        }
      }
      // Bytes 8c .. 8c+7 of the k step's 32 (k 4c .. 4c+3): chunk 2ks + c/2, half c % 2.
      const int chunk = 2 * ks + (c >> 1), half = (c & 1) * 8;
#pragma unroll
      for (int mf = 0; mf < Cfg::MF; ++mf) {
        if (mf < valid_mf) {
          const int row = mf * 16 + g;
          uint32_t lo[2], hi[2];  // rows g and g+8
          asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                       : "=r"(lo[0]), "=r"(lo[1])
                       : "r"(s_a + Loader::a_offset(row, chunk) + half));
          asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                       : "=r"(hi[0]), "=r"(hi[1])
                       : "r"(s_a + Loader::a_offset(row + 8, chunk) + half));
          const uint32_t af[4] = {lo[0], hi[0], lo[1], hi[1]};
#pragma unroll
          for (int nf = 0; nf < Cfg::NF; ++nf) MmaBF16::mma(acc[mf][nf], af, bf[nf]);
        }
      }
    }
  }

  // The scales of the lane's b rows (fragment nf, column 2c + j): loaded when the tile
  // starts, so that their latency hides under its mainloop (a down GEMM of k = 128 has one
  // stage a tile).
  struct Epilogue {
    float scale[Cfg::NF][2];
  };
  __device__ __forceinline__ static void begin(const GemmParams& p, const TileCoord& t, int wn,
                                               int lane, Epilogue& e) {
    const float* scale = p.b_scale + t.group * p.b_scale_group;
#pragma unroll
    for (int nf = 0; nf < Cfg::NF; ++nf) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        int64_t col, b_row;
        tile_b_row<Cfg>(p, t.n_tile, wn * Cfg::WN + nf * 8 + (lane & 3) * 2 + j, col, b_row);
        e.scale[nf][j] = col < p.n ? __ldg(scale + b_row * p.b_scale_row) : 0.f;
      }
    }
  }

  // The b rows' scales on the sums, then the 16-bit epilogue (silu_and_mul, bf16 c).
  __device__ __forceinline__ static void store(const GemmParams& p, const TileCoord& t,
                                               float (&acc)[Cfg::MF][Cfg::NF][4], int, int wn,
                                               int lane, const Epilogue& e) {
#pragma unroll
    for (int nf = 0; nf < Cfg::NF; ++nf) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int mf = 0; mf < Cfg::MF; ++mf) {
          acc[mf][nf][j] *= e.scale[nf][j];
          acc[mf][nf][j + 2] *= e.scale[nf][j];
        }
      }
    }
    store_tile<Cfg, __nv_bfloat16>(acc, static_cast<__nv_bfloat16*>(p.c), p.n, t.row0, t.rows,
                                   t.n_tile, p.silu != 0, 0, wn, lane);
  }
};

}  // namespace moekit::detail::gemm
