// Tests of the one-token GEMV MLP (src/gemm/gemv_mlp.h): on the GPU against the CPU
// reference on fresh random inputs through SharedExpertMLPFwd (sizes off every chunk,
// batch and grid boundary, poisoned outputs and workspace), with the PDL chain on and
// off, f32 output, determinism and back-to-back graph replays; on the CPU the path rule
// and the supported shapes.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/pdl.h"
#include "gemm/gemv_mlp.h"
#include "gemm/streamk_mlp.h"
#include "moekit/moe.h"
#include "support/gpu.h"
#include "test_dense_mlp_common.h"

namespace moekit {
namespace {

using testing::DeviceTensor;

using dense_mlp_test::expect_close;
using dense_mlp_test::kPoison;
using dense_mlp_test::name;
using dense_mlp_test::sync_ok;
using Case = dense_mlp_test::MlpCase;
using Inputs = dense_mlp_test::MlpInputs;
using Device = dense_mlp_test::MlpDevice;

constexpr int kGemvPath = 4;

struct Knobs {
  Knobs(int path_value, int pdl_value)
      : path(detail::dense_mlp_path_override(), path_value),
        pdl(detail::pdl_override(), pdl_value) {}
  dense_mlp_test::ScopedKnob path, pdl;
};

std::vector<Case> cases() {
  const DType b = DType::kBF16, h = DType::kF16;
  return {
      {b, 1, 8, 8},        // one chunk per row, one column per kernel
      {h, 1, 256, 128},    // H: exactly one chunk per thread
      {b, 1, 1000, 520},   // 125 / 65 chunks: partial batches
      {h, 1, 2056, 7168},  // gate_up k: 257 chunks (one past a thread row); down k 7168
      {b, 1, 24, 18440},   // down k: 2305 chunks, past one batch of 2048; 24 columns
      {b, 1, 7168, 2048},  // ds-v3's shared expert: columns loop over the grid
      {h, 1, 5120, 1536},  // glm45's
      {h, 1, 7168, 64},    // a short down k against 7168 rows
  };
}

TEST(GemvMlpGpu, MatchesReferenceWithAndWithoutPdl) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 9100;
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    ASSERT_TRUE(detail::gemv_mlp_supported(c.dt, c.T, c.H, c.S))
        << "the GEMV MLP must run on an sm_90 GPU for this shape";
    const Inputs in(c, ++seed);
    const HostTensor ref = in.reference(c);
    for (int pdl : {1, 2}) {
      SCOPED_TRACE(pdl == 1 ? "PDL on" : "PDL off");
      Knobs knobs(kGemvPath, pdl);
      Device d(c, in);
      shared_expert_mlp(d.args, nullptr);
      sync_ok();
      expect_close(d.out.download(), ref, c.dt, "GEMV shared_expert_mlp " + name(c));
    }
  }
}

// The fused layer's shared expert writes f32 (a later sum).
TEST(GemvMlpGpu, F32OutputMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  const Case cs[] = {{DType::kBF16, 1, 1000, 520}, {DType::kF16, 1, 2048, 1024}};
  uint64_t seed = 9200;
  for (const Case& c : cs) {
    SCOPED_TRACE(name(c));
    const Inputs in(c, ++seed);
    const HostTensor ref = in.reference(c);
    DeviceTensor x(in.x), wgu(in.wgu), wd(in.wd);
    DeviceTensor act(c.dt, {c.T, c.S}, kPoison), out(DType::kF32, {c.T, c.H}, kPoison);
    detail::run_gemv_mlp(c.dt, x.data(), c.T, c.H, c.S, wgu.data(), wd.data(), act.data(),
                         out.data(), DType::kF32, nullptr);
    sync_ok();
    const HostTensor got = out.download();
    HostTensor rounded(c.dt, {c.T, c.H});
    for (int64_t i = 0; i < c.T * c.H; ++i) rounded.set(i, got.at(i));
    expect_close(rounded, ref, c.dt, "f32 output " + name(c));
  }
}

TEST(GemvMlpGpu, DeterministicAndCloseToTheGemmPath) {
  MOEKIT_REQUIRE_GPU();
  const Case c{DType::kBF16, 1, 7168, 2048};
  const Inputs in(c, 9300);
  Device d(c, in);
  HostTensor first, gemm;
  {
    Knobs knobs(kGemvPath, 0);
    shared_expert_mlp(d.args, nullptr);
    sync_ok();
    first = d.out.download();
    for (int rep = 0; rep < 3; ++rep) {
      d.poison_out();
      shared_expert_mlp(d.args, nullptr);
      sync_ok();
      const HostTensor again = d.out.download();
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.nbytes()), 0) << "run " << rep;
    }
  }
  {
    Knobs knobs(2, 0);
    d.poison_out();
    shared_expert_mlp(d.args, nullptr);
    sync_ok();
    gemm = d.out.download();
  }
  expect_close(first, gemm, c.dt, "GEMV vs GEMM path");
}

// Back-to-back graph replays: with PDL the next gate_up may start while down runs; it
// must not overwrite h (act) before down has read it.
TEST(GemvMlpGpu, BackToBackGraphReplays) {
  MOEKIT_REQUIRE_GPU();
  const Case c{DType::kF16, 1, 1536, 520};
  const Inputs in(c, 9400);
  const HostTensor ref = in.reference(c);
  Knobs knobs(kGemvPath, 1);
  Device d(c, in);
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
  expect_close(d.out.download(), ref, c.dt, "graph replays");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The measured default (docs/gemm.md "GEMV MLP"): one token on MLPs of >= 256 MB of
// weights (stream-K's before); forced paths win.
TEST(GemvMlp, DefaultPathRule) {
  Knobs knobs(0, 0);
  if (std::getenv("MOEKIT_DENSE_MLP"))
    GTEST_SKIP() << "MOEKIT_DENSE_MLP is set: the default is overridden";
  EXPECT_TRUE(detail::gemv_mlp_preferred(1, 7168, 18432));   // kimi-k2 t1, 793 MB
  EXPECT_FALSE(detail::gemv_mlp_preferred(1, 7168, 2048));   // ds-v3 t1, 88 MB: direct
  EXPECT_FALSE(detail::gemv_mlp_preferred(1, 5120, 1536));   // glm45 t1: direct
  EXPECT_FALSE(detail::gemv_mlp_preferred(2, 7168, 18432));  // two tokens: stream-K
  EXPECT_FALSE(detail::gemv_mlp_preferred(32, 7168, 2048));  // direct
  detail::dense_mlp_path_override() = kGemvPath;
  EXPECT_TRUE(detail::gemv_mlp_preferred(1, 7168, 2048));
  detail::dense_mlp_path_override() = 3;
  EXPECT_FALSE(detail::gemv_mlp_preferred(1, 7168, 2048));
  detail::dense_mlp_path_override() = 1;
  EXPECT_FALSE(detail::gemv_mlp_preferred(1, 7168, 18432));
}

TEST(GemvMlp, SupportedOnlyForItsShapes) {
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 2, 256, 128));  // one token only
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 0, 256, 128));
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kF32, 1, 256, 128));
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 1, 260, 128));      // H % 8
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 1, 256, 132));      // S % 8
  EXPECT_FALSE(detail::gemv_mlp_supported(DType::kBF16, 1, 256, 1 << 20));  // h past smem
  EXPECT_EQ(detail::gemv_mlp_supported(DType::kBF16, 1, 256, 128), testing::gpu_available());
}

}  // namespace
}  // namespace moekit
