// Internal: kernel launches of the permute ops, called by the .cpp files after
// validation, and the sizing rules both sides share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/kernel_launch.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// The expert count the permute ops take (the grouped GEMMs' group limit).
constexpr int kPermuteMaxExperts = 1024;
// The expert count of the 512-expert kernels and instances. Up to it both ops launch
// only those (the seed shapes' kernels, grids and blocks, untouched). Above it:
// PermuteAlign's one-launch kernel (whose u16 warp-count table would need 64 KiB at
// 1024 experts) gives way to the chunked kernels at every route count; PrePermute's
// one-launch kernel and the chunked count / scan run their 1024-expert instances; the
// scatter kernels size their dynamic shared memory by E.
constexpr int kPermuteFusedMaxExperts = 512;
// PermuteAlign runs as one launch (every block recounts all ids) up to this many
// routes; above it, three kernels over chunks of kRouteChunk routes.
constexpr int64_t kAlignFusedMaxRoutes = 32768;
// PrePermute runs as one fused kernel (each block recounts all ids) up to this
// many routes; above it, count / scan / scatter / copy kernels.
constexpr int64_t kPrePermuteFusedMaxRoutes = 4096;
constexpr int kRouteChunk = 8192;
// Chunks of the multi-kernel paths: at least one, so that without routes (T = 0 above 512
// experts) the scan and the fill still run (a grid of 0 blocks is a launch error).
inline int64_t route_chunks(int64_t num_routes) {
  return num_routes > 0 ? (num_routes + kRouteChunk - 1) / kRouteChunk : 1;
}

// Whether each op runs its one-launch kernel (else the chunked kernels, which need
// route_chunk_workspace_bytes of workspace).
inline bool align_one_launch(int64_t num_routes, int num_experts) {
  return num_routes <= kAlignFusedMaxRoutes && num_experts <= kPermuteFusedMaxExperts;
}
inline bool pre_permute_one_launch(int64_t num_routes, int /*num_experts*/) {
  return num_routes <= kPrePermuteFusedMaxRoutes;
}
// The expert count a templated kernel's shared arrays (and the chunk scan's block) are
// sized for: kPermuteFusedMaxExperts up to it (the launches E <= 512 always had), else
// kPermuteMaxExperts.
inline int chunk_experts_cap(int num_experts) {
  return num_experts <= kPermuteFusedMaxExperts ? kPermuteFusedMaxExperts : kPermuteMaxExperts;
}

// Scratch of the multi-kernel paths: per-chunk expert counts [chunks, E], then
// expert starts [E] and counts [E] (i32), rounded up to 256 bytes.
inline size_t route_chunk_workspace_bytes(int64_t num_routes, int num_experts) {
  const int64_t chunks = route_chunks(num_routes);
  const size_t bytes = static_cast<size_t>(chunks + 2) * static_cast<size_t>(num_experts) * 4;
  return (bytes + 255) / 256 * 256;
}

struct AlignLaunch {
  const int32_t* topk_ids = nullptr;
  int num_routes = 0;  // T*K
  int num_experts = 0;
  int block_size = 0;
  int32_t* sorted_token_ids = nullptr;
  int sorted_size = 0;
  int32_t* expert_ids = nullptr;
  int num_blocks = 0;
  int32_t* num_tokens_post_padded = nullptr;
  void* workspace = nullptr;  // route_chunk_workspace_bytes() when multi-block
};
void launch_permute_align(const AlignLaunch& l, cudaStream_t stream);

struct PrePermuteLaunch {
  const void* hidden = nullptr;  // [T, H], rows of row_bytes (a multiple of 16)
  // 0: the routes only (layout_metadata, inverse_indices; hidden and permuted unused), as
  // the FP8 pre-permute (quantize_fp8.h) runs them before its own row pass.
  int64_t row_bytes = 0;
  const int32_t* ids = nullptr;  // [T, K]
  int num_routes = 0;
  int top_k = 0;
  int num_experts = 0;
  int alignment = 1;
  void* permuted = nullptr;
  int32_t* layout_metadata = nullptr;
  int32_t* inverse_indices = nullptr;
  void* workspace = nullptr;
};
void launch_pre_permute(const PrePermuteLaunch& l, cudaStream_t stream);

struct PostPermuteLaunch {
  const void* expert_output = nullptr;  // [P, H]
  DType in_dtype = DType::kUndefined;
  int64_t num_rows = 0;  // P
  int64_t hidden = 0;    // H, a multiple of 8
  const float* topk_weights = nullptr;
  const int32_t* inverse_indices = nullptr;
  int64_t num_tokens = 0;
  int top_k = 0;
  void* out = nullptr;
  DType out_dtype = DType::kUndefined;
};
void launch_post_permute(const PostPermuteLaunch& l, cudaStream_t stream);

// The small post-permute kernel takes the shape: top_k <= 8 and every index it forms
// (t*H + col, row*H + col, t*K + k, the thread id) fits in a signed 32-bit int.
inline bool post_permute_small_ok(const PostPermuteLaunch& l) {
  constexpr int64_t kMax = INT32_MAX;
  return l.top_k >= 1 && l.top_k <= 8 && l.hidden <= kMax && l.num_tokens <= kMax &&
         l.num_tokens * l.hidden <= kMax && l.num_rows * l.hidden <= kMax &&
         l.num_tokens * l.top_k <= kMax;
}

// n / d == (umulhi(n, magic) + n) >> shift for every 0 <= n < 2^31 and 1 <= d < 2^31
// (Granlund-Montgomery round-up multiplier; the sum cannot overflow 32 bits since
// umulhi(n, magic) <= n < 2^31). Checked exhaustively on ranges by a CPU test.
struct PostPermuteDivisor {
  uint32_t magic;
  int shift;
};
inline PostPermuteDivisor post_permute_divisor(int d) {
  int l = 0;
  while ((int64_t{1} << l) < d) ++l;  // l = ceil(log2(d))
  const uint64_t two_l = uint64_t{1} << l;
  const uint64_t m =
      ((uint64_t{1} << 32) * (two_l - static_cast<uint64_t>(d))) / static_cast<uint64_t>(d) + 1;
  return {static_cast<uint32_t>(m), l};
}
inline uint32_t post_permute_divide(uint32_t n, PostPermuteDivisor dv) {
  const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * dv.magic) >> 32);
  return (hi + n) >> dv.shift;
}

// Multi-kernel building blocks shared by PermuteAlign and PrePermute (route_sort.cu).
// counts[c][e] = routes of chunk c with id e; then, in place, the number of such
// routes in earlier chunks; start[e] / cnt[e] in the workspace tail; optional
// layout_metadata[e] = start + cnt and num_tokens_post_padded = padded total.
struct RouteChunks {
  int chunks = 0;                    // of kRouteChunk routes
  const int32_t* offsets = nullptr;  // [chunks, E] the counts turned offsets
  const int32_t* start = nullptr;    // [E]
  const int32_t* cnt = nullptr;      // [E]
};
RouteChunks launch_route_chunk_count_scan(const int32_t* ids, int num_routes, int num_experts,
                                          int alignment, void* workspace, int32_t* layout_metadata,
                                          int32_t* num_post_padded, cudaStream_t stream);

// The dynamic shared memory of chunk scatter Kernel at E experts: kRouteChunk ids and
// `per_expert` ints per expert (the kernel allowed the most its E's cap takes).
template <auto Kernel>
int chunk_scatter_smem(int per_expert, int num_experts) {
  raise_smem_limit<Kernel>((kRouteChunk + per_expert * chunk_experts_cap(num_experts)) * 4);
  return (kRouteChunk + per_expert * num_experts) * 4;
}

}  // namespace moekit::detail
