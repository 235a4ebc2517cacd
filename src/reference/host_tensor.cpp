#include "reference/host_tensor.h"

#include <cstring>

#include "core/host_dtype.h"

namespace moekit {

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  bytes_.assign(static_cast<size_t>(numel()) * dtype_size(dtype_), 0);
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

TensorView HostTensor::view() const {
  return make_view(bytes_.data(), dtype_, static_cast<int>(shape_.size()), shape_.data());
}

std::vector<double> to_doubles(const TensorView& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = host::load(t, i);
  return v;
}

double HostTensor::at(int64_t i) const {
  return host::load(view(), i);
}

void HostTensor::set(int64_t i, double value) {
  host::store(view(), i, value);
}

void HostTensor::fill_normal(std::mt19937_64& rng, double stddev, double mean) {
  std::normal_distribution<double> dist(mean, stddev);
  TensorView v = view();
  for (int64_t i = 0, n = numel(); i < n; ++i) host::store(v, i, dist(rng));
}

void HostTensor::fill_bytes(uint8_t byte) {
  std::memset(bytes_.data(), byte, bytes_.size());
}

}  // namespace moekit
