// Shared pieces of the dense-MLP path tests (GEMV, direct, stream-K): a case, its random
// inputs and CPU reference, its device copies with poisoned output and workspace, the
// accuracy check, plans on a path (forced through args.plan), and a scoped knob.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/pdl.h"
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

// The plan on `path` for args: the planner's when it takes that path, else the first
// candidate on it. False when no candidate takes the path.
inline bool plan_on_path(MlpPath path, const SharedExpertMLPArgs& args, MlpPlan* plan) {
  const MlpPlan planned = plan_shared_expert_mlp(args);
  if (planned.path == path) {
    *plan = planned;
    return true;
  }
  for (const MlpPlan& m : shared_expert_mlp_plan_candidates(args)) {
    if (m.path == path) {
      *plan = m;
      return true;
    }
  }
  return false;
}

// Runs d's args under `plan` (poisoned output first) and returns the output.
inline HostTensor run_plan(MlpDevice& d, const MlpPlan& plan, cudaStream_t stream = nullptr) {
  d.poison_out();
  d.args.plan = &plan;
  shared_expert_mlp(d.args, stream);
  d.args.plan = nullptr;
  sync_ok();
  return d.out.download();
}

// The PDL switch (0 default, 1 on, 2 off) for one scope.
using testing::ScopedPdl;

// The path's plan against the reference on each case, PDL on and off (fresh device copies
// with poisoned output and workspace each time). The path has to run these shapes on an
// sm_90 GPU.
inline void expect_path_matches_reference(MlpPath path, const std::vector<MlpCase>& cases,
                                          uint64_t seed) {
  for (const MlpCase& c : cases) {
    SCOPED_TRACE(name(c));
    const MlpInputs in(c, ++seed);
    const HostTensor ref = in.reference(c);
    for (int pdl : {1, 2}) {
      SCOPED_TRACE(pdl == 1 ? "PDL on" : "PDL off");
      ScopedPdl knob(pdl);
      MlpDevice d(c, in);
      MlpPlan plan;
      ASSERT_TRUE(plan_on_path(path, d.args, &plan)) << "the path must run this shape";
      expect_close(run_plan(d, plan), ref, c.dt, "shared_expert_mlp " + to_string(plan));
    }
  }
}

// Every candidate plan on `path` against the reference on each case (one device copy per
// case, the output poisoned before each run).
inline void expect_every_candidate_matches_reference(MlpPath path,
                                                     const std::vector<MlpCase>& cases,
                                                     uint64_t seed) {
  for (const MlpCase& c : cases) {
    SCOPED_TRACE(name(c));
    const MlpInputs in(c, ++seed);
    const HostTensor ref = in.reference(c);
    MlpDevice d(c, in);
    int runs = 0;
    for (const MlpPlan& plan : shared_expert_mlp_plan_candidates(d.args)) {
      if (plan.path != path) continue;
      ++runs;
      expect_close(run_plan(d, plan), ref, c.dt, "shared_expert_mlp " + to_string(plan));
    }
    EXPECT_GT(runs, 0) << "no candidate on the path";
  }
}

// A path's f32-output entry (the fused layer's shared expert writes f32 for a later sum):
// run(dtype, x, T, H, S, w_gate_up, w_down, act, out, out_dtype, stream), checked on each
// case against the reference with poisoned act and out.
template <class Run>
void expect_f32_output_matches(std::initializer_list<MlpCase> cases, uint64_t seed, Run run) {
  for (const MlpCase& c : cases) {
    SCOPED_TRACE(name(c));
    const MlpInputs in(c, ++seed);
    const HostTensor ref = in.reference(c);
    testing::DeviceTensor x(in.x), wgu(in.wgu), wd(in.wd);
    testing::DeviceTensor act(c.dt, {c.T, c.S}, kPoison), out(DType::kF32, {c.T, c.H}, kPoison);
    run(c.dt, x.data(), c.T, c.H, c.S, wgu.data(), wd.data(), act.data(), out.data(), DType::kF32,
        nullptr);
    sync_ok();
    const HostTensor got = out.download();
    HostTensor rounded(c.dt, {c.T, c.H});
    for (int64_t i = 0; i < c.T * c.H; ++i) rounded.set(i, got.at(i));
    expect_close(rounded, ref, c.dt, "f32 output " + name(c));
  }
}

// The path's plan, PDL off: four runs bitwise equal (poisoned output between them), and
// close to the two-GEMM plan's result.
inline void expect_deterministic_and_close_to_gemm(MlpPath path, const MlpCase& c, uint64_t seed) {
  const MlpInputs in(c, seed);
  MlpDevice d(c, in);
  ScopedPdl knob(2);
  MlpPlan plan, gemms;
  ASSERT_TRUE(plan_on_path(path, d.args, &plan));
  ASSERT_TRUE(plan_on_path(MlpPath::kTwoGemms, d.args, &gemms));
  const HostTensor first = run_plan(d, plan);
  for (int rep = 0; rep < 3; ++rep) {
    const HostTensor again = run_plan(d, plan);
    EXPECT_EQ(std::memcmp(first.data(), again.data(), first.nbytes()), 0) << "run " << rep;
  }
  expect_close(first, run_plan(d, gemms), c.dt, to_string(plan) + " vs " + to_string(gemms));
}

// The path's plan with PDL on: four calls captured in a graph and replayed three times
// back to back. With PDL the next gate_up may start while down runs; it must not
// overwrite h (act) before down has read it.
inline void expect_graph_replays_match(MlpPath path, const MlpCase& c, uint64_t seed) {
  const MlpInputs in(c, seed);
  const HostTensor ref = in.reference(c);
  ScopedPdl knob(1);
  MlpDevice d(c, in);
  MlpPlan plan;
  ASSERT_TRUE(plan_on_path(path, d.args, &plan));
  d.args.plan = &plan;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  for (int i = 0; i < 4; ++i) shared_expert_mlp(d.args, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 3; ++rep) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  expect_close(d.out.download(), ref, c.dt, "graph replays of " + to_string(plan));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace moekit::dense_mlp_test
