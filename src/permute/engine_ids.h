// Route ids as engines hold them: i64 ids, or global ids with an expert map (expert
// parallelism). The routed kernels read i32 local ids only, so such ids are translated
// by ONE small pass into workspace that runs only when a call has a map or i64 ids: the
// default path (i32 local ids, no map) launches exactly the kernels it always did
// (docs/routing-permute.md, "Engine ids"). The layer ops, which produce their own ids,
// map them in the routing kernel instead (FusedTopKLaunch::expert_map).
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// Whether ids (i32 or i64) with an optional expert map need the translation pass.
inline bool ids_need_translation(const TensorView& ids, const TensorView& expert_map) {
  return expert_map.defined() || ids.dtype != DType::kI32;
}

// Workspace bytes of `routes` translated ids (i32; the carvers round up to 256 bytes).
inline size_t translated_ids_bytes(int64_t routes) {
  return static_cast<size_t>(routes) * sizeof(int32_t);
}

// An optional expert_map: [E_global] i32, 1 to 2^31-1 entries (`len`: the length it
// must have, or kAnyDim). Returns its length, 0 when absent.
inline int64_t check_expert_map(const ArgCheck& c, const TensorView& expert_map,
                                int64_t len = kAnyDim) {
  if (!expert_map.defined()) return 0;
  c.tensor("expert_map", expert_map, {DType::kI32}, {len});
  const int64_t n = expert_map.size(0);
  MOEKIT_REQUIRE(c, n >= 1 && n <= INT32_MAX, "expert_map",
                 "1 to 2^31-1 entries (one per global expert)", expert_map.describe());
  return n;
}

// local_ids[r] for every route r < num_routes, with id = ids[r]:
//   with a map:    map[id] when 0 <= id < map_size and 0 <= map[id] < num_local, else -1;
//   without a map: id when 0 <= id < num_local, else -1.
// An i64 id is compared as i64 (never truncated to 32 bits first).
struct IdTranslation {
  const void* ids = nullptr;  // [num_routes] i32 or i64
  DType ids_dtype = DType::kI32;
  int64_t num_routes = 0;
  const int32_t* expert_map = nullptr;  // optional [map_size]
  int64_t map_size = 0;
  int num_local = 0;
  int32_t* local_ids = nullptr;      // out [num_routes]
  const char* op = "translate_ids";  // named by a launch error
};
void launch_translate_ids(const IdTranslation& t, cudaStream_t stream);

// The translation of validated ids [T, K] (with the optional map) into local_ids [T*K]
// (translated_ids_bytes(T*K) of workspace); returns local_ids.
const int32_t* translate_ids_into(const TensorView& ids, const TensorView& expert_map,
                                  int num_local, int32_t* local_ids, cudaStream_t stream);

}  // namespace moekit::detail
