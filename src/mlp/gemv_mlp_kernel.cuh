// The one-token dense MLP's kernels (docs/dense-mlp.md "GEMV MLP"): out[n] = sum_k x[k] w[n, k]
// over one token: a CTA per weight row (pair) at a time, read as one contiguous run of 16-byte
// loads.
//
// Why not the tensor-core paths at T = 1: the FLOPs are nothing (2 per weight byte
// pair), the weight stream is everything, and DRAM reads best in long contiguous runs.
// The stream-K and direct kernels read each weight row 64-256 bytes at a time across
// many rows (the mma fragments' shape); here a warp reads 512 contiguous bytes per load
// instruction and the grid's CTAs walk neighbouring rows, as a plain read kernel does.
//
// Work: CTA b takes output columns b, b + gridDim.x, ... (silu: gate row n and up row
// n_out + n of the same column, silu(gate) * up rounded once to the output type; else row
// n); its threads split the row's 16-byte chunks (thread t: t, t + kThreads, ...; up to
// kChunks per row issued before their FMAs), so a column is one or two DRAM round trips of
// the whole CTA and the grid's last columns leave no long tail. The sums: a shuffle tree
// per warp, then thread 0 adds the warps' partials in warp order (fixed: deterministic).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.cuh"
#include "core/pdl.cuh"
#include "gemm/common/ptx.cuh"
#include "mlp/pdl_roles.h"

namespace moekit::detail::gemm::gemv {

using namespace pdl_roles;  // kPdlNone / kPdlFirst / kPdlSecond

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kLoads = 8;  // 16-byte weight loads in flight per thread per batch

struct Params {
  const void* x;  // [K]: the token (gate_up) or h (down)
  const void* w;  // silu: [2 n_out, K] (gate rows, then up rows); else [n_out, K]
  void* out;      // [n_out]
  int K;          // a multiple of 8 (16-byte chunks)
  int n_out;
  int pdl;  // kPdlNone / kPdlFirst (gate_up) / kPdlSecond (down)
};

// acc += dot(8 weights, 8 x values), in f32.
template <typename T>
__device__ __forceinline__ void dot8(float& acc, const uint4& w, const uint4& x) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 a, b;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wv[i]));
      b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xv[i]));
    } else {
      a = __half22float2(*reinterpret_cast<const __half2*>(&wv[i]));
      b = __half22float2(*reinterpret_cast<const __half2*>(&xv[i]));
    }
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
}

// Dynamic shared memory: the K x values (16 * K / 8 bytes).
template <typename T, typename Out, bool kSilu>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const Params p) {
  extern __shared__ uint4 xs[];
  __shared__ float red[2][kWarps][2];      // per-warp partials, double-buffered by column
  constexpr int kRows = kSilu ? 2 : 1;     // weight rows per column
  constexpr int kChunks = kLoads / kRows;  // chunks per row per thread per batch
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = p.K / 8;
  const uint4* w = static_cast<const uint4*>(p.w);
  // Down (kPdlSecond) starts while gate_up drains: its first row's head into L2 first
  // (the MLP's kernels never write weights; core/pdl.cuh allows a prefetch before the
  // wait).
  if (p.pdl == kPdlSecond && blockIdx.x < p.n_out && threadIdx.x == 0)
    bulk_prefetch_l2(w + static_cast<int64_t>(blockIdx.x) * chunks, min(p.K * 2, 8192));
  pdl_wait();
  const uint4* x = static_cast<const uint4*>(p.x);
  for (int c = threadIdx.x; c < chunks; c += kThreads) xs[c] = x[c];
  __syncthreads();
  if (p.pdl == kPdlFirst) pdl_trigger();            // down may launch; it waits for our stores
  const uint64_t policy = l2_evict_first_policy();  // each weight byte is read once
  int parity = 0;
  for (int col = blockIdx.x; col < p.n_out; col += gridDim.x, parity ^= 1) {
    const uint4* row[kRows];
    row[0] = w + static_cast<int64_t>(col) * chunks;
    if constexpr (kSilu) row[1] = w + static_cast<int64_t>(p.n_out + col) * chunks;
    float acc[kRows] = {};
    for (int c0 = threadIdx.x; c0 < chunks; c0 += kThreads * kChunks) {
      uint4 v[kRows][kChunks];
#pragma unroll
      for (int j = 0; j < kChunks; ++j)
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          v[r][j] = ld_weights(row[r] + c0 + kThreads * j, c0 + kThreads * j < chunks, policy);
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        if (c0 + kThreads * j < chunks) {
          const uint4 xv = xs[c0 + kThreads * j];
#pragma unroll
          for (int r = 0; r < kRows; ++r) dot8<T>(acc[r], v[r][j], xv);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
      if (lane == 0) red[parity][warp][r] = acc[r];
    }
    // One barrier per column: the next column writes the other half of red.
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum[kRows] = {};
#pragma unroll
      for (int i = 0; i < kWarps; ++i)
#pragma unroll
        for (int r = 0; r < kRows; ++r) sum[r] += red[parity][i][r];
      Out* o = static_cast<Out*>(p.out);
      if constexpr (kSilu)
        o[col] = from_float<Out>(silu(sum[0]) * sum[1]);
      else
        o[col] = from_float<Out>(sum[0]);
    }
  }
}

}  // namespace moekit::detail::gemm::gemv
