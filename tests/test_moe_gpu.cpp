// GPU tests of the MoE ops against the CPU references on fresh random inputs:
// activations N(0,1), weights N(0, 1/in_features), logits N(0,1); bf16 and f16; edge
// shapes and id patterns; poisoned outputs (every element must be written).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "support/gpu.h"
#include "test_moe_common.h"
#include "test_moe_gpu_common.h"

namespace moekit {
namespace {

using moetest::expect_close;
using moetest::Ids;
using moetest::kPoison;
using moetest::sync_ok;
using testing::DeviceTensor;
using testing::DeviceWorkspace;

// ---- routed experts: fused_moe_experts and indexed_expert_mlp ----

struct ExpertsCase {
  DType dt;
  int64_t T, H, E, F, K;
  Ids ids;
};

std::string case_name(const ExpertsCase& c) {
  return std::string(dtype_name(c.dt)) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
         " E=" + std::to_string(c.E) + " F=" + std::to_string(c.F) + " K=" + std::to_string(c.K) +
         " ids=" + moetest::ids_name(c.ids);
}

struct ExpertsInputs {
  HostTensor x, wgu, wd, w, ids;
  ExpertsInputs(const ExpertsCase& c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    x = moetest::normal(rng, c.dt, {c.T, c.H}, 1.0);
    wgu = moetest::normal(rng, c.dt, {c.E, 2 * c.F, c.H}, 1.0 / std::sqrt(double(c.H)));
    wd = moetest::normal(rng, c.dt, {c.E, c.H, c.F}, 1.0 / std::sqrt(double(c.F)));
    w = moetest::make_topk_weights(rng, c.T, c.K);
    ids = moetest::make_ids(rng, c.T, c.K, c.E, c.ids);
  }
};

HostTensor reference_experts(const ExpertsCase& c, const ExpertsInputs& in) {
  HostTensor ref(c.dt, {c.T, c.H});
  FusedMoEExpertsArgs r;
  r.hidden_states = in.x.view();
  r.w_gate_up = in.wgu.view();
  r.w_down = in.wd.view();
  r.topk_weights = in.w.view();
  r.topk_ids = in.ids.view();
  r.output = ref.view();
  reference::fused_moe_experts(r);
  return ref;
}

// Runs the op on the device and returns its output (after checking it against the
// reference when ref != nullptr).
HostTensor run_experts(const ExpertsCase& c, const ExpertsInputs& in, bool indexed,
                       const HostTensor* ref) {
  DeviceTensor x(in.x), wgu(in.wgu), wd(in.wd), w(in.w), ids(in.ids);
  DeviceTensor out(c.dt, {c.T, c.H}, kPoison);
  FusedMoEExpertsArgs a;
  a.hidden_states = x.view();
  a.w_gate_up = wgu.view();
  a.w_down = wd.view();
  a.topk_weights = w.view();
  a.topk_ids = ids.view();
  a.output = out.view();
  const size_t bytes =
      indexed ? indexed_expert_mlp_workspace_size(a) : fused_moe_experts_workspace_size(a);
  DeviceWorkspace ws(bytes);
  a.workspace = ws.get();
  if (indexed) {
    indexed_expert_mlp(a, nullptr);
  } else {
    fused_moe_experts(a, nullptr);
  }
  sync_ok();
  HostTensor host = out.download();
  if (ref) {
    expect_close(
        host, *ref, c.dt,
        std::string(indexed ? "indexed_expert_mlp " : "fused_moe_experts ") + case_name(c));
  }
  return host;
}

std::vector<ExpertsCase> experts_cases() {
  std::vector<ExpertsCase> cases;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int64_t T : {0, 1, 7, 37, 64}) cases.push_back({dt, T, 256, 64, 128, 8, Ids::kDistinct});
  }
  const DType b = DType::kBF16, h = DType::kF16;
  // Fallback sizes of the indexed op and larger batches.
  cases.push_back({b, 65, 256, 64, 128, 8, Ids::kMixed});
  cases.push_back({h, 200, 256, 64, 128, 8, Ids::kDistinct});
  // Id patterns.
  cases.push_back({b, 37, 256, 64, 128, 8, Ids::kMinusOne});
  cases.push_back({h, 33, 256, 64, 128, 8, Ids::kDuplicates});
  cases.push_back({b, 40, 256, 64, 128, 6, Ids::kOutOfRange});
  cases.push_back({b, 64, 256, 64, 128, 4, Ids::kOneExpert});  // 256 routes to one expert
  cases.push_back({h, 50, 256, 64, 128, 8, Ids::kFewExperts});
  cases.push_back({h, 23, 256, 64, 128, 8, Ids::kMixed});
  cases.push_back({b, 130, 256, 64, 128, 8, Ids::kMixed});
  // Many experts, large K, K = 1, sizes that are not tile multiples.
  cases.push_back({b, 40, 64, 512, 32, 16, Ids::kDistinct});
  cases.push_back({h, 64, 64, 512, 32, 16, Ids::kMixed});
  cases.push_back({b, 19, 256, 8, 128, 1, Ids::kDistinct});
  cases.push_back({b, 33, 136, 16, 72, 4, Ids::kMixed});
  cases.push_back({h, 5, 8, 3, 8, 2, Ids::kDuplicates});
  cases.push_back({b, 70, 136, 16, 72, 4, Ids::kMinusOne});
  return cases;
}

TEST(MoEGpu, RoutedExpertsMatchReference) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 1000;
  for (const ExpertsCase& c : experts_cases()) {
    SCOPED_TRACE(case_name(c));
    ExpertsInputs in(c, ++seed);
    const HostTensor ref = reference_experts(c, in);
    run_experts(c, in, /*indexed=*/false, &ref);
    run_experts(c, in, /*indexed=*/true, &ref);
  }
}

// Odd expert counts and counts past 512 (the sorted path's chunked route sort, E > 512;
// the grouped GEMMs' 1024 groups), at T = 1, 7, 64 (both routed paths of indexed_expert_mlp)
// and 4096 (sorted only), with every id pattern: -1 ids, duplicates, out-of-range ids,
// empty experts (few experts; most experts of E = 1024 at T = 1) and every route on one.
TEST(MoEGpu, RoutedExpertsManyAndOddExperts) {
  MOEKIT_REQUIRE_GPU();
  const Ids patterns[] = {Ids::kDistinct,  Ids::kMinusOne,   Ids::kDuplicates, Ids::kOutOfRange,
                          Ids::kOneExpert, Ids::kFewExperts, Ids::kMixed};
  uint64_t seed = 1500;
  size_t i = 0;
  for (int64_t E : {129, 257, 513, 1024}) {
    for (int64_t T : {1, 7, 64, 4096}) {
      // Two id patterns per shape, every pattern at every E over the four T.
      for (int j = 0; j < 2; ++j) {
        const ExpertsCase c{i % 2 ? DType::kF16 : DType::kBF16, T, 64, E, 32, 8, patterns[i % 7]};
        ++i;
        SCOPED_TRACE(case_name(c));
        ExpertsInputs in(c, ++seed);
        const HostTensor ref = reference_experts(c, in);
        run_experts(c, in, /*indexed=*/false, &ref);
        run_experts(c, in, /*indexed=*/true, &ref);
      }
    }
  }
}

TEST(MoEGpu, RoutedExpertsAreDeterministic) {
  MOEKIT_REQUIRE_GPU();
  for (int64_t T : {37, 150}) {
    const ExpertsCase c{DType::kBF16, T, 256, 64, 128, 8, Ids::kMixed};
    ExpertsInputs in(c, 77 + T);
    for (bool indexed : {false, true}) {
      const HostTensor a = run_experts(c, in, indexed, nullptr);
      const HostTensor b = run_experts(c, in, indexed, nullptr);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << case_name(c) << indexed;
    }
  }
}

// ---- moe_expert_mlp on a contiguous permuted buffer ----

TEST(MoEGpu, ExpertMLPMatchesReferenceAndLeavesPaddingUntouched) {
  MOEKIT_REQUIRE_GPU();
  struct Case {
    DType dt;
    int64_t E, H, F, max_count;
    int alignment;
  };
  const Case cases[] = {{DType::kBF16, 16, 256, 128, 40, 1},
                        {DType::kF16, 16, 256, 128, 40, 8},
                        {DType::kBF16, 64, 136, 72, 9, 64},
                        {DType::kF16, 5, 64, 32, 0, 4},        // every expert empty
                        {DType::kBF16, 1, 256, 128, 300, 8}};  // every row in one expert
  uint64_t seed = 500;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + " E=" + std::to_string(c.E) +
                 " A=" + std::to_string(c.alignment));
    std::mt19937_64 rng(++seed);
    std::uniform_int_distribution<int64_t> count(0, c.max_count);
    // Some empty experts.
    moetest::RaggedRows rows = moetest::ragged_rows(
        c.E, c.alignment, [&](int64_t e) { return (e % 3 == 1) ? int64_t{0} : count(rng); });
    const HostTensor& meta = rows.meta;
    const int64_t P = rows.P;
    const std::vector<int>& expert_of_row = rows.expert_of_row;
    HostTensor x = moetest::normal(rng, c.dt, {P, c.H}, 1.0);
    HostTensor wgu = moetest::normal(rng, c.dt, {c.E, 2 * c.F, c.H}, 1.0 / std::sqrt(double(c.H)));
    HostTensor wd = moetest::normal(rng, c.dt, {c.E, c.H, c.F}, 1.0 / std::sqrt(double(c.F)));
    DeviceTensor dx(x), dwgu(wgu), dwd(wd), dmeta(meta);
    DeviceTensor out(c.dt, {P, c.H}, kPoison);
    ExpertMLPArgs a;
    a.expert_input = dx.view();
    a.layout_metadata = dmeta.view();
    a.layout = PermutedLayout::contiguous(c.alignment);
    a.w_gate_up = dwgu.view();
    a.w_down = dwd.view();
    a.expert_output = out.view();
    DeviceWorkspace ws(expert_mlp_workspace_size(a));
    a.workspace = ws.get();
    moe_expert_mlp(a, nullptr);
    sync_ok();
    HostTensor got = out.download();
    HostTensor ref(c.dt, {P, c.H});
    ExpertMLPArgs r = a;
    r.expert_input = x.view();
    r.layout_metadata = meta.view();
    r.w_gate_up = wgu.view();
    r.w_down = wd.view();
    r.expert_output = ref.view();
    reference::moe_expert_mlp(r);
    std::vector<uint8_t> mask(static_cast<size_t>(P));
    for (int64_t row = 0; row < P; ++row) mask[row] = expert_of_row[row] >= 0;
    expect_close(got, ref, c.dt, "moe_expert_mlp", mask.data());
    const uint8_t* bytes = static_cast<const uint8_t*>(got.data());
    const int64_t row_bytes = c.H * 2;
    for (int64_t row = 0; row < P; ++row) {
      if (mask[row]) continue;
      for (int64_t i = 0; i < row_bytes; ++i) {
        if (bytes[row * row_bytes + i] != kPoison) {
          ADD_FAILURE() << "padding row " << row << " was written";
          break;
        }
      }
    }
  }
}

// ---- shared_expert_mlp ----

TEST(MoEGpu, SharedExpertMLPMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  struct Case {
    DType dt;
    int64_t T, H, S;
  };
  const Case cases[] = {{DType::kBF16, 0, 256, 128},
                        {DType::kBF16, 1, 256, 128},
                        {DType::kF16, 37, 256, 128},
                        {DType::kBF16, 200, 136, 72},
                        {DType::kF16, 129, 512, 256}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + " T=" + std::to_string(c.T) +
                 " H=" + std::to_string(c.H) + " S=" + std::to_string(c.S));
    std::mt19937_64 rng(++seed);
    HostTensor x = moetest::normal(rng, c.dt, {c.T, c.H}, 1.0);
    HostTensor wgu = moetest::normal(rng, c.dt, {2 * c.S, c.H}, 1.0 / std::sqrt(double(c.H)));
    HostTensor wd = moetest::normal(rng, c.dt, {c.H, c.S}, 1.0 / std::sqrt(double(c.S)));
    DeviceTensor dx(x), dwgu(wgu), dwd(wd);
    DeviceTensor out(c.dt, {c.T, c.H}, kPoison);
    SharedExpertMLPArgs a;
    a.hidden_states = dx.view();
    a.w_gate_up = dwgu.view();
    a.w_down = dwd.view();
    a.output = out.view();
    DeviceWorkspace ws(shared_expert_mlp_workspace_size(a));
    a.workspace = ws.get();
    shared_expert_mlp(a, nullptr);
    sync_ok();
    HostTensor ref(c.dt, {c.T, c.H});
    SharedExpertMLPArgs r = a;
    r.hidden_states = x.view();
    r.w_gate_up = wgu.view();
    r.w_down = wd.view();
    r.output = ref.view();
    reference::shared_expert_mlp(r);
    expect_close(out.download(), ref, c.dt, "shared_expert_mlp");
  }
}

// ---- fused_moe and fused_moe_shared_expert ----

struct LayerCase {
  DType dt;
  DType logits_dt;
  int64_t T, H, E, F, K, S;  // S = 0: fused_moe; S < 0: fused_moe_shared_expert, no shared weights
  bool grouped;              // sigmoid + bias + 8 groups, top-4 groups, renormalize, x2.5
};

std::string layer_name(const LayerCase& c) {
  return std::string(c.S > 0   ? "fused_moe_shared_expert "
                     : c.S < 0 ? "fused_moe_shared_expert(none) "
                               : "fused_moe ") +
         dtype_name(c.dt) + " logits=" + dtype_name(c.logits_dt) + " T=" + std::to_string(c.T) +
         " E=" + std::to_string(c.E) + " K=" + std::to_string(c.K) + " S=" + std::to_string(c.S) +
         (c.grouped ? " grouped" : "");
}

HostTensor run_layer(const LayerCase& c, uint64_t seed, cudaStream_t stream, bool check,
                     cudaGraph_t* graph_out = nullptr) {
  std::mt19937_64 rng(seed);
  HostTensor x = moetest::normal(rng, c.dt, {c.T, c.H}, 1.0);
  HostTensor logits = moetest::normal(rng, c.logits_dt, {c.T, c.E}, 1.0);
  HostTensor bias = moetest::normal(rng, DType::kF32, {c.E}, 0.1);
  HostTensor wgu = moetest::normal(rng, c.dt, {c.E, 2 * c.F, c.H}, 1.0 / std::sqrt(double(c.H)));
  HostTensor wd = moetest::normal(rng, c.dt, {c.E, c.H, c.F}, 1.0 / std::sqrt(double(c.F)));
  const int64_t S = c.S > 0 ? c.S : 8;
  HostTensor sgu = moetest::normal(rng, c.dt, {2 * S, c.H}, 1.0 / std::sqrt(double(c.H)));
  HostTensor sd = moetest::normal(rng, c.dt, {c.H, S}, 1.0 / std::sqrt(double(S)));
  DeviceTensor dx(x), dlogits(logits), dbias(bias), dwgu(wgu), dwd(wd), dsgu(sgu), dsd(sd);
  DeviceTensor out(c.dt, {c.T, c.H}, kPoison);

  FusedMoESharedExpertArgs a;
  a.moe.hidden_states = dx.view();
  a.moe.gating_output = dlogits.view();
  a.moe.params.top_k = static_cast<int>(c.K);
  if (c.grouped) {
    a.moe.correction_bias = dbias.view();
    a.moe.params.scoring_func = ScoringFunc::kSigmoid;
    a.moe.params.renormalize = true;
    a.moe.params.num_expert_group = 8;
    a.moe.params.topk_group = 4;
    a.moe.params.routed_scaling_factor = 2.5f;
  }
  a.moe.w_gate_up = dwgu.view();
  a.moe.w_down = dwd.view();
  a.moe.output = out.view();
  if (c.S >= 0) {
    a.shared_w_gate_up = dsgu.view();
    a.shared_w_down = dsd.view();
  }
  const size_t bytes =
      c.S ? fused_moe_shared_expert_workspace_size(a) : fused_moe_workspace_size(a.moe);
  DeviceWorkspace ws(bytes);
  a.moe.workspace = ws.get();
  if (graph_out) {
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  }
  if (c.S) {
    fused_moe_shared_expert(a, stream);
  } else {
    fused_moe(a.moe, stream);
  }
  if (graph_out) {
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraphExecDestroy(exec);
    *graph_out = graph;
  }
  sync_ok();
  HostTensor got = out.download();
  if (check) {
    HostTensor ref(c.dt, {c.T, c.H});
    FusedMoESharedExpertArgs r = a;
    r.moe.hidden_states = x.view();
    r.moe.gating_output = logits.view();
    r.moe.correction_bias = c.grouped ? bias.view() : TensorView{};
    r.moe.w_gate_up = wgu.view();
    r.moe.w_down = wd.view();
    r.moe.output = ref.view();
    r.shared_w_gate_up = c.S >= 0 ? sgu.view() : TensorView{};
    r.shared_w_down = c.S >= 0 ? sd.view() : TensorView{};
    if (c.S) {
      reference::fused_moe_shared_expert(r);
    } else {
      reference::fused_moe(r.moe);
    }
    expect_close(got, ref, c.dt, layer_name(c));
  }
  return got;
}

void expect_layers_match(const std::vector<LayerCase>& cases, uint64_t seed) {
  for (const LayerCase& c : cases) {
    SCOPED_TRACE(layer_name(c));
    run_layer(c, ++seed, nullptr, /*check=*/true);
  }
}

TEST(MoEGpu, FusedMoELayersMatchReference) {
  MOEKIT_REQUIRE_GPU();
  const DType b = DType::kBF16, h = DType::kF16, f = DType::kF32;
  expect_layers_match(
      {
          {b, f, 0, 256, 64, 128, 8, 0, false},
          {b, f, 1, 256, 64, 128, 8, 0, false},
          {h, f, 37, 256, 64, 128, 8, 0, true},
          {b, b, 64, 256, 64, 128, 6, 0, false},
          {b, f, 100, 256, 64, 128, 8, 0, true},
          {h, h, 65, 136, 32, 72, 4, 0, false},
          {b, f, 0, 256, 64, 128, 8, 128, true},
          {b, f, 1, 256, 64, 128, 8, 128, true},
          {h, f, 37, 256, 64, 128, 8, 256, false},
          {b, f, 100, 256, 64, 128, 8, 128, true},
          {h, f, 200, 136, 32, 72, 4, 72, false},
          {b, f, 16, 64, 256, 32, 8, 64, true},
          {h, f, 40, 256, 8, 128, 4, 0, false},
          {b, f, 40, 256, 8, 128, 4, 128, false},
          {b, f, 37, 256, 64, 128, 8, -1, false},
          {b, f, 100, 256, 64, 128, 8, -1, true},
          // Every route to one expert (E = 1, top-1): the direct and the sorted path.
          {b, f, 37, 256, 1, 128, 1, 0, false},
          {h, f, 300, 256, 1, 128, 1, 0, false},
          {b, f, 100, 256, 1, 128, 1, 128, false},
      },
      3000);
}

// The layer ops at odd expert counts and past 512 (the routing's 32-slot rows; the sorted
// path's 1024-expert PrePermute instances): T = 1, 7 and 64 (direct), 65 (the sorted
// path's one-launch PrePermute) and 4096 (its chunked kernels), plain and grouped routing
// (8 groups: E = 1024 only, as E must divide), with and without a shared expert.
TEST(MoEGpu, FusedMoELayersManyAndOddExperts) {
  MOEKIT_REQUIRE_GPU();
  const DType b = DType::kBF16, h = DType::kF16, f = DType::kF32;
  expect_layers_match(
      {
          {b, f, 1, 64, 129, 32, 8, 0, false},     {h, f, 7, 64, 129, 32, 8, 64, false},
          {b, b, 64, 64, 129, 32, 8, 0, false},    {h, f, 65, 64, 129, 32, 8, 0, false},
          {b, f, 4096, 64, 129, 32, 8, 0, false},  {b, f, 1, 64, 257, 32, 8, 64, false},
          {h, h, 7, 64, 257, 32, 8, 0, false},     {b, f, 64, 64, 257, 32, 8, 0, false},
          {b, f, 65, 64, 257, 32, 8, 64, false},   {h, f, 4096, 64, 257, 32, 8, 64, false},
          {b, f, 1, 64, 513, 32, 8, 0, false},     {h, f, 7, 64, 513, 32, 8, 0, false},
          {b, f, 64, 64, 513, 32, 8, 64, false},   {b, f, 65, 64, 513, 32, 8, 0, false},
          {b, f, 4096, 64, 513, 32, 8, 0, false},  {b, f, 1, 64, 1024, 32, 8, 0, true},
          {h, f, 7, 64, 1024, 32, 8, 64, false},   {b, f, 64, 64, 1024, 32, 8, 0, true},
          {h, f, 65, 64, 1024, 32, 8, 64, true},   {b, f, 4096, 64, 1024, 32, 8, 0, false},
          {h, f, 4096, 64, 1024, 32, 8, 64, true},
      },
      3500);
}

TEST(MoEGpu, LayersCaptureInCudaGraphs) {
  MOEKIT_REQUIRE_GPU();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const LayerCase cases[] = {
      {DType::kBF16, DType::kF32, 16, 256, 64, 128, 8, 128, true},   // direct path
      {DType::kBF16, DType::kF32, 100, 256, 64, 128, 8, 128, true},  // permuted path
      {DType::kF16, DType::kF32, 3, 256, 64, 128, 8, 0, false},
  };
  uint64_t seed = 4000;
  for (const LayerCase& c : cases) {
    SCOPED_TRACE(layer_name(c));
    ++seed;
    const HostTensor eager = run_layer(c, seed, stream, /*check=*/false);
    cudaGraph_t graph = nullptr;
    const HostTensor graphed = run_layer(c, seed, stream, /*check=*/true, &graph);
    if (graph) cudaGraphDestroy(graph);
    EXPECT_EQ(std::memcmp(eager.data(), graphed.data(), eager.nbytes()), 0);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace moekit
