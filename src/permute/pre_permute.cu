// MoEPrePermuteFwd kernels.
// Up to kPrePermuteFusedMaxRoutes routes: ONE kernel. Each block owns <= 32 routes;
// it issues the loads of its source rows first, then recounts all ids (cheap at
// this size) to get the expert starts, ranks its routes with __match_any_sync,
// writes inverse_indices and stores the rows (16-byte vectors).
// Above: chunk counts + scan (route_sort.cu), a scatter kernel that writes
// inverse_indices per chunk, and a copy kernel driven by inverse_indices.
#include <algorithm>

#include "core/check.h"
#include "core/pdl.cuh"
#include "permute/permute_kernels.h"
#include "permute/route_sort.cuh"

namespace moekit::detail {
namespace {

constexpr int kCopyThreads = 256;
constexpr int kPreload = 8;        // 16-byte vectors per thread loaded before the ranks are known
constexpr int kMaxFusedRows = 32;  // routes per block of the fused kernel (one warp ranks them)
constexpr int kScatterThreads = 1024;
constexpr int kScatterWarps = kScatterThreads / 32;
constexpr int kMaxCopyRows = 64;

// Copies work items [f_begin, work) step kCopyThreads, 4 in flight per thread:
// item f = (row r of the block, 16-byte column col); dest[r] < 0 skips the row.
__device__ __forceinline__ void copy_items(const uint4* __restrict__ hidden, int V, int r0,
                                           int top_k, const int* dest, int f_begin, int work,
                                           uint4* __restrict__ permuted) {
  for (int f = f_begin; f < work; f += 4 * kCopyThreads) {
    uint4 buf[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int g = f + j * kCopyThreads;
      if (g < work) {
        const int r = g / V;
        const int col = g - r * V;
        buf[j] = __ldg(hidden + static_cast<int64_t>((r0 + r) / top_k) * V + col);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int g = f + j * kCopyThreads;
      if (g < work) {
        const int r = g / V;
        const int d = dest[r];
        if (d >= 0) permuted[static_cast<int64_t>(d) * V + (g - r * V)] = buf[j];
      }
    }
  }
}

// The fused kernel (T*K <= kPrePermuteFusedMaxRoutes): block b owns routes
// [b*rows, b*rows + rows). Three block barriers: after zeroing, after the counts,
// and after warp 0 has scanned the expert starts (<= kMaxE / 32 experts per lane) and
// ranked the block's routes. kMaxE (chunk_experts_cap): the per-expert arrays' size. Every
// E <= 512 runs the 512 instance (its shared memory and occupancy); 1024 only E > 512.
template <int kMaxE>
__global__ void __launch_bounds__(kCopyThreads)
    pre_permute_fused_kernel(const uint4* __restrict__ hidden, int V,
                             const int32_t* __restrict__ ids, int num_routes, int top_k,
                             int num_experts, int alignment, int rows_per_block,
                             uint4* __restrict__ permuted, int32_t* __restrict__ layout_metadata,
                             int32_t* __restrict__ inverse) {
  __shared__ int hist[kMaxE];
  __shared__ int before[kMaxE];
  __shared__ int start[kMaxE];
  __shared__ int dest[kMaxFusedRows];
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  const int tid = threadIdx.x;
  const int r0 = blockIdx.x * rows_per_block;
  const int nr = min(rows_per_block, num_routes - r0);
  const int work = nr * V;

  uint4 pre[kPreload];  // source rows are known up front
#pragma unroll
  for (int j = 0; j < kPreload; ++j) {
    const int g = tid + j * kCopyThreads;
    if (g < work) {
      const int r = g / V;
      pre[j] = __ldg(hidden + static_cast<int64_t>((r0 + r) / top_k) * V + (g - r * V));
    }
  }
  const int my_id = tid < nr ? __ldg(ids + r0 + tid) : -1;  // warp 0 ranks these
  for (int e = tid; e < num_experts; e += kCopyThreads) {
    hist[e] = 0;
    before[e] = 0;
  }
  __syncthreads();
  for (int j0 = 0; j0 < num_routes; j0 += 8 * kCopyThreads) {
    int v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = j0 + u * kCopyThreads + tid;
      v[u] = j < num_routes ? __ldg(ids + j) : -1;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      // One order-free sum per id: into `before` (routes ahead of this block) or
      // `hist` (the rest); warp 0 adds the two.
      if (route::valid_id(v[u], num_experts))
        atomicAdd(j0 + u * kCopyThreads + tid < r0 ? &before[v[u]] : &hist[v[u]], 1);
    }
  }
  pdl_trigger();  // the preloaded rows and every id are loaded
  __syncthreads();
  if (tid < 32) {
    const int lane = tid;
    const int per = (num_experts + 31) / 32;
    const int lo = min(lane * per, num_experts), hi = min(lo + per, num_experts);
    int local = 0;
    for (int x = lo; x < hi; ++x) {
      hist[x] += before[x];
      local += route::align_up(hist[x], alignment);
    }
    int incl = local;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int y = __shfl_up_sync(route::kFullMask, incl, d);
      if (lane >= d) incl += y;
    }
    int run = incl - local;
    for (int x = lo; x < hi; ++x) {
      start[x] = run;
      if (blockIdx.x == 0) layout_metadata[x] = run + hist[x];
      run += route::align_up(hist[x], alignment);
    }
    __syncwarp();
    const int i = r0 + lane;
    int e = my_id;
    if (!route::valid_id(e, num_experts)) e = -1;
    const unsigned peers = __match_any_sync(route::kFullMask, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const int pos = e >= 0 ? start[e] + before[e] + rank : -1;
    if (lane < nr) {
      dest[lane] = pos;
      inverse[i] = pos;
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPreload; ++j) {
    const int g = tid + j * kCopyThreads;
    if (g < work) {
      const int r = g / V;
      const int d = dest[r];
      if (d >= 0) permuted[static_cast<int64_t>(d) * V + (g - r * V)] = pre[j];
    }
  }
  copy_items(hidden, V, r0, top_k, dest, tid + kPreload * kCopyThreads, work, permuted);
}

__global__ void __launch_bounds__(kScatterThreads)
    pre_permute_scatter_kernel(const int32_t* __restrict__ ids, int num_routes, int num_experts,
                               const int32_t* __restrict__ chunk_offsets,
                               const int32_t* __restrict__ g_start, int32_t* __restrict__ inverse) {
  extern __shared__ int smem[];
  int* s_ids = smem;                                    // [kRouteChunk]
  int* warp_cnt = s_ids + kRouteChunk;                  // [kScatterWarps][E]
  int* start = warp_cnt + kScatterWarps * num_experts;  // [E]
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  const route::Chunk ch = route::this_chunk<kRouteChunk>(num_routes);
#pragma unroll 8
  for (int i = ch.tid; i < ch.len; i += kScatterThreads)
    s_ids[i] = route::staged_id(__ldg(ids + ch.c0 + i), num_experts);
  route::scatter_chunk<kScatterThreads, /*kCounts=*/false>(
      s_ids, ch.len, num_experts, warp_cnt, start, g_start, nullptr, nullptr, chunk_offsets,
      [&](int i, int pos) { inverse[ch.c0 + i] = pos; });
}

__global__ void __launch_bounds__(kCopyThreads)
    pre_permute_copy_kernel(const uint4* __restrict__ hidden, int V,
                            const int32_t* __restrict__ inverse, int num_routes, int top_k,
                            int rows_per_block, uint4* __restrict__ permuted) {
  __shared__ int dest[kMaxCopyRows];
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  const int r0 = blockIdx.x * rows_per_block;
  const int nr = min(rows_per_block, num_routes - r0);
  if (threadIdx.x < nr) dest[threadIdx.x] = __ldg(inverse + r0 + threadIdx.x);
  // The row loads and stores alternate in copy_items: trigger before them (the next
  // kernel's CTAs only become resident once every CTA here is).
  pdl_trigger();
  __syncthreads();
  copy_items(hidden, V, r0, top_k, dest, threadIdx.x, nr * V, permuted);
}

}  // namespace

void launch_pre_permute(const PrePermuteLaunch& l, cudaStream_t stream) {
  const int N = l.num_routes, E = l.num_experts;
  const int V = static_cast<int>(l.row_bytes / 16);  // validated: 64 * V < 2^31
  const uint4* hidden = static_cast<const uint4*>(l.hidden);
  uint4* permuted = static_cast<uint4*>(l.permuted);
  if (pre_permute_one_launch(N, E)) {
    // Enough blocks to fill the GPU, at least ~128 vectors per block, at most 32 rows
    // (the best of a rows sweep on the seed shapes, docs/routing-permute.md).
    // N == 0 still runs one block: it writes the (all-zero) layout_metadata.
    int64_t rows = (N + 527) / 528;
    if (V > 0) rows = std::max<int64_t>(rows, (128 + V - 1) / V);
    rows = std::min<int64_t>(std::max<int64_t>(rows, 1), kMaxFusedRows);
    const int blocks = std::max(1, static_cast<int>((N + rows - 1) / rows));
    auto kernel = chunk_experts_cap(E) == kPermuteFusedMaxExperts
                      ? pre_permute_fused_kernel<kPermuteFusedMaxExperts>
                      : pre_permute_fused_kernel<kPermuteMaxExperts>;
    launch_pdl(kernel, dim3(blocks), dim3(kCopyThreads), 0, stream, hidden, V, l.ids, N, l.top_k, E,
               l.alignment, static_cast<int>(rows), permuted, l.layout_metadata, l.inverse_indices);
  } else {
    const RouteChunks rc = launch_route_chunk_count_scan(l.ids, N, E, l.alignment, l.workspace,
                                                         l.layout_metadata, nullptr, stream);
    const int smem = chunk_scatter_smem<pre_permute_scatter_kernel>(kScatterWarps + 1, E);
    launch_pdl(pre_permute_scatter_kernel, dim3(rc.chunks), dim3(kScatterThreads), smem, stream,
               l.ids, N, E, rc.offsets, rc.start, l.inverse_indices);
    if (V > 0) {  // routes only (row_bytes 0): no copy
      const int64_t rows = std::min<int64_t>(kMaxCopyRows, std::max<int64_t>(1, 2048 / V));
      const int64_t blocks = (N + rows - 1) / rows;
      launch_pdl(pre_permute_copy_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kCopyThreads),
                 0, stream, hidden, V, l.inverse_indices, N, l.top_k, static_cast<int>(rows),
                 permuted);
    }
  }
  check_launch("moe_pre_permute");
}

}  // namespace moekit::detail
