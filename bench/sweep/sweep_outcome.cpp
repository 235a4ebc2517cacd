// sweep_outcome.h: the retry of a failing comparison at the activation amax's neighbouring
// bf16 steps.
#include "sweep_outcome.h"

namespace moekit::sweep {

void compare_amax_ties(Outcome& o, bool amax_tie, const std::function<void(int)>& run,
                       const std::function<void(Outcome&)>& compare) {
  run(0);
  Outcome first;
  compare(first);
  if (!first.passed && amax_tie) {
    for (const int ulps : {1, -1}) {
      run(ulps);
      Outcome retry;
      compare(retry);
      if (retry.passed) {
        o.reference +=
            ulps > 0 ? ", activation amax +1 bf16 step" : ", activation amax -1 bf16 step";
        return;
      }
    }
  }
  for (const std::string& why : first.problems) o.fail(why);
}

void compare_fp8_ties(Outcome& o, bool fp8_acts,
                      const std::function<void(bool, Outcome&)>& compare) {
  Outcome first;
  compare(false, first);
  if (!first.passed && fp8_acts) {
    Outcome retry;
    compare(true, retry);
    if (retry.passed) {
      o.reference += ", FP8 activation near-ties rounded the other way";
      return;
    }
  }
  for (const std::string& why : first.problems) o.fail(why);
}

}  // namespace moekit::sweep
