// The tuned layer's picture (plot.h, render_tune_svg): its inputs read and joined per token
// count (plot_tune_inputs.cpp), then drawn (plot_tune.cpp). Host code only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plot.h"
#include "tune_partial.h"

namespace moekit::bench::plot {

// moekit-tune's partial file: the layer and its measurements.
struct TunedLayer {
  std::string shape;  // the header after its prefix: "fused_moe bf16 E=128 ... seed=1"
  std::string op, dtype;
  std::string key;  // op|dtype|E|H|F|top_k|routing|S|experts, as a table's columns hold them
  std::vector<tune::Measurement> ms;  // a time that is not finite reads as -1 (not timed)
};
TunedLayer read_tuned_layer(const std::string& text, const std::string& name);

// A table's entry of the layer (entries of other shapes are skipped).
struct TableEntry {
  std::vector<std::pair<int64_t, int64_t>> tokens;  // inclusive ranges
  std::string plan, device, source;                 // source: "NAME:LINE"
  bool serves(int64_t T) const;
};
std::vector<TableEntry> read_table_entries(const std::string& text, const std::string& name,
                                           const TunedLayer& layer);

// A moekit-bench --tokens run's record of the layer at one count, in microseconds.
struct BenchPoint {
  int64_t tokens = 0;
  double best_alternative_us = -1, ideal_us = -1;
  std::string best_alternative;  // its name
};
struct BenchSeries {
  std::string op, workload, device;
  std::vector<BenchPoint> points;  // by token count
};
BenchSeries read_bench_series(const TunePlotInputs& in, const TunedLayer& layer);

// One routing's times at one count: the default plan's and the tuned one's (the table
// entry's plan where one serves the count, else the default; without a table the fastest
// accurate candidate).
struct TunedPoint {
  int64_t tokens = 0;
  const tune::Measurement* def = nullptr;
  const tune::Measurement* tuned = nullptr;
  bool from_entry = false;  // a table entry (or, without a table, a faster candidate) chose it
};
struct RoutingSeries {
  std::string routing;
  std::vector<TunedPoint> points;  // by token count
};
// Throws std::runtime_error (the entry's file:line) when an entry serves a count the
// partial file did not measure, or its plan was not measured at a count it serves.
std::vector<RoutingSeries> tuned_series(const TunedLayer& layer,
                                        const std::vector<TableEntry>* table);

// The picture (table and bench: null when not given).
std::string tune_figure(const TunedLayer& layer, const std::vector<RoutingSeries>& series,
                        const std::vector<TableEntry>* table, const BenchSeries* bench,
                        const TunePlotInputs& in);

}  // namespace moekit::bench::plot
