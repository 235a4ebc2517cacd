#include "gemm/sm90/device.h"

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

int sm90_dynamic_waves(bool pingpong, bool dense_rows) {
  static const int env = [] {
    const char* v = std::getenv("MOEKIT_SM90_DYNAMIC");
    return v && *v ? std::atoi(v) : -1;
  }();
  static const int env_tail = [] {
    const char* v = std::getenv("MOEKIT_SM90_DYNAMIC_TAIL");
    return v && *v ? std::atoi(v) : 0;
  }();
  switch (sm90_dynamic_override()) {
    case 1:
      return kSm90DynamicAll;
    case 2:
      return -1;
    case 3:
      return 1;
    default:
      break;
  }
  if (env == 0) return -1;
  if (env == 1) return kSm90DynamicAll;
  if (!pingpong) return dense_rows ? -1 : kSm90DynamicAll;
  return env_tail >= 1 ? env_tail : -1;
}

bool sm90_dynamic_mlp() {
  static const bool on = [] {
    const char* v = std::getenv("MOEKIT_SM90_DYNAMIC_MLP");
    return !(v && *v && std::atoi(v) == 0);
  }();
  return on;
}

unsigned* sm90_tile_counter(unsigned* counter, bool pingpong, bool dense_rows, cudaStream_t stream,
                            const char* op, int* waves) {
  *waves = counter ? sm90_dynamic_waves(pingpong, dense_rows) : -1;
  if (*waves < 0) return nullptr;
  const cudaError_t err = cudaMemsetAsync(counter, 0, sizeof(unsigned), stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("moekit::") + op +
                ": zeroing the tile counter in the workspace failed: " + cudaGetErrorString(err));
  }
  return counter;
}

}  // namespace moekit::detail
