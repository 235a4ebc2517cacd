// CPU tests of compare_amax_ties and compare_fp8_ties (sweep_outcome.h): a failing comparison
// of a dynamic FP8 per-tensor case is retried at the activation amax's neighbouring bf16 steps,
// and only there; a failing CPU comparison of quantized activations once with their near-ties
// flipped, and only then.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sweep_outcome.h"

namespace moekit::sweep {
namespace {

// Runs compare_amax_ties with a reference that matches only at the steps in `passing`;
// returns the steps the reference ran at.
std::vector<int> retry(Outcome& o, bool amax_tie, const std::vector<int>& passing) {
  std::vector<int> runs;
  compare_amax_ties(
      o, amax_tie, [&](int ulps) { runs.push_back(ulps); },
      [&](Outcome& r) {
        for (const int p : passing)
          if (p == runs.back()) return;
        r.fail("output: step " + std::to_string(runs.back()) + " differs");
      });
  return runs;
}

TEST(SweepOutcome, APassingComparisonRunsTheReferenceOnce) {
  Outcome o;
  o.reference = "gpu-f32";
  EXPECT_EQ(retry(o, true, {0}), std::vector<int>{0});
  EXPECT_TRUE(o.passed);
  EXPECT_EQ(o.reference, "gpu-f32");
}

TEST(SweepOutcome, WithoutATieAFailureIsNotRetried) {
  Outcome o;
  EXPECT_EQ(retry(o, false, {1, -1}), std::vector<int>{0});
  EXPECT_FALSE(o.passed);
  ASSERT_EQ(o.problems.size(), 1u);
  EXPECT_EQ(o.problems[0], "output: step 0 differs");
}

TEST(SweepOutcome, ATiePassesAtEitherNeighbouringStepAndSaysWhich) {
  Outcome up;
  EXPECT_EQ(retry(up, true, {1}), (std::vector<int>{0, 1}));
  EXPECT_TRUE(up.passed);
  EXPECT_NE(up.reference.find("+1 bf16 step"), std::string::npos);
  Outcome down;
  EXPECT_EQ(retry(down, true, {-1}), (std::vector<int>{0, 1, -1}));
  EXPECT_TRUE(down.passed);
  EXPECT_NE(down.reference.find("-1 bf16 step"), std::string::npos);
}

TEST(SweepOutcome, ATieFailingEverywhereKeepsTheFirstProblemsAndEarlierOnes) {
  Outcome o;
  o.fail("expert_output: NaN in a valid row");
  EXPECT_EQ(retry(o, true, {2}), (std::vector<int>{0, 1, -1}));
  EXPECT_FALSE(o.passed);
  ASSERT_EQ(o.problems.size(), 2u);
  EXPECT_EQ(o.problems[1], "output: step 0 differs");
}

// Runs compare_fp8_ties with a reference that matches only at the readings in `passing`;
// returns the readings (flip_ties) it ran.
std::vector<bool> retry_ties(Outcome& o, bool fp8_acts, const std::vector<bool>& passing) {
  std::vector<bool> runs;
  compare_fp8_ties(o, fp8_acts, [&](bool flip, Outcome& r) {
    runs.push_back(flip);
    for (const bool p : passing)
      if (p == flip) return;
    r.fail(std::string("output: ") + (flip ? "flipped" : "as rounded") + " differs");
  });
  return runs;
}

TEST(SweepOutcome, Fp8TiesRetryOnlyAFailureOfQuantizedActivations) {
  Outcome pass;
  pass.reference = "cpu-f64";
  EXPECT_EQ(retry_ties(pass, true, {false}), std::vector<bool>{false});
  EXPECT_TRUE(pass.passed);
  EXPECT_EQ(pass.reference, "cpu-f64");
  Outcome unquantized;
  EXPECT_EQ(retry_ties(unquantized, false, {true}), std::vector<bool>{false});
  EXPECT_FALSE(unquantized.passed);
  Outcome tie;
  tie.reference = "cpu-f64";
  EXPECT_EQ(retry_ties(tie, true, {true}), (std::vector<bool>{false, true}));
  EXPECT_TRUE(tie.passed);
  EXPECT_NE(tie.reference.find("near-ties rounded the other way"), std::string::npos);
  Outcome wrong;
  wrong.fail("output: 3 NaN/Inf in valid rows");
  EXPECT_EQ(retry_ties(wrong, true, {}), (std::vector<bool>{false, true}));
  EXPECT_FALSE(wrong.passed);
  ASSERT_EQ(wrong.problems.size(), 2u);
  EXPECT_EQ(wrong.problems[1], "output: as rounded differs");
}

}  // namespace
}  // namespace moekit::sweep
