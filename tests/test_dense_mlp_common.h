// Shared pieces of the dense-MLP path tests (stream-K, direct): a case, its random
// inputs and CPU reference, its device copies with poisoned output and workspace, the
// accuracy check, and a scoped knob.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "support/gpu.h"
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

constexpr uint8_t kPoison = 0xFF;  // 0xFFFF is a NaN in bf16 and f16

// Sets an override knob (an int& of detail::) for one scope and restores it after.
class ScopedKnob {
 public:
  ScopedKnob(int& knob, int value) : knob_(knob), saved_(knob) { knob = value; }
  ~ScopedKnob() { knob_ = saved_; }
  ScopedKnob(const ScopedKnob&) = delete;
  ScopedKnob& operator=(const ScopedKnob&) = delete;

 private:
  int& knob_;
  int saved_;
};

// Device copies of the inputs, a poisoned output and a poisoned workspace.
struct MlpDevice {
  testing::DeviceTensor x, wgu, wd, out;
  SharedExpertMLPArgs args;
  testing::DeviceWorkspace ws;
  MlpDevice(const MlpCase& c, const MlpInputs& in)
      : x(in.x),
        wgu(in.wgu),
        wd(in.wd),
        out(c.dt, {c.T, c.H}, kPoison),
        args(make_args()),
        ws(shared_expert_mlp_workspace_size(args)) {
    args.workspace = ws.get();
    poison_workspace();
  }
  SharedExpertMLPArgs make_args() const {
    SharedExpertMLPArgs a;
    a.hidden_states = x.view();
    a.w_gate_up = wgu.view();
    a.w_down = wd.view();
    a.output = out.view();
    return a;
  }
  void poison_out() {
    const size_t bytes = static_cast<size_t>(args.output.numel()) * dtype_size(args.output.dtype);
    ASSERT_EQ(cudaMemset(out.data(), kPoison, bytes), cudaSuccess);
  }
  void poison_workspace() {
    if (args.workspace.bytes)
      ASSERT_EQ(cudaMemset(args.workspace.data, kPoison, args.workspace.bytes), cudaSuccess);
  }
};

}  // namespace moekit::dense_mlp_test
