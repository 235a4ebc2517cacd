// FusedTopKFwd: CPU reference vs hand-computed cases, validation errors, and
// (with a Hopper GPU) the kernel vs the reference on fresh random inputs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moekit/error.h"
#include "moekit/reference.h"
#include "moekit/routing.h"
#include "reference/host_tensor.h"
#include "routing/fused_topk_kernel.h"
#include "support/gpu.h"
#include "test_routing_common.h"

namespace moekit {
namespace {

using namespace routetest;  // NOLINT: the shared routing test helpers

HostTensor f32_tensor(std::vector<int64_t> shape, std::vector<double> v) {
  HostTensor t(DType::kF32, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), v[i]);
  return t;
}

// ---------------------------------------------------------------- CPU: reference

TEST(FusedTopKReference, SoftmaxHandComputed) {
  HostTensor g = f32_tensor({1, 4}, {1, 2, 3, 4});
  TopKParams p;
  p.top_k = 2;
  const double s = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0);
  TopKOut o = run_reference(g, nullptr, p);
  EXPECT_EQ(o.ids.as<int32_t>()[0], 3);
  EXPECT_EQ(o.ids.as<int32_t>()[1], 2);
  EXPECT_FLOAT_EQ(o.w.as<float>()[0], static_cast<float>(std::exp(4.0) / s));
  EXPECT_FLOAT_EQ(o.w.as<float>()[1], static_cast<float>(std::exp(3.0) / s));

  p.renormalize = true;
  p.routed_scaling_factor = 2.5f;
  o = run_reference(g, nullptr, p);
  const double r = std::exp(4.0) + std::exp(3.0);
  EXPECT_FLOAT_EQ(o.w.as<float>()[0], static_cast<float>(2.5 * std::exp(4.0) / r));
  EXPECT_FLOAT_EQ(o.w.as<float>()[1], static_cast<float>(2.5 * std::exp(3.0) / r));
}

TEST(FusedTopKReference, SigmoidBiasSelectsButDoesNotWeigh) {
  HostTensor g = f32_tensor({1, 4}, {0, 1, -1, 2});
  HostTensor bias = f32_tensor({4}, {0.5, 0, 1.0, 0});
  TopKParams p;
  p.top_k = 2;
  p.scoring_func = ScoringFunc::kSigmoid;
  // sel = {1.0, 0.731, 1.269, 0.881}: experts 2 then 0; weights are the unbiased scores.
  TopKOut o = run_reference(g, &bias, p);
  EXPECT_EQ(o.ids.as<int32_t>()[0], 2);
  EXPECT_EQ(o.ids.as<int32_t>()[1], 0);
  EXPECT_FLOAT_EQ(o.w.as<float>()[0], static_cast<float>(sigmoid(-1)));
  EXPECT_FLOAT_EQ(o.w.as<float>()[1], 0.5f);
  p.renormalize = true;
  o = run_reference(g, &bias, p);
  EXPECT_FLOAT_EQ(o.w.as<float>()[0], static_cast<float>(sigmoid(-1) / (sigmoid(-1) + 0.5)));
  // Without the bias: experts 3 then 1.
  o = run_reference(g, nullptr, p);
  EXPECT_EQ(o.ids.as<int32_t>()[0], 3);
  EXPECT_EQ(o.ids.as<int32_t>()[1], 1);
}

TEST(FusedTopKReference, GroupedTopK) {
  // 4 groups of 2. Without a bias a group scores its best sel: groups 0 (5) and 2 (4.5)
  // are kept, so the picks are 0 and 4 although expert 2 (4) beats expert 4's group-mate.
  HostTensor g = f32_tensor({1, 8}, {5, -5, 4, 3.9, 4.5, -5, 0, -0.1});
  TopKParams p;
  p.top_k = 2;
  p.scoring_func = ScoringFunc::kSigmoid;
  p.num_expert_group = 4;
  p.topk_group = 2;
  TopKOut o = run_reference(g, nullptr, p);
  EXPECT_EQ(o.ids.as<int32_t>()[0], 0);
  EXPECT_EQ(o.ids.as<int32_t>()[1], 4);
  // With a (zero) bias a group scores the sum of its two best: group 1 (1.96) then
  // group 0 (1.0) beat group 2 (0.996), so the picks are 0 and 2.
  HostTensor zero_bias(DType::kF32, {8});
  o = run_reference(g, &zero_bias, p);
  EXPECT_EQ(o.ids.as<int32_t>()[0], 0);
  EXPECT_EQ(o.ids.as<int32_t>()[1], 2);
  EXPECT_FLOAT_EQ(o.w.as<float>()[1], static_cast<float>(sigmoid(4)));
}

TEST(FusedTopKReference, TiesGoToTheLowerId) {
  HostTensor g = f32_tensor({2, 6}, {1, 1, 1, 1, 1, 1, 0, 2, 0, 2, 0, 2});
  TopKParams p;
  p.top_k = 3;
  TopKOut o = run_reference(g, nullptr, p);
  const int32_t* ids = o.ids.as<int32_t>();
  EXPECT_EQ(std::vector<int>(ids, ids + 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(std::vector<int>(ids + 3, ids + 6), (std::vector<int>{1, 3, 5}));
}

// ---------------------------------------------------------------- CPU: validation

class FusedTopKValidation : public ::testing::Test {
 protected:
  static constexpr int64_t T = 4, E = 16;
  std::vector<float> g = std::vector<float>(T * E), bias = std::vector<float>(E),
                     w = std::vector<float>(T * 8);
  std::vector<int32_t> ids = std::vector<int32_t>(T * 8);
  FusedTopKArgs args() {
    FusedTopKArgs a;
    a.gating_output = make_view(g.data(), DType::kF32, {T, E});
    a.params.top_k = 8;
    a.topk_weights = make_view(w.data(), DType::kF32, {T, 8});
    a.topk_ids = make_view(ids.data(), DType::kI32, {T, 8});
    return a;
  }
  // Expects moekit::Error naming `arg`.
  void expect_error(const FusedTopKArgs& a, const std::string& arg) {
    try {
      fused_topk(a, nullptr);
      ADD_FAILURE() << "no error for bad '" << arg << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
    }
  }
};

// The early-trigger rule of the FusedTopK launch (fused_topk_kernel.h): grids of at most
// one CTA per SM, and full grids (>= 95% of the CTA slots).
TEST(FusedTopKTrigger, Rule) {
  using detail::fused_topk_early_trigger;
  EXPECT_TRUE(fused_topk_early_trigger(132, 132, 12));
  EXPECT_TRUE(fused_topk_early_trigger(128, 132, 12));
  EXPECT_FALSE(fused_topk_early_trigger(133, 132, 12));
  EXPECT_TRUE(fused_topk_early_trigger(1024, 132, 8));    // E = 384: 1024 of 1056 slots
  EXPECT_FALSE(fused_topk_early_trigger(1024, 132, 10));  // E = 256: 1024 of 1320
  EXPECT_FALSE(fused_topk_early_trigger(1024, 132, 12));  // E = 128: 1024 of 1584
  EXPECT_TRUE(fused_topk_early_trigger(1004, 132, 8));    // the first >= 95% of 1056
  EXPECT_FALSE(fused_topk_early_trigger(1003, 132, 8));
  EXPECT_TRUE(fused_topk_early_trigger(16384, 132, 12));  // several waves
}

// args() passes every check: without a GPU it stops at the launch target (with one, it would
// launch on host memory).
TEST_F(FusedTopKValidation, ValidArgsStopAtTheLaunchTarget) {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) GTEST_SKIP() << "a CUDA device is present";
  cudaGetLastError();
  try {
    fused_topk(args(), nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("moekit::fused_topk: argument 'stream': expected a CUDA "
                                          "device to launch on",
                                          0),
              0u)
        << e.what();
  }
}

TEST_F(FusedTopKValidation, RejectsBadDtypes) {
  FusedTopKArgs a = args();
  a.gating_output.dtype = DType::kI32;
  expect_error(a, "gating_output");
  a = args();
  a.topk_ids.dtype = DType::kF32;
  expect_error(a, "topk_ids");
  a = args();
  a.topk_weights.dtype = DType::kBF16;
  expect_error(a, "topk_weights");
  a = args();
  a.correction_bias = make_view(bias.data(), DType::kBF16, {E});
  expect_error(a, "correction_bias");
}

TEST_F(FusedTopKValidation, RejectsBadShapes) {
  FusedTopKArgs a = args();
  a.topk_weights = make_view(w.data(), DType::kF32, {T, 7});
  expect_error(a, "topk_weights");
  a = args();
  a.topk_ids = make_view(ids.data(), DType::kI32, {T - 1, 8});
  expect_error(a, "topk_ids");
  a = args();
  a.correction_bias = make_view(bias.data(), DType::kF32, {E - 1});
  expect_error(a, "correction_bias");
  a = args();
  a.gating_output = make_view(g.data(), DType::kF32, {T * E});
  expect_error(a, "gating_output");
  a = args();
  a.gating_output.stride[0] = E + 1;  // not contiguous
  expect_error(a, "gating_output");
  std::vector<float> big(2 * 1025);
  a = args();
  a.gating_output = make_view(big.data(), DType::kF32, {2, 1025});
  expect_error(a, "gating_output");
}

TEST_F(FusedTopKValidation, RejectsBadParams) {
  FusedTopKArgs a = args();
  a.params.top_k = 0;
  expect_error(a, "top_k");
  a.params.top_k = 17;
  expect_error(a, "top_k");
  std::vector<float> small(T * 4);
  a = args();
  a.gating_output = make_view(small.data(), DType::kF32, {T, 4});  // top_k 8 > E 4
  expect_error(a, "top_k");
  a = args();
  a.params.routed_scaling_factor = NAN;
  expect_error(a, "routed_scaling_factor");
  a.params.routed_scaling_factor = INFINITY;
  expect_error(a, "routed_scaling_factor");
  a = args();
  a.params.scoring_func = static_cast<ScoringFunc>(7);
  expect_error(a, "scoring_func");
  a = args();
  a.params.num_expert_group = 3;  // does not divide 16
  a.params.topk_group = 1;
  expect_error(a, "num_expert_group");
  a.params.num_expert_group = -4;
  expect_error(a, "num_expert_group");
  a.params.num_expert_group = 4;
  a.params.topk_group = 0;
  expect_error(a, "topk_group");
  a.params.topk_group = 5;
  expect_error(a, "topk_group");
  a.params.topk_group = 1;  // 1 group of 4 experts cannot hold 8 picks
  expect_error(a, "top_k");
  a = args();
  a.params.topk_group = 2;  // without grouping
  expect_error(a, "topk_group");
}

TEST_F(FusedTopKValidation, RejectsNullPointers) {
  FusedTopKArgs a = args();
  a.topk_ids.data = nullptr;
  expect_error(a, "topk_ids");
  a = args();
  a.gating_output.data = nullptr;
  expect_error(a, "gating_output");
  a = args();
  a.topk_weights = TensorView{};
  expect_error(a, "topk_weights");
  a = args();
  a.topk_weights.data = reinterpret_cast<char*>(w.data()) + 2;  // misaligned f32
  expect_error(a, "topk_weights");
}

// ---------------------------------------------------------------- GPU

struct TopKCase {
  DType dtype;
  int64_t T;
  int E;
  TopKParams p;
  bool bias = false;
  double stddev = 1.0;
  int int_levels = 0;     // > 0: logits drawn from {0, .., int_levels-1} (many exact ties)
  double bias_std = 0.1;  // 0: an all-zero bias (keeps ties exact, switches group scoring)
  int num_local = 0;      // > 0: the layer ops' expert map to this many local experts
};

std::string describe(const TopKCase& c) {
  const TopKParams& p = c.p;
  return std::string(dtype_name(c.dtype)) + " T=" + std::to_string(c.T) +
         " E=" + std::to_string(c.E) + " K=" + std::to_string(p.top_k) +
         (p.scoring_func == ScoringFunc::kSoftmax ? " softmax" : " sigmoid") +
         (c.bias ? " bias" : "") + (p.renormalize ? " renorm" : "") +
         " groups=" + std::to_string(p.num_expert_group) + "/" + std::to_string(p.topk_group) +
         " scale=" + std::to_string(p.routed_scaling_factor) +
         (c.int_levels ? " int-levels=" + std::to_string(c.int_levels) : "") +
         (c.num_local ? " mapped to " + std::to_string(c.num_local) : "");
}

// An expert map of E global experts onto num_local local ones as an engine's rank holds
// them: num_local global ids at random places get a random permutation of the local ids,
// the others -1, except a few out of range (>= num_local, < -1), which the kernel writes as
// -1 (docs/moe.md "Engine inputs").
std::vector<int32_t> random_expert_map(int E, int num_local, std::mt19937_64& rng) {
  std::vector<int32_t> globals(E), locals(num_local), map(E, -1);
  std::iota(globals.begin(), globals.end(), 0);
  std::iota(locals.begin(), locals.end(), 0);
  std::shuffle(globals.begin(), globals.end(), rng);
  std::shuffle(locals.begin(), locals.end(), rng);
  for (int i = 0; i < num_local; ++i) map[globals[i]] = locals[i];
  const int32_t bad[] = {num_local, num_local + 7, -2, INT32_MIN, INT32_MAX};
  for (int i = 0; i < 5 && num_local + i < E; ++i) map[globals[num_local + i]] = bad[i];
  return map;
}

void fill_row(HostTensor& g, int64_t t, const TopKCase& c, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, c.stddev);
  std::uniform_int_distribution<int> level(0, std::max(c.int_levels - 1, 0));
  for (int e = 0; e < c.E; ++e)
    g.set(t * c.E + e, c.int_levels ? static_cast<double>(level(rng)) : normal(rng));
}

void check_topk_case(const TopKCase& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937_64 rng(seed);
  HostTensor g(c.dtype, {c.T, c.E});
  HostTensor bias(DType::kF32, {c.E});
  if (c.bias && c.bias_std > 0) bias.fill_normal(rng, c.bias_std);
  const HostTensor* bias_p = c.bias ? &bias : nullptr;
  for (int64_t t = 0; t < c.T; ++t) {
    int tries = 0;
    do {
      fill_row(g, t, c, rng);
      ASSERT_LT(++tries, 200) << "could not draw a tie-free row";
    } while (!row_is_tie_free(g, bias_p, t, c.p));
  }
  TopKOut ref = run_reference(g, bias_p, c.p);
  // With a map the kernel writes the picked expert's local id (or -1): the layer ops' instance.
  HostTensor map(DType::kI32, {c.E});
  if (c.num_local > 0) {
    const std::vector<int32_t> m = random_expert_map(c.E, c.num_local, rng);
    std::memcpy(map.data(), m.data(), m.size() * 4);
    int32_t* ids = ref.ids.as<int32_t>();
    for (int64_t i = 0; i < c.T * c.p.top_k; ++i) {
      const int32_t local = m[ids[i]];
      ids[i] = local >= 0 && local < c.num_local ? local : -1;
    }
  }

  testing::DeviceTensor dg(g), dbias(bias), dmap(map);
  testing::DeviceTensor dw(DType::kF32, {c.T, c.p.top_k}, 0xFF);    // NaN poison
  testing::DeviceTensor dids(DType::kI32, {c.T, c.p.top_k}, 0x5A);  // 0x5a5a5a5a poison
  FusedTopKArgs a;
  a.gating_output = dg.view();
  if (c.bias) a.correction_bias = dbias.view();
  a.params = c.p;
  a.topk_weights = dw.view();
  a.topk_ids = dids.view();
  const auto run = [&] {
    if (c.num_local == 0) return fused_topk(a, nullptr);
    detail::FusedTopKLaunch l;  // as fused_moe launches it with an expert map
    l.gating = dg.data();
    l.dtype = c.dtype;
    l.bias = c.bias ? static_cast<const float*>(dbias.data()) : nullptr;
    l.num_tokens = c.T;
    l.num_experts = c.E;
    l.params = c.p;
    l.topk_weights = static_cast<float*>(dw.data());
    l.topk_ids = static_cast<int32_t*>(dids.data());
    l.expert_map = static_cast<const int32_t*>(dmap.data());
    l.num_local = c.num_local;
    detail::launch_fused_topk(l, nullptr);
  };
  run();
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  HostTensor w = dw.download(), ids = dids.download();

  const int64_t n = c.T * c.p.top_k;
  int64_t id_mismatch = 0, w_mismatch = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (ids.as<int32_t>()[i] != ref.ids.as<int32_t>()[i]) {
      if (id_mismatch++ < 5)
        ADD_FAILURE() << "id mismatch at token " << i / c.p.top_k << " k " << i % c.p.top_k
                      << ": got " << ids.as<int32_t>()[i] << ", want " << ref.ids.as<int32_t>()[i];
    }
    const double got = w.as<float>()[i], want = ref.w.as<float>()[i];
    if (!(std::abs(got - want) <= 1e-6 * std::abs(want))) {
      if (w_mismatch++ < 5)
        ADD_FAILURE() << "weight mismatch at " << i << ": got " << got << ", want " << want;
    }
  }
  EXPECT_EQ(id_mismatch, 0);
  EXPECT_EQ(w_mismatch, 0);

  // Bit-identical on a second run, into freshly poisoned outputs (a run that wrote nothing
  // would otherwise pass).
  MOEKIT_CUDA_OK(cudaMemset(dw.data(), 0xFF, w.nbytes()));
  MOEKIT_CUDA_OK(cudaMemset(dids.data(), 0x5A, ids.nbytes()));
  run();
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  HostTensor w2 = dw.download(), ids2 = dids.download();
  EXPECT_EQ(std::memcmp(w.data(), w2.data(), w.nbytes()), 0);
  EXPECT_EQ(std::memcmp(ids.data(), ids2.data(), ids.nbytes()), 0);
}

std::vector<TopKCase> random_cases() {
  std::vector<TopKCase> cases = {
      {DType::kF32, 1, 128, params(8, kSoftmax, true)},
      {DType::kF32, 37, 128, params(8, kSoftmax, false)},
      {DType::kF32, 133, 384, params(8, kSigmoid, true), false},
      {DType::kF32, 133, 384, params(8, kSigmoid, true), true},
      {DType::kF32, 100, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true},
      {DType::kF32, 100, 256, params(8, kSoftmax, false, 8, 4), false},
      {DType::kF32, 64, 160, params(8, kSigmoid, true, 0, 0, 2.5f), true},
      {DType::kF32, 50, 512, params(16, kSoftmax, true), false},
      {DType::kF32, 50, 512, params(16, kSigmoid, false, 16, 3, 1.5f), true},
      {DType::kF32, 50, 512, params(16, kSigmoid, true, 512, 20), true},  // groups of one
      {DType::kF32, 29, 96, params(4, kSoftmax, true, 3, 2), false},
      {DType::kF32, 17, 8, params(8, kSoftmax, false), false},  // K == E
      {DType::kF32, 17, 1, params(1, kSigmoid, false), true},   // E == 1
      {DType::kF32, 9, 33, params(5, kSoftmax, true), false},   // E just past a warp
      {DType::kF32, 9, 64, params(2, kSigmoid, true, 2, 1), true},
      {DType::kF32, 9, 64, params(2, kSigmoid, true, 4, 4), true},  // every group kept
      {DType::kBF16, 513, 128, params(8, kSoftmax, true)},
      {DType::kF16, 513, 128, params(8, kSoftmax, true)},
      {DType::kBF16, 333, 384, params(8, kSigmoid, true), true},
      {DType::kF16, 333, 384, params(8, kSigmoid, true), true},
      {DType::kBF16, 64, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true},
      {DType::kF16, 64, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true},
      {DType::kBF16, 31, 512, params(16, kSoftmax, false), false},
  };
  return cases;
}

TEST(FusedTopKGpu, MatchesReferenceOnRandomInputs) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 1234;
  for (const TopKCase& c : random_cases()) check_topk_case(c, seed++);
}

TEST(FusedTopKGpu, EmptyAndLargeBatches) {
  MOEKIT_REQUIRE_GPU();
  check_topk_case({DType::kBF16, 0, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true}, 7);
  check_topk_case({DType::kBF16, 65536, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true}, 8);
  check_topk_case({DType::kF32, 65536, 128, params(8, kSoftmax, true)}, 9);
  // The largest rows and K (the CPU reference of these takes ~8 s each).
  check_topk_case({DType::kBF16, 65536, 512, params(16, kSigmoid, true, 16, 3, 2.5f), true}, 47);
  check_topk_case({DType::kF16, 65536, 512, params(16, kSoftmax, true)}, 48);
}

// Both instantiations of the PDL trigger (it only decides when the next kernel may launch):
// on an H200, grids of one wave with spare CTA slots (T = 4096 with E = 128 or 256) skip
// the early trigger; E = 384 (a full wave) and small grids trigger.
TEST(FusedTopKGpu, EarlyAndLateTriggerMatchReference) {
  MOEKIT_REQUIRE_GPU();
  check_topk_case({DType::kBF16, 4096, 128, params(8, kSoftmax, true)}, 70);
  check_topk_case({DType::kBF16, 4096, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true}, 80);
  check_topk_case({DType::kF16, 4096, 384, params(8, kSigmoid, true)}, 90);
  check_topk_case({DType::kF32, 200, 64, params(4, kSoftmax, false)}, 95);
}

TEST(FusedTopKGpu, TiesGoToTheLowerId) {
  MOEKIT_REQUIRE_GPU();
  // Logits from a handful of integer levels: most rows hold exact ties in and around
  // the top-k (and, with groups, tied group scores).
  std::vector<TopKCase> cases = {
      {DType::kBF16, 200, 128, params(8, kSoftmax, true), false, 1.0, 3},
      {DType::kF32, 200, 384, params(8, kSigmoid, true), false, 1.0, 4},
      {DType::kBF16, 200, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true, 1.0, 4, 0.0},
      {DType::kF16, 200, 512, params(16, kSoftmax, false, 32, 7), false, 1.0, 2},
      {DType::kF32, 50, 64, params(8, kSoftmax, false), false, 1.0, 1},  // all equal
  };
  uint64_t seed = 99;
  for (const TopKCase& c : cases) check_topk_case(c, seed++);
  // Direct check of the rule: all-equal logits pick experts 0..K-1 in order.
  HostTensor g(DType::kF32, {3, 64});
  testing::DeviceTensor dg(g), dw(DType::kF32, {3, 8}), dids(DType::kI32, {3, 8});
  FusedTopKArgs a;
  a.gating_output = dg.view();
  a.params = params(8, kSoftmax, true);
  a.topk_weights = dw.view();
  a.topk_ids = dids.view();
  fused_topk(a, nullptr);
  HostTensor ids = dids.download(), w = dw.download();
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(ids.as<int32_t>()[i], i % 8);
    EXPECT_FLOAT_EQ(w.as<float>()[i], 0.125f);
  }
}

// Edge shapes of the limits against the reference: E = 512 with top_k = 16, odd T,
// one token (T = 65536 with E = 512: EmptyAndLargeBatches).
TEST(FusedTopKGpu, LimitShapes) {
  MOEKIT_REQUIRE_GPU();
  check_topk_case({DType::kF32, 1, 512, params(16, kSigmoid, false), true}, 43);
  check_topk_case({DType::kBF16, 1, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true}, 44);
  check_topk_case({DType::kBF16, 4097, 384, params(16, kSigmoid, true), true}, 45);
  check_topk_case({DType::kF32, 333, 200, params(16, kSoftmax, false, 8, 5), false}, 46);
}

// Odd expert counts and counts past 512 (the 32-slot instance, E > 512), at T = 1, 7, 64
// and 4096 (a grid past 64 blocks: both PDL trigger instances), softmax and sigmoid, with
// a bias, grouped on both group paths (groups of one 32-expert slot: E = 1024 in 32 groups;
// staged in shared memory: 3 groups of 43 / 171, 8 of 128, 1024 groups of one), ties,
// top_k = 16, and huge sigmoid logits (the exact reciprocal).
TEST(FusedTopKGpu, ManyAndOddExperts) {
  MOEKIT_REQUIRE_GPU();
  std::vector<TopKCase> cases;
  const DType dts[] = {DType::kBF16, DType::kF16, DType::kF32};
  int i = 0;
  for (int E : {129, 257, 513, 1024}) {
    for (int64_t T : {1, 7, 64, 4096}) {
      const DType dt = dts[i++ % 3];
      cases.push_back({dt, T, E, params(8, kSoftmax, true)});
      cases.push_back({dt, T, E, params(16, kSigmoid, true, 0, 0, 2.5f), true});
    }
  }
  const std::vector<TopKCase> extra = {
      {DType::kBF16, 300, 129, params(8, kSigmoid, true, 3, 2, 2.5f), true},
      {DType::kF32, 300, 513, params(8, kSoftmax, false, 3, 1), false},
      {DType::kBF16, 300, 513, params(16, kSigmoid, true, 3, 2, 1.5f), true},
      {DType::kBF16, 4096, 1024, params(8, kSigmoid, true, 32, 4, 2.5f), true},  // slot groups
      {DType::kF16, 300, 1024, params(8, kSigmoid, true, 32, 4, 2.5f), false},
      {DType::kF32, 300, 1024, params(16, kSigmoid, true, 8, 3, 2.5f), true},
      {DType::kBF16, 64, 1024, params(16, kSigmoid, true, 1024, 20), true},  // groups of one
      {DType::kF32, 7, 1024, params(16, kSoftmax, false), false},
      {DType::kBF16, 200, 1024, params(8, kSoftmax, true), false, 1.0, 3},  // ties
      {DType::kF16, 200, 513, params(16, kSoftmax, false, 3, 2), false, 1.0, 2},
      {DType::kBF16, 300, 1024, params(16, kSigmoid, false, 16, 3, 1.5f), true, 60.0},
      {DType::kF16, 300, 513, params(8, kSigmoid, true), true, 60.0},
      {DType::kF32, 17, 1024, params(16, kSigmoid, false), true},
      {DType::kBF16, 65536, 1024, params(8, kSoftmax, true)},
  };
  cases.insert(cases.end(), extra.begin(), extra.end());
  uint64_t seed = 800;
  for (const TopKCase& c : cases) check_topk_case(c, seed++);
}

// The mapped instances (the layer ops with an expert map) on every slot count (E_global 96,
// 160, 300, 400, 512, 1024: 4, 8, 12, 16, 16, 32 slots), softmax and sigmoid with a bias,
// DeepSeek-V3's grouped routing (E = 256, 8 groups, 4 kept, correction_bias, K = 8) and
// ties, one and many tokens (both PDL trigger instances): the local ids of the reference's
// picks, -1 for remote experts and out-of-range map entries, the reference's weights.
TEST(FusedTopKGpu, ExpertMapWritesLocalIdsOnEverySlotCount) {
  MOEKIT_REQUIRE_GPU();
  std::vector<TopKCase> cases;
  const DType dts[] = {DType::kBF16, DType::kF16, DType::kF32};
  int i = 0;
  for (int E : {96, 160, 300, 400, 512, 1024}) {
    for (int64_t T : {1, 77, 4096}) {
      const DType dt = dts[i++ % 3];
      TopKCase soft{dt, T, E, params(8, kSoftmax, true)};
      soft.num_local = E / 8;
      TopKCase sig{dt, T, E, params(16, kSigmoid, true, 0, 0, 2.5f), true};
      sig.num_local = E / 4;
      cases.push_back(soft);
      cases.push_back(sig);
    }
  }
  for (int64_t T : {1, 64, 333, 4096}) {
    for (const DType dt : dts) {
      TopKCase ds{dt, T, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true};
      ds.num_local = 32;  // EP 8: one rank's experts
      cases.push_back(ds);
    }
  }
  TopKCase ties{DType::kBF16, 200, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true, 1.0, 4, 0.0};
  ties.num_local = 64;
  cases.push_back(ties);
  TopKCase all_local{DType::kF32, 100, 300, params(8, kSoftmax, false)};
  all_local.num_local = 300;  // every expert local (a permutation of the ids)
  cases.push_back(all_local);
  uint64_t seed = 4242;
  for (const TopKCase& c : cases) check_topk_case(c, seed++);
}

// Huge logits: sigmoid scores below the normal range take the exact reciprocal
// (fused_topk.cu), on every slot count and group path.
TEST(FusedTopKGpu, HugeSigmoidLogitsMatchReference) {
  MOEKIT_REQUIRE_GPU();
  const std::vector<TopKCase> cases = {
      {DType::kF16, 37, 128, params(8, kSigmoid, true), true, 60.0},
      {DType::kBF16, 300, 160, params(8, kSigmoid, true, 0, 0, 2.5f), true, 60.0},
      {DType::kBF16, 300, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true, 60.0},
      {DType::kF16, 300, 384, params(8, kSigmoid, true), true, 60.0},
      {DType::kBF16, 300, 512, params(16, kSigmoid, false, 16, 3, 1.5f), true, 60.0},
      {DType::kBF16, 300, 512, params(16, kSigmoid, true, 512, 20), true, 60.0},
      {DType::kF32, 300, 64, params(2, kSigmoid, true, 2, 1), true, 60.0},
  };
  uint64_t seed = 500;
  for (const TopKCase& c : cases) check_topk_case(c, seed++);
}

// Per-call device time of seed-page shapes: a CUDA graph of back-to-back calls.
TEST(FusedTopKGpu, TimingOfSeedShapes) {
  MOEKIT_REQUIRE_GPU();
  struct Shape {
    const char* name;
    DType dtype;
    int64_t T;
    int E;
    TopKParams p;
    bool bias;
  };
  std::vector<Shape> shapes = {
      {"kimi-k2-t32", DType::kBF16, 32, 384, params(8, kSigmoid, true), false},
      {"kimi-k2-t4096", DType::kBF16, 4096, 384, params(8, kSigmoid, true), false},
      {"qwen3-235b-t512", DType::kBF16, 512, 128, params(8, kSoftmax, true), false},
      {"qwen3-235b-t4096", DType::kBF16, 4096, 128, params(8, kSoftmax, true), false},
      {"kimi-k2-t512-bias", DType::kBF16, 512, 384, params(8, kSigmoid, true), true},
      {"ds-v3-grouped-t1", DType::kBF16, 1, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true},
      {"ds-v3-grouped-t4096", DType::kBF16, 4096, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true},
  };
  cudaStream_t s;
  MOEKIT_CUDA_OK(cudaStreamCreate(&s));
  for (const Shape& sh : shapes) {
    std::mt19937_64 rng(5);
    HostTensor g(sh.dtype, {sh.T, sh.E}), bias(DType::kF32, {sh.E});
    g.fill_normal(rng);
    bias.fill_normal(rng, 0.1);
    testing::DeviceTensor dg(g), db(bias), dw(DType::kF32, {sh.T, 8}), di(DType::kI32, {sh.T, 8});
    FusedTopKArgs a;
    a.gating_output = dg.view();
    if (sh.bias) a.correction_bias = db.view();
    a.params = sh.p;
    a.topk_weights = dw.view();
    a.topk_ids = di.view();
    constexpr int kReps = 50;
    fused_topk(a, s);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MOEKIT_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < kReps; ++i) fused_topk(a, s);
    MOEKIT_CUDA_OK(cudaStreamEndCapture(s, &graph));
    MOEKIT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    MOEKIT_CUDA_OK(cudaGraphLaunch(exec, s));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, s);
    for (int i = 0; i < 5; ++i) cudaGraphLaunch(exec, s);
    cudaEventRecord(e1, s);
    MOEKIT_CUDA_OK(cudaEventSynchronize(e1));
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    printf("[timing] fused_topk %-22s %7.2f us/call\n", sh.name, 1000.0 * ms / (5 * kReps));
    // The replays' output: ids of experts, distinct per token, finite weights.
    HostTensor ids = di.download(), w = dw.download();
    for (int64_t t = 0; t < sh.T; ++t) {
      for (int k = 0; k < 8; ++k) {
        const int32_t e = ids.as<int32_t>()[t * 8 + k];
        ASSERT_TRUE(e >= 0 && e < sh.E) << sh.name << " token " << t << " id " << e;
        for (int j = 0; j < k; ++j) ASSERT_NE(e, ids.as<int32_t>()[t * 8 + j]) << sh.name;
        ASSERT_TRUE(std::isfinite(w.as<float>()[t * 8 + k])) << sh.name << " token " << t;
      }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace moekit
