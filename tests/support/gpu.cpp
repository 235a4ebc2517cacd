#include "support/gpu.h"

#include <stdexcept>
#include <string>

namespace moekit::testing {

static void cuda_or_throw(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

bool gpu_available() {
  static const bool available = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      return false;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
    return prop.major == 9;
  }();
  return available;
}

DeviceTensor::DeviceTensor(const HostTensor& host) : dtype_(host.dtype()), shape_(host.shape()) {
  size_t bytes = host.nbytes();
  cuda_or_throw(cudaMalloc(&data_, bytes ? bytes : 256), "cudaMalloc");
  if (bytes) cuda_or_throw(cudaMemcpy(data_, host.data(), bytes, cudaMemcpyHostToDevice), "upload");
}

DeviceTensor::DeviceTensor(DType dtype, std::vector<int64_t> shape, uint8_t poison)
    : dtype_(dtype), shape_(std::move(shape)) {
  size_t bytes = HostTensor(dtype_, shape_).nbytes();
  cuda_or_throw(cudaMalloc(&data_, bytes ? bytes : 256), "cudaMalloc");
  if (bytes) cuda_or_throw(cudaMemset(data_, poison, bytes), "cudaMemset");
  // cudaMemset runs on the legacy default stream, which a non-blocking stream does not wait
  // for: without this the poison could land after a test's kernel wrote its output.
  cuda_or_throw(cudaDeviceSynchronize(), "cudaMemset (sync)");
}

DeviceTensor::~DeviceTensor() {
  if (data_) cudaFree(data_);
}

DeviceTensor::DeviceTensor(DeviceTensor&& o) noexcept
    : data_(o.data_), dtype_(o.dtype_), shape_(std::move(o.shape_)) {
  o.data_ = nullptr;
}

DeviceTensor& DeviceTensor::operator=(DeviceTensor&& o) noexcept {
  if (this != &o) {
    if (data_) cudaFree(data_);
    data_ = o.data_;
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    o.data_ = nullptr;
  }
  return *this;
}

TensorView DeviceTensor::view() const {
  return make_view(data_, dtype_, static_cast<int>(shape_.size()), shape_.data());
}

HostTensor DeviceTensor::download() const {
  HostTensor host(dtype_, shape_);
  if (host.nbytes()) {
    cuda_or_throw(cudaMemcpy(host.data(), data_, host.nbytes(), cudaMemcpyDeviceToHost),
                  "download");
  }
  return host;
}

void DeviceTensor::upload(const HostTensor& host) {
  if (host.nbytes()) {
    cuda_or_throw(cudaMemcpy(data_, host.data(), host.nbytes(), cudaMemcpyHostToDevice), "upload");
  }
}

DeviceWorkspace::DeviceWorkspace(size_t bytes) : bytes_(bytes) {
  if (bytes) cuda_or_throw(cudaMalloc(&data_, bytes), "cudaMalloc workspace");
}

DeviceWorkspace::~DeviceWorkspace() {
  if (data_) cudaFree(data_);
}

}  // namespace moekit::testing
