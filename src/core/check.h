// Argument validation shared by every op. Each failure throws moekit::Error with
// "<op>: argument '<name>': expected <...>, got <...>".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "moekit/error.h"
#include "moekit/tensor.h"

namespace moekit::detail {

constexpr int64_t kAnyDim = -1;  // wildcard in an expected shape

std::string shape_string(std::initializer_list<int64_t> shape);

class ArgCheck {
 public:
  explicit ArgCheck(const char* op) : op_(op) {}

  [[noreturn]] void fail(const std::string& arg, const std::string& expected,
                         const std::string& got) const;

  // A required tensor: defined, one of `dtypes`, the given shape (kAnyDim matches
  // anything), contiguous, non-null when non-empty, data aligned to `align_bytes`
  // (0 = the dtype's natural alignment).
  void tensor(const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
              std::initializer_list<int64_t> shape, size_t align_bytes = 0) const;
  // The same checks, only when `t` is defined.
  void optional_tensor(const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
                       std::initializer_list<int64_t> shape, size_t align_bytes = 0) const;
  // A tensor whose dtype must equal another argument's.
  void same_dtype(const char* name, const TensorView& t, const char* other_name,
                  const TensorView& other) const;
  // A scalar condition: when !ok, fail(name, expected, got).
  void require(bool ok, const char* name, const std::string& expected,
               const std::string& got) const {
    if (!ok) fail(name, expected, got);
  }
  // Workspace of at least `needed` bytes (skipped when needed == 0), 256-byte aligned.
  void workspace(const Workspace& ws, size_t needed) const;

  const char* op() const { return op_; }

 private:
  const char* op_;
};

// ArgCheck::require whose message arguments are evaluated only when `ok` is false: the
// success path of a call builds no strings (std::to_string, describe()). Prefer it to
// require() wherever the message is computed.
#define MOEKIT_REQUIRE(check, ok, name, expected, got) \
  do {                                                 \
    if (!(ok)) (check).fail(name, expected, got);      \
  } while (0)

// Throws moekit::Error naming the op when the last launch failed.
void check_launch(const char* op);

}  // namespace moekit::detail
