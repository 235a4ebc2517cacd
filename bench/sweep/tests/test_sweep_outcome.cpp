// CPU tests of compare_amax_ties (sweep_outcome.h): a failing comparison of a dynamic FP8
// per-tensor case is retried at the activation amax's neighbouring bf16 steps, and only there.
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

}  // namespace
}  // namespace moekit::sweep
