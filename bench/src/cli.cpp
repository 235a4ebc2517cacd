#include "cli.h"

#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace moekit::bench {

std::string usage() {
  return R"(moekit-bench: the benchmark table of moekit's ops (BENCH.md methodology)

usage: moekit-bench [options]
  --op LIST             only ops whose name contains one of the comma-separated strings
  --workload LIST       only workloads whose name contains one of the strings
  --dtype LIST          only dtypes containing one of the strings (e.g. bf16,fp8)
  --quick               a small representative subset (~2 rows per op)
  --workloads FILE      workloads in the schema of bench/workloads/seed1.json
                        (default: the built-in copy of the seed list; page figures optional)
  --tokens LIST         re-run token-shaped workloads at every listed count, e.g. 1-16,31,33
                        (scales T and the T-derived shapes; masked rows scale their T)
  --random-counts       ragged per-expert row counts (from routing) for the ops that take
                        a permuted layout directly (default: equal counts, as the page)
  --skew ALPHA          routing skew: a fixed per-expert logit bias -ALPHA*log(1+rank)
  --seed N              input seed (default 1)
  --rounds N            interleaved timing rounds (default 3)
  --max-ms MS           device time per implementation per round (default 200)
  --check-rows N        rows the GPU reference checks on large shapes (default 256)
  --no-check            skip the accuracy check
  --no-alternatives     time moekit only
  --alternatives LIST   only alternatives whose name contains one of the strings
  --skip-alternatives LIST  no alternatives whose name contains one of the strings
  --candidates          also time every plan moekit can run for each row (the planner's
                        candidates), interleaved with the default plan, each checked
  --candidate I         run candidate I of each row's plan candidates instead of the
                        planner's plan (rows with fewer candidates are skipped)
  --plan TEXT           run the candidate whose one-line form (moekit/plan.h) is TEXT
                        instead of the planner's plan (rows without it are skipped)
  --extra-alternatives FILE  merge externally measured times (records with op, workload,
                        dtype and alternatives {name: ms}) into the table
  --json FILE           machine-readable results, and their picture next to them
                        (FILE.json -> FILE.svg; moekit-plot draws a saved run)
  --markdown FILE       the tables as markdown
  --ceilings-cache FILE where measured ceilings are cached (default: $MOEKIT_BENCH_CACHE,
                        else ~/.cache/moekit/ceilings-<device uuid>.json)
  --remeasure-ceilings  measure the ceilings even when cached
  --nominal-ceilings    use BENCH.md's ceilings instead of measuring
  --list                print the selected rows and exit (no GPU needed)
  --help
)";
}

Options parse_options(const std::vector<std::string>& args) {
  Options o;
  auto value = [&](size_t& i) -> const std::string& {
    if (i + 1 >= args.size()) throw std::invalid_argument(args[i] + " needs a value");
    return args[++i];
  };
  auto number = [&](const std::string& opt, const std::string& v) {
    char* end = nullptr;
    double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0')
      throw std::invalid_argument(opt + ": expected a number, got '" + v + "'");
    return d;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    std::string inline_value;
    bool has_inline = false;
    size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_inline = true;
    }
    auto val = [&]() -> std::string { return has_inline ? inline_value : value(i); };
    if (a == "--op") {
      o.filters.op = val();
    } else if (a == "--workload") {
      o.filters.workload = val();
    } else if (a == "--dtype") {
      o.filters.dtype = val();
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--workloads") {
      o.workloads_path = val();
    } else if (a == "--tokens") {
      o.tokens = parse_token_list(val());
    } else if (a == "--random-counts") {
      o.random_counts = true;
    } else if (a == "--skew") {
      o.skew_alpha = number(a, val());
      if (o.skew_alpha < 0) throw std::invalid_argument("--skew: expected ALPHA >= 0");
    } else if (a == "--seed") {
      double s = number(a, val());
      if (s < 0) throw std::invalid_argument("--seed: expected N >= 0");
      o.seed = static_cast<uint64_t>(s);
    } else if (a == "--rounds") {
      double r = number(a, val());
      if (r < 1 || r > 100) throw std::invalid_argument("--rounds: expected 1..100");
      o.rounds = static_cast<int>(r);
    } else if (a == "--max-ms") {
      o.max_ms = number(a, val());
      if (o.max_ms <= 0) throw std::invalid_argument("--max-ms: expected MS > 0");
    } else if (a == "--check-rows") {
      double r = number(a, val());
      if (r < 1) throw std::invalid_argument("--check-rows: expected N >= 1");
      o.check_rows = static_cast<int>(r);
    } else if (a == "--no-check") {
      o.check = false;
    } else if (a == "--no-alternatives") {
      o.alternatives = false;
    } else if (a == "--alternatives") {
      o.alt_filter = val();
    } else if (a == "--skip-alternatives") {
      o.alt_skip = val();
    } else if (a == "--candidates") {
      o.candidates = true;
    } else if (a == "--candidate") {
      double c = number(a, val());
      if (c < 0 || c > 1e6 || c != std::floor(c))
        throw std::invalid_argument("--candidate: expected an index I >= 0");
      o.candidate = static_cast<int>(c);
    } else if (a == "--plan") {
      o.plan = val();
    } else if (a == "--extra-alternatives") {
      o.extra_alternatives_path = val();
    } else if (a == "--json") {
      o.json_path = val();
    } else if (a == "--markdown") {
      o.markdown_path = val();
    } else if (a == "--ceilings-cache") {
      o.ceilings_cache = val();
    } else if (a == "--remeasure-ceilings") {
      o.remeasure_ceilings = true;
    } else if (a == "--nominal-ceilings") {
      o.nominal_ceilings = true;
    } else if (a == "--list") {
      o.list = true;
    } else if (a == "--help" || a == "-h") {
      o.help = true;
    } else {
      throw std::invalid_argument("unknown option '" + args[i] + "' (see --help)");
    }
  }
  if (o.candidates && (o.candidate >= 0 || !o.plan.empty()))
    throw std::invalid_argument("--candidates excludes --candidate I and --plan");
  if (o.candidate >= 0 && !o.plan.empty())
    throw std::invalid_argument("--candidate I and --plan exclude each other");
  return o;
}

}  // namespace moekit::bench
