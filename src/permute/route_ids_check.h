// Validation shared by the two ops that sort routes (moe_permute_align, moe_pre_permute)
// and by their workspace-size queries.
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

// The workspace of an op that sorts routes: the translated ids first (engine ids,
// engine_ids.h; 256-byte aligned), then the op's own scratch of `own` bytes.
inline size_t with_translated_ids(bool translate, int64_t routes, size_t own) {
  if (!translate) return own;
  return (translated_ids_bytes(routes) + 255) / 256 * 256 + own;
}

}  // namespace moekit::detail
