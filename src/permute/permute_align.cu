// MoEPermuteAlignFwd kernels. Up to kAlignFusedMaxRoutes routes: ONE launch of
// 1024-thread blocks (align_fused_kernel). Above: chunk counts + scan
// (route_sort.cu), then a scatter kernel per chunk of kRouteChunk routes. Padding
// and tail slots get the sentinel T*K and expert_ids is filled one warp per block
// of block_size slots, so every output element is written exactly once.
#include <algorithm>
#include <cstdlib>

#include "core/check.h"
#include "core/pdl.cuh"
#include "permute/permute_kernels.h"
#include "permute/route_sort.cuh"

namespace moekit::detail {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// One warp per block b of block_size slots (b = gwarp, gwarp + nwarps, ...):
// expert_ids[b], and the sentinel in every slot of b that holds no route.
__device__ void align_fill(int gwarp, int nwarps, int num_experts, int block_size, const int* start,
                           const int* cnt, int total, int sentinel, int32_t* sorted,
                           int sorted_size, int32_t* expert_ids, int num_blocks) {
  const int lane = threadIdx.x & 31;
  for (int b = gwarp; b < num_blocks; b += nwarps) {
    const int p0 = b * block_size;
    int expert = -1, fill_from = p0;
    if (p0 < total) {
      // The first expert whose padded range ends past p0 (empty experts end at their start).
      int lo = 0, hi = num_experts - 1;
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (start[mid] + route::align_up(cnt[mid], block_size) > p0) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      expert = lo;
      fill_from = max(p0, start[lo] + cnt[lo]);
    }
    if (lane == 0) expert_ids[b] = expert;
    const int p_end = min(p0 + block_size, sorted_size);
    for (int p = fill_from + lane; p < p_end; p += 32) sorted[p] = sentinel;
  }
}

__global__ void __launch_bounds__(kThreads)
    align_scatter_kernel(const int32_t* __restrict__ ids, int num_routes, int num_experts,
                         int block_size, const int32_t* __restrict__ chunk_offsets,
                         const int32_t* __restrict__ g_start, const int32_t* __restrict__ g_cnt,
                         int32_t* __restrict__ sorted, int sorted_size,
                         int32_t* __restrict__ expert_ids, int num_blocks) {
  extern __shared__ int smem[];
  int* s_ids = smem;                             // [kRouteChunk]
  int* warp_cnt = s_ids + kRouteChunk;           // [kWarps][E]
  int* start = warp_cnt + kWarps * num_experts;  // [E]
  int* cnt = start + num_experts;                // [E]
  pdl_wait();                                    // PDL: before any global access (core/pdl.cuh)
  const int tid = threadIdx.x;
  const int c0 = blockIdx.x * kRouteChunk;
  const int len = min(kRouteChunk, num_routes - c0);
#pragma unroll 8
  for (int i = tid; i < len; i += kThreads) {
    const int e = __ldg(ids + c0 + i);
    s_ids[i] = route::valid_id(e, num_experts) ? e : -1;
  }
  for (int i = tid; i < kWarps * num_experts; i += kThreads) warp_cnt[i] = 0;
  for (int e = tid; e < num_experts; e += kThreads) {
    start[e] = g_start[e];
    cnt[e] = g_cnt[e];
  }
  pdl_trigger();
  __syncthreads();
  route::warp_counts(s_ids, len, num_experts, warp_cnt);
  __syncthreads();
  route::warp_offsets(warp_cnt, num_experts, start,
                      chunk_offsets + static_cast<int64_t>(blockIdx.x) * num_experts);
  __syncthreads();
  route::warp_scatter(s_ids, len, num_experts, warp_cnt, [&](int i, int pos) {
    if (pos >= 0) sorted[pos] = c0 + i;
  });
  const int last = num_experts - 1;
  const int total = start[last] + route::align_up(cnt[last], block_size);
  align_fill(blockIdx.x * kWarps + (tid >> 5), gridDim.x * kWarps, num_experts, block_size, start,
             cnt, total, num_routes, sorted, sorted_size, expert_ids, num_blocks);
}

// Up to kAlignFusedMaxRoutes routes: one launch over many SMs.
// block b owns routes [1024 b, 1024 b + 1024), one 32-route step per warp. Every
// block recounts all ids (order-free shared atomics; <= 32 loads per thread) to get
// the expert starts and the routes of each expert before its chunk, ranks its own
// routes (match_any inside the warp, per-warp counts for the earlier warps), and
// fills its share of the padding slots and expert_ids. No workspace, no second pass.
constexpr int kFusedChunk = kThreads;  // routes per block

__global__ void __launch_bounds__(kThreads)
    align_fused_kernel(const int32_t* __restrict__ ids, int num_routes, int num_experts,
                       int block_size, int32_t* __restrict__ sorted, int sorted_size,
                       int32_t* __restrict__ expert_ids, int num_blocks,
                       int32_t* __restrict__ num_post) {
  __shared__ int hist[kPermuteMaxExperts];
  __shared__ int before[kPermuteMaxExperts];
  __shared__ int start[kPermuteMaxExperts];
  __shared__ __align__(16) unsigned char wcnt[kWarps][kPermuteMaxExperts];  // <= 32 each
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c0 = blockIdx.x * kFusedChunk;
  for (int e = tid; e < num_experts; e += kThreads) {
    hist[e] = 0;
    before[e] = 0;
  }
  reinterpret_cast<uint4*>(wcnt[warp])[lane] = make_uint4(0, 0, 0, 0);  // 512 bytes per warp
  const int i = c0 + tid;
  int e = i < num_routes ? __ldg(ids + i) : -1;
  if (!route::valid_id(e, num_experts)) e = -1;
  __syncthreads();
  for (int j0 = 0; j0 < num_routes; j0 += 16 * kThreads) {
    int v[16];
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      const int j = j0 + u * kThreads + tid;
      v[u] = j < num_routes ? __ldg(ids + j) : -1;
    }
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      if (route::valid_id(v[u], num_experts)) {
        atomicAdd(&hist[v[u]], 1);  // sums: the order of the adds does not matter
        if (j0 + u * kThreads + tid < c0) atomicAdd(&before[v[u]], 1);
      }
    }
  }
  pdl_trigger();  // every id is loaded
  const unsigned peers = __match_any_sync(route::kFullMask, e);
  const unsigned below = peers & ((1u << lane) - 1u);
  if (e >= 0 && below == 0) wcnt[warp][e] = static_cast<unsigned char>(__popc(peers));
  __syncthreads();
  for (int x = tid; x < num_experts; x += kThreads) start[x] = route::align_up(hist[x], block_size);
  __syncthreads();
  const int total = route::block_exclusive_scan(start, num_experts);
  if (e >= 0) {
    int off = start[e] + before[e] + __popc(below);
    for (int w = 0; w < warp; ++w) off += wcnt[w][e];
    sorted[off] = i;
  }
  align_fill(blockIdx.x * kWarps + warp, gridDim.x * kWarps, num_experts, block_size, start, hist,
             total, num_routes, sorted, sorted_size, expert_ids, num_blocks);
  if (blockIdx.x == 0 && tid == 0) *num_post = total;
}

// Version 2 of the one-launch path (the default; MOEKIT_ROUTING_LEGACY=1 selects the
// kernel above). Per block: one shared atomic per id (into `before` or `after` this
// block's chunk, so hist = before + after), warp 0 alone scans the expert starts
// (no block-wide scan), three barriers in all; the padding fill finds a block's
// expert with one warp count (experts whose padded range ends at or before p0)
// instead of a binary search of dependent shared loads.
__global__ void __launch_bounds__(kThreads)
    align_fused_v2_kernel(const int32_t* __restrict__ ids, int num_routes, int num_experts,
                          int block_size, int32_t* __restrict__ sorted, int sorted_size,
                          int32_t* __restrict__ expert_ids, int num_blocks,
                          int32_t* __restrict__ num_post) {
  __shared__ int before[kPermuteMaxExperts];     // routes of e in earlier chunks
  __shared__ int cnt[kPermuteMaxExperts];        // routes of e from this chunk on, then all
  __shared__ int start[kPermuteMaxExperts + 1];  // padded starts; start[E] = total
  __shared__ __align__(16) unsigned char wcnt[kWarps][kPermuteMaxExperts];  // <= 32 each
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c0 = blockIdx.x * kFusedChunk;
  const int E = num_experts;
  const int bs_mask = block_size - 1;  // block_size is a power of two (validated)
  for (int x = tid; x < E; x += kThreads) {
    before[x] = 0;
    cnt[x] = 0;
  }
  reinterpret_cast<uint4*>(wcnt[warp])[lane] = make_uint4(0, 0, 0, 0);  // 512 bytes per warp
  const int i = c0 + tid;
  int e = i < num_routes ? __ldg(ids + i) : -1;
  if (!route::valid_id(e, E)) e = -1;
  __syncthreads();
  for (int j0 = 0; j0 < num_routes; j0 += 16 * kThreads) {
    int v[16];
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      const int j = j0 + u * kThreads + tid;
      v[u] = j < num_routes ? __ldg(ids + j) : -1;
    }
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      if (route::valid_id(v[u], E))  // sums: the order of the adds does not matter
        atomicAdd(j0 + u * kThreads + tid < c0 ? &before[v[u]] : &cnt[v[u]], 1);
    }
  }
  pdl_trigger();  // every id is loaded
  const unsigned peers = __match_any_sync(route::kFullMask, e);
  const unsigned below = peers & ((1u << lane) - 1u);
  if (e >= 0 && below == 0) wcnt[warp][e] = static_cast<unsigned char>(__popc(peers));
  __syncthreads();
  if (warp == 0) {
    const int per = (E + 31) / 32;
    const int lo = min(lane * per, E), hi = min(lo + per, E);
    int local = 0;
    for (int x = lo; x < hi; ++x) local += ((before[x] + cnt[x] + bs_mask) & ~bs_mask);
    int incl = local;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int y = __shfl_up_sync(route::kFullMask, incl, d);
      if (lane >= d) incl += y;
    }
    int run = incl - local;
    for (int x = lo; x < hi; ++x) {
      const int c = before[x] + cnt[x];
      start[x] = run;
      cnt[x] = c;
      run += (c + bs_mask) & ~bs_mask;
    }
    if (lane == 31) start[E] = incl;
  }
  __syncthreads();
  const int total = start[E];
  if (e >= 0) {
    int off = start[e] + before[e] + __popc(below);
    // Earlier warps' counts: 32 independent loads (a loop bounded by `warp` would
    // wait for each load in turn: the last warp is the block's critical path).
#pragma unroll
    for (int w = 0; w < kWarps; ++w) off += w < warp ? wcnt[w][e] : 0;
    sorted[off] = i;
  }
  // One warp per block b of block_size slots: expert_ids[b] and the sentinels.
  const int nwarps = gridDim.x * kWarps;
  for (int b = blockIdx.x * kWarps + warp; b < num_blocks; b += nwarps) {
    const int p0 = b * block_size;
    int expert = -1, fill_from = p0;
    if (p0 < total) {
      // Padded ranges end at start[x + 1], in order: the block's expert is the
      // number of experts whose range ends at or before p0.
      int c = 0;
#pragma unroll 4
      for (int x = lane; x < E; x += 32) c += start[x + 1] <= p0 ? 1 : 0;
      expert = static_cast<int>(__reduce_add_sync(route::kFullMask, static_cast<unsigned>(c)));
      fill_from = max(p0, start[expert] + cnt[expert]);
    }
    if (lane == 0) expert_ids[b] = expert;
    const int p_end = min(p0 + block_size, sorted_size);
    for (int p = fill_from + lane; p < p_end; p += 32) sorted[p] = num_routes;
  }
  if (blockIdx.x == 0 && tid == 0) *num_post = total;
}

bool align_legacy_select() {
  static const bool env_legacy = [] {
    const char* v = std::getenv("MOEKIT_ROUTING_LEGACY");
    return v != nullptr && v[0] == '1';
  }();
  const int o = permute_align_variant_override();
  return o == 0 ? env_legacy : o == 2;
}

}  // namespace

int& permute_align_variant_override() {
  static int v = 0;
  return v;
}

void launch_permute_align(const AlignLaunch& l, cudaStream_t stream) {
  const int E = l.num_experts;
  if (l.num_routes <= kAlignFusedMaxRoutes) {
    // Enough blocks for the routes (1024 each) and for the fill (32 blocks of slots each).
    const int blocks = std::max(
        {(l.num_routes + kFusedChunk - 1) / kFusedChunk, (l.num_blocks + kWarps - 1) / kWarps, 1});
    if (align_legacy_select()) {
      launch_pdl(align_fused_kernel, dim3(blocks), dim3(kThreads), 0, stream, l.topk_ids,
                 l.num_routes, E, l.block_size, l.sorted_token_ids, l.sorted_size, l.expert_ids,
                 l.num_blocks, l.num_tokens_post_padded);
    } else {
      launch_pdl(align_fused_v2_kernel, dim3(blocks), dim3(kThreads), 0, stream, l.topk_ids,
                 l.num_routes, E, l.block_size, l.sorted_token_ids, l.sorted_size, l.expert_ids,
                 l.num_blocks, l.num_tokens_post_padded);
    }
  } else {
    launch_route_chunk_count_scan(l.topk_ids, l.num_routes, E, l.block_size, l.workspace, nullptr,
                                  l.num_tokens_post_padded, stream);
    const int chunks = (l.num_routes + kRouteChunk - 1) / kRouteChunk;
    const int32_t* offsets = static_cast<const int32_t*>(l.workspace);
    const int32_t* start = offsets + static_cast<int64_t>(chunks) * E;
    const int smem = (kRouteChunk + (kWarps + 2) * E) * 4;
    constexpr int kMaxSmem = (kRouteChunk + (kWarps + 2) * kPermuteMaxExperts) * 4;
    allow_large_smem(reinterpret_cast<const void*>(align_scatter_kernel), kMaxSmem, 0);
    launch_pdl(align_scatter_kernel, dim3(chunks), dim3(kThreads), smem, stream, l.topk_ids,
               l.num_routes, E, l.block_size, offsets, start, start + E, l.sorted_token_ids,
               l.sorted_size, l.expert_ids, l.num_blocks);
  }
  check_launch("moe_permute_align");
}

}  // namespace moekit::detail
