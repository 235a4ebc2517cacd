#include "gemm/sm90_device.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

#include "moekit/error.h"

namespace moekit::detail {

int sm90_sm_count() {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return 0;
  }
  if (cached[device] == 0) {
    int major = 0, sms = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      major = 0;
    }
    cached[device] = major == 9 ? sms : -1;
  }
  return cached[device] > 0 ? cached[device] : 0;
}

int& sm90_dynamic_override() {
  static int v = 0;
  return v;
}

bool sm90_use_dynamic(bool pingpong, bool dense_rows) {
  static const int env = [] {
    const char* v = std::getenv("MOEKIT_SM90_DYNAMIC");
    return v && *v ? std::atoi(v) : -1;
  }();
  const int o = sm90_dynamic_override();
  if (o == 1 || o == 2) return o == 1;
  if (env == 0 || env == 1) return env == 1;
  return !pingpong && !dense_rows;
}

unsigned* sm90_tile_counter(unsigned* counter, bool pingpong, bool dense_rows, cudaStream_t stream,
                            const char* op) {
  if (!counter || !sm90_use_dynamic(pingpong, dense_rows)) return nullptr;
  const cudaError_t err = cudaMemsetAsync(counter, 0, sizeof(unsigned), stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("moekit::") + op +
                ": zeroing the tile counter in the workspace failed: " + cudaGetErrorString(err));
  }
  return counter;
}

}  // namespace moekit::detail
