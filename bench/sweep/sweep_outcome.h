// One sweep case's outcome and the comparison retries of FP8 ties (host code, no device: the
// case generator's tests check them on the CPU).
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

// A CPU-reference comparison: `compare(flip_ties, o)` computes the reference (with flip_ties,
// its quantized F-wide activations' near-ties rounded the other way,
// Fp8Activations::kQuantizedTiesFlipped) and compares it into o. With `fp8_acts`, a failure is
// retried with the ties flipped and passes when that does (o.reference says so); else o gets
// the first comparison's problems.
void compare_fp8_ties(Outcome& o, bool fp8_acts,
                      const std::function<void(bool, Outcome&)>& compare);

}  // namespace moekit::sweep
