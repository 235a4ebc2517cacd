// The direct small-batch GEMM of the dense MLP (docs/dense-mlp.md "Direct dense MLP"):
// out[t, n] = sum_k x[t, k] w[n, k] for T <= 32 tokens, the weights streamed straight
// from global memory into mma.sync registers (no shared-memory staging), the tokens'
// k slice staged once in shared memory. Streaming 16-byte loads with many bytes in
// flight per SM is what reaches the memory's rate on 15-60 MB matrices, where TMA rings
// and cp.async tiles fall short (docs/dense-mlp.md).
//
// Swap-AB: 16 weight rows are the M side of mma.sync m16n8k16, 8 tokens the N side.
// Lane (g = lane / 4, q = lane % 4) loads 16 bytes of weight rows g and g + 8 at k
// 8q .. 8q + 7 of each 32-wide chunk: the mma's logical k (2q, 2q + 1, 2q + 8, 2q + 9)
// is read as physical k 8q .. 8q + 3 (first mma) and 8q + 4 .. 8q + 7 (second). A sum
// over k does not care about the order, so the tokens' fragments are read with the same
// permutation: one 16-byte shared load of x[token g][8q .. 8q + 7] feeds both mmas.
//
// Work: a CTA = 8 warps x 16 weight rows (silu: 8 gate + 8 up rows of the same 8
// output columns, so a thread holds gate and up of its column) over a k slice; the
// `split` CTAs of a thread-block cluster take the k slices of the same rows and add
// their partials through distributed shared memory in rank order (deterministic, no
// workspace). PDL roles: kFirst waits before any global access, kSecond loads its first
// weights (which no kernel of the MLP writes) before it waits.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.cuh"
#include "core/pdl.cuh"
#include "gemm/common/ptx.cuh"
#include "mlp/pdl_roles.h"

namespace moekit::detail::gemm::direct {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunkK = 32;   // k per pair of mmas
constexpr int kBatch = 4;     // chunks per load batch; two batches are in flight
constexpr int kMaxSplit = 8;  // ranks per cluster (portable clusters)
// Padding of a staged x row, elements: 32 (64 bytes) puts the two token rows that one
// quarter-warp's 16-byte fragment reads touch (g, g + 1) in disjoint bank halves
// (conflict-free x reads: docs/dense-mlp.md "Direct dense MLP").
constexpr int kXPad = 32;
using namespace pdl_roles;  // kPdlNone / kPdlFirst / kPdlSecond

struct Params {
  const void* x;  // [T, K]
  const void* w;  // [rows, K]: silu [2 n_out, K] (gate rows, then up rows), else [n_out, K]
  void* out;      // [T, n_out]
  int T, K, n_out;
  int k_slice;    // k per cluster rank, a multiple of kChunkK
  int x_stride;   // shared row stride of the staged x, elements (k_slice + kXPad)
  int pdl;        // kPdlNone / kPdlFirst / kPdlSecond
  int pair_rows;  // lanes g, g ^ 1 load one row's 128-byte line together (see the loads)
};

// Weight elements per row of its k slice that each CTA prefetches into L2 before its loads
// (the head of its stream; larger delayed x: docs/dense-mlp.md "Direct dense MLP").
constexpr int kPrefetchElems = 256;

// The cluster sum of the k split's partials, in rank order (the same bits every run): each
// warp stores its partials into its owner's slots through distributed shared memory (remote
// stores do not wait), one cluster barrier, the owner sums its local slots. Partial slots
// per CTA (float4 x 32 lanes x 8-token groups each): the owner of warp w (rank w % split)
// keeps slot (w / split) * split + r for rank r's partial, up to ceil(kWarps / split) *
// split slots (at least kWarps).
__host__ __device__ constexpr int reduce_slots(int split) {
  return (kWarps + split - 1) / split * split > kWarps ? (kWarps + split - 1) / split * split
                                                       : kWarps;
}

// Output columns per CTA: silu 8 per warp, plain 16 per warp.
template <bool kSilu>
constexpr int cols_per_cta() {
  return kSilu ? 8 * kWarps : 16 * kWarps;
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

template <typename T, typename Mma, typename Out, int TN, bool kSilu, int B = kBatch>
__global__ void __launch_bounds__(kThreads, 2) direct_gemm_kernel(const Params p) {
  constexpr int NG = TN / 8;  // 8-token groups
  namespace cg = cooperative_groups;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int split = static_cast<int>(gridDim.x), rank = static_cast<int>(blockIdx.x);
  const int k0 = rank * p.k_slice;
  const int kend = min(p.K, k0 + p.k_slice);
  const int chunks = kend > k0 ? (kend - k0 + kChunkK - 1) / kChunkK : 0;

  // This lane's two weight rows (fragment rows g and g + 8) and output column(s).
  const auto rows_of = [&](int gg, int& r0, int& r1, bool& v0, bool& v1) {
    if constexpr (kSilu) {
      const int c = (blockIdx.y * kWarps + warp) * 8 + gg;
      r0 = c;            // gate
      r1 = p.n_out + c;  // up
      v0 = v1 = c < p.n_out;
    } else {
      r0 = (blockIdx.y * kWarps + warp) * 16 + gg;
      r1 = r0 + 8;
      v0 = r0 < p.n_out;
      v1 = r1 < p.n_out;
    }
  };
  int row0, row1;
  bool ok0, ok1;
  rows_of(g, row0, row1, ok0, ok1);
  const int col = row0;  // silu: the output column (its gate row)
  const T* w = static_cast<const T*>(p.w);
  const auto row_ptr = [&](int r, bool v) {
    return w + static_cast<int64_t>(v ? r : 0) * p.K + k0;
  };
  const T* w0 = row_ptr(row0, ok0) + 8 * q;
  const T* w1 = row_ptr(row1, ok1) + 8 * q;
  // Loads per pair of chunks (64 k = one 128-byte line of a row): chunk c + j (j even) from
  // pa[0] / pb[0], chunk c + j + 1 from pa[1] / pb[1], both at (c + j) * kChunkK + kq[.].
  // Unpaired: this lane's own rows at k 8q and 8q + 32 (4 lanes read 64 bytes of a row).
  // Paired (p.pair_rows): lanes g and g ^ 1 read one row's whole line together (rows g & ~1
  // from [0], g | 1 from [1], k 8 (q + 4 (g & 1))), and compute() swaps the halves that
  // belong to the partner lane (shfl.xor 4), so 8 lanes read each line in one instruction.
  const bool pair = p.pair_rows != 0;
  const int h = g & 1;
  const T* pa[2];
  const T* pb[2];
  bool oka[2], okb[2];
  int kq[2];
  if (pair) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int r0, r1;
      bool v0, v1;
      rows_of((g & ~1) | i, r0, r1, v0, v1);
      pa[i] = row_ptr(r0, v0) + 8 * (q + 4 * h);
      pb[i] = row_ptr(r1, v1) + 8 * (q + 4 * h);
      oka[i] = v0;
      okb[i] = v1;
      kq[i] = 8 * (q + 4 * h);
    }
  } else {
    pa[0] = w0;
    pa[1] = w0 + kChunkK;
    pb[0] = w1;
    pb[1] = w1 + kChunkK;
    oka[0] = oka[1] = ok0;
    okb[0] = okb[1] = ok1;
    kq[0] = 8 * q;
    kq[1] = 8 * q + kChunkK;
  }
  const uint64_t policy = l2_evict_first_policy();
  const auto load_with = [&](auto fetch, uint4(&a)[B], uint4(&b)[B], int c) {
    constexpr int kFetch = decltype(fetch)::value;
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int i = j & 1;
      const int kk = (c + j - i) * kChunkK;
      const bool in = k0 + kk + kq[i] < kend;
      a[j] = ld_weights<kFetch>(pa[i] + kk, in && oka[i], policy);
      b[j] = ld_weights<kFetch>(pb[i] + kk, in && okb[i], policy);
    }
  };
  // Paired loads already ask for whole lines; single lanes ask the L2 to fetch 128 bytes.
  const auto load = [&](uint4(&a)[B], uint4(&b)[B], int c) {
    if (pair)
      load_with(std::integral_constant<int, 0>{}, a, b, c);
    else
      load_with(std::integral_constant<int, 128>{}, a, b, c);
  };

  // Push: peers' shared memory may only be written once they run; arrive now, wait before
  // the first remote store (long done by then).
  const bool push = split > 1;
  if (push) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  // The head of the weight stream goes to L2 while x is staged (and, before the PDL wait,
  // while the previous kernel ends): a prefetch is L2-coherent, so it cannot feed stale
  // data to the loads below, which all come after the wait.
  if (q == 0) {
    const int n = min(kPrefetchElems, kend - k0);
    if (n > 0 && ok0) bulk_prefetch_l2(w0, n * static_cast<int>(sizeof(T)));
    if (n > 0 && ok1) bulk_prefetch_l2(w1, n * static_cast<int>(sizeof(T)));
  }
  if (p.pdl == kPdlFirst) pdl_wait();
  uint4 cur0[B], cur1[B];
  // At 32 tokens x's copies go before the first weight batch (x's staging gates the k loop
  // there); at 8 tokens after it (docs/dense-mlp.md "Direct dense MLP").
  const bool x_first = TN == 32 && p.pdl != kPdlSecond;
  if (!x_first) load(cur0, cur1, 0);
  if (p.pdl == kPdlSecond) pdl_wait();  // x is the previous kernel's output

  // Stage x[0 .. TN)[k0 .. k0 + k_slice) (zeros past T and K).
  const T* x = static_cast<const T*>(p.x);
  const uint32_t xs = smem_addr(smem);
  const int units = p.k_slice / 8;
  for (int i = threadIdx.x; i < TN * units; i += kThreads) {
    const int t = i / units, u = i - t * units;
    const int k = k0 + 8 * u;
    const bool valid = t < p.T && k < kend;
    cp_async_16(xs + (t * p.x_stride + 8 * u) * 2,
                x + (valid ? static_cast<int64_t>(t) * p.K + k : 0), valid);
  }
  cp_async_commit();
  if (x_first) load(cur0, cur1, 0);
  cp_async_wait<0>();
  __syncthreads();
  if (p.pdl == kPdlFirst) pdl_trigger();  // the dependent only prefetches weights early

  float acc[NG][4];
#pragma unroll
  for (int n = 0; n < NG; ++n)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[n][j] = 0.f;
  const uint32_t xrow = xs + (g * p.x_stride + 8 * q) * 2;
  // Paired loads: this lane holds, per pair of chunks, its partner's half of the line in
  // one register set; swap it for the partner's copy of this lane's own half.
  const auto unpair = [&](uint4& lo, uint4& hi) {
    uint32_t* l = &lo.x;
    uint32_t* u = &hi.x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t recv = __shfl_xor_sync(0xffffffffu, h ? l[e] : u[e], 4);
      const uint32_t first = h ? recv : l[e];
      u[e] = h ? u[e] : recv;
      l[e] = first;
    }
  };
  const auto compute = [&](uint4(&a)[B], uint4(&b)[B], int c) {
    if (pair) {
#pragma unroll
      for (int j = 0; j < B; j += 2) {
        unpair(a[j], a[j + 1]);
        unpair(b[j], b[j + 1]);
      }
    }
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const uint32_t a_lo[4] = {a[j].x, b[j].x, a[j].y, b[j].y};
      const uint32_t a_hi[4] = {a[j].z, b[j].z, a[j].w, b[j].w};
#pragma unroll
      for (int n = 0; n < NG; ++n) {
        const uint4 xv = lds128(xrow + (n * 8 * p.x_stride + (c + j) * kChunkK) * 2);
        const uint32_t b_lo[2] = {xv.x, xv.y};
        const uint32_t b_hi[2] = {xv.z, xv.w};
        Mma::mma(acc[n], a_lo, b_lo);
        Mma::mma(acc[n], a_hi, b_hi);
      }
    }
  };
  // Two named register buffers (no copy between them: with one, ptxas allocated a single
  // set and issued each batch's loads only after the previous batch's mmas).
  for (int c = 0; c < chunks; c += 2 * B) {
    uint4 nxt0[B], nxt1[B];
    load(nxt0, nxt1, c + B);
    compute(cur0, cur1, c);
    load(cur0, cur1, c + 2 * B);
    if (c + B < chunks) compute(nxt0, nxt1, c + B);
  }

  // Cluster sum: rank (warp % split) sums the warp's tile over all ranks.
  float4* slots = reinterpret_cast<float4*>(smem + TN * p.x_stride * 2);
  if (push) {
    cg::cluster_group cluster = cg::this_cluster();
    const int base = warp / split * split;  // this warp's slots at its owner
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
    float4* dst = cluster.map_shared_rank(slots + (base + rank) * NG * 32 + lane, warp % split);
#pragma unroll
    for (int n = 0; n < NG; ++n)
      dst[n * 32] = make_float4(acc[n][0], acc[n][1], acc[n][2], acc[n][3]);
    cluster.sync();  // release / acquire: every partial is in its owner's slots
    if (warp % split != rank) return;
#pragma unroll
    for (int n = 0; n < NG; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[n][j] = 0.f;
    for (int r = 0; r < split; ++r) {
#pragma unroll
      for (int n = 0; n < NG; ++n) {
        const float4 v = slots[((base + r) * NG + n) * 32 + lane];
        acc[n][0] += v.x;
        acc[n][1] += v.y;
        acc[n][2] += v.z;
        acc[n][3] += v.w;
      }
    }
  }

  // Epilogue: acc[n][0..1] = row g, tokens 8n + 2q, + 1; acc[n][2..3] = row g + 8.
  Out* out = static_cast<Out*>(p.out);
#pragma unroll
  for (int n = 0; n < NG; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = n * 8 + 2 * q + h;
      if (t >= p.T) continue;
      Out* o = out + static_cast<int64_t>(t) * p.n_out;
      if constexpr (kSilu) {
        if (ok0) o[col] = from_float<Out>(silu(acc[n][h]) * acc[n][2 + h]);
      } else {
        if (ok0) o[row0] = from_float<Out>(acc[n][h]);
        if (ok1) o[row1] = from_float<Out>(acc[n][2 + h]);
      }
    }
  }
}

}  // namespace moekit::detail::gemm::direct
