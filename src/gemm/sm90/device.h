// Host helper of the SM90 kernels' launches: the dynamic schedule's tile counter.
#pragma once

#include <cuda_runtime_api.h>

namespace moekit::detail {

// Trailing waves a dynamic SM90 launch hands out from its counter: every tile after each
// block's first (docs/gemm.md "Persistent grid and dynamic schedule").
constexpr int kSm90DynamicAll = 1 << 20;

// The counter of one launch: `counter` zeroed on `stream` (*waves = kSm90DynamicAll), or,
// for a static launch (counter nullptr), nullptr (*waves = -1). Throws moekit::Error
// naming `op` when the zeroing fails.
unsigned* sm90_tile_counter(unsigned* counter, cudaStream_t stream, const char* op, int* waves);

}  // namespace moekit::detail
