// Host helpers for kernel launches: per-device cached queries (a kernel's dynamic
// shared-memory limit, blocks per SM, co-resident clusters) and cudaLaunchKernelEx
// configurations with cluster / PDL / cooperative attributes.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <mutex>

#include "core/device.h"

namespace moekit::detail {

// One kernel's dynamic shared-memory limit (cudaFuncAttributeMaxDynamicSharedMemorySize),
// raised once per device to each larger size asked; thread-safe. The record is per device and
// primary context: after a cudaDeviceReset or in another context a launch fails (check_launch).
class SmemLimit {
 public:
  // cudaSuccess, or the driver's refusal (the CUDA error cleared; the next call asks again).
  cudaError_t raise(const void* kernel, int bytes);

 private:
  std::atomic<int> granted_[kMaxDevices] = {};  // bytes allowed so far, per device
  std::mutex mutex_;                            // serializes the driver calls
};

// Lets Kernel take `bytes` of dynamic shared memory on the current device (over 48 KiB needs
// it); a driver call only the first time per device and size.
template <auto Kernel>
cudaError_t raise_smem_limit(int bytes) {
  static SmemLimit limit;
  return limit.raise(reinterpret_cast<const void*>(Kernel), bytes);
}

// Resident blocks per SM of `kernel` with `threads` threads and `smem` bytes of dynamic
// shared memory (cudaOccupancyMaxActiveBlocksPerMultiprocessor), cached per device; 1 when
// the query fails or says 0 (the error cleared). Raise the kernel's limit first.
int blocks_per_sm(const void* kernel, int threads, size_t smem);

// Clusters of `cluster` blocks (along x) of `threads` threads with `smem` bytes each that
// the device holds at once (cudaOccupancyMaxActiveClusters), cached per device; 0 when the
// query fails (the error cleared).
int co_resident_clusters(const void* kernel, int cluster, int threads, size_t smem);

// A cudaLaunchKernelEx configuration and the attributes asked for (each at most once), in
// the order asked.
// config() points into this object: keep it alive through the launch.
class LaunchConfig {
 public:
  LaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream);
  LaunchConfig& cluster(int blocks);  // clusters of `blocks` blocks along x
  LaunchConfig& pdl();                // programmatic stream serialization (core/pdl.cuh)
  LaunchConfig& cooperative();
  cudaLaunchConfig_t config();

 private:
  cudaLaunchAttribute& add(cudaLaunchAttributeID id);
  cudaLaunchConfig_t config_ = {};
  cudaLaunchAttribute attrs_[3] = {};
  unsigned num_attrs_ = 0;
};

}  // namespace moekit::detail
