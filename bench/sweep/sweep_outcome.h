// One sweep case's outcome and the comparison retry of FP8 per-tensor ties (host code, no
// device: the case generator's tests check it on the CPU).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moekit::sweep {

struct Outcome {
  bool passed = true;     // the reference comparison and the contract checks
  bool identical = true;  // the second run gave the first run's bytes
  std::vector<std::string> problems;
  std::string reference;       // e.g. "gpu-f32, 512 of 40960 rows"
  std::string path;            // the path the library took (sweep_paths.h), where it can tell
  int64_t ambiguous_rows = 0;  // routing near-ties left out of the comparison
  void fail(const std::string& why) {
    passed = false;
    problems.push_back(why);
  }
};

// A GPU-reference comparison: `run(ulps)` computes the reference (its F-wide activation's
// dynamic per-tensor amax moved by `ulps` bf16 steps, gpu_reference::Fp8Acts), `compare(o)`
// compares it into o. With `amax_tie`, a failure at 0 is retried at +1 and -1 steps and
// passes there when either does (o.reference names the step); else o gets the first
// comparison's problems.
void compare_amax_ties(Outcome& o, bool amax_tie, const std::function<void(int)>& run,
                       const std::function<void(Outcome&)>& compare);

}  // namespace moekit::sweep
