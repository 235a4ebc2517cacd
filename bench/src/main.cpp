// moekit-bench: the benchmark table of moekit's ops, measured as BENCH.md says
// (see docs/bench.md for usage and methodology).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>

#include "case.h"
#include "ceilings.h"
#include "cli.h"
#include "plans.h"
#include "plot.h"
#include "report.h"
#include "workload.h"

namespace moekit::bench {
const char* build_commit();  // generated at build time (bench/cmake/commit.cmake)
}

namespace moekit::bench {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << text;
}

// The run's picture next to its JSON (plot.h); a failure to draw costs the picture only.
void write_picture(const std::string& json_path, const std::string& json_text) {
  const std::string path = svg_path_for(json_path);
  try {
    write_file(path, render_svg(json_text));
    std::fprintf(stderr, "moekit-bench: picture %s\n", path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit-bench: no picture (%s)\n", e.what());
  }
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

std::string commit() {
  std::string c = build_commit();
  if (c == "unknown")
    if (const char* e = std::getenv("MOEKIT_COMMIT"); e && *e) c = e;
  return c;
}

bool name_selected(const std::string& name, const std::string& filter) {
  if (filter.empty()) return true;
  size_t pos = 0;
  while (pos <= filter.size()) {
    size_t comma = filter.find(',', pos);
    std::string item = filter.substr(pos, comma == std::string::npos ? comma : comma - pos);
    if (!item.empty() && name.find(item) != std::string::npos) return true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return false;
}

// Progress on stderr: one rewritten line on a terminal, one line per row otherwise.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(isatty(2)) {}
  void stage(size_t i, const Row& r, const std::string& what) {
    if (!tty_) return;
    std::fprintf(stderr, "\r\033[K[%3zu/%zu] %s %s %s: %s", i + 1, total_, r.w.op.c_str(),
                 r.display_name().c_str(), r.dtype.c_str(), what.c_str());
    std::fflush(stderr);
  }
  void done(size_t i, const RowResult& r, double elapsed_s) {
    std::string line;
    char buf[512];
    if (r.status == "ok") {
      std::snprintf(buf, sizeof buf, "%s ms", format_ms(r.ours_ms).c_str());
      line = buf;
      if (r.ratio() > 0) {
        std::snprintf(buf, sizeof buf, ", %.2fx vs %s", r.ratio(), r.best_alt_name().c_str());
        line += buf;
      }
      if (r.page_ms > 0 && r.ours_ms > 0) {
        std::snprintf(buf, sizeof buf, ", %.2fx page", r.ours_ms / r.page_ms);
        line += buf;
      }
      line += r.checked ? (r.acc_pass ? ", acc pass" : ", ACC FAIL") : "";
    } else {
      line = r.status;
    }
    std::fprintf(stderr, "%s[%3zu/%zu] %s %s %s: %s  (%.0f s)\n", tty_ ? "\r\033[K" : "", i + 1,
                 total_, r.op.c_str(), r.workload.c_str(), r.dtype.c_str(), line.c_str(),
                 elapsed_s);
    std::fflush(stderr);
  }

 private:
  size_t total_;
  bool tty_;
};

int run(const Options& opt, const std::string& cmdline) {
  // Workloads and rows.
  std::string wl_text =
      opt.workloads_path.empty() ? builtin_workloads_json() : read_file(opt.workloads_path);
  std::vector<Workload> workloads = parse_workloads(wl_text);
  std::vector<Row> all =
      opt.tokens.empty() ? expand_rows(workloads) : expand_token_rows(workloads, opt.tokens);
  std::vector<Row> rows;
  for (const Row& r : all)
    if (row_matches(r, opt.filters)) rows.push_back(r);
  if (opt.quick) rows = quick_subset(rows);
  if (rows.empty()) {
    std::fprintf(stderr, "moekit-bench: no rows match the filters\n");
    return 2;
  }
  if (opt.list) {
    for (const Row& r : rows)
      std::printf("%-26s %-28s %-10s page %s ms\n", r.w.op.c_str(), r.display_name().c_str(),
                  r.dtype.c_str(), r.page ? format_ms(r.page->ours_ms).c_str() : "-");
    std::printf("%zu rows\n", rows.size());
    return 0;
  }

  Device dev;
  std::string why;
  if (!open_device(&dev, &why)) {
    std::fprintf(stderr,
                 "moekit-bench: %s.\nThe benchmark runs moekit's kernels and needs an NVIDIA "
                 "Hopper (sm_90) GPU; nothing was measured.\n",
                 why.c_str());
    return 1;
  }
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Blas blas;
  Env env{opt, dev, stream, &blas};

  RunMeta meta;
  meta.device = dev.name;
  meta.device_uuid = dev.uuid;
  meta.commit = commit();
  meta.date = now_utc();
  meta.workloads =
      opt.workloads_path.empty() ? "built-in bench/workloads/seed1.json" : opt.workloads_path;
  meta.options = cmdline;
  meta.knobs = moekit_knobs(environ);
  if (opt.nominal_ceilings) {
    meta.ceilings = Ceilings{};
  } else {
    std::fprintf(stderr, "moekit-bench: ceilings...\n");
    meta.ceilings = get_ceilings(dev, blas, ceilings_cache_path(opt.ceilings_cache, dev),
                                 opt.remeasure_ceilings, stream);
  }
  std::fprintf(stderr,
               "moekit-bench: %s (%s), %d SMs, L2 %zu MB; read %.2f TB/s, bf16 %.0f, fp8 %.0f "
               "TFLOP/s (%s); %zu rows\n",
               dev.name.c_str(), dev.uuid.c_str(), dev.sms, dev.l2_bytes >> 20,
               meta.ceilings.read_tbps, meta.ceilings.bf16_tflops, meta.ceilings.fp8_tflops,
               meta.ceilings.source.c_str(), rows.size());

  {
    // The launch floor: an empty kernel timed exactly like the latency-bound rows.
    TimingPlan fp;
    fp.mode = TimingMode::kGraph;
    fp.copies = 256;
    fp.rounds = opt.rounds;
    fp.max_ms = opt.max_ms;
    meta.launch_floor_ms = measure_launch_floor(1, 32, fp, dev, stream);
    meta.launch_floor_grid_blocks = dev.sms;
    meta.launch_floor_grid_ms = measure_launch_floor(dev.sms, 1024, fp, dev, stream);
    std::fprintf(stderr, "moekit-bench: %s\n", launch_floor_line(meta).c_str());
  }

  std::vector<RowResult> results;
  Progress progress(rows.size());
  const auto t0 = std::chrono::steady_clock::now();
  bool context_lost = false;
  int acc_fail = 0, errors = 0, missing = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    RowResult rr;
    rr.op = row.w.op;
    rr.workload = row.display_name();
    rr.base_workload = row.w.name;
    rr.tokens = row.tokens;
    rr.dtype = row.dtype;
    if (row.page) rr.page_ms = row.page->ours_ms;
    if (context_lost) {
      rr.status = "not run (CUDA context lost earlier)";
      results.push_back(rr);
      continue;
    }
    try {
      std::unique_ptr<Case> c = make_case(row, opt);
      std::string missing_why;
      if (!c->ours_linked(&missing_why)) {
        rr.status = "not implemented in this build (" + missing_why + ")";
        ++missing;
      } else {
        progress.stage(i, row, "generating inputs");
        c->setup(env);
        rr.active_experts = c->num_experts > 0 ? c->stats.active_experts : -1;
        rr.num_experts = c->num_experts;
        rr.routed_rows = c->stats.routed_rows;
        rr.counts = c->counts;
        rr.cost = op_cost(row, c->stats);
        if (choose_plan(*c, opt, rr)) {
          const bool fp8 = uses_fp8_peak(row.w.op) || weight_quant_fp8(row);
          if (opt.check) {
            progress.stage(i, row, "checking accuracy");
            CheckResult cr = c->check(env);
            rr.checked = cr.checked;
            rr.acc_pass = cr.pass;
            rr.rel_l2 = cr.rel_l2;
            rr.err_ratio = cr.err_ratio;
            rr.reference = cr.reference;
            for (const std::string& n : cr.notes) rr.notes.push_back("accuracy: " + n);
            if (cr.checked && !cr.pass) ++acc_fail;
          }
          // The timing mode goes by the ideal at the nominal ceilings, not this GPU's: a row
          // near the 20 us line (SharedExpertMLP ds-v3-t32, 19.6 us) otherwise flipped to the
          // flushed mode on GPUs that measured a slower read (0.039 vs 0.031 ms, session 13).
          TimingPlan plan = timing_plan_for(*c, timing_ideal_ms(rr.cost, fp8), opt, dev);
          c->set_copies(plan.copies);
          rr.timing = plan.describe();
          std::vector<Impl> impls;
          impls.push_back(Impl{"moekit", [&c, forced = rr.forced_candidate](int k, cudaStream_t s) {
                                 c->force_candidate(forced);  // --candidates forces others
                                 c->run_ours(k, s);
                               }});
          if (opt.alternatives) {
            progress.stage(i, row, "preparing alternatives");
            for (AltFactory& f : c->alternatives()) {
              if (!name_selected(f.name, opt.alt_filter)) continue;
              if (!opt.alt_skip.empty() && name_selected(f.name, opt.alt_skip)) continue;
              try {
                impls.push_back(f.make(env));
              } catch (const std::exception& e) {
                Impl im{f.name, nullptr};
                im.available = false;
                im.note = std::string("n/a: ") + e.what();
                impls.push_back(im);
              }
            }
          }
          const size_t first_candidate = impls.size();
          if (opt.candidates) {
            progress.stage(i, row, "checking the plan candidates");
            for (Impl& im : candidate_impls(*c, env, rr)) impls.push_back(std::move(im));
          }
          progress.stage(i, row, "timing (" + rr.timing + ")");
          std::vector<TimingResult> tr = time_impls(impls, plan, dev, stream);
          if (!impls[0].available) {
            rr.status = "error: " + impls[0].note;
            ++errors;
          }
          rr.ours_ms = tr[0].ms;
          if (!tr[0].note.empty() && impls[0].available) rr.notes.push_back(tr[0].note);
          for (size_t k = 1; k < first_candidate; ++k) {
            AltTime a;
            a.name = impls[k].name;
            a.ms = tr[k].ms;
            a.note = tr[k].note;
            rr.alternatives.push_back(a);
          }
          record_candidate_times(impls, tr, first_candidate, rr);
          rr.sol = classify(rr.cost, fp8, meta.ceilings, rr.ours_ms);
          for (const std::string& n : c->notes) rr.notes.push_back(n);
          if (!rr.counts.empty() && rr.counts != "routed")
            rr.notes.push_back("per-expert counts: " + rr.counts);
        }
      }
    } catch (const std::exception& e) {
      rr.status = std::string("error: ") + e.what();
      ++errors;
      cudaError_t sticky = cudaDeviceSynchronize();
      if (sticky != cudaSuccess) {
        context_lost = true;
        rr.status += std::string(" (CUDA context lost: ") + cudaGetErrorString(sticky) + ")";
      }
      cudaGetLastError();
    }
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress.done(i, rr, el);
    results.push_back(std::move(rr));
    // Rewritten after every row, so an interrupted run keeps what it measured.
    if (!opt.json_path.empty()) write_file(opt.json_path, render_json(results, meta));
  }

  if (!opt.extra_alternatives_path.empty()) {
    std::vector<std::string> unmatched;
    int n = merge_extra_alternatives(results, read_file(opt.extra_alternatives_path), &unmatched);
    std::fprintf(stderr,
                 "moekit-bench: merged %d external times from %s (%zu records matched no row)\n", n,
                 opt.extra_alternatives_path.c_str(), unmatched.size());
  }
  std::fputs(render_table(results, meta).c_str(), stdout);
  if (!opt.json_path.empty()) {
    const std::string json_text = render_json(results, meta);
    write_file(opt.json_path, json_text);
    write_picture(opt.json_path, json_text);
  }
  if (!opt.markdown_path.empty()) write_file(opt.markdown_path, render_markdown(results, meta));
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "moekit-bench: %zu rows in %.0f s: %d accuracy failures, %d errors, %d not "
               "implemented\n",
               results.size(), total, acc_fail, errors, missing);
  cudaStreamDestroy(stream);
  return context_lost ? 1 : 0;
}

}  // namespace
}  // namespace moekit::bench

int main(int argc, char** argv) {
  using namespace moekit::bench;
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string cmdline = "moekit-bench";
  for (const std::string& a : args) cmdline += " " + a;
  Options opt;
  try {
    opt = parse_options(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit-bench: %s\n", e.what());
    return 2;
  }
  if (opt.help) {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }
  try {
    return run(opt, cmdline);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit-bench: %s\n", e.what());
    return 1;
  }
}
