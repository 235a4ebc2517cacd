// An owning host tensor for references, tests and input generation.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "moekit/tensor.h"

namespace moekit {

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);  // zero-filled

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  size_t nbytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  TensorView view() const;  // a host view (ops' references take these)

  double at(int64_t i) const;         // widened to double
  void set(int64_t i, double value);  // rounded to the dtype
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(bytes_.data());
  }
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes_.data());
  }

  // Every element ~ N(mean, stddev^2), rounded to the dtype.
  void fill_normal(std::mt19937_64& rng, double stddev = 1.0, double mean = 0.0);
  // Every byte set to `byte` (poison).
  void fill_bytes(uint8_t byte);

 private:
  DType dtype_ = DType::kUndefined;
  std::vector<int64_t> shape_;
  std::vector<uint8_t> bytes_;
};

// The elements of a host view, widened to double (the CPU references' f64 inputs).
std::vector<double> to_doubles(const TensorView& t);

}  // namespace moekit
