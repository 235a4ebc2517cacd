// GPU tests of the stream-K dense MLP (src/mlp/streamk_mlp.h) through SharedExpertMLPFwd:
// against the CPU reference on fresh random inputs, at token counts and sizes that put
// the (tile, k) split points everywhere (tiles with one to 56 contributing CTAs, sizes
// off the tile and stage), with poisoned outputs and a poisoned workspace (the kernel
// must zero its own counters), on several grid sizes (plans forced through args.plan); bit-for-bit
// determinism, CUDA graph replays, and agreement with the two-GEMM path.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mlp/streamk_mlp.h"
#include "moe/moe_internal.h"
#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "support/gpu.h"
#include "test_dense_mlp_common.h"
#include "test_moe_common.h"

namespace moekit {
namespace {

using dense_mlp_test::kPoison;

using dense_mlp_test::expect_close;
using dense_mlp_test::MlpCase;
using dense_mlp_test::MlpDevice;
using dense_mlp_test::MlpInputs;
using dense_mlp_test::name;
using dense_mlp_test::sync_ok;

// The stream-K plan on `grid` CTAs (0: one per SM, the planner's).
MlpPlan streamk_plan(int grid) {
  MlpPlan plan;
  plan.path = MlpPath::kStreamK;
  plan.split_gate_up = plan.split_down = grid > 0 ? grid : detail::device_props().sms;
  return plan;
}

std::vector<MlpCase> cases() {
  const DType b = DType::kBF16, h = DType::kF16;
  return {
      {b, 1, 256, 128},
      {h, 1, 256, 128},
      {b, 7, 136, 72},
      {h, 16, 8, 8},
      {b, 17, 264, 40},
      {h, 32, 512, 256},
      {b, 33, 1024, 1000},
      {h, 64, 2056, 520},
      {b, 64, 8, 2048},
      // tiles1 = 2 with 56 k iterations: most of the 112 iterations are a CTA's whole
      // range, so a tile is summed from up to 56 partials.
      {b, 5, 7168, 64},
      // k extents that end inside the second 64-element box of a stage (and H = 8: a box
      // entirely past the tensor).
      {h, 3, 72, 8},
  };
}

TEST(StreamkMlpGpu, MatchesReferenceOnEveryGrid) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 7100;
  for (const MlpCase& c : cases()) {
    SCOPED_TRACE(name(c));
    ASSERT_GT(detail::dense_mlp_scratch_bytes(c.dt, c.T, c.H, c.S, detail::device_props()), 0u)
        << "the stream-K MLP must be available on an sm_90 GPU for this shape";
    const MlpInputs in(c, ++seed);
    const HostTensor ref = in.reference(c);
    for (int grid : {0, 1, 7, 61}) {
      SCOPED_TRACE("grid " + std::to_string(grid));
      MlpDevice d(c, in);
      expect_close(dense_mlp_test::run_plan(d, streamk_plan(grid)), ref, c.dt,
                   "stream-K shared_expert_mlp " + name(c));
    }
  }
}

TEST(StreamkMlpGpu, DeterministicAndCloseToTheGemmPath) {
  MOEKIT_REQUIRE_GPU();
  const MlpCase cs[] = {{DType::kBF16, 32, 7168, 2048}, {DType::kF16, 9, 5120, 1536}};
  uint64_t seed = 7200;
  for (const MlpCase& c : cs) {
    SCOPED_TRACE(name(c));
    const MlpInputs in(c, ++seed);
    MlpDevice d(c, in);
    const MlpPlan plan = streamk_plan(0);
    const HostTensor first = dense_mlp_test::run_plan(d, plan);
    for (int rep = 0; rep < 3; ++rep) {
      d.poison_workspace();
      const HostTensor again = dense_mlp_test::run_plan(d, plan);
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.nbytes()), 0) << "run " << rep;
    }
    MlpPlan gemms;
    ASSERT_TRUE(dense_mlp_test::plan_on_path(MlpPath::kTwoGemms, d.args, &gemms));
    // Both round h once to the dtype, so they agree to the dtype's tolerance.
    expect_close(first, dense_mlp_test::run_plan(d, gemms), c.dt,
                 "stream-K vs GEMM path " + name(c));
  }
}

TEST(StreamkMlpGpu, GraphReplaysZeroTheirOwnCounters) {
  MOEKIT_REQUIRE_GPU();
  const MlpCase c{DType::kBF16, 12, 1536, 520};
  const MlpInputs in(c, 7300);
  const HostTensor ref = in.reference(c);
  MlpDevice d(c, in);
  const MlpPlan plan = streamk_plan(0);
  d.args.plan = &plan;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  shared_expert_mlp(d.args, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 3; ++rep) {
    d.poison_workspace();
    ASSERT_EQ(cudaMemset(d.out.data(), kPoison, ref.nbytes()), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_close(d.out.download(), ref, c.dt, "graph replay " + std::to_string(rep));
  }
  // Back-to-back replays without a host sync in between.
  for (int rep = 0; rep < 5; ++rep) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  expect_close(d.out.download(), ref, c.dt, "back-to-back replays");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Without a GPU (or off sm_90) the path reserves nothing and the op keeps its GEMMs.
TEST(StreamkMlp, ScratchOnlyWhereTheKernelRuns) {
  const detail::DeviceProps h200 = detail::h200_props();
  EXPECT_EQ(detail::dense_mlp_scratch_bytes(DType::kBF16, 65, 256, 128, h200), 0u);
  EXPECT_EQ(detail::dense_mlp_scratch_bytes(DType::kBF16, 0, 256, 128, h200), 0u);
  EXPECT_EQ(detail::dense_mlp_scratch_bytes(DType::kF32, 8, 256, 128, h200), 0u);
  EXPECT_EQ(detail::dense_mlp_scratch_bytes(DType::kBF16, 8, 0, 128, h200), 0u);
  EXPECT_GT(detail::dense_mlp_scratch_bytes(DType::kBF16, 8, 256, 128, h200), 0u);
  // Off sm_90 (arch 0: no device) the path reserves nothing and the op keeps its GEMMs.
  EXPECT_EQ(detail::dense_mlp_scratch_bytes(DType::kBF16, 8, 256, 128, detail::DeviceProps()), 0u);
}

}  // namespace
}  // namespace moekit
