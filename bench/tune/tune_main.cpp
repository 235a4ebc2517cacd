// moekit-tune (docs/tuning.md "moekit-tune"): for one MoE layer shape, every plan candidate
// at every token count, checked against the reference and timed with moekit-bench's
// harness (the bench's case of the layer op, its candidate implementations, interleaved
// rounds, medians), under uniform and skewed routing; then the table. Resumable: each
// (count, routing) step's measurements are appended to a partial file a re-run continues
// from.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "case.h"
#include "device.h"
#include "model.h"
#include "moe/tuning_table.h"
#include "moekit/tuning.h"
#include "plans.h"
#include "report.h"
#include "tune.h"

namespace moekit::tune {
namespace {

void print_candidates(const TuneOptions& o) {
  for (int64_t T : o.tokens) {
    LayerPlan planned;
    std::vector<LayerPlan> all;
    try {
      all = layer_candidates(o, T, &planned);
    } catch (const Error& e) {
      // A count this machine cannot plan (FP8 GEMMs need an sm_90 device): the other counts
      // still print.
      std::printf("T=%lld: no plan on this machine: %s\n", static_cast<long long>(T), e.what());
      continue;
    }
    std::printf("T=%lld: %zu candidates (the library's plan: %s)\n", static_cast<long long>(T),
                all.size(), to_string(planned).c_str());
    for (size_t i = 0; i < all.size(); ++i)
      std::printf("  %3zu %s\n", i, to_string(all[i]).c_str());
  }
}

std::string read_text(const std::string& path, bool* exists) {
  std::ifstream in(path);
  *exists = static_cast<bool>(in);
  std::ostringstream s;
  if (*exists) s << in.rdbuf();
  return s.str();
}

// One (count, routing) step: the bench's case of the layer, every candidate checked, then
// screened (one short round, all candidates interleaved) and the finalists (pick_finalists:
// the default, `keep`, the fastest accurate others) timed in the same interleaved rounds of
// the full method. Returns the finalists' measurements; `screen` gets a one-line summary.
std::vector<Measurement> measure(const TuneOptions& o, int64_t T, const std::string& routing,
                                 double alpha, const std::set<std::string>& keep,
                                 const bench::Device& dev, cudaStream_t stream,
                                 std::string* screen) {
  bench::Options bo;
  bo.seed = o.seed;
  bo.rounds = o.rounds;
  bo.max_ms = o.max_ms;
  bo.skew_alpha = routing == "skewed" ? alpha : 0;
  bo.alternatives = false;
  const bench::Row row = layer_row(o, T);
  bench::Env env{bo, dev, stream, nullptr};
  std::unique_ptr<bench::Case> c = bench::make_case(row, bo);
  c->setup(env);
  c->force_candidate(-1);
  const std::string planned = c->plan();
  const bench::TimingPlan plan = bench::timing_plan_for(
      *c, bench::timing_ideal_ms(bench::op_cost(row, c->stats), false), bo, dev);
  c->set_copies(plan.copies);
  bench::RowResult rr;
  std::vector<bench::Impl> impls = bench::candidate_impls(*c, env, rr);
  const auto measurements = [&](const std::vector<bench::TimingResult>& tr) {
    std::vector<Measurement> out;
    for (size_t k = 0; k < rr.candidates.size() && k < tr.size(); ++k) {
      Measurement m;
      m.tokens = T;
      m.routing = routing;
      m.plan = rr.candidates[k].plan;
      m.us = impls[k].available && tr[k].ms > 0 ? tr[k].ms * 1000 : -1;
      m.accurate = rr.candidates[k].checked && rr.candidates[k].acc_pass;
      m.is_default = m.plan == planned;
      out.push_back(m);
    }
    return out;
  };
  std::vector<bool> final_ones(impls.size(), true);
  if (o.finalists > 0 && impls.size() > static_cast<size_t>(o.finalists) + 1) {
    bench::TimingPlan brief = plan;
    brief.rounds = 1;
    brief.max_ms = o.screen_ms;
    const std::vector<Measurement> screened =
        measurements(bench::time_impls(impls, brief, dev, stream));
    final_ones = pick_finalists(screened, o.finalists, keep);
    int accurate = 0, picked = 0;
    for (size_t k = 0; k < screened.size(); ++k) {
      accurate += screened[k].accurate && screened[k].us > 0;
      picked += final_ones[k];
      impls[k].skip_timing = !final_ones[k];
    }
    char b[160];
    std::snprintf(b, sizeof b,
                  "# screened T=%lld %s: %zu candidates, %d accurate and timed, %d finalists",
                  static_cast<long long>(T), routing.c_str(), screened.size(), accurate, picked);
    *screen = b;
  }
  const std::vector<Measurement> timed = measurements(bench::time_impls(impls, plan, dev, stream));
  std::vector<Measurement> out;
  for (size_t k = 0; k < timed.size(); ++k)
    if (final_ones[k]) out.push_back(timed[k]);
  return out;
}

std::string duration(double s) {
  char b[32];
  if (s < 120)
    std::snprintf(b, sizeof b, "%.0f s", s);
  else
    std::snprintf(b, sizeof b, "%.0f min", s / 60);
  return b;
}

// --verify-builtin / --verify FILE: every plan a table names for this device, run through
// the bench's case of its layer at the ends of each served range and checked against the
// reference (the bench's accuracy check). Exit 0 only when every check passes.
int verify(const TuneOptions& o) {
  bench::Device dev;
  std::string why;
  if (!bench::open_device(&dev, &why)) {
    std::fprintf(stderr, "moekit-tune: no usable CUDA GPU (%s): tables not verified.\n",
                 why.c_str());
    return 1;
  }
  clear_tuning_tables();
  if (!o.verify_file.empty()) load_tuning_table(o.verify_file);
  const std::string what = o.verify_file.empty() ? "the built-in tables" : o.verify_file;
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int entries = 0, checks = 0, failed = 0, other_device = 0;
  for (const TuningEntry& e : tuning_entries()) {
    // Loaded entries first, then the built-in ones: with a file, only its own.
    if (!o.verify_file.empty() && e.source.rfind(o.verify_file + ":", 0) != 0) continue;
    if (e.device != dev.name) {
      ++other_device;
      continue;
    }
    ++entries;
    const TuneOptions eo = options_for_entry(e);
    for (int64_t T : verify_counts(e)) {
      bench::Options bo;
      bo.seed = o.seed;
      bo.alternatives = false;
      bench::Env env{bo, dev, stream, nullptr};
      std::unique_ptr<bench::Case> c = bench::make_case(layer_row(eo, T), bo);
      c->setup(env);
      const std::vector<std::string> plans = c->plan_candidates();
      const auto it = std::find(plans.begin(), plans.end(), e.plan);
      std::string verdict;
      if (it == plans.end()) {
        verdict = "FAIL: not among the layer's " + std::to_string(plans.size()) + " candidates";
      } else {
        c->force_candidate(static_cast<int>(it - plans.begin()));
        const bench::CheckResult cr = c->check(env);
        char err[64];
        std::snprintf(err, sizeof err, "rel_l2 %.3g, against %s", cr.rel_l2, cr.reference.c_str());
        verdict = !cr.checked ? "FAIL: not checked"
                  : cr.pass   ? std::string("pass, ") + err
                              : std::string("FAIL: ") + err;
      }
      ++checks;
      failed += verdict.rfind("pass", 0) != 0;
      std::printf("%s T=%lld %s: %s\n", e.source.c_str(), static_cast<long long>(T), e.plan.c_str(),
                  verdict.c_str());
    }
  }
  cudaStreamDestroy(stream);
  clear_tuning_tables();
  std::printf(
      "moekit-tune: %s: %d entries of %s verified at %d counts, %d failed (%d entries "
      "of other devices not run)\n",
      what.c_str(), entries, dev.name.c_str(), checks, failed, other_device);
  return failed == 0 ? 0 : 1;
}

int run(const TuneOptions& o) {
  if (verifying(o)) return verify(o);
  if (o.dry_run) {
    print_candidates(o);
    return 0;
  }
  bench::Device dev;
  std::string why;
  if (!bench::open_device(&dev, &why)) {
    print_candidates(o);
    std::fprintf(stderr,
                 "moekit-tune: no usable CUDA GPU (%s): nothing measured. Above: the candidates "
                 "this build plans for each count on this machine (a GPU plans its own).\n",
                 why.c_str());
    return 1;
  }
  // The default is the library as built (its built-in tables included): loaded tables off.
  clear_tuning_tables();
  const double alpha = o.skewed ? skew_alpha_for(o.local_experts(), o.top_k) : 0;
  std::fprintf(stderr, "moekit-tune: %s on %s; skew alpha %.4f (busiest expert 2x the mean)\n",
               o.model.c_str(), dev.name.c_str(), alpha);
  const std::string header = partial_header(o), partial = o.partial_path();
  bool exists = false;
  const std::string previous = read_text(partial, &exists);
  std::vector<Measurement> all =
      exists ? read_partial(previous, header, partial) : std::vector<Measurement>();
  std::ofstream log(partial, std::ios::app);
  if (!exists) log << header << "\n";
  std::vector<std::pair<int64_t, std::string>> todo;
  for (int64_t T : o.tokens) {
    for (const char* routing : {"uniform", "skewed"}) {
      if (std::string(routing) == "skewed" && !o.skewed) continue;
      bool done = false;
      for (const Measurement& m : all) done |= m.tokens == T && m.routing == routing;
      if (!done) todo.push_back({T, routing});
    }
  }
  if (!all.empty())
    std::fprintf(stderr, "moekit-tune: resuming from %s (%zu measurements), %zu steps left\n",
                 partial.c_str(), all.size(), todo.size());
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < todo.size(); ++i) {
    const auto [T, routing] = todo[i];
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The steps grow with T; the mean of those done is a rough guide, said so.
    const std::string eta = i == 0 ? "?" : "~" + duration(elapsed / i * (todo.size() - i));
    std::fprintf(stderr, "[%zu/%zu] T=%lld %s (elapsed %s, left %s)\n", i + 1, todo.size(),
                 static_cast<long long>(T), routing.c_str(), duration(elapsed).c_str(),
                 eta.c_str());
    // The other routing's finalists at T (measured earlier, or before a resume) are timed
    // here too, so a plan can win on its mean over both routings.
    std::set<std::string> keep;
    for (const Measurement& m : all)
      if (m.tokens == T && m.routing != routing) keep.insert(m.plan);
    std::string screen;
    const std::vector<Measurement> step = measure(o, T, routing, alpha, keep, dev, stream, &screen);
    if (!screen.empty()) {
      std::fprintf(stderr, "  %s\n", screen.c_str() + 2);
      log << screen << "\n";
    }
    for (const Measurement& m : step) {
      log << format_measurement(m) << "\n";
      all.push_back(m);
    }
    log.flush();
  }
  cudaStreamDestroy(stream);
  std::vector<std::string> decisions;
  const std::vector<TuningEntry> entries = build_entries(o, dev.name, all, &decisions);
  for (const std::string& d : decisions) std::fprintf(stderr, "  %s\n", d.c_str());
  std::ofstream out(o.out);
  out << detail::format_tuning_table(entries);
  if (!out) {
    std::fprintf(stderr, "moekit-tune: cannot write %s\n", o.out.c_str());
    return 1;
  }
  out.close();
  // The table as the library will see it: it parses and names this device's candidates.
  load_tuning_table(o.out);
  clear_tuning_tables();
  std::fprintf(stderr, "moekit-tune: %zu entries -> %s (loads: checked)\n", entries.size(),
               o.out.c_str());
  return 0;
}

}  // namespace
}  // namespace moekit::tune

int main(int argc, char** argv) {
  using namespace moekit::tune;
  TuneOptions o;
  try {
    o = parse_tune_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit-tune: %s\n", e.what());
    return 2;
  }
  if (o.help) {
    std::printf("%s", tune_usage().c_str());
    return 0;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit-tune: %s\n", e.what());
    return 1;
  }
}
