// The SM90 expert-MLP chain (docs/gemm.md "SM90 expert-MLP chain": both GEMMs of an expert
// MLP in one persistent launch, down tiles waiting on per-group counters). CPU: which MLPs
// the planner chains. GPU: moe_expert_mlp and fused_moe with the chain against the CPU
// reference and bit for bit against the two sm90 launches it replaces (same tiles,
// same k order), on ragged rows with empty and one-row experts, n and k off the tile
// sizes, padding rows poisoned, repeated calls on one
// workspace (eager and in a CUDA graph), and the fused layer, whose down GEMM writes over
// its own input rows. Every GPU case asserts that the chain ran. Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm.h"
#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "support/gpu.h"
#include "test_moe_common.h"

namespace moekit {
namespace {

using testing::DeviceTensor;
using testing::DeviceWorkspace;

constexpr uint8_t kPoison = 0xFF;  // a NaN in bf16 and f16

// The chain on both GEMMs' `kernel` tiles, and the same tiles as two static launches.
// The planner's chains swap their tails (docs/gemm.md "Swapped tail tiles").
MlpPlan chain_plan(GemmKernel kernel, bool swap_tails = true) {
  MlpPlan m;
  m.path = MlpPath::kChain;
  m.gate_up = m.down = GemmPlan{kernel, 128, 256, 1, GemmSchedule::kDynamic, swap_tails};
  return m;
}
MlpPlan two_launches(GemmKernel kernel, bool swap_tails = true) {
  MlpPlan m;
  m.gate_up = m.down = GemmPlan{kernel, 128, 256, 1, GemmSchedule::kStatic, swap_tails};
  return m;
}

// The two GEMMs as run_expert_mlp_gemms builds them.
struct MlpGemms {
  detail::GroupedGemmProblem up, down;
};
MlpGemms mlp_gemms(DType dt, int64_t E, int64_t H, int64_t F, int64_t P, int alignment) {
  static char act, in;  // distinct addresses: down reads what up writes
  MlpGemms g;
  g.up.in_dtype = g.up.out_dtype = dt;
  g.up.a = &in;
  g.up.c = &act;
  g.up.num_groups = static_cast<int>(E);
  g.up.n = F;
  g.up.k = H;
  g.up.activation = Activation::kSiluAndMul;
  g.up.rows = detail::GemmRows::kContiguous;
  g.up.alignment = alignment;
  g.up.m = P;
  g.down = g.up;
  g.down.a = &act;
  g.down.c = &in;
  g.down.n = H;
  g.down.k = F;
  g.down.activation = Activation::kNone;
  static unsigned counters[2];  // the expert MLPs always carve them
  g.up.tile_counter = &counters[0];
  g.down.tile_counter = &counters[1];
  return g;
}

TEST(MlpChain, PlannerChainsOnlyMlpsWhoseGemmsBothRunSm90Tiles) {
  const detail::GemmDevice h200(detail::h200_props());
  const auto path = [&](const MlpGemms& g) { return detail::plan_mlp_gemms(g.up, g.down, h200); };
  // ds-v3 prefill (256 experts x 128 rows): both GEMMs sm90_pairs, the pair chain.
  const MlpGemms prefill = mlp_gemms(DType::kBF16, 256, 7168, 2048, 256 * 128, 1);
  EXPECT_EQ(path(prefill), chain_plan(GemmKernel::kSm90Pairs));
  // Fewer rows per expert (64): sm90 and the chain on its tiles.
  const MlpGemms small = mlp_gemms(DType::kBF16, 256, 7168, 2048, 256 * 64, 1);
  EXPECT_EQ(path(small), chain_plan(GemmKernel::kSm90));
  // qwen3-235b prefill (128 experts x 256 rows): chained on the pairs too.
  const MlpGemms qwen = mlp_gemms(DType::kF16, 128, 4096, 1536, 128 * 256, 1);
  EXPECT_EQ(path(qwen), chain_plan(GemmKernel::kSm90Pairs));
  // Decode (16 rows per expert): two launches of the decode tiles.
  const MlpGemms decode = mlp_gemms(DType::kBF16, 256, 7168, 2048, 256 * 16, 1);
  EXPECT_EQ(path(decode).path, MlpPath::kTwoGemms);
  // A forced chain runs where the chain can run, whatever the planner picks ...
  EXPECT_EQ(
      detail::mlp_gemms_plan_rejection(chain_plan(GemmKernel::kSm90), decode.up, decode.down, h200),
      "");
  // ... and is refused where it cannot, saying why; so is a mixed or a static chain.
  const auto refused = [&](MlpGemms g, const char* what) {
    EXPECT_EQ(path(g).path, MlpPath::kTwoGemms) << what;
    EXPECT_NE(detail::mlp_gemms_plan_rejection(chain_plan(GemmKernel::kSm90), g.up, g.down, h200),
              "")
        << what;
  };
  {
    MlpGemms g = prefill;
    g.down.out_dtype = DType::kF32;
    refused(g, "f32 out");
    g = prefill;
    g.up.rows = g.down.rows = detail::GemmRows::kMasked;
    g.up.max_m = g.down.max_m = 128;
    refused(g, "masked rows");
    g = mlp_gemms(DType::kBF16, 1025, 7168, 2048, 1025 * 128, 1);
    refused(g, "1025 groups");
    g = prefill;
    g.down.a = g.up.a;
    refused(g, "down does not read act");
    g = prefill;
    g.up.k = 0;
    refused(g, "k == 0");
    g = prefill;
    g.up.m = g.down.m = 0;
    refused(g, "no rows");
  }
  MlpPlan mixed = chain_plan(GemmKernel::kSm90Pairs);
  mixed.down.kernel = GemmKernel::kSm90;
  EXPECT_NE(detail::mlp_gemms_plan_rejection(mixed, prefill.up, prefill.down, h200), "");
  MlpPlan static_chain = chain_plan(GemmKernel::kSm90);
  static_chain.gate_up.schedule = static_chain.down.schedule = GemmSchedule::kStatic;
  EXPECT_NE(detail::mlp_gemms_plan_rejection(static_chain, prefill.up, prefill.down, h200), "");
  // No sm_90 device: never the chain.
  EXPECT_EQ(detail::plan_mlp_gemms(prefill.up, prefill.down, detail::GemmDevice()).path,
            MlpPath::kTwoGemms);
}

// ---- GPU: moe_expert_mlp ----

struct Case {
  DType dt;
  int64_t E, H, F, max_count;
  int alignment;
  bool forced;  // the chain forced (small shapes the planner gives the decode tiles), else the
                // planner's
};

std::string case_name(const Case& c) {
  return std::string(dtype_name(c.dt)) + " E=" + std::to_string(c.E) + " H=" + std::to_string(c.H) +
         " F=" + std::to_string(c.F) + " max_count=" + std::to_string(c.max_count) +
         " A=" + std::to_string(c.alignment) + (c.forced ? " forced" : " planner");
}

struct Inputs {
  moetest::RaggedRows rows;
  HostTensor x[2], wgu, wd;
  Inputs(const Case& c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> count(0, c.max_count);
    // Empty experts, a one-row expert, one at exactly 128 rows, the rest random.
    rows = moetest::ragged_rows(c.E, c.alignment, [&](int64_t e) {
      return e % 4 == 1 ? int64_t{0} : e == 0 ? int64_t{1} : e == 2 ? int64_t{128} : count(rng);
    });
    for (HostTensor& t : x) t = moetest::normal(rng, c.dt, {rows.P, c.H}, 1.0);
    wgu = moetest::normal(rng, c.dt, {c.E, 2 * c.F, c.H}, 1.0 / std::sqrt(double(c.H)));
    wd = moetest::normal(rng, c.dt, {c.E, c.H, c.F}, 1.0 / std::sqrt(double(c.F)));
  }
};

void sync_ok() {
  const cudaError_t err = cudaDeviceSynchronize();
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

// `calls` moe_expert_mlp calls on one workspace (call r reads x[r % 2] into out[r % 2]),
// eager or as one CUDA graph; returns out[0], out[1] (poisoned before). *chained: chain
// launches made.
std::vector<HostTensor> run(const Case& c, const Inputs& in, int calls, bool graph,
                            int64_t* chained, const MlpPlan* plan = nullptr) {
  DeviceTensor x0(in.x[0]), x1(in.x[1]), meta(in.rows.meta), wgu(in.wgu), wd(in.wd);
  DeviceTensor out[2] = {DeviceTensor(c.dt, {in.rows.P, c.H}, kPoison),
                         DeviceTensor(c.dt, {in.rows.P, c.H}, kPoison)};
  ExpertMLPArgs a;
  a.expert_input = x0.view();
  a.layout_metadata = meta.view();
  a.layout = PermutedLayout::contiguous(c.alignment);
  a.w_gate_up = wgu.view();
  a.w_down = wd.view();
  a.expert_output = out[0].view();
  DeviceWorkspace ws(expert_mlp_workspace_size(a));
  a.workspace = ws.get();
  a.plan = plan;
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const int64_t before = detail::sm90_mlp_chain_launches();
  if (graph) EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  for (int r = 0; r < calls; ++r) {
    a.expert_input = (r % 2 ? x1 : x0).view();
    a.expert_output = out[r % 2].view();
    moe_expert_mlp(a, stream);
  }
  if (graph) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);  // twice: the counters re-zeroed
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  *chained = detail::sm90_mlp_chain_launches() - before;
  return {out[0].download(), out[1].download()};
}

void expect_same_bytes(const HostTensor& a, const HostTensor& b, const std::string& what) {
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << what << ": bytes differ";
}

void expect_reference(const Case& c, const Inputs& in, int which, const HostTensor& got) {
  HostTensor ref(c.dt, {in.rows.P, c.H});
  ExpertMLPArgs r;
  r.expert_input = in.x[which].view();
  r.layout_metadata = in.rows.meta.view();
  r.layout = PermutedLayout::contiguous(c.alignment);
  r.w_gate_up = in.wgu.view();
  r.w_down = in.wd.view();
  r.expert_output = ref.view();
  reference::moe_expert_mlp(r);
  std::vector<uint8_t> mask(static_cast<size_t>(in.rows.P));
  for (size_t row = 0; row < mask.size(); ++row) mask[row] = in.rows.expert_of_row[row] >= 0;
  const Tolerance tol = tolerance_for(c.dt);
  const Accuracy acc = compare(got.view(), ref.view(), tol, mask.data());
  EXPECT_TRUE(acc.pass(tol)) << "x" << which << ": " << acc.str() << " over " << acc.count;
  const auto* bytes = static_cast<const uint8_t*>(got.data());
  const int64_t row_bytes = c.H * 2;
  int64_t written = 0;
  for (int64_t row = 0; row < in.rows.P; ++row) {
    if (mask[static_cast<size_t>(row)]) continue;
    for (int64_t i = 0; i < row_bytes; ++i) written += bytes[row * row_bytes + i] != kPoison;
  }
  EXPECT_EQ(written, 0) << "bytes written in padding rows";
}

// The cases of MatchesReferenceAndTheTwoLaunches: forced chains on shapes the planner gives
// the decode tiles, and the planner's picks (the sm90_pairs chain, the sm90 one).
std::vector<Case> chain_cases() {
  const DType b = DType::kBF16, h = DType::kF16;
  return {
      {b, 7, 200, 136, 300, 1, true},    {h, 7, 200, 136, 300, 8, true},
      {b, 13, 520, 72, 40, 4, true},     {h, 3, 64, 32, 600, 1, true},
      {b, 24, 1024, 384, 400, 1, false},  // the planner: sm90_pairs, the pair chain
      {b, 24, 1024, 384, 200, 1, false},  // the planner: ~70 rows per expert, sm90
  };
}

// The chain against the reference, and bit for bit against two sm90 launches (the static
// walk): the same 128 x 256 tiles, the same k order, on sm90's or sm90_pairs' tiles; with
// and without swapped tail tiles (the planner's chain swaps them).
void check_chain_matches_reference_and_two_launches(const Case& c, const Inputs& in) {
  for (bool swap_tails : {true, false}) {
    SCOPED_TRACE(swap_tails ? "swap_tails" : "plain tiles");
    const MlpPlan forced = chain_plan(GemmKernel::kSm90, swap_tails);
    int64_t chained = 0;
    const bool planner = !c.forced && swap_tails;
    const auto chain = run(c, in, 2, false, &chained, planner ? nullptr : &forced);
    EXPECT_EQ(chained, 2) << "the chain did not run";
    expect_reference(c, in, 0, chain[0]);
    expect_reference(c, in, 1, chain[1]);
    const MlpPlan plain_plan = two_launches(GemmKernel::kSm90, swap_tails);
    const auto plain = run(c, in, 2, false, &chained, &plain_plan);
    EXPECT_EQ(chained, 0);
    for (int i = 0; i < 2; ++i) expect_same_bytes(chain[i], plain[i], "chain vs two launches");
  }
}

TEST(MlpChainGpu, MatchesReferenceAndTheTwoLaunches) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 9100;
  for (const Case& c : chain_cases()) {
    SCOPED_TRACE(case_name(c));
    check_chain_matches_reference_and_two_launches(c, Inputs(c, ++seed));
  }
}

// The chain on sm90_pairs' tiles: m-pairs, odd last m-tiles (n-pairs), odd n-tile counts,
// and shapes so small that most clusters' first claim is past the end (rank 0 then must
// wait for rank 1's receipt before it exits). Bytes equal to sm90_pairs' two launches.
TEST(MlpChainGpu, PairTilesMatchReferenceAndTwoPairLaunches) {
  MOEKIT_REQUIRE_GPU();
  const DType b = DType::kBF16, h = DType::kF16;
  const Case cases[] = {
      {h, 3, 64, 32, 600, 1, true},     {b, 1, 64, 32, 1, 1, true},
      {b, 7, 200, 136, 300, 1, true},   {h, 13, 520, 72, 600, 8, true},
      {b, 24, 1024, 384, 400, 1, true}, {b, 8, 512, 256, 512, 1, true},
  };
  uint64_t seed = 9150;
  for (const Case& c : cases) {
    for (bool swap_tails : {true, false}) {
      SCOPED_TRACE(case_name(c) + (swap_tails ? " swap_tails" : " plain tiles"));
      const Inputs in(c, ++seed);
      const MlpPlan pair_chain = chain_plan(GemmKernel::kSm90Pairs, swap_tails);
      const MlpPlan pair_launches = two_launches(GemmKernel::kSm90Pairs, swap_tails);
      int64_t chained = 0;
      for (int rep = 0; rep < 3; ++rep) {  // the exit hazard was a race: a few launches
        const auto chain = run(c, in, 2, false, &chained, &pair_chain);
        EXPECT_EQ(chained, 2) << "the chain did not run";
        expect_reference(c, in, 0, chain[0]);
        expect_reference(c, in, 1, chain[1]);
        if (rep > 0) continue;
        const auto plain = run(c, in, 2, false, &chained, &pair_launches);
        EXPECT_EQ(chained, 0);
        for (int i = 0; i < 2; ++i) expect_same_bytes(chain[i], plain[i], "pair chain vs launches");
      }
    }
  }
}

TEST(MlpChainGpu, RepeatedCallsReuseTheWorkspace) {
  MOEKIT_REQUIRE_GPU();
  const Case c{DType::kBF16, 24, 1024, 384, 400, 1, false};
  const Inputs in(c, 9200);
  int64_t chained = 0;
  const auto once = run(c, in, 2, false, &chained);
  ASSERT_EQ(chained, 2);
  const auto eager = run(c, in, 7, false, &chained);  // x0 -> out0, x1 -> out1, ...
  EXPECT_EQ(chained, 7);
  const auto graphed = run(c, in, 4, true, &chained);  // captured, launched twice
  EXPECT_EQ(chained, 4) << "calls captured";
  for (int i = 0; i < 2; ++i) {
    expect_same_bytes(once[i], eager[i], "7 calls vs 2");
    expect_same_bytes(once[i], graphed[i], "a graph of 4 calls launched twice vs 2 calls");
  }
}

// Two chains at once on two streams (each a persistent grid of every SM): each must finish
// and match its single-stream bytes, whatever of the other is resident.
TEST(MlpChainGpu, TwoStreamsAtOnce) {
  MOEKIT_REQUIRE_GPU();
  const Case c{DType::kBF16, 24, 1024, 384, 400, 1, false};
  const Inputs in(c, 9250);
  int64_t chained = 0;
  const auto once = run(c, in, 2, false, &chained);
  ASSERT_EQ(chained, 2);
  DeviceTensor x0(in.x[0]), x1(in.x[1]), meta(in.rows.meta), wgu(in.wgu), wd(in.wd);
  DeviceTensor outs[2] = {DeviceTensor(c.dt, {in.rows.P, c.H}, kPoison),
                          DeviceTensor(c.dt, {in.rows.P, c.H}, kPoison)};
  ExpertMLPArgs a[2];
  std::unique_ptr<DeviceWorkspace> ws[2];
  cudaStream_t streams[2];
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), cudaSuccess);
    a[i].expert_input = (i ? x1 : x0).view();
    a[i].layout_metadata = meta.view();
    a[i].layout = PermutedLayout::contiguous(c.alignment);
    a[i].w_gate_up = wgu.view();
    a[i].w_down = wd.view();
    a[i].expert_output = outs[i].view();
    ws[i] = std::make_unique<DeviceWorkspace>(expert_mlp_workspace_size(a[i]));
    a[i].workspace = ws[i]->get();
  }
  const int64_t before = detail::sm90_mlp_chain_launches();
  for (int r = 0; r < 5; ++r) {
    for (int i = 0; i < 2; ++i) moe_expert_mlp(a[i], streams[i]);
  }
  for (cudaStream_t s : streams) {
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaStreamDestroy(s);
  }
  EXPECT_EQ(detail::sm90_mlp_chain_launches() - before, 10);
  for (int i = 0; i < 2; ++i) expect_same_bytes(once[i], outs[i].download(), "two streams");
}

// ---- GPU: fused_moe, whose expert MLP writes its output over its permuted input ----

TEST(MlpChainGpu, FusedMoEMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  const DType dt = DType::kBF16;
  const int64_t T = 1200, H = 264, E = 32, F = 200, K = 4;  // ~150 routed rows per expert
  std::mt19937_64 rng(9300);
  HostTensor x = moetest::normal(rng, dt, {T, H}, 1.0);
  HostTensor logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
  HostTensor wgu = moetest::normal(rng, dt, {E, 2 * F, H}, 1.0 / std::sqrt(double(H)));
  HostTensor wd = moetest::normal(rng, dt, {E, H, F}, 1.0 / std::sqrt(double(F)));
  DeviceTensor dx(x), dlogits(logits), dwgu(wgu), dwd(wd);
  const auto layer = [&](int64_t* chained) {
    DeviceTensor out(dt, {T, H}, kPoison);
    FusedMoEArgs a;
    a.hidden_states = dx.view();
    a.gating_output = dlogits.view();
    a.params.top_k = static_cast<int>(K);
    a.w_gate_up = dwgu.view();
    a.w_down = dwd.view();
    a.output = out.view();
    DeviceWorkspace ws(fused_moe_workspace_size(a));
    a.workspace = ws.get();
    const int64_t before = detail::sm90_mlp_chain_launches();
    fused_moe(a, nullptr);
    sync_ok();
    *chained = detail::sm90_mlp_chain_launches() - before;
    return out.download();
  };
  int64_t chained = 0;
  const HostTensor got = layer(&chained);
  EXPECT_EQ(chained, 1) << "the fused layer's expert MLP did not take the chain";
  HostTensor ref(dt, {T, H});
  FusedMoEArgs r;
  r.hidden_states = x.view();
  r.gating_output = logits.view();
  r.params.top_k = static_cast<int>(K);
  r.w_gate_up = wgu.view();
  r.w_down = wd.view();
  r.output = ref.view();
  reference::fused_moe(r);
  const Tolerance tol = tolerance_for(dt);
  const Accuracy acc = compare(got.view(), ref.view(), tol);
  EXPECT_TRUE(acc.pass(tol)) << acc.str() << " over " << acc.count;
}

}  // namespace
}  // namespace moekit
