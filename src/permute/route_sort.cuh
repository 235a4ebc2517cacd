// Device helpers that sort routes by expert deterministically, without atomics
// deciding any order: counts (order-free sums), block scans, and ranks from
// __match_any_sync over warps that each own a contiguous, ascending range of
// routes. A route's position is
//   start[e] + (routes of e in earlier chunks) + (in earlier warps) + (earlier in its warp),
// i.e. ascending flat-index order within each expert.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/pdl.cuh"

namespace moekit::detail::route {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ bool valid_id(int e, int num_experts) {
  return static_cast<unsigned>(e) < static_cast<unsigned>(num_experts);
}

// Callers guarantee v + a - 1 fits in int (validated: P / sorted_size < 2^31).
__device__ __forceinline__ int align_up(int v, int a) {
  return (v + a - 1) / a * a;
}

// In-place exclusive scan of vals[0, n) (shared memory); returns the total.
// Every thread of the block must call it; it ends with __syncthreads().
__device__ inline int block_exclusive_scan(int* vals, int n) {
  __shared__ int warp_tot[32];
  __shared__ int total_s;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
  const int ipt = (n + nt - 1) / nt;
  const int lo = min(tid * ipt, n), hi = min(lo + ipt, n);
  int local = 0;
  for (int i = lo; i < hi; ++i) local += vals[i];
  int incl = local;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int y = __shfl_up_sync(kFullMask, incl, d);
    if (lane >= d) incl += y;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int v = lane < nw ? warp_tot[lane] : 0;
    int inc = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int y = __shfl_up_sync(kFullMask, inc, d);
      if (lane >= d) inc += y;
    }
    if (lane < nw) warp_tot[lane] = inc - v;
    if (lane == 31) total_s = inc;
  }
  __syncthreads();
  int run = warp_tot[warp] + incl - local;
  for (int i = lo; i < hi; ++i) {
    const int v = vals[i];
    vals[i] = run;
    run += v;
  }
  __syncthreads();
  return total_s;
}

// The contiguous sub-range [lo, hi) of a chunk of `len` routes owned by this warp.
struct WarpRange {
  int lo, hi;
};
__device__ __forceinline__ WarpRange warp_range(int len) {
  const int nw = blockDim.x >> 5, w = threadIdx.x >> 5;
  const int per = (len + nw - 1) / nw;
  const int lo = min(w * per, len);
  return {lo, min(lo + per, len)};
}

// warp_cnt[w*E + e] += routes with id e in warp w's range. s_ids holds valid ids or -1.
__device__ inline void warp_counts(const int* s_ids, int len, int num_experts, int* warp_cnt) {
  const WarpRange r = warp_range(len);
  int* mine = warp_cnt + (threadIdx.x >> 5) * num_experts;
  for (int i = r.lo + (threadIdx.x & 31); i < r.hi; i += 32) {
    const int e = s_ids[i];
    if (e >= 0) atomicAdd(&mine[e], 1);  // a sum: the order of the adds does not matter
  }
}

// Turns per-warp counts into each warp's first position for expert e:
// base_a[e] (+ base_b[e]) + the counts of earlier warps.
__device__ inline void warp_offsets(int* warp_cnt, int num_experts, const int* base_a,
                                    const int* base_b) {
  const int nw = blockDim.x >> 5;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int run = base_a[e] + (base_b != nullptr ? base_b[e] : 0);
    for (int w = 0; w < nw; ++w) {
      const int c = warp_cnt[w * num_experts + e];
      warp_cnt[w * num_experts + e] = run;
      run += c;
    }
  }
}

// Calls emit(i, pos) for every route i of this warp's range, in 32-route steps;
// pos = -1 for a dropped route. Ranks inside a step come from __match_any_sync.
template <class Emit>
__device__ inline void warp_scatter(const int* s_ids, int len, int num_experts, int* warp_off,
                                    Emit emit) {
  const WarpRange r = warp_range(len);
  const int lane = threadIdx.x & 31;
  const unsigned lanes_below = (1u << lane) - 1u;
  int* mine = warp_off + (threadIdx.x >> 5) * num_experts;
  for (int base = r.lo; base < r.hi; base += 32) {  // warp-uniform bounds
    const int i = base + lane;
    const int e = i < r.hi ? s_ids[i] : -1;
    const unsigned peers = __match_any_sync(kFullMask, e);
    const unsigned below = peers & lanes_below;
    const int pos = e >= 0 ? mine[e] + __popc(below) : -1;
    if (i < r.hi) emit(i, pos);
    __syncwarp();
    if (e >= 0 && below == 0) mine[e] += __popc(peers);  // one leader per expert
    __syncwarp();
  }
}

// This thread and block's chunk of kChunk routes: [c0, c0 + len).
struct Chunk {
  int tid, c0, len;
};
template <int kChunk>
__device__ __forceinline__ Chunk this_chunk(int num_routes) {
  const int tid = threadIdx.x;
  const int c0 = blockIdx.x * kChunk;
  return {tid, c0, min(kChunk, num_routes - c0)};
}
// An id as the scatter stages it: e when valid, else -1.
__device__ __forceinline__ int staged_id(int e, int num_experts) {
  return valid_id(e, num_experts) ? e : -1;
}

// The scatter of one chunk of routes (block blockIdx.x of kThreads threads) whose ids (valid
// or -1) s_ids holds, after the chunked count and scan (route_sort.cu): counted per warp
// into warp_cnt [kThreads / 32][E] and ranked from the expert starts g_start (loaded into
// start [E]; kCounts: the counts g_cnt too, into cnt [E]) plus the chunk's offsets;
// place(i, pos) for every route i of the chunk (pos -1: dropped). The kernels stage s_ids
// themselves: that loop in a helper compiles to other machine code (sm_90a).
template <int kThreads, bool kCounts, class Place>
__device__ __forceinline__ void scatter_chunk(const int* s_ids, int len, int num_experts,
                                              int* warp_cnt, int* start, const int32_t* g_start,
                                              int* cnt, const int32_t* g_cnt,
                                              const int32_t* chunk_offsets, Place place) {
  constexpr int kWarps = kThreads / 32;
  const int tid = threadIdx.x;
  for (int i = tid; i < kWarps * num_experts; i += kThreads) warp_cnt[i] = 0;
  for (int e = tid; e < num_experts; e += kThreads) {
    start[e] = g_start[e];
    if constexpr (kCounts) cnt[e] = g_cnt[e];
  }
  pdl_trigger();
  __syncthreads();
  warp_counts(s_ids, len, num_experts, warp_cnt);
  __syncthreads();
  warp_offsets(warp_cnt, num_experts, start,
               chunk_offsets + static_cast<int64_t>(blockIdx.x) * num_experts);
  __syncthreads();
  warp_scatter(s_ids, len, num_experts, warp_cnt, place);
}

}  // namespace moekit::detail::route
