// Rows in the contiguous(alignment) layout of permuted rows (activation.h ActivationLaunch,
// fp8_mlp.h Fp8RowGroups, quantize_fp8.h QuantizeFp8Launch): group e holds rows
// [align_up(ends[e-1], alignment), ends[e]) (ends sorted, ends[-1] = 0); the rows between groups
// are padding.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moekit::detail {

// The group row r falls in or before: the first e with ends[e] > r (E if none).
__device__ __forceinline__ int group_ending_after(const int32_t* ends, int E, int64_t r) {
  int lo = 0, hi = E;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (ends[mid] > r) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Whether row r (< ends[e]) lies in group e, past the padding before the group's aligned
// start.
__device__ __forceinline__ bool past_group_start(const int32_t* ends, int e, int alignment,
                                                 int64_t r) {
  const int64_t prev = e > 0 ? ends[e - 1] : 0;
  const int64_t start = (prev + alignment - 1) / alignment * alignment;
  return r >= start;
}

// Whether row r holds data: every row without `ends`; else r lies in one of the E groups.
__device__ __forceinline__ bool row_in_groups(int64_t r, const int32_t* ends, int E,
                                              int alignment) {
  if (ends == nullptr) return true;
  const int e = group_ending_after(ends, E, r);
  return e < E && past_group_start(ends, e, alignment, r);
}

}  // namespace moekit::detail
