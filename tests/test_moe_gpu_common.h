// Checks shared by the MoE GPU tests (test_moe_gpu.cpp, test_moe_activation_gpu.cpp).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "reference/accuracy.h"
#include "reference/host_tensor.h"

namespace moekit::moetest {

constexpr uint8_t kPoison = 0xFF;  // 0xFFFF is a NaN in bf16 and f16

inline void sync_ok() {
  cudaError_t err = cudaDeviceSynchronize();
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

// out against ref within the dtype's SPEC limits (the rows of row_mask, when given).
inline void expect_close(const HostTensor& out, const HostTensor& ref, DType dt,
                         const std::string& what, const uint8_t* row_mask = nullptr) {
  const Tolerance tol = tolerance_for(dt);
  const Accuracy acc = compare(out.view(), ref.view(), tol, row_mask);
  EXPECT_TRUE(acc.pass(tol)) << what << ": " << acc.str() << " over " << acc.count;
}

}  // namespace moekit::moetest
