// The one place where the sweep forces the library's kernel paths: it sets the internal
// test knobs (moekit::detail::*_override) a case's Knobs ask for and restores them after,
// and tells which path the library takes. When typed plans replace these hooks, only this
// file and sweep_paths.cpp change.
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
// far as the library can tell from the host: the GEMM configs its heuristics or the knobs
// pick, the routed layers' direct / sorted path, the dense MLP's path. "" for the ops
// with one path per variant knob.
std::string path_taken(const SweepCase& c);

// SM90 expert-MLP chain launches so far (a case that took the chain raises it).
int64_t chain_launches();

}  // namespace moekit::sweep
