#include "core/device.h"

#include <cuda_runtime_api.h>

#include <mutex>

namespace moekit::detail {
namespace {

constexpr int kMaxDevices = 64;

int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

DeviceProps query(int device) {
  DeviceProps p;
  int major = 0, minor = 0, sms = 0, l2 = 0, smem_sm = 0, smem_block = 0;
  const bool ok =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) ==
          cudaSuccess &&
      cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          cudaSuccess;
  if (!ok) {
    cudaGetLastError();
    return p;
  }
  p.arch = major * 10 + minor;
  p.sms = sms;
  p.l2_bytes = l2;
  p.smem_per_sm = smem_sm;
  p.smem_per_block = smem_block;
  return p;
}

}  // namespace

DeviceProps h200_props() {
  DeviceProps p;
  p.arch = 90;
  p.sms = 132;
  p.l2_bytes = 60 * 1024 * 1024;
  p.smem_per_sm = 233472;
  p.smem_per_block = 232448;
  return p;
}

const DeviceProps& device_props() {
  static DeviceProps props[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  static const DeviceProps none{};
  const int device = current_device();
  if (device < 0) return none;
  std::call_once(once[device], [device] { props[device] = query(device); });
  return props[device];
}

int device_cached(int slot, int (*query_fn)()) {
  static int values[kMaxDevices][kDeviceCacheSlots];
  static std::once_flag once[kMaxDevices][kDeviceCacheSlots];
  const int device = current_device();
  if (device < 0 || slot < 0 || slot >= kDeviceCacheSlots) return query_fn();
  std::call_once(once[device][slot], [&] { values[device][slot] = query_fn(); });
  return values[device][slot];
}

}  // namespace moekit::detail
