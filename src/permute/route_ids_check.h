// Validation, workspace layout and id inputs shared by the two ops that sort routes
// (moe_permute_align, moe_pre_permute) and by their workspace-size queries; the rows check
// of the ops that move rows (moe_pre_permute, moe_post_permute).
#pragma once

#include <cstdint>
#include <string>

#include "core/check.h"
#include "permute/engine_ids.h"
#include "permute/permute_kernels.h"

namespace moekit::detail {

// ids [T, K] i32 or i64 (`T` may be kAnyDim) with K >= 1 and a route count the
// multi-kernel path can count in i32 chunks, and the expert count (1..kPermuteMaxExperts).
// Returns T*K.
inline int64_t check_route_ids(const ArgCheck& check, const char* ids_name, const TensorView& ids,
                               int64_t T, const char* experts_name, int num_experts) {
  check.tensor(ids_name, ids, {DType::kI32, DType::kI64}, {T, kAnyDim});
  const int64_t K = ids.size(1);
  MOEKIT_REQUIRE(check, K >= 1, ids_name, "at least one route per token (dim 1 >= 1)",
                 ids.describe());
  MOEKIT_REQUIRE(check, num_experts >= 1 && num_experts <= kPermuteMaxExperts, experts_name,
                 "1 to " + std::to_string(kPermuteMaxExperts), std::to_string(num_experts));
  const int64_t N = ids.size(0) * K;
  MOEKIT_REQUIRE(check, N <= INT32_MAX - kRouteChunk, ids_name,
                 "at most 2^31-1-" + std::to_string(kRouteChunk) + " routes (T*K)", ids.describe());
  return N;
}

// Rows [any, H] (bf16 / f16 / f32, 16-byte aligned) with H a multiple of 8 (the kernels'
// 16-byte vectors). Returns H.
inline int64_t check_permute_rows(const ArgCheck& check, const char* name, const TensorView& rows) {
  check.tensor(name, rows, {DType::kBF16, DType::kF16, DType::kF32}, {kAnyDim, kAnyDim}, 16);
  const int64_t H = rows.size(1);
  MOEKIT_REQUIRE(check, H >= 8 && H % 8 == 0, name, "a hidden size that is a multiple of 8",
                 rows.describe());
  return H;
}

// The workspace of an op that sorts routes: the translated ids first (engine ids,
// engine_ids.h; 256-byte aligned), then the chunked kernels' scratch (none when the op
// runs its one-launch kernel).
inline size_t translated_ids_head(int64_t routes) {
  return (translated_ids_bytes(routes) + 255) / 256 * 256;
}
inline size_t sort_workspace_bytes(const TensorView& ids, const TensorView& expert_map,
                                   int64_t routes, int num_experts, bool one_launch) {
  const size_t own = one_launch ? 0 : route_chunk_workspace_bytes(routes, num_experts);
  return (ids_need_translation(ids, expert_map) ? translated_ids_head(routes) : 0) + own;
}

// The sorting kernels' i32 local ids and scratch in that workspace: ids as given, or engine
// ids translated into its head (out-of-range ones as -1).
struct SortInputs {
  const int32_t* ids;
  void* scratch;
};
inline SortInputs sort_inputs(const TensorView& ids, const TensorView& expert_map, int num_local,
                              int64_t routes, const Workspace& ws, cudaStream_t stream) {
  if (!ids_need_translation(ids, expert_map)) return {ids.ptr<const int32_t>(), ws.data};
  return {translate_ids_into(ids, expert_map, num_local, static_cast<int32_t*>(ws.data), stream),
          static_cast<char*>(ws.data) + translated_ids_head(routes)};
}

}  // namespace moekit::detail
