// Shared pieces of the dense-MLP path tests (stream-K, direct): a case, its random
// inputs and CPU reference, and the accuracy check.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "test_moe_common.h"

namespace moekit::dense_mlp_test {

struct MlpCase {
  DType dt;
  int64_t T, H, S;
};

inline std::string name(const MlpCase& c) {
  return std::string(dtype_name(c.dt)) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
         " S=" + std::to_string(c.S);
}

struct MlpInputs {
  HostTensor x, wgu, wd;
  MlpInputs(const MlpCase& c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    x = moetest::normal(rng, c.dt, {c.T, c.H}, 1.0);
    wgu = moetest::normal(rng, c.dt, {2 * c.S, c.H}, 1.0 / std::sqrt(double(c.H)));
    wd = moetest::normal(rng, c.dt, {c.H, c.S}, 1.0 / std::sqrt(double(c.S)));
  }
  HostTensor reference(const MlpCase& c) const {
    HostTensor ref(c.dt, {c.T, c.H});
    SharedExpertMLPArgs r;
    r.hidden_states = x.view();
    r.w_gate_up = wgu.view();
    r.w_down = wd.view();
    r.output = ref.view();
    reference::shared_expert_mlp(r);
    return ref;
  }
};

inline void expect_close(const HostTensor& out, const HostTensor& ref, DType dt,
                         const std::string& what) {
  const Tolerance tol = tolerance_for(dt);
  const Accuracy acc = compare(out.view(), ref.view(), tol);
  EXPECT_TRUE(acc.pass(tol)) << what << ": " << acc.str() << " over " << acc.count;
}

inline void sync_ok() {
  const cudaError_t err = cudaDeviceSynchronize();
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

}  // namespace moekit::dense_mlp_test
