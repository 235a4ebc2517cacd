#include "core/device.h"

#include <cuda_runtime_api.h>

#include <mutex>

namespace moekit::detail {
namespace {

// query(device) once per device, thread-safe; `none` without a usable device.
template <class T, class Query>
const T& per_device(Query query) {
  static T values[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  static const T none{};
  const int device = current_device();
  if (device < 0) return none;
  std::call_once(once[device], [&] { values[device] = query(device); });
  return values[device];
}

DeviceProps query_props(int device) {
  DeviceProps p;
  int major = 0, minor = 0, sms = 0;
  const bool ok =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess;
  if (!ok) {
    cudaGetLastError();
    return p;
  }
  p.arch = major * 10 + minor;
  p.sms = sms;
  int pageable = 0;
  if (cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device) != cudaSuccess) {
    cudaGetLastError();
    pageable = 0;
  }
  p.pageable_access = pageable != 0;
  return p;
}

std::string query_name(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return prop.name;
}

}  // namespace

int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

DeviceProps h200_props() {
  DeviceProps p;
  p.arch = 90;
  p.sms = 132;
  return p;
}

const DeviceProps& device_props() {
  return per_device<DeviceProps>(query_props);
}

const std::string& device_name() {
  return per_device<std::string>(query_name);
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
