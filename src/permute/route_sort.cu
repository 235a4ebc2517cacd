// Multi-block route counting shared by PermuteAlign and PrePermute (large T*K):
// kernel 1 counts each chunk's routes per expert, kernel 2 (one block) turns the
// [chunks, E] counts into per-chunk offsets and the expert starts.
#include "core/check.h"
#include "core/pdl.cuh"
#include "permute/permute_kernels.h"
#include "permute/route_sort.cuh"

namespace moekit::detail {
namespace {

constexpr int kCountThreads = 1024;

// kMaxE (chunk_experts_cap): the histogram's size. Every E <= 512 runs the 512 instance
// (so those launches keep their shared memory and occupancy); 1024 serves only E > 512.
template <int kMaxE>
__global__ void __launch_bounds__(kCountThreads)
    chunk_count_kernel(const int32_t* __restrict__ ids, int num_routes, int num_experts,
                       int32_t* __restrict__ counts) {
  __shared__ int hist[kMaxE];
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int c0 = blockIdx.x * kRouteChunk;
  const int len = min(kRouteChunk, num_routes - c0);
#pragma unroll 8
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const int e = __ldg(ids + c0 + i);
    if (route::valid_id(e, num_experts)) atomicAdd(&hist[e], 1);  // order-free sum
  }
  pdl_trigger();
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x)
    counts[static_cast<int64_t>(blockIdx.x) * num_experts + e] = hist[e];
}

// One block of kMaxE threads: one thread per expert (kMaxE as in chunk_count_kernel).
template <int kMaxE>
__global__ void __launch_bounds__(kMaxE)
    chunk_scan_kernel(int32_t* __restrict__ counts, int chunks, int num_experts, int alignment,
                      int32_t* __restrict__ start_out, int32_t* __restrict__ cnt_out,
                      int32_t* __restrict__ layout_metadata, int32_t* __restrict__ num_post) {
  __shared__ int s_start[kMaxE];
  __shared__ int s_cnt[kMaxE];
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    // Column scan over chunks, 16 loads in flight at a time.
    int run = 0;
    for (int c0 = 0; c0 < chunks; c0 += 16) {
      int v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j)
        v[j] = c0 + j < chunks ? counts[static_cast<int64_t>(c0 + j) * num_experts + e] : 0;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (c0 + j < chunks) counts[static_cast<int64_t>(c0 + j) * num_experts + e] = run;
        run += v[j];
      }
    }
    s_cnt[e] = run;
    s_start[e] = route::align_up(run, alignment);
  }
  pdl_trigger();  // the counts are read (the in-place offsets are written with them)
  __syncthreads();
  const int total = route::block_exclusive_scan(s_start, num_experts);
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    start_out[e] = s_start[e];
    cnt_out[e] = s_cnt[e];
    if (layout_metadata != nullptr) layout_metadata[e] = s_start[e] + s_cnt[e];
  }
  if (threadIdx.x == 0 && num_post != nullptr) *num_post = total;
}

template <int kMaxE>
void launch_count_scan(const int32_t* ids, int num_routes, int num_experts, int alignment,
                       int32_t* counts, int32_t* start, int32_t* cnt, int32_t* layout_metadata,
                       int32_t* num_post_padded, cudaStream_t stream) {
  const int chunks = static_cast<int>(route_chunks(num_routes));
  launch_pdl(chunk_count_kernel<kMaxE>, dim3(chunks), dim3(kCountThreads), 0, stream, ids,
             num_routes, num_experts, counts);
  launch_pdl(chunk_scan_kernel<kMaxE>, dim3(1), dim3(kMaxE), 0, stream, counts, chunks, num_experts,
             alignment, start, cnt, layout_metadata, num_post_padded);
}

}  // namespace

RouteChunks launch_route_chunk_count_scan(const int32_t* ids, int num_routes, int num_experts,
                                          int alignment, void* workspace, int32_t* layout_metadata,
                                          int32_t* num_post_padded, cudaStream_t stream) {
  const int chunks = static_cast<int>(route_chunks(num_routes));
  int32_t* counts = static_cast<int32_t*>(workspace);
  int32_t* start = counts + static_cast<int64_t>(chunks) * num_experts;
  int32_t* cnt = start + num_experts;
  if (chunk_experts_cap(num_experts) == kPermuteFusedMaxExperts) {
    launch_count_scan<kPermuteFusedMaxExperts>(ids, num_routes, num_experts, alignment, counts,
                                               start, cnt, layout_metadata, num_post_padded,
                                               stream);
  } else {
    launch_count_scan<kPermuteMaxExperts>(ids, num_routes, num_experts, alignment, counts, start,
                                          cnt, layout_metadata, num_post_padded, stream);
  }
  return {chunks, counts, start, cnt};
}

}  // namespace moekit::detail
