#include "gemm/sm90_device.h"

#include <cuda_runtime_api.h>

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

}  // namespace moekit::detail
