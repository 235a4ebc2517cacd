// Where the sweep forces the library's kernel paths: every op's plan through args.plan (an
// index into the op's candidates for the GEMM ops and the expert MLP; the dense and layer
// plan knobs below for the others), and the PDL test knob; and which path the library takes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/plan.h"
#include "sweep_case.h"

namespace moekit::sweep {

// Sets every knob that differs from its default for one scope; restores all on exit.
class ForcedPaths {
 public:
  explicit ForcedPaths(const Knobs& knobs);
  ~ForcedPaths();
  ForcedPaths(const ForcedPaths&) = delete;
  ForcedPaths& operator=(const ForcedPaths&) = delete;

 private:
  struct Saved;
  Saved* saved_;
};

// The path the library takes for the case under its knobs (call inside ForcedPaths), as
// far as the library can tell from the host: the GEMM and expert-MLP plans its planners or
// the knobs pick. "" for the other ops, whose runners set the plan they run.
std::string path_taken(const SweepCase& c);

// The plan a plan knob forces (an index into the op's candidates, modulo their count), kept
// in *storage; nullptr for -1 (the planner's plan) or no candidates.
template <class Plan>
const Plan* forced_plan(int knob, const std::vector<Plan>& candidates, Plan* storage) {
  if (knob < 0 || candidates.empty()) return nullptr;
  *storage = candidates[static_cast<size_t>(knob) % candidates.size()];
  return storage;
}

// The dense-MLP plan the knobs force (dense_path: 1 stream-K, 2 the GEMMs, 3 direct, 4 GEMV;
// streamk_grid; direct_split: both GEMMs' k split where a candidate has it), given the
// planner's plan and the op's candidates: the path's plan (the planner's if it takes that
// path, else its first candidate; a path that cannot run the shape: the GEMMs). False when
// the knobs force nothing.
bool forced_dense_plan(const Knobs& knobs, const MlpPlan& planned,
                       const std::vector<MlpPlan>& candidates, MlpPlan* plan);
// The layer plan the knobs force (routed_path: 1 direct where it can run, 2 sorted; the
// dense knobs on the shared expert). False when they force nothing.
bool forced_layer_plan(const Knobs& knobs, const LayerPlan& planned,
                       const std::vector<LayerPlan>& candidates, LayerPlan* plan);

// SM90 expert-MLP chain launches so far (a case that took the chain raises it).
int64_t chain_launches();

}  // namespace moekit::sweep
