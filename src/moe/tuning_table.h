// Tuning tables inside the library (include/moekit/tuning.h, docs/tuning.md): the text
// format's reader and writer, the registry of built-in and loaded tables and the layer
// ops' lookup.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gemm/gemm_planner.h"
#include "moe/layer_planner.h"
#include "moekit/plan.h"
#include "moekit/tuning.h"

namespace moekit::detail {

// The table's columns, in order (the header line names them so).
extern const char* const kTuningColumns[14];

// A device as the loader checks an entry's plan against it: entries of this device name
// must name a candidate of their shape (at each served range's ends) on `gemm`.
struct TuningDevice {
  std::string name;
  GemmDevice gemm;
};

struct ParsedEntry {
  TuningEntry entry;
  LayerPlan plan;
};

// Parses a table's text. Throws moekit::Error "NAME:LINE: field 'F': expected ..., got ..."
// on the first bad line. `check`: entries of that device must name plans it can run at the
// ends of their served ranges (null: parse only).
std::vector<ParsedEntry> parse_tuning_table(const std::string& text, const std::string& name,
                                            const TuningDevice* check);
// The table's text of `entries`: a comment, the header, one line per entry.
std::string format_tuning_table(const std::vector<TuningEntry>& entries);
// "1-16,24,32" (consecutive counts joined into ranges).
std::string format_token_ranges(const std::vector<TokenRange>& ranges);
// A shape's dtype column: "bf16", or "bf16 fp8_per_channel" with FP8 weights.
std::string tuning_dtype_field(const TuningShape& shape);
std::vector<TokenRange> token_ranges(const std::vector<int64_t>& sorted_counts);

bool serves(const TuningEntry& entry, int64_t T);
// The layer op's problem for a table's shape at T tokens.
LayerProblem tuning_problem(const TuningShape& shape, int64_t T);
TuningShape layer_tuning_shape(const char* op, const MoEShapes& s, const TopKParams& routing,
                               int64_t S);

// The registry: loaded tables are put first; the built-in ones (compiled in from CMake's
// list, parsed once on first use) are searched last.
void add_tuning_table(std::vector<ParsedEntry> entries);
// False when no table is loaded or built in: the layer ops then skip the lookup (and the
// shape key's strings) altogether.
bool tuning_tables_present();
// The plan of the first entry serving (device, shape, T) whose plan `device` can run for
// the problem (a stale entry is skipped); false when none. The problem is the call's when
// given (`actual`: what the shape does not key, such as a static activation scale, can
// refuse a plan), else tuning_problem(shape, T).
bool tuned_layer_plan(const std::string& device_name, const TuningShape& shape, int64_t T,
                      const GemmDevice& device, LayerPlan* out,
                      const LayerProblem* actual = nullptr);

// The built-in tables: (name, text) pairs, generated from CMake's list.
struct BuiltinTable {
  const char* name;
  const char* text;
};
const std::vector<BuiltinTable>& builtin_tuning_tables();

}  // namespace moekit::detail
