// moekit-bench's command line. Host code only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload.h"

namespace moekit::bench {

struct Options {
  Filters filters;
  bool quick = false;
  std::string workloads_path;  // empty: the built-in seed list
  std::vector<int64_t> tokens;
  std::string json_path, markdown_path, extra_alternatives_path;
  bool random_counts = false;  // ragged per-expert counts for permuted-layout ops
  double skew_alpha = 0;       // routing skew: logit bias -alpha*log(1+rank)
  uint64_t seed = 1;
  int rounds = 3;
  double max_ms = 200;   // device time per implementation per round
  int check_rows = 256;  // rows the GPU reference checks on shapes too big for the CPU
  bool check = true;     // accuracy vs the reference
  bool alternatives = true;
  std::string alt_filter;   // comma-separated substrings of alternative names to run
  std::string alt_skip;     // ... and of names not to run
  bool candidates = false;  // also time every plan candidate of each row (*_plan_candidates)
  int candidate = -1;       // >= 0: run only candidate I of each row (args.plan) as moekit
  std::string plan;         // non-empty: run the candidate with this one-line form (--plan)
  bool list = false;        // print the selected rows and exit (no GPU needed)
  bool help = false;
  std::string ceilings_cache;  // file; empty: $MOEKIT_BENCH_CACHE or ~/.cache/moekit
  bool remeasure_ceilings = false;
  bool nominal_ceilings = false;  // skip measuring; use BENCH.md's figures
};

// Throws std::invalid_argument naming the bad option.
Options parse_options(const std::vector<std::string>& args);
std::string usage();

}  // namespace moekit::bench
