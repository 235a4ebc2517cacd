// GPU test helpers: skip without a GPU, device buffers, host<->device copies.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/pdl.h"
#include "reference/host_tensor.h"

namespace moekit::testing {

// True when a CUDA device of compute capability 9.x is present.
bool gpu_available();

// Skips the current test, saying why, when no Hopper GPU is present.
#define MOEKIT_REQUIRE_GPU()                                                          \
  do {                                                                                \
    if (!::moekit::testing::gpu_available())                                          \
      GTEST_SKIP() << "no Hopper (sm_90) CUDA GPU on this machine: GPU test skipped"; \
  } while (0)

#define MOEKIT_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(expr)

// A device copy of a host tensor (same dtype and shape); frees on destruction.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& host);                                 // uploads
  DeviceTensor(DType dtype, std::vector<int64_t> shape, uint8_t poison = 0xFF);  // poisoned
  ~DeviceTensor();
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& o) noexcept;
  DeviceTensor& operator=(DeviceTensor&& o) noexcept;

  TensorView view() const;
  HostTensor download() const;
  void upload(const HostTensor& host);
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kUndefined;
  std::vector<int64_t> shape_;
};

// Device scratch memory for an op's workspace.
class DeviceWorkspace {
 public:
  explicit DeviceWorkspace(size_t bytes);
  ~DeviceWorkspace();
  DeviceWorkspace(const DeviceWorkspace&) = delete;
  DeviceWorkspace& operator=(const DeviceWorkspace&) = delete;
  Workspace get() const { return {data_, bytes_}; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// detail::pdl_override() (0 default, 1 on, 2 off) for one scope.
class ScopedPdl {
 public:
  explicit ScopedPdl(int v) : prev_(detail::pdl_override()) { detail::pdl_override() = v; }
  ~ScopedPdl() { detail::pdl_override() = prev_; }
  ScopedPdl(const ScopedPdl&) = delete;
  ScopedPdl& operator=(const ScopedPdl&) = delete;

 private:
  int prev_;
};

}  // namespace moekit::testing
