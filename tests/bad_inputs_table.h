// The bad-input tables' runner (test_moe_bad_inputs*.cpp): valid arguments over fake device
// addresses (distinct, aligned, never dereferenced), one thing broken per row, and the exact
// error: "moekit::<op>: argument '<name>': expected <...>, got <...>".
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace moekit {
namespace {  // NOLINT: one copy per test unit

// ---- fake device memory ----

// Tensor k lives at (k + 1) * 2^49: ranges of different tensors never overlap (a tensor
// is at most 2^48 bytes), and every address is aligned to anything.
constexpr uintptr_t kSlot = uintptr_t{1} << 49;

void* slot(int k, int64_t byte_offset = 0) {
  return reinterpret_cast<void*>((static_cast<uintptr_t>(k) + 1) * kSlot + byte_offset);
}

int g_next_slot = 0;

TensorView fake(DType dt, std::initializer_list<int64_t> shape) {
  return make_view(slot(g_next_slot++ % 48), dt, shape);
}

Workspace fake_ws(size_t bytes = size_t{1} << 40) {
  return Workspace{slot(50), bytes};
}

// A view with a size make_view refuses (negative) or an ndim out of range.
TensorView with_dim(TensorView t, int d, int64_t v) {
  t.shape[d] = v;
  return t;
}
TensorView with_ndim(TensorView t, int ndim) {
  t.ndim = ndim;
  return t;
}
TensorView non_contiguous(TensorView t) {
  t.stride[0] += 8;
  return t;
}
TensorView shifted(TensorView t, int64_t bytes) {
  t.data = static_cast<char*>(t.data) + bytes;
  return t;
}
TensorView at(TensorView t, const void* data) {
  t.data = const_cast<void*>(data);
  return t;
}

constexpr DType kBF = DType::kBF16, kF16 = DType::kF16, kF32 = DType::kF32, kI32 = DType::kI32;
constexpr DType kFP8 = DType::kFP8E4M3, kI64 = DType::kI64;
constexpr int64_t kBig = int64_t{1} << 31;  // one past INT32_MAX

// ---- the table runner ----

template <class Args>
struct Row {
  const char* category;
  std::function<void(Args&)> mutate;
  const char* arg;
  const char* expected;  // a fragment of the message's "expected ..." part
  const char* got;       // a fragment of its "got ..." part
};

// Calls `call` on each row's arguments and checks the message: exactly this op and
// argument, then "expected <...expected...>, got <...got...>".
template <class Args>
void run_table(const char* op, const std::function<Args()>& valid,
               const std::function<void(const Args&)>& call, const std::vector<Row<Args>>& rows) {
  for (const Row<Args>& row : rows) {
    SCOPED_TRACE(std::string(op) + ": " + row.category + " (" + row.arg + ")");
    Args a = valid();
    row.mutate(a);
    try {
      call(a);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      const std::string head =
          std::string("moekit::") + op + ": argument '" + row.arg + "': expected ";
      ASSERT_EQ(msg.compare(0, head.size(), head), 0) << msg;
      const size_t got_at = msg.find(", got ", head.size());
      ASSERT_NE(got_at, std::string::npos) << msg;
      const std::string expected = msg.substr(head.size(), got_at - head.size());
      const std::string got = msg.substr(got_at + 6);
      EXPECT_NE(expected.find(row.expected), std::string::npos) << msg;
      EXPECT_NE(got.find(row.got), std::string::npos) << msg;
    }
  }
}

bool cuda_device_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

// Expects `call` (a valid call of `op` on a machine without a GPU) to stop at the launch
// target: every argument check passed, nothing launched.
void expect_no_device(const char* op, const std::function<void()>& call) {
  const std::string no_device = "': expected a CUDA device to launch on, got none: cudaGetDevice";
  try {
    call();
    ADD_FAILURE() << op << ": no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(std::string("moekit::") + op + ": argument 'stream" + no_device, 0), 0u)
        << msg;
  }
}

}  // namespace
}  // namespace moekit
