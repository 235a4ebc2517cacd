// moekit-sweep: the seeded random sweep of every op and kernel path against the
// references (docs/sweep.md).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sweep_case.h"
#include "sweep_run.h"

namespace moekit::sweep {
namespace {

constexpr int64_t kDefaultCases = 10000, kLargeCases = 50000;

const char* const kUsage =
    "usage: moekit-sweep [--seed S] [--cases N] [--large] [--op NAME[,NAME]]\n"
    "                    [--family NAME[,NAME]] [--skip-family NAME[,NAME]] [--first I]\n"
    "                    [--case I] [--spec 'op=... ...'] [--list] [--verbose]\n"
    "                    [--budget-seconds S] [--hang-seconds S]\n"
    "  Draws cases I = first, first+1, ... of seed S (the op of case I is op I mod 12),\n"
    "  keeps those the filters pass, runs N of them; --case runs one, --spec one given\n"
    "  explicitly; --list prints the cases without running them. Exit 0 when every case\n"
    "  passed and reran bit-identically.\n";

struct Options {
  uint64_t seed = 1;
  int64_t cases = -1, first = 0, one_case = -1;
  bool large = false, list = false, verbose = false;
  std::string spec;
  std::set<std::string> ops, families, skip_families;
  double budget_seconds = 0, hang_seconds = 120;
};

std::set<std::string> split(const std::string& s) {
  std::set<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.insert(item);
  }
  return out;
}

const std::set<std::string> kValueFlags = {
    "--seed", "--cases",  "--first",       "--case",           "--spec",
    "--op",   "--family", "--skip-family", "--budget-seconds", "--hang-seconds"};

bool parse_args(int argc, char** argv, Options* o, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        *error = a + " needs a value";
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    if (a == "--large") {
      o->large = true;
    } else if (a == "--list") {
      o->list = true;
    } else if (a == "--verbose") {
      o->verbose = true;
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (!kValueFlags.count(a)) {
      *error = "unknown argument '" + a + "'";
      return false;
    } else if (!(v = value())) {
      return false;
    } else if (a == "--seed") {
      o->seed = std::strtoull(v, nullptr, 10);
    } else if (a == "--cases") {
      o->cases = std::atoll(v);
    } else if (a == "--first") {
      o->first = std::atoll(v);
    } else if (a == "--case") {
      o->one_case = std::atoll(v);
    } else if (a == "--spec") {
      o->spec = v;
    } else if (a == "--op") {
      o->ops = split(v);
      for (const std::string& name : o->ops) {
        Op op;
        if (!parse_op(name, &op)) {
          *error = "unknown op '" + name + "'";
          return false;
        }
      }
    } else if (a == "--family") {
      o->families = split(v);
    } else if (a == "--skip-family") {
      o->skip_families = split(v);
    } else if (a == "--budget-seconds") {
      o->budget_seconds = std::atof(v);
    } else if (a == "--hang-seconds") {
      o->hang_seconds = std::atof(v);
    }
  }
  return true;
}

struct OpStats {
  int64_t cases = 0, failed = 0, non_identical = 0, ambiguous = 0;
  double seconds = 0;
  std::map<std::string, int64_t> families, paths, activations;
};

std::string reproduce(const char* self, const Options& o, const SweepCase& c) {
  // The size class is part of a case's draw (its caps shrink the shapes).
  std::string s = c.index >= 0 ? std::string(self) + (o.large ? " --large" : "") + " --seed " +
                                     std::to_string(o.seed) + " --case " + std::to_string(c.index)
                               : std::string();
  const std::string spec = std::string(self) + " --spec '" + format_spec(c) + "'";
  return s.empty() ? spec : s + "\n    or: " + spec;
}

void print_paths(const std::map<std::string, int64_t>& paths) {
  std::vector<std::pair<int64_t, std::string>> v;
  for (const auto& [p, n] : paths)
    if (!p.empty()) v.push_back({n, p});
  if (v.empty()) return;
  std::sort(v.rbegin(), v.rend());
  std::string line = "    paths:";
  for (size_t i = 0; i < v.size() && i < 16; ++i) {
    line += " [" + v[i].second + "] " + std::to_string(v[i].first);
  }
  if (v.size() > 16) line += " (+" + std::to_string(v.size() - 16) + " more)";
  std::printf("%s\n", line.c_str());
}

bool hopper_present(std::string* name) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return false;
  *name = p.name;
  return p.major == 9;
}

int run(int argc, char** argv) {
  Options opt;
  std::string error;
  if (!parse_args(argc, argv, &opt, &error)) {
    std::fprintf(stderr, "moekit-sweep: %s\n%s", error.c_str(), kUsage);
    return 2;
  }
  const Limits limits = opt.large ? large_limits() : default_limits();
  const int64_t want = opt.cases >= 0 ? opt.cases : opt.large ? kLargeCases : kDefaultCases;

  // The cases, in order.
  std::vector<SweepCase> cases;
  if (!opt.spec.empty()) {
    SweepCase c;
    if (!parse_spec(opt.spec, &c, &error)) {
      std::fprintf(stderr, "moekit-sweep: --spec: %s\n", error.c_str());
      return 2;
    }
    cases.push_back(c);
  } else if (opt.one_case >= 0) {
    cases.push_back(draw_case(opt.seed, opt.one_case, limits));
  }
  const auto wanted = [&](const SweepCase& c) {
    return (opt.families.empty() || opt.families.count(c.family)) &&
           !opt.skip_families.count(c.family);
  };
  int64_t next = opt.first;
  const auto draw_next = [&](SweepCase* c) {
    for (;;) {
      const int64_t i = next++;
      if (!opt.ops.empty() && !opt.ops.count(op_name(static_cast<Op>(i % kOpCount)))) continue;
      *c = draw_case(opt.seed, i, limits);
      if (wanted(*c)) return;
    }
  };
  if (opt.list) {
    for (const SweepCase& c : cases) std::printf("%s\n", format_spec(c).c_str());
    for (int64_t i = 0; cases.empty() && i < want; ++i) {
      SweepCase c;
      draw_next(&c);
      const std::string why = invalid_reason(c);
      std::printf("%lld %s%s\n", static_cast<long long>(c.index), format_spec(c).c_str(),
                  why.empty() ? "" : ("   INVALID: " + why).c_str());
    }
    return 0;
  }

  std::string device;
  if (!hopper_present(&device)) {
    std::printf("moekit-sweep: no Hopper (sm_90) GPU here; nothing run\n");
    return 77;
  }
  const bool explicit_cases = !cases.empty();
  const int64_t total = explicit_cases ? static_cast<int64_t>(cases.size()) : want;
  std::printf("moekit-sweep: seed %llu, %lld cases (%s limits: %.0e FLOPs, %.0e bytes), %s\n",
              static_cast<unsigned long long>(opt.seed), static_cast<long long>(total),
              opt.large ? "large" : "default", limits.max_flops, limits.max_bytes, device.c_str());
  std::fflush(stdout);

  Context ctx(opt.large ? (size_t{12} << 30) : (size_t{3} << 30), opt.hang_seconds);
  std::vector<OpStats> stats(kOpCount);
  std::vector<std::string> failures;
  const auto start = std::chrono::steady_clock::now();
  int64_t ran = 0;
  for (int64_t i = 0; i < total; ++i) {
    SweepCase c;
    if (explicit_cases) {
      c = cases[i];
    } else {
      draw_next(&c);
    }
    if (opt.budget_seconds > 0) {
      const std::chrono::duration<double> t = std::chrono::steady_clock::now() - start;
      if (t.count() > opt.budget_seconds) break;
    }
    const std::string repro = reproduce(argv[0], opt, c);
    ctx.current = repro;
    const std::string invalid = invalid_reason(c);
    if (opt.verbose) {
      std::printf("case %lld %s\n", static_cast<long long>(c.index), format_spec(c).c_str());
      std::fflush(stdout);
    }
    OpStats& st = stats[static_cast<int>(c.op)];
    const auto t0 = std::chrono::steady_clock::now();
    Outcome o;
    if (!invalid.empty()) {
      o.fail("not a valid case: " + invalid);
    } else {
      for (int attempt = 0;; ++attempt) {
        try {
          o = run_case(ctx, c);
          break;
        } catch (const ArenaFull&) {
          if (attempt >= 3) throw;
          ctx.arena().grow(2 * ctx.arena().capacity() + ctx.arena().used());
        } catch (const CudaFault& e) {
          std::printf(
              "\nFATAL (CUDA error; the sweep stops): %s\n  case %lld %s\n  reproduce: %s\n",
              e.what(), static_cast<long long>(c.index), op_name(c.op), repro.c_str());
          return 3;
        }
      }
    }
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    ++ran;
    ++st.cases;
    st.seconds += dt.count();
    st.ambiguous += o.ambiguous_rows;
    ++st.families[c.family];
    ++st.paths[o.path];
    if (mlp_op(c.op)) ++st.activations[activation_label(c)];
    if (c.op == Op::kGroupedGemmFp8) ++st.activations[fp8_gemm_label(c)];
    if (!o.passed || !o.identical) {
      st.failed += o.passed ? 0 : 1;
      st.non_identical += o.identical ? 0 : 1;
      std::string line = "FAIL case " + std::to_string(c.index) + " " + op_name(c.op) + " [" +
                         c.family + "] path: " + (o.path.empty() ? "-" : o.path) +
                         "; reference: " + o.reference;
      for (const std::string& p : o.problems) line += "\n  " + p;
      line += "\n  reproduce: " + repro;
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      failures.push_back(line);
    }
    if (!opt.verbose && ran % 1000 == 0) {
      const std::chrono::duration<double> t = std::chrono::steady_clock::now() - start;
      std::printf("  %lld cases, %.0f s\n", static_cast<long long>(ran), t.count());
      std::fflush(stdout);
    }
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;

  std::printf("\n%-26s %7s %7s %14s %10s %9s\n", "op", "cases", "failed", "non-identical",
              "ambiguous", "ms/case");
  int64_t failed = 0, non_identical = 0;
  for (int i = 0; i < kOpCount; ++i) {
    const OpStats& s = stats[i];
    if (s.cases == 0) continue;
    std::printf("%-26s %7lld %7lld %14lld %10lld %9.2f\n", op_name(static_cast<Op>(i)),
                static_cast<long long>(s.cases), static_cast<long long>(s.failed),
                static_cast<long long>(s.non_identical), static_cast<long long>(s.ambiguous),
                1e3 * s.seconds / s.cases);
    std::string fam = "    families:";
    for (const auto& [f, n] : s.families) fam += " " + f + " " + std::to_string(n);
    std::printf("%s\n", fam.c_str());
    if (!s.activations.empty()) {
      std::string acts =
          i == static_cast<int>(Op::kGroupedGemmFp8) ? "    modes:" : "    activations:";
      for (const auto& [a, n] : s.activations) acts += " " + a + " " + std::to_string(n);
      std::printf("%s\n", acts.c_str());
    }
    print_paths(s.paths);
    failed += s.failed;
    non_identical += s.non_identical;
  }
  if (!failures.empty()) {
    std::printf("\nfailures (%zu):\n", failures.size());
    for (size_t i = 0; i < failures.size() && i < 50; ++i) std::printf("%s\n", failures[i].c_str());
  }
  std::printf("\nsweep: %lld cases, %lld failed, %lld non-identical (%.0f s)\n",
              static_cast<long long>(ran), static_cast<long long>(failed),
              static_cast<long long>(non_identical), elapsed.count());
  return failed || non_identical ? 1 : 0;
}

}  // namespace
}  // namespace moekit::sweep

int main(int argc, char** argv) {
  try {
    return moekit::sweep::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit-sweep: %s\n", e.what());
    return 3;
  }
}
