// The plan column of a row and the plan candidates of --candidates / --candidate I: the
// op's planner decides what moekit runs; these flags force its other candidates through
// args.plan (docs/bench.md "Plans").
#pragma once

#include <vector>

#include "case.h"
#include "device.h"
#include "report.h"

namespace moekit::bench {

// Records the plan the row runs in rr.plan ("-" without a planner). With --candidate I it
// forces candidate I first; false (rr.status saying why) when the row has no candidate I.
bool choose_plan(Case& c, const Options& opt, RowResult& rr);

// --candidates: checks every candidate of the row (when checking) and returns one
// implementation per candidate, each forcing its plan before its call, to be timed in the
// row's rounds. rr.candidates gets their plans and checks, in the same order.
std::vector<Impl> candidate_impls(Case& c, Env& env, RowResult& rr);

// Copies the times of candidate_impls' implementations, timed as tr[first...], into
// rr.candidates.
void record_candidate_times(const std::vector<Impl>& impls, const std::vector<TimingResult>& tr,
                            size_t first, RowResult& rr);

// How a row is timed (moekit-bench, moekit-tune): back-to-back graph replays over rotating
// copies for rows whose ideal time is under 20 us, else one call per replay with the L2
// flushed when the working set fits twice the L2, else plain.
TimingPlan timing_plan_for(const Case& c, double ideal_ms, const Options& opt, const Device& dev);

}  // namespace moekit::bench
