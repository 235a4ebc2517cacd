#include "plans.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace moekit::bench {

bool choose_plan(Case& c, const Options& opt, RowResult& rr) {
  try {
    if (!opt.plan.empty()) {
      const std::vector<std::string> plans = c.plan_candidates();
      const auto it = std::find(plans.begin(), plans.end(), opt.plan);
      if (it == plans.end()) {
        rr.status = "no candidate \"" + opt.plan + "\" (--plan; the row has " +
                    std::to_string(plans.size()) + ")";
        return false;
      }
      const int i = static_cast<int>(it - plans.begin());
      c.force_candidate(i);
      rr.forced_candidate = i;
      rr.notes.push_back("plan forced: " + opt.plan);
    } else if (opt.candidate >= 0) {
      const size_t n = c.plan_candidates().size();
      if (static_cast<size_t>(opt.candidate) >= n) {
        rr.status = n == 0 ? std::string("no plan candidates (--candidate)")
                           : "no candidate " + std::to_string(opt.candidate) + " (the row has " +
                                 std::to_string(n) + ")";
        return false;
      }
      c.force_candidate(opt.candidate);
      rr.forced_candidate = opt.candidate;
      rr.notes.push_back("plan forced: candidate " + std::to_string(opt.candidate) + " of " +
                         std::to_string(n));
    }
    rr.plan = c.plan();
  } catch (const std::exception& e) {
    // A planner that refuses the arguments: the op itself will say so when it runs.
    rr.plan = "-";
    rr.notes.push_back(std::string("plan: ") + e.what());
    if (opt.candidate >= 0 || !opt.plan.empty()) {
      rr.status = std::string("error: plan: ") + e.what();
      return false;
    }
  }
  return true;
}

std::vector<Impl> candidate_impls(Case& c, Env& env, RowResult& rr) {
  std::vector<Impl> impls;
  const std::vector<std::string> plans = c.plan_candidates();
  for (int i = 0; i < static_cast<int>(plans.size()); ++i) {
    CandidateTime ct;
    ct.index = i;
    ct.plan = plans[i];
    Impl im{"candidate " + std::to_string(i), [&c, i](int copy, cudaStream_t s) {
              c.force_candidate(i);
              c.run_ours(copy, s);
            }};
    if (env.opt.check) {
      try {
        c.force_candidate(i);
        CheckResult cr = c.check(env);
        ct.checked = cr.checked;
        ct.acc_pass = cr.pass;
        ct.rel_l2 = cr.rel_l2;
        ct.err_ratio = cr.err_ratio;
        for (const std::string& n : cr.notes) ct.note += (ct.note.empty() ? "" : "; ") + n;
      } catch (const std::exception& e) {
        im.available = false;
        ct.note = std::string("failed: ") + e.what();
        cudaError_t sticky = cudaStreamSynchronize(env.stream);
        if (sticky != cudaSuccess)
          throw std::runtime_error("CUDA context lost while checking " + im.name + " (" + ct.plan +
                                   "): " + cudaGetErrorString(sticky));
      }
    }
    rr.candidates.push_back(ct);
    impls.push_back(std::move(im));
  }
  c.force_candidate(-1);
  return impls;
}

void record_candidate_times(const std::vector<Impl>& impls, const std::vector<TimingResult>& tr,
                            size_t first, RowResult& rr) {
  for (size_t k = 0; k < rr.candidates.size() && first + k < impls.size(); ++k) {
    CandidateTime& ct = rr.candidates[k];
    ct.ms = tr[first + k].ms;
    const std::string& note = tr[first + k].note;
    if (!note.empty() && note != ct.note) ct.note += (ct.note.empty() ? "" : "; ") + note;
  }
}

TimingPlan timing_plan_for(const Case& c, double ideal_ms, const Options& opt, const Device& dev) {
  TimingPlan p;
  p.rounds = opt.rounds;
  p.max_ms = opt.max_ms;
  const size_t ws = std::max<size_t>(c.working_set_bytes(), 1);
  const size_t l2x2 = 2 * dev.l2_bytes;
  if (ideal_ms < 0.020) {
    // Back-to-back calls in a graph, rotating over enough copies that the inputs are
    // not served from L2 (capped: tiny inputs would need thousands of copies).
    p.mode = TimingMode::kGraph;
    size_t want = (l2x2 + ws - 1) / ws;
    size_t cap = std::max<size_t>(1, (size_t(2) << 30) / ws);
    p.copies = static_cast<int>(std::clamp<size_t>(std::min(want, cap), 1, 256));
  } else if (ws < l2x2) {
    p.mode = TimingMode::kFlush;
  } else {
    p.mode = TimingMode::kPlain;
  }
  return p;
}

}  // namespace moekit::bench
