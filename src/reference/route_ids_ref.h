// The engine ids of the reference ops (docs/routing-permute.md, "Engine ids"): route
// ids held as i32 or i64, optionally global ids read through an expert map.
#pragma once

#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::reference {

// The local expert of route i (flat index into ids), or -1: ids[i] through the map when
// one is given (-1 when the id is outside the map), kept when in [0, num_local).
inline int64_t local_expert(const TensorView& ids, int64_t i, const TensorView& expert_map,
                            int64_t num_local) {
  const int64_t id = ids.dtype == DType::kI64 ? ids.ptr<const int64_t>()[i]
                                              : static_cast<int64_t>(ids.ptr<const int32_t>()[i]);
  int64_t local = id;
  if (expert_map.defined())
    local = id >= 0 && id < expert_map.numel() ? expert_map.ptr<const int32_t>()[id] : -1;
  return local >= 0 && local < num_local ? local : -1;
}

}  // namespace moekit::reference
