// FusedTopKFwd with NaN and Inf in the logits or the bias (docs/routing-permute.md "NaN
// and Inf logits"). CPU: the reference's NaN rule on hand-computed rows. GPU: on every
// kernel path (slot counts 4-16, grouped one-slot-per-group and shared-memory groups), rows holding
// a NaN / +-Inf logit (one, several, all, negative NaNs) give K distinct ids in [0, E) and match
// the reference (weights NaN where it says); every other row equals the clean run's bytes. Skipped
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moekit/reference.h"
#include "moekit/routing.h"
#include "reference/host_tensor.h"
#include "support/gpu.h"
#include "support/nonfinite.h"
#include "test_routing_common.h"

namespace moekit {
namespace {

using namespace routetest;  // NOLINT: the shared routing test helpers

HostTensor f32_row(std::vector<double> v) {
  HostTensor t(DType::kF32, {1, static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), v[i]);
  return t;
}

// ---------------------------------------------------------------- CPU: the reference

TEST(FusedTopKNonFiniteReference, NanSelRanksFirstAndKeepsItsNanWeight) {
  // Sigmoid: the NaN expert first, then the largest numbers; +Inf -> 1, -Inf -> 0.
  const TopKOut o = run_reference(f32_row({0.5, NAN, 2.0, -INFINITY, INFINITY}), nullptr,
                                  params(3, kSigmoid, false));
  EXPECT_EQ(o.ids.as<int32_t>()[0], 1);
  EXPECT_EQ(o.ids.as<int32_t>()[1], 4);
  EXPECT_EQ(o.ids.as<int32_t>()[2], 2);
  EXPECT_TRUE(std::isnan(o.w.as<float>()[0]));
  EXPECT_EQ(o.w.as<float>()[1], 1.0f);
  EXPECT_FLOAT_EQ(o.w.as<float>()[2], static_cast<float>(sigmoid(2.0)));
  // Renormalized, the NaN reaches every weight of the row.
  const TopKOut r =
      run_reference(f32_row({0.5, NAN, 2.0, 1.0}), nullptr, params(2, kSigmoid, true));
  EXPECT_TRUE(std::isnan(r.w.as<float>()[0]) && std::isnan(r.w.as<float>()[1]));
  // Two NaNs tie: the lower id first.
  const TopKOut t =
      run_reference(f32_row({NAN, 3.0, NAN, 1.0}), nullptr, params(3, kSigmoid, false));
  EXPECT_EQ(t.ids.as<int32_t>()[0], 0);
  EXPECT_EQ(t.ids.as<int32_t>()[1], 2);
  EXPECT_EQ(t.ids.as<int32_t>()[2], 1);
}

TEST(FusedTopKNonFiniteReference, SoftmaxOfANanOrInfRowIsAllNan) {
  for (double bad : {static_cast<double>(NAN), static_cast<double>(INFINITY)}) {
    const TopKOut o =
        run_reference(f32_row({0.5, 3.0, bad, 1.0}), nullptr, params(2, kSoftmax, false));
    EXPECT_EQ(o.ids.as<int32_t>()[0], 0) << bad;  // every sel NaN: ids 0..K-1
    EXPECT_EQ(o.ids.as<int32_t>()[1], 1) << bad;
    EXPECT_TRUE(std::isnan(o.w.as<float>()[0]) && std::isnan(o.w.as<float>()[1])) << bad;
  }
  // -Inf logits get weight 0; a row of only -Inf is all NaN.
  const TopKOut o =
      run_reference(f32_row({-INFINITY, 0.0, -INFINITY, 0.0}), nullptr, params(3, kSoftmax, false));
  EXPECT_EQ(o.ids.as<int32_t>()[0], 1);
  EXPECT_EQ(o.ids.as<int32_t>()[1], 3);
  EXPECT_EQ(o.w.as<float>()[0], 0.5f);
  EXPECT_EQ(o.w.as<float>()[2], 0.0f);
  const TopKOut all =
      run_reference(f32_row({-INFINITY, -INFINITY}), nullptr, params(1, kSoftmax, false));
  EXPECT_TRUE(std::isnan(all.w.as<float>()[0]));
}

TEST(FusedTopKNonFiniteReference, GroupWithANanScoresFirst) {
  // Groups of two; without a bias a group scores its best sel: group 0 holds the NaN.
  const TopKOut o = run_reference(f32_row({0.1, NAN, 3.0, 2.0, 1.0, 0.0}), nullptr,
                                  params(2, kSigmoid, false, 3, 1));
  EXPECT_EQ(o.ids.as<int32_t>()[0], 1);
  EXPECT_EQ(o.ids.as<int32_t>()[1], 0);
  // A NaN in the bias moves the selection only: expert 2 first, its weight a number.
  HostTensor bias(DType::kF32, {4});
  bias.set(2, NAN);
  const TopKOut b =
      run_reference(f32_row({1.0, 2.0, -1.0, 0.0}), &bias, params(2, kSigmoid, false));
  EXPECT_EQ(b.ids.as<int32_t>()[0], 2);
  EXPECT_EQ(b.ids.as<int32_t>()[1], 1);
  EXPECT_FLOAT_EQ(b.w.as<float>()[0], static_cast<float>(sigmoid(-1.0)));
}

// ---------------------------------------------------------------- GPU

// How a row's logits are poisoned.
enum class Poison {
  kNone,
  kOneNan,       // one NaN
  kNegativeNan,  // NaNs with the sign bit set and a payload, two of them
  kAllNan,
  kPosInf,  // one +Inf
  kNegInf,  // three -Inf
  kMixed,   // +Inf, -Inf and NaN
  kAllNegInf,
  kCount,
};

const char* poison_name(Poison p) {
  static const char* names[] = {"none",    "one_nan", "negative_nan", "all_nan", "pos_inf",
                                "neg_inf", "mixed",   "all_neg_inf",  "?"};
  return names[static_cast<int>(p)];
}

// Element i as the non-finite value (raw bits: a NaN's sign and payload survive).
void set_bits(HostTensor& g, int64_t i, bool nan, bool negative) {
  using testing::NonFinite;
  testing::set_nonfinite(g, i,
                         nan ? (negative ? NonFinite::kNegativeNan : NonFinite::kNan)
                             : (negative ? NonFinite::kNegInf : NonFinite::kPosInf));
}

void poison_row(HostTensor& g, int64_t t, int E, Poison p, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> col(0, E - 1);
  const int64_t base = t * E;
  switch (p) {
    case Poison::kNone:
    case Poison::kCount:
      break;
    case Poison::kOneNan:
      set_bits(g, base + col(rng), true, false);
      break;
    case Poison::kNegativeNan:
      set_bits(g, base + col(rng), true, true);
      set_bits(g, base + col(rng), true, true);
      break;
    case Poison::kAllNan:
      for (int e = 0; e < E; ++e) set_bits(g, base + e, true, e % 2 == 1);
      break;
    case Poison::kPosInf:
      set_bits(g, base + col(rng), false, false);
      break;
    case Poison::kNegInf:
      for (int i = 0; i < 3; ++i) set_bits(g, base + col(rng), false, true);
      break;
    case Poison::kMixed:
      set_bits(g, base + col(rng), false, false);
      set_bits(g, base + col(rng), false, true);
      set_bits(g, base + col(rng), true, false);
      break;
    case Poison::kAllNegInf:
      for (int e = 0; e < E; ++e) set_bits(g, base + e, false, true);
      break;
  }
}

struct NonFiniteCase {
  DType dtype;
  int64_t T;
  int E;
  TopKParams p;
  bool bias;
};

std::string describe(const NonFiniteCase& c) {
  return std::string(dtype_name(c.dtype)) + " T=" + std::to_string(c.T) +
         " E=" + std::to_string(c.E) + " K=" + std::to_string(c.p.top_k) +
         (c.p.scoring_func == kSoftmax ? " softmax" : " sigmoid") + (c.bias ? " bias" : "") +
         (c.p.renormalize ? " renorm" : "") + " groups=" + std::to_string(c.p.num_expert_group) +
         "/" + std::to_string(c.p.topk_group);
}

TopKOut run_gpu(const HostTensor& g, const HostTensor* bias, const TopKParams& p) {
  const int64_t T = g.shape()[0];
  testing::DeviceTensor dg(g), db(bias ? *bias : HostTensor(DType::kF32, {1}));
  testing::DeviceTensor dw(DType::kF32, {T, p.top_k}, 0x5A), di(DType::kI32, {T, p.top_k}, 0x5A);
  FusedTopKArgs a;
  a.gating_output = dg.view();
  if (bias) a.correction_bias = db.view();
  a.params = p;
  a.topk_weights = dw.view();
  a.topk_ids = di.view();
  fused_topk(a, nullptr);
  const cudaError_t err = cudaDeviceSynchronize();
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  return {dw.download(), di.download()};
}

bool same_weight(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::abs(static_cast<double>(got) - want) <= 1e-6 * std::abs(static_cast<double>(want));
}

// K distinct ids in [0, E) in every row: what a layer needs to index safely.
void expect_valid_ids(const HostTensor& ids, int64_t T, int K, int E, const char* what) {
  int64_t bad = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* row = ids.as<int32_t>() + t * K;
    for (int k = 0; k < K; ++k) {
      const bool in_range = row[k] >= 0 && row[k] < E;
      const bool repeated = std::find(row, row + k, row[k]) != row + k;
      if ((!in_range || repeated) && bad++ < 3) {
        ADD_FAILURE() << what << ": token " << t << " k " << k << " id " << row[k]
                      << (repeated ? " (repeated)" : " (out of range)");
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

void check_nonfinite_case(const NonFiniteCase& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937_64 rng(seed);
  const int K = c.p.top_k;
  HostTensor clean(c.dtype, {c.T, c.E}), bias(DType::kF32, {c.E});
  clean.fill_normal(rng, 1.0);
  if (c.bias) bias.fill_normal(rng, 0.1);
  const HostTensor* bias_p = c.bias ? &bias : nullptr;
  // Every third row poisoned, cycling through the patterns; the others as drawn.
  std::vector<Poison> poison(static_cast<size_t>(c.T), Poison::kNone);
  HostTensor dirty(c.dtype, {c.T, c.E});
  for (int64_t t = 0; t < c.T; ++t) {
    if (t % 3 == 1) poison[t] = static_cast<Poison>(1 + (t / 3) % (int(Poison::kCount) - 1));
    for (int tries = 0;; ++tries) {
      ASSERT_LT(tries, 200) << "could not draw a tie-free row";
      std::memcpy(static_cast<char*>(dirty.data()) + t * c.E * dtype_size(c.dtype),
                  static_cast<const char*>(clean.data()) + t * c.E * dtype_size(c.dtype),
                  c.E * dtype_size(c.dtype));
      poison_row(dirty, t, c.E, poison[t], rng);
      if (poison[t] == Poison::kNone || row_is_tie_free(dirty, bias_p, t, c.p)) break;
      for (int e = 0; e < c.E; ++e) {  // a new clean row, then poison it again
        clean.set(t * c.E + e, std::normal_distribution<double>(0.0, 1.0)(rng));
      }
    }
  }
  const TopKOut ref = run_reference(dirty, bias_p, c.p);
  const TopKOut base = run_gpu(clean, bias_p, c.p);
  const TopKOut got = run_gpu(dirty, bias_p, c.p);
  expect_valid_ids(got.ids, c.T, K, c.E, "poisoned logits");
  int64_t changed = 0, mismatched = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    const size_t off = static_cast<size_t>(t * K);
    if (poison[t] == Poison::kNone) {
      changed += std::memcmp(got.w.as<float>() + off, base.w.as<float>() + off, K * 4) != 0 ||
                 std::memcmp(got.ids.as<int32_t>() + off, base.ids.as<int32_t>() + off, K * 4);
      continue;
    }
    for (int k = 0; k < K; ++k) {
      const int32_t id = got.ids.as<int32_t>()[off + k], want = ref.ids.as<int32_t>()[off + k];
      const float w = got.w.as<float>()[off + k], ww = ref.w.as<float>()[off + k];
      if ((id != want || !same_weight(w, ww)) && mismatched++ < 5) {
        ADD_FAILURE() << "token " << t << " (" << poison_name(poison[t]) << ") k " << k
                      << ": got id " << id << " w " << w << ", want id " << want << " w " << ww;
      }
    }
  }
  EXPECT_EQ(changed, 0) << "rows without a non-finite logit differ from the clean run";
  EXPECT_EQ(mismatched, 0);
}

TEST(FusedTopKNonFiniteGpu, PoisonedRowsFollowTheReferenceOthersAreUntouched) {
  MOEKIT_REQUIRE_GPU();
  const std::vector<NonFiniteCase> cases = {
      {DType::kF32, 64, 128, params(8, kSoftmax, true), false},
      {DType::kBF16, 64, 128, params(8, kSigmoid, false), true},
      {DType::kBF16, 64, 256, params(8, kSigmoid, true, 8, 4, 2.5f), true},  // one slot a group
      {DType::kF16, 64, 256, params(8, kSoftmax, false, 8, 4), false},
      {DType::kF16, 48, 384, params(8, kSigmoid, true), true},
      {DType::kF32, 48, 512, params(16, kSoftmax, true, 32, 7), false},  // shared-memory groups
      {DType::kBF16, 48, 512, params(16, kSigmoid, false, 64, 9, 1.5f), true},
      {DType::kF32, 33, 96, params(4, kSigmoid, true, 6, 2), true},
      {DType::kF32, 24, 8, params(8, kSoftmax, false), false},  // K == E
      {DType::kBF16, 24, 1, params(1, kSigmoid, true), true},   // E == 1
  };
  uint64_t seed = 2800;
  for (const NonFiniteCase& c : cases) check_nonfinite_case(c, seed++);
}

// The same at odd expert counts and past 512 (the 32-slot rows): plain, shared-memory
// groups (3 of 171) and one-slot groups (32 of 32).
TEST(FusedTopKNonFiniteGpu, PoisonedRowsManyAndOddExperts) {
  MOEKIT_REQUIRE_GPU();
  const std::vector<NonFiniteCase> cases = {
      {DType::kF32, 33, 129, params(8, kSigmoid, true), true},
      {DType::kF32, 48, 513, params(8, kSoftmax, true), false},
      {DType::kF16, 48, 513, params(8, kSigmoid, true, 3, 2, 2.5f), true},
      {DType::kF32, 48, 513, params(16, kSoftmax, false, 3, 1), false},
      {DType::kF32, 48, 1024, params(16, kSigmoid, false, 32, 4), true},
      {DType::kF32, 48, 1024, params(8, kSoftmax, true), false},
  };
  uint64_t seed = 2850;
  for (const NonFiniteCase& c : cases) check_nonfinite_case(c, seed++);
}

// A NaN or an Inf in the bias: every row's selection moves (NaN: that expert first), the
// weights stay the unbiased scores; ids valid, as the reference.
TEST(FusedTopKNonFiniteGpu, NonFiniteBiasMovesOnlyTheSelection) {
  MOEKIT_REQUIRE_GPU();
  struct BiasCase {
    int E;
    TopKParams p;
    float value;
  };
  const BiasCase cases[] = {
      {128, params(8, kSigmoid, true), NAN},
      {256, params(8, kSigmoid, true, 8, 4, 2.5f), NAN},
      {256, params(8, kSigmoid, true, 8, 4, 2.5f), INFINITY},
      {192, params(6, kSigmoid, false, 12, 3), -INFINITY},
  };
  uint64_t seed = 2900;
  for (const BiasCase& c : cases) {
    SCOPED_TRACE("E=" + std::to_string(c.E) + " bias value " + std::to_string(c.value));
    std::mt19937_64 rng(seed++);
    const int64_t T = 40;
    HostTensor g(DType::kBF16, {T, c.E}), bias(DType::kF32, {c.E});
    g.fill_normal(rng, 1.0);
    bias.fill_normal(rng, 0.1);
    bias.set(5, c.value);
    for (int64_t t = 0; t < T; ++t) {
      for (int tries = 0; !row_is_tie_free(g, &bias, t, c.p); ++tries) {
        ASSERT_LT(tries, 200);
        for (int e = 0; e < c.E; ++e)
          g.set(t * c.E + e, std::normal_distribution<double>(0.0, 1.0)(rng));
      }
    }
    const TopKOut ref = run_reference(g, &bias, c.p);
    const TopKOut got = run_gpu(g, &bias, c.p);
    expect_valid_ids(got.ids, T, c.p.top_k, c.E, "non-finite bias");
    EXPECT_EQ(std::memcmp(got.ids.data(), ref.ids.data(), got.ids.nbytes()), 0);
    int64_t bad_w = 0;
    for (int64_t i = 0; i < T * c.p.top_k; ++i)
      bad_w += !same_weight(got.w.as<float>()[i], ref.w.as<float>()[i]);
    EXPECT_EQ(bad_w, 0);
  }
}

}  // namespace
}  // namespace moekit
