// What the pictures (plot.h) read from a run's JSON, and the parts both kinds of picture
// share: the header (title, the run's facts, legend), colours, axes. Host code only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "svg.h"

namespace moekit::bench::plot {

// One record; a missing, null or non-finite number reads as -1.
struct Record {
  std::string op, workload, base_workload, dtype, status, accuracy;
  int64_t tokens = -1;
  double ours_ms = -1, page_ms = -1, ideal_ms = -1, sol = -1;
  std::vector<std::pair<std::string, double>> alternatives;  // name, ms (-1: not timed)
  bool measured() const { return status == "ok" && ours_ms > 0; }
  double alternative_ms(const std::string& name) const;  // -1 when absent or not timed
};

struct Run {
  std::string device, commit, date, options;
  std::vector<std::string> knobs;
  double read_tbps = -1, bf16_tflops = -1, fp8_tflops = -1, launch_floor_ms = -1;
  std::vector<Record> records;
  std::vector<std::string> alternative_names;  // in order of first appearance
  bool tokens_run = false;                     // some record has a token count
};

// Throws std::runtime_error when the text is not a moekit-bench JSON.
Run parse_run(const std::string& json_text);

// Colours: the page, moekit (token curves), the roofline / SOL, alternative i.
extern const char* const kPageColor;
extern const char* const kOursColor;
extern const char* const kRooflineColor;
std::string alternative_color(size_t i);

struct LegendEntry {
  enum Kind { kBar, kLine, kDashed, kDotted, kDiamond, kMark, kNote };  // kNote: text alone
  Kind kind;
  std::string series, label, color;  // series: the data-series attribute (tests find it)
};

// Title (GPU, commit, date), `summary`, the ceilings / launch floor / knobs, the command,
// and the legend, across `width` (at least kMinFigureWidth). Returns the y under them.
constexpr double kMinFigureWidth = 680;
double draw_header(Svg& svg, const Run& run, const std::string& summary,
                   const std::vector<LegendEntry>& legend, double width);
// The same from its parts: `title` (also the document's <title>), lines of text wrapped to
// the width, the legend.
struct HeadingLine {
  std::string text;
  TextStyle style;
};
double draw_heading(Svg& svg, const std::string& title, const std::vector<HeadingLine>& lines,
                    const std::vector<LegendEntry>& legend, double width);

// "accuracy: 132 pass, 1 fail" over the measured records.
std::string accuracy_summary(const std::vector<Record>& records);

std::string format(const char* fmt, double v);
double geomean(const std::vector<double>& xs);  // -1 when empty
// `text` cut with "…" to fit `width` px at `size`.
std::string fit(const std::string& text, double size, double width);
// `text` in lines of at most `width` px, broken at spaces.
std::vector<std::string> wrap(const std::string& text, double size, double width);

// Two columns of panels in order: the first panel of the second column, chosen so that
// the taller column is as short as can be.
size_t split_in_two(const std::vector<double>& heights);

// The two pictures (plot.h says what they show): SVG documents.
std::string ops_figure(const Run& run);     // plot_ops.cpp
std::string tokens_figure(const Run& run);  // plot_tokens.cpp

}  // namespace moekit::bench::plot
