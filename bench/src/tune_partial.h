// moekit-tune's partial-results file, line by line (docs/tuning.md "moekit-tune"): one
// measurement a line, `T | routing | plan | us | accurate|inaccurate | default|-`. Host code
// without the library: moekit-tune (bench/tune, which also checks the plan's grammar with the
// library's parse_plan) and moekit-plot --tune (plot_tune.cpp) read it through here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moekit::tune {

// One measurement: a candidate's median at T under one routing.
struct Measurement {
  int64_t tokens = 0;
  std::string routing;  // "uniform" / "skewed"
  std::string plan;
  double us = -1;  // < 0: not timed (failed)
  bool accurate = false;
  bool is_default = false;  // the plan the library runs today (plan_*)
};

// The partial file's first line starts so; the layer's shape follows.
extern const char* const kPartialHeaderPrefix;

// A line's '|'-separated fields, spaces around them trimmed (the partial file's lines and a
// tuning table's).
std::vector<std::string> split_fields(const std::string& line);

std::string format_measurement(const Measurement& m);
// One line of format_measurement's; false with `why` when it does not parse (the plan is
// only checked to be there).
bool parse_measurement(const std::string& line, Measurement* m, std::string* why);

}  // namespace moekit::tune
