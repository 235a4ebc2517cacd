#include "moekit/tensor.h"

#include <string>

#include "moekit/error.h"

namespace moekit {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF32:
      return "f32";
    case DType::kI32:
      return "i32";
    case DType::kFP8E4M3:
      return "fp8e4m3";
    case DType::kI64:
      return "i64";
    case DType::kUndefined:
      break;
  }
  return "undefined";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kFP8E4M3:
      return 1;
    case DType::kI64:
      return 8;
    case DType::kUndefined:
      break;
  }
  return 0;
}

// ndim clamped to the storage: a view whose ndim was set out of range never reads past
// its shape and stride arrays (ArgCheck refuses it; describe() says so).
static int stored_dims(int ndim) {
  return ndim < 0 ? 0 : ndim > kMaxDims ? kMaxDims : ndim;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < stored_dims(ndim); ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = stored_dims(ndim) - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  if (!defined()) return "undefined";
  // Plain string appends, no ostringstream: some validation paths build this eagerly.
  std::string s = dtype_size(dtype) ? std::string(dtype_name(dtype))
                                    : "dtype code " + std::to_string(static_cast<int>(dtype));
  if (ndim < 0 || ndim > kMaxDims) return s + " with ndim " + std::to_string(ndim) + " (not 0..4)";
  s += "[";
  for (int d = 0; d < ndim; ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  s += "]";
  return s;
}

TensorView make_view(const void* data, DType dtype, int ndim, const int64_t* shape) {
  if (ndim < 0 || ndim > kMaxDims) {
    throw Error("moekit::make_view: argument 'ndim': expected 0.." + std::to_string(kMaxDims) +
                ", got " + std::to_string(ndim));
  }
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 0) {
      std::string dims;
      for (int i = 0; i < ndim; ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
      throw Error("moekit::make_view: argument 'shape': expected non-negative sizes, got [" + dims +
                  "]");
    }
  }
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = dtype;
  v.ndim = ndim;
  uint64_t s = 1;  // unsigned: absurd sizes wrap instead of overflowing (ArgCheck refuses them)
  for (int d = ndim - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.stride[d] = static_cast<int64_t>(s);
    s *= static_cast<uint64_t>(shape[d]);
  }
  return v;
}

TensorView make_view(const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return make_view(data, dtype, static_cast<int>(shape.size()), shape.begin());
}

int64_t permuted_rows(int64_t num_tokens, int top_k, int num_local_experts, int alignment) {
  return num_tokens * top_k + static_cast<int64_t>(num_local_experts) * (alignment - 1);
}

}  // namespace moekit
