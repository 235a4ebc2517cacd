// Non-owning tensor views and the small vocabulary types every moekit op takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace moekit {

enum class DType : int {
  kUndefined = 0,  // an absent optional tensor
  kBF16,
  kF16,
  kF32,
  kI32,
  kFP8E4M3,  // OCP E4M3FN
  kI64,      // expert ids as engines hold them (topk_ids only)
};

const char* dtype_name(DType dtype);  // "bf16", "f16", "f32", "i32", "fp8e4m3", "i64"
size_t dtype_size(DType dtype);       // bytes per element (0 for kUndefined)

constexpr int kMaxDims = 4;

// A pointer with a dtype, a shape and strides (in elements). moekit never owns
// or frees the memory. A default-constructed view is "undefined" and stands for
// an absent optional tensor. Ops require contiguous row-major views.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kUndefined;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};

  bool defined() const { return dtype != DType::kUndefined; }
  int64_t numel() const;
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string describe() const;  // e.g. "bf16[512, 4096]"

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// A contiguous row-major view.
TensorView make_view(const void* data, DType dtype, std::initializer_list<int64_t> shape);
TensorView make_view(const void* data, DType dtype, int ndim, const int64_t* shape);

// Scratch memory the caller provides for ops that need it (query the size with
// the op's *_workspace_size function). moekit never allocates on a hot path.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// How routed rows are laid out in a permuted (expert-grouped) buffer.
struct PermutedLayout {
  enum class Kind { kContiguous, kMasked };
  Kind kind = Kind::kContiguous;
  int alignment = 1;  // contiguous: each expert's block starts at a multiple of this
  int64_t max_m = 0;  // masked: rows per expert in an [E, max_m, .] buffer

  static PermutedLayout contiguous(int alignment = 1) {
    PermutedLayout l;
    l.kind = Kind::kContiguous;
    l.alignment = alignment;
    return l;
  }
  static PermutedLayout masked(int64_t max_m) {
    PermutedLayout l;
    l.kind = Kind::kMasked;
    l.max_m = max_m;
    return l;
  }
};

// Rows to allocate for a contiguous(alignment) permuted buffer:
// T*K + num_local_experts*(alignment-1).
int64_t permuted_rows(int64_t num_tokens, int top_k, int num_local_experts, int alignment);

}  // namespace moekit
