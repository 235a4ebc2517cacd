// Where the sweep forces the library's kernel paths: the GEMM ops' plans through args.plan
// (forced_plan, the ops in sweep_ops_gemm.cpp), the other paths through the internal test
// knobs (moekit::detail::*_override) a case's Knobs ask for, restored after; and which path
// the library takes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
// far as the library can tell from the host: the GEMM plans its planners or the knobs
// pick, the routed layers' direct / sorted path, the dense MLP's path. "" for the ops
// with one path per variant knob.
std::string path_taken(const SweepCase& c);

// The plan a plan knob forces (an index into the op's candidates, modulo their count), kept
// in *storage; nullptr for -1 (the planner's plan) or no candidates.
template <class Plan>
const Plan* forced_plan(int knob, const std::vector<Plan>& candidates, Plan* storage) {
  if (knob < 0 || candidates.empty()) return nullptr;
  *storage = candidates[static_cast<size_t>(knob) % candidates.size()];
  return storage;
}

// SM90 expert-MLP chain launches so far (a case that took the chain raises it).
int64_t chain_launches();

}  // namespace moekit::sweep
