// Tuning tables (docs/tuning.md): measured per-model layer plans that replace the
// planner's where a table has an entry for the device, the layer's shape and the token
// count. The layer ops (fused_moe, fused_moe_shared_expert) and their plan_* look entries
// up when args.plan is null; an entry whose plan cannot run the call (a rejection) is
// skipped for the planner's plan, never an error. Tables are compiled in (built-in) or
// loaded here; loaded tables are searched first, the last loaded first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/quant.h"
#include "moekit/routing.h"

namespace moekit {

// A layer as a table keys it: what the op sees of its arguments.
struct TuningShape {
  std::string op;        // "fused_moe" or "fused_moe_shared_expert"
  std::string dtype;     // "bf16" / "f16"
  int64_t E = 0;         // experts the op sees (its weights' dim 0)
  int64_t H = 0, F = 0;  // hidden, expert intermediate
  int top_k = 0;         //
  std::string routing;   // routing_name(params): "softmax", "sigmoid groups 8/4", ...
  int64_t S = 0;         // shared expert width, 0 = none
  // The weights' scheme, routed and shared alike (a layer whose shared expert's differs has
  // no entries); a table writes it after the dtype: "bf16 fp8_per_channel".
  QuantScheme quant = QuantScheme::kNone;
  bool operator==(const TuningShape& o) const;
};

// An inclusive range of token counts.
struct TokenRange {
  int64_t lo = 0, hi = 0;
};

struct TuningEntry {
  std::string device;  // cudaDeviceProp::name, e.g. "NVIDIA H200"
  TuningShape shape;
  // The model's experts this layer holds: "all", or "lo-hi" (expert parallelism: hi - lo + 1
  // = E). Informational: the op cannot see it, so entries differing only here overlap.
  std::string experts = "all";
  std::vector<TokenRange> tokens;  // the counts the entry serves, every one measured
  std::string plan;                // to_string of the LayerPlan
  double time_us = 0;              // the plan's mean time over the served counts
  double default_us = 0;           // the planner's plan's, the same counts
  std::string source;              // the file (or name) and line it came from, "f:12"
};

// The routing's name in a table: "softmax" / "sigmoid", then " groups G/TG" when grouped.
std::string routing_name(const TopKParams& params);

// Loads a table (the format: docs/tuning.md). Throws moekit::Error naming the file, line
// and field when it does not parse, names a plan that does not parse, names a plan this
// build cannot run for its shape (checked where the entry's device is the current one),
// or has entries of one shape whose token counts overlap. All or nothing: a table that
// throws adds no entry.
void load_tuning_table(const std::string& path);
// The same for a table's text; `name` stands for the file in errors and in source.
void load_tuning_table_text(const std::string& text, const std::string& name = "<text>");
// Forgets every loaded table (the built-in ones stay).
void clear_tuning_tables();
// Every entry in lookup order: loaded tables (last loaded first), then the built-in ones.
std::vector<TuningEntry> tuning_entries();

// The guardrail (docs/tuning.md "The rule"): a tuned plan replaces the default only where,
// over the counts it serves, it is at least 1% faster on average (the mean of default/tuned
// - 1 over the counts) and no count is more than 2% slower (tuned > 1.02 x default), every
// count measured (both times > 0).
struct CountTiming {
  int64_t tokens = 0;
  double tuned_us = 0;    // the tuned plan's median, <= 0: not measured
  double default_us = 0;  // the default plan's median, <= 0: not measured
};
struct GuardrailVerdict {
  bool accepted = false;
  double mean_speedup = 0;  // mean of default/tuned - 1 (0.01 = 1% faster)
  double worst_ratio = 0;   // max tuned/default
  std::string reason;       // why not, when refused
};
constexpr double kGuardrailMinMeanSpeedup = 0.01;
constexpr double kGuardrailMaxSlowdown = 0.02;
GuardrailVerdict guardrail(const std::vector<CountTiming>& served);

}  // namespace moekit
