#include "core/check.h"

#include <cuda_runtime_api.h>

#include <sstream>

namespace moekit::detail {

std::string shape_string(std::initializer_list<int64_t> shape) {
  // Plain string appends: no ostringstream (its locale setup costs ~1 us per call).
  std::string s = "[";
  bool first = true;
  for (int64_t d : shape) {
    if (!first) s += ", ";
    s += d == kAnyDim ? std::string("*") : std::to_string(d);
    first = false;
  }
  s += "]";
  return s;
}

static std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}

void ArgCheck::fail(const std::string& arg, const std::string& expected,
                    const std::string& got) const {
  throw Error(std::string("moekit::") + op_ + ": argument '" + arg + "': expected " + expected +
              ", got " + got);
}

void ArgCheck::tensor(const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
                      std::initializer_list<int64_t> shape, size_t align_bytes) const {
  // Messages are built only on failure: this runs for every tensor of every call.
  if (!t.defined()) {
    fail(name, dtype_list(dtypes) + " tensor of shape " + shape_string(shape),
         "an undefined tensor");
  }
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok |= (d == t.dtype);
  if (!dtype_ok) fail(name, "dtype " + dtype_list(dtypes), t.describe());
  bool shape_ok = t.ndim == static_cast<int>(shape.size());
  int d = 0;
  for (int64_t want : shape) {
    if (shape_ok && want != kAnyDim && t.shape[d] != want) shape_ok = false;
    ++d;
  }
  if (!shape_ok) fail(name, "shape " + shape_string(shape), t.describe());
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) fail(name, "non-negative sizes", t.describe());
  }
  if (!t.is_contiguous()) fail(name, "a contiguous row-major tensor", "strides that are not");
  if (t.numel() > 0 && t.data == nullptr) fail(name, "a non-null data pointer", "nullptr");
  size_t align = align_bytes ? align_bytes : dtype_size(t.dtype);
  if (t.data && reinterpret_cast<uintptr_t>(t.data) % align != 0) {
    std::ostringstream os;
    os << "pointer " << t.data;
    fail(name, "data aligned to " + std::to_string(align) + " bytes", os.str());
  }
}

void ArgCheck::optional_tensor(const char* name, const TensorView& t,
                               std::initializer_list<DType> dtypes,
                               std::initializer_list<int64_t> shape, size_t align_bytes) const {
  if (t.defined()) tensor(name, t, dtypes, shape, align_bytes);
}

void ArgCheck::same_dtype(const char* name, const TensorView& t, const char* other_name,
                          const TensorView& other) const {
  if (t.dtype != other.dtype) {
    fail(name, std::string("dtype ") + dtype_name(other.dtype) + " (that of '" + other_name + "')",
         t.describe());
  }
}

void ArgCheck::workspace(const Workspace& ws, size_t needed) const {
  if (needed == 0) return;
  if (ws.data == nullptr || ws.bytes < needed) {
    fail("workspace", "at least " + std::to_string(needed) + " bytes",
         ws.data ? std::to_string(ws.bytes) + " bytes" : std::string("no workspace"));
  }
  if (reinterpret_cast<uintptr_t>(ws.data) % 256 != 0) {
    fail("workspace", "data aligned to 256 bytes", "an unaligned pointer");
  }
}

void check_launch(const char* op) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(std::string("moekit::") + op + ": CUDA launch failed: " + cudaGetErrorString(err));
  }
}

}  // namespace moekit::detail
