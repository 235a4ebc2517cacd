// MoEPermuteAlignFwd kernels. Up to kAlignFusedMaxRoutes routes and
// kPermuteFusedMaxExperts experts: ONE launch of 1024-thread blocks
// (align_fused_kernel). Above either: chunk counts + scan
// (route_sort.cu), then a scatter kernel per chunk of kRouteChunk routes. Padding
// and tail slots get the sentinel T*K and expert_ids is filled one warp per block
// of block_size slots, so every output element is written exactly once.
#include <algorithm>

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
  const route::Chunk ch = route::this_chunk<kRouteChunk>(num_routes);
#pragma unroll 8
  for (int i = ch.tid; i < ch.len; i += kThreads)
    s_ids[i] = route::staged_id(__ldg(ids + ch.c0 + i), num_experts);
  route::scatter_chunk<kThreads, /*kCounts=*/true>(s_ids, ch.len, num_experts, warp_cnt, start,
                                                   g_start, cnt, g_cnt, chunk_offsets,
                                                   [&](int i, int pos) {
                                                     if (pos >= 0) sorted[pos] = ch.c0 + i;
                                                   });
  const int last = num_experts - 1;
  const int total = start[last] + route::align_up(cnt[last], block_size);
  align_fill(blockIdx.x * kWarps + (ch.tid >> 5), gridDim.x * kWarps, num_experts, block_size,
             start, cnt, total, num_routes, sorted, sorted_size, expert_ids, num_blocks);
}

constexpr int kFusedChunk = kThreads;  // routes per block of the one-launch kernel

// Up to kAlignFusedMaxRoutes routes: one launch over many SMs. Block b owns routes
// [1024 b, 1024 b + 1024), one 32-route step per warp. Every block recounts all ids
// (one shared atomic per id, into `before` or `cnt` of its chunk) to get the expert
// starts and the routes of each expert before its chunk. The per-warp offsets are
// prefix-summed once per expert, not once per route (docs/routing-permute.md): the
// leader of each (warp, expert) group writes the group's size into wc[e][warp] (u16),
// and after the count barrier thread x < E
//  * sums its expert's column in place (4 x 16-byte loads of its own 64-byte row,
//    swizzled so that a quarter-warp's loads hit distinct banks): wc[x][w] becomes
//    before[x] + the routes of x in warps < w (< 2^16: T*K <= 32768);
//  * computes start[x] itself: a warp scan of the padded counts plus the padded
//    counts of all lower experts (<= 15 loads per lane and one warp reduction), so no
//    single warp scans all experts serially.
// A route's slot is then start[e] + wc[e][warp] + its match_any rank: two shared
// loads. Three block barriers; no workspace, no second pass.
constexpr int kWcRow = 32;  // u16 entries per expert row of wc (one per warp)

// Index of (expert e, warp w) in wc: row e, 16-byte chunk (w / 8 + e / 2) % 4 of it.
__device__ __forceinline__ int wc_index(int e, int w) {
  return e * kWcRow + ((((w >> 3) + (e >> 1)) & 3) << 3) + (w & 7);
}

// Counts every id into before[e] (flat index < c0) or cnt[e] (the rest), kLoads
// loads in flight per thread per round: one shared atomic per id (sums: the order of
// the adds does not matter). A 16-slot round issues its whole body even when most
// slots are predicated off, so the caller picks kLoads by T*K.
template <int kLoads>
__device__ __forceinline__ void count_ids(const int32_t* __restrict__ ids, int num_routes, int E,
                                          int c0, int* before, int* cnt) {
  const int tid = threadIdx.x;
  for (int j0 = 0; j0 < num_routes; j0 += kLoads * kThreads) {
    int v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int j = j0 + u * kThreads + tid;
      v[u] = j < num_routes ? __ldg(ids + j) : -1;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      if (route::valid_id(v[u], E))
        atomicAdd(j0 + u * kThreads + tid < c0 ? &before[v[u]] : &cnt[v[u]], 1);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    align_fused_kernel(const int32_t* __restrict__ ids, int num_routes, int num_experts,
                       int block_size, int32_t* __restrict__ sorted, int sorted_size,
                       int32_t* __restrict__ expert_ids, int num_blocks,
                       int32_t* __restrict__ num_post) {
  __shared__ int before[kPermuteFusedMaxExperts];     // routes of e in earlier chunks
  __shared__ int cnt[kPermuteFusedMaxExperts];        // routes of e from this chunk on
  __shared__ int tot[kPermuteFusedMaxExperts];        // routes of e
  __shared__ int start[kPermuteFusedMaxExperts + 1];  // padded starts; start[E] = total
  __shared__ __align__(16) uint16_t wc[kPermuteFusedMaxExperts * kWcRow];
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c0 = blockIdx.x * kFusedChunk;
  const int E = num_experts;
  const int bs_mask = block_size - 1;  // block_size is a power of two (validated)
  if (tid < E) {
    before[tid] = 0;
    cnt[tid] = 0;
  }
  for (int x = tid; x < E * (kWcRow / 8); x += kThreads)
    reinterpret_cast<uint4*>(wc)[x] = make_uint4(0, 0, 0, 0);
  const int i = c0 + tid;
  int e = i < num_routes ? __ldg(ids + i) : -1;
  if (!route::valid_id(e, E)) e = -1;
  __syncthreads();
  if (num_routes <= kThreads) {  // block-uniform: as few load slots as needed
    count_ids<1>(ids, num_routes, E, c0, before, cnt);
  } else if (num_routes <= 4 * kThreads) {
    count_ids<4>(ids, num_routes, E, c0, before, cnt);
  } else {
    count_ids<16>(ids, num_routes, E, c0, before, cnt);
  }
  pdl_trigger();  // every id is loaded
  const unsigned peers = __match_any_sync(route::kFullMask, e);
  const unsigned below = peers & ((1u << lane) - 1u);
  if (e >= 0 && below == 0) wc[wc_index(e, warp)] = static_cast<uint16_t>(__popc(peers));
  __syncthreads();
  if (warp * 32 < E) {  // warp-uniform: the warps holding experts
    const int x = tid;
    const bool has = x < E;
    const int b = has ? before[x] : 0;
    const int c = has ? b + cnt[x] : 0;
    const int p = (c + bs_mask) & ~bs_mask;
    int incl = p;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int y = __shfl_up_sync(route::kFullMask, incl, d);
      if (lane >= d) incl += y;
    }
    int lower = 0;  // padded counts of the experts below this warp's 32
#pragma unroll 4
    for (int j = lane; j < warp * 32; j += 32) lower += (before[j] + cnt[j] + bs_mask) & ~bs_mask;
    lower = static_cast<int>(__reduce_add_sync(route::kFullMask, static_cast<unsigned>(lower)));
    const int st = lower + incl - p;
    if (has) {
      start[x] = st;
      tot[x] = c;
      if (x == E - 1) start[E] = st + p;
      // Column prefix of row x, in place: word k of chunk q holds warps 8q + 2k, +1.
      uint4* row = reinterpret_cast<uint4*>(wc + x * kWcRow);
      const int sw = (x >> 1) & 3;
      uint4 q[4];
#pragma unroll
      for (int h = 0; h < 4; ++h) q[h] = row[(h + sw) & 3];
      unsigned run = static_cast<unsigned>(b);
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        unsigned* wd = reinterpret_cast<unsigned*>(&q[h]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const unsigned w2 = wd[k];            // lo: warp 2k, hi: warp 2k + 1 (<= 32 each)
          wd[k] = run * 0x10001u + (w2 << 16);  // lo: run, hi: run + count(lo)
          run += (w2 & 0xffffu) + (w2 >> 16);
        }
      }
#pragma unroll
      for (int h = 0; h < 4; ++h) row[(h + sw) & 3] = q[h];
    }
  }
  __syncthreads();
  const int total = start[E];
  if (e >= 0) sorted[start[e] + wc[wc_index(e, warp)] + __popc(below)] = i;
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
      fill_from = max(p0, start[expert] + tot[expert]);
    }
    if (lane == 0) expert_ids[b] = expert;
    const int p_end = min(p0 + block_size, sorted_size);
    for (int p = fill_from + lane; p < p_end; p += 32) sorted[p] = num_routes;
  }
  if (blockIdx.x == 0 && tid == 0) *num_post = total;
}

}  // namespace

void launch_permute_align(const AlignLaunch& l, cudaStream_t stream) {
  const int E = l.num_experts;
  if (align_one_launch(l.num_routes, E)) {
    // Enough blocks for the routes (1024 each) and for the fill (32 blocks of slots each).
    const int blocks = std::max(
        {(l.num_routes + kFusedChunk - 1) / kFusedChunk, (l.num_blocks + kWarps - 1) / kWarps, 1});
    launch_pdl(align_fused_kernel, dim3(blocks), dim3(kThreads), 0, stream, l.topk_ids,
               l.num_routes, E, l.block_size, l.sorted_token_ids, l.sorted_size, l.expert_ids,
               l.num_blocks, l.num_tokens_post_padded);
  } else {
    const RouteChunks rc =
        launch_route_chunk_count_scan(l.topk_ids, l.num_routes, E, l.block_size, l.workspace,
                                      nullptr, l.num_tokens_post_padded, stream);
    const int smem = chunk_scatter_smem<align_scatter_kernel>(kWarps + 2, E);
    launch_pdl(align_scatter_kernel, dim3(rc.chunks), dim3(kThreads), smem, stream, l.topk_ids,
               l.num_routes, E, l.block_size, rc.offsets, rc.start, rc.cnt, l.sorted_token_ids,
               l.sorted_size, l.expert_ids, l.num_blocks);
  }
  check_launch("moe_permute_align");
}

}  // namespace moekit::detail
