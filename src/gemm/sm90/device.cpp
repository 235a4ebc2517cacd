#include "gemm/sm90/device.h"

#include <cuda_runtime_api.h>

#include <string>

#include "moekit/error.h"

namespace moekit::detail {

unsigned* sm90_tile_counter(unsigned* counter, cudaStream_t stream, const char* op, int* waves) {
  *waves = counter ? kSm90DynamicAll : -1;
  if (!counter) return nullptr;
  const cudaError_t err = cudaMemsetAsync(counter, 0, sizeof(unsigned), stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("moekit::") + op +
                ": zeroing the tile counter in the workspace failed: " + cudaGetErrorString(err));
  }
  return counter;
}

}  // namespace moekit::detail
