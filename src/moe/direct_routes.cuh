// Device pieces of the direct ("indexed") small-batch kernel (direct_tiles.cuh; bf16 / f16
// weights in moe_kernels.cu, e4m3 weights in moe_kernels_fp8.cu): weight-stream loads, the
// mma, the per-block decoding of routes from topk_ids in shared memory, a tile's rows and the
// host's persistent grid.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/device.h"
#include "core/kernel_launch.h"
#include "gemm/common/ptx.cuh"  // MmaBF16, MmaF16
#include "moe/moe_internal.h"

namespace moekit::detail {
namespace direct {
namespace {  // NOLINT: internal linkage in each kernel unit, as before the split

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxWords = static_cast<int>(kDirectMaxExperts / 32);
static_assert(kMaxWords <= kThreads, "the bitmap prefix scan uses one thread per word");

// ---- small device helpers ----

// Weights are read exactly once: keep them out of L1, prefetch 256 B lines into L2.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The m16n8k16 mma of the weights' type (gemm/common/ptx.cuh), on the fragments as loaded.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  using Mma = std::conditional_t<std::is_same_v<T, __half>, gemm::MmaF16, gemm::MmaBF16>;
  const uint32_t a[4] = {a0, a1, a2, a3};
  const uint32_t b[2] = {b0, b1};
  Mma::mma(c, a, b);
}

// The threads of a direct kernel's block: Weights::kBlockThreads where the weights' policy
// names it, else kThreads.
template <class W, class = void>
struct BlockThreads {
  static constexpr int value = kThreads;
};
template <class W>
struct BlockThreads<W, std::void_t<decltype(W::kBlockThreads)>> {
  static constexpr int value = W::kBlockThreads;
};

// ---- route decoding (per block, in shared memory) ----

struct DecodeSmem {
  int ids[kDirectMaxRoutes];     // topk_ids, flat
  int routes[kDirectMaxRoutes];  // flat route indices of the current expert, ascending
  unsigned bits[kMaxWords];      // presence bitmap of valid expert ids
  int word_prefix[kMaxWords];    // exclusive prefix of the words' popcounts
  int warp_tmp[kWarps];
  int chunk_start[kDirectMaxRoutes + 1];  // count_chunks: the 8-route chunks before each slot
  int num_active;                         // distinct valid experts
  int num_chunks;                         // 8-route chunks of all of them
  int any_long;                           // count_chunks: some expert has > 8 routes
  int expert;
};

// The expert ids of the routes: topk_ids, flat.
struct RouteIds {
  const int32_t* __restrict__ ids;
  __device__ __forceinline__ int operator()(int r) const { return ids[r]; }
};

// The per-warp counts in sm.warp_tmp (after a barrier): `before`, the sum over the warps
// below `warp`; `total`, over all NT / 32 warps of the block.
template <int NT = kThreads>
__device__ __forceinline__ void sum_warp_counts(const DecodeSmem& sm, int warp, int& before,
                                                int& total) {
  static_assert(NT % 32 == 0 && NT <= kThreads && kMaxWords <= NT, "a block of whole warps");
  before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) {
    const int v = sm.warp_tmp[w];
    before += w < warp ? v : 0;
    total += v;
  }
}

// Block-wide exclusive prefix sum of each thread's `value` in thread order (returned) and the
// block's `total`: a warp scan, then the warps' sums through sm.warp_tmp. Out of line: inlined
// into the direct kernels it made ptxas spill (up to 100 bytes) in their FP8 instances.
template <int NT = kThreads>
__device__ __noinline__ int block_exclusive_scan(int value, DecodeSmem& sm, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = value;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) sm.warp_tmp[warp] = incl;
  __syncthreads();
  int before;
  sum_warp_counts<NT>(sm, warp, before, total);
  return before + incl - value;
}

// Loads the ids, marks the experts present and counts them. Active experts are
// numbered ("slots") in ascending id order.
// `ids(r)` is route r's expert id (RouteIds: topk_ids[r]).
template <class Ids, int NT = kThreads>
__device__ void decode_experts(const Ids& ids, int R, int E, DecodeSmem& sm) {
  const int words = (E + 31) / 32;
  const int t = threadIdx.x;
  for (int i = t; i < words; i += NT) sm.bits[i] = 0u;
  __syncthreads();
  for (int r = t; r < R; r += NT) {
    const int id = ids(r);
    sm.ids[r] = id;
    if (id >= 0 && id < E) atomicOr(&sm.bits[id >> 5], 1u << (id & 31));  // OR: order-free
  }
  __syncthreads();
  int total;
  const int prefix = block_exclusive_scan<NT>(t < words ? __popc(sm.bits[t]) : 0, sm, total);
  if (t < words) sm.word_prefix[t] = prefix;
  if (t == 0) sm.num_active = total;
  __syncthreads();
}

// The expert id of active slot `slot` (< num_active).
__device__ int expert_of_slot(int slot, int E, DecodeSmem& sm) {
  const int words = (E + 31) / 32;
  const int t = threadIdx.x;
  if (t < words) {
    unsigned b = sm.bits[t];
    const int p = sm.word_prefix[t];
    if (slot >= p && slot < p + __popc(b)) {
      for (int j = slot - p; j > 0; --j) b &= b - 1;  // drop the lower set bits
      sm.expert = t * 32 + __ffs(b) - 1;
    }
  }
  __syncthreads();
  return sm.expert;
}

// ---- 8-route chunks ----
// The kernel's mma takes 8 routes at a time, so an expert with m routes runs ceil(m / 8) chunks,
// each a pass over the expert's weights. A work item is one chunk of one tile, and the chunks
// of a tile are neighbouring items: neighbouring blocks run them at about the same time, so
// the weights come from DRAM once and from the L2 for the other chunks. (One block taking an
// expert's chunks in turn read them from DRAM again: by then the grid's other blocks had
// streamed more than the L2 holds.)

// After decode_experts: sm.num_chunks, the chunks of all active slots; where that exceeds the
// slots (some expert has more than 8 routes), sm.chunk_start[s] = the chunks of the active
// slots before slot s (s <= num_active), which locate_item reads only then.
template <int NT = kThreads>
__device__ __noinline__ void count_chunks(int R, int E, DecodeSmem& sm) {
  const int t = threadIdx.x;
  const int n = sm.num_active;
  if (R <= 8) {  // no expert has more than 8 routes: one chunk a slot, nothing to count
    if (t == 0) sm.num_chunks = n;
    __syncthreads();
    return;
  }
  for (int i = t; i < n; i += NT) sm.chunk_start[i] = 0;
  if (t == 0) sm.any_long = 0;
  __syncthreads();
  for (int r = t; r < R; r += NT) {  // routes per slot
    const int id = sm.ids[r];
    if (id >= 0 && id < E) {
      const int w = id >> 5;
      const int before = atomicAdd(
          &sm.chunk_start[sm.word_prefix[w] + __popc(sm.bits[w] & ((1u << (id & 31)) - 1u))], 1);
      if (before == 8) sm.any_long = 1;  // its ninth route
    }
  }
  __syncthreads();
  if (sm.any_long == 0) {  // block-uniform: one chunk a slot (the common case), no scan
    if (t == 0) sm.num_chunks = n;
  } else {
    // Thread t scans slots [S t, S t + S): chunks, then their exclusive prefix.
    constexpr int S = static_cast<int>(kDirectMaxRoutes) / NT;
    static_assert(S * NT == kDirectMaxRoutes, "whole segments");
    int chunks[S], sum = 0;
#pragma unroll
    for (int j = 0; j < S; ++j) {
      const int slot = t * S + j;
      chunks[j] = slot < n ? (sm.chunk_start[slot] + 7) / 8 : 0;
      sum += chunks[j];
    }
    int total;
    int start = block_exclusive_scan<NT>(sum, sm, total);
#pragma unroll
    for (int j = 0; j < S; ++j) {
      const int slot = t * S + j;
      if (slot < n) sm.chunk_start[slot] = start;  // only this thread read it
      start += chunks[j];
    }
    if (t == 0) {
      sm.chunk_start[n] = total;
      sm.num_chunks = total;
    }
  }
  __syncthreads();
}

// Work item `item` of `tiles` a chunk: its active slot, tile and chunk (items of slot s:
// [chunk_start[s] * tiles, chunk_start[s + 1] * tiles), tile-major, chunks within a tile).
struct ItemPlace {
  int slot;
  int chunk;
  int tile;  // < n_out / 16
};
__device__ __forceinline__ ItemPlace locate_item(int64_t item, int64_t tiles,
                                                 const DecodeSmem& sm) {
  const int v = static_cast<int>(item / tiles);  // chunk_start[slot] <= v < chunk_start[slot + 1]
  if (sm.num_chunks == sm.num_active) {  // one chunk a slot (block-uniform): slot v, no search
    return ItemPlace{v, 0, static_cast<int>(item - static_cast<int64_t>(v) * tiles)};
  }
  int lo = 0, hi = sm.num_active - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (sm.chunk_start[mid] <= v)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int first = sm.chunk_start[lo], n = sm.chunk_start[lo + 1] - first;
  const int local = static_cast<int>(item - static_cast<int64_t>(first) * tiles);
  const int tile = local / n;
  return ItemPlace{lo, local - tile * n, tile};
}

// Collects the flat indices of the routes to expert e (ascending) into sm.routes.
template <int NT = kThreads>
__device__ int collect_routes(int e, int R, DecodeSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int count = 0;
  for (int r0 = 0; r0 < R; r0 += NT) {
    const int r = r0 + threadIdx.x;
    const bool match = r < R && sm.ids[r] == e;
    const unsigned bal = __ballot_sync(0xffffffffu, match);
    if (lane == 0) sm.warp_tmp[warp] = __popc(bal);
    __syncthreads();
    int before, total;
    sum_warp_counts<NT>(sm, warp, before, total);
    if (match) sm.routes[count + before + __popc(bal & ((1u << lane) - 1u))] = r;
    count += total;
    __syncthreads();
  }
  return count;
}

// ---- the tile walk ----

// This lane's weight rows of a tile starting at output column n0 (col0 = n0 + g): m-tile mt,
// half h -> tile row mt*16 + h*8 + g (gate/up: h*8 + g of the gate or the up block), as
// element offsets (32-bit: a base pointer plus offsets keep the register count down) from
// row col0; wmask bit mt*2 + h set for the rows before n_out (the others load zeros).
template <bool kGateUp, int MT>
__device__ __forceinline__ void tile_rows(int64_t col0, int64_t n_out, int64_t kdim,
                                          int32_t (&woff)[MT][2], unsigned& wmask) {
  wmask = 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int tile_row = (kGateUp ? 0 : mt * 16) + half * 8;
      const int64_t row_off = (kGateUp && mt == 1) ? n_out + tile_row : tile_row;
      woff[mt][half] = static_cast<int32_t>(row_off * kdim);
      if (col0 + tile_row < n_out) wmask |= 1u << (mt * 2 + half);
    }
  }
}

// ---- host: the persistent grid ----

// The device's SM count (132 where none is known, as before any device query).
int num_sms() {
  const int sms = device_props().sms;
  return sms > 0 ? sms : 132;
}

// The most work items a direct kernel has: the 8-route chunks (count_chunks) of at most `slots`
// active experts over R routes (ceil(m / 8) <= 1 + m / 8 a slot; one route at least a chunk),
// times the tiles.
inline int64_t max_direct_items(int64_t slots, int64_t R, int64_t tiles) {
  return std::min<int64_t>(R, slots + R / 8) * tiles;
}

template <class Kernel>
int64_t persistent_grid(Kernel kernel, int64_t max_items, int threads = kThreads) {
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, 0);
  return std::max<int64_t>(1,
                           std::min<int64_t>(max_items, static_cast<int64_t>(per_sm) * num_sms()));
}

}  // namespace
}  // namespace direct
}  // namespace moekit::detail
