#include "gemm/sm90_device.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>

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

unsigned* sm90_dynamic_tile_counter(cudaStream_t stream) {
  static const bool env = [] {
    const char* v = std::getenv("MOEKIT_SM90_DYNAMIC");
    return v && std::atoi(v) == 1;
  }();
  const int o = sm90_dynamic_override();
  if (o == 2 || (o != 1 && !env)) return nullptr;
  constexpr int kMaxDevices = 64, kPool = 1024;
  static unsigned* pools[kMaxDevices] = {};
  static std::atomic<unsigned> next{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return nullptr;
  }
  if (!pools[device]) {
    void* mem = nullptr;
    if (cudaMalloc(&mem, kPool * sizeof(unsigned)) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    pools[device] = static_cast<unsigned*>(mem);
  }
  unsigned* c = pools[device] + next.fetch_add(1) % kPool;
  if (cudaMemsetAsync(c, 0, sizeof(unsigned), stream) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return c;
}

}  // namespace moekit::detail
