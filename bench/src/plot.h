// The benchmark's pictures: an SVG drawn from a run's JSON (render_json's schema), so
// the same code draws a run as it ends (moekit-bench --json FILE writes FILE's .svg) and a
// saved run later (moekit-plot, scripts/plots). Host code only.
//
// A table run: one panel per op (and an overview panel of per-op geometric means), one
// row per workload and dtype: ours against the page and each alternative of the run as
// ratio bars on a log axis centred on 1 (the other's time / ours: right of 1, moekit is
// faster), the page/ours figure, and the row's SOL (ideal / measured: the roofline share).
// A --tokens run: one panel per op, workload and dtype: time against token count for
// moekit, each alternative and the roofline (the ideal time), with the page's figure at
// its own token count.
// A tuned layer (moekit-plot --tune, plot_tune.cpp): moekit-tune's measurements against
// token count, the tuned plan's (where its table serves the count, else the default's) and
// the default plan's under uniform and skewed routing, with a moekit-bench --tokens run of
// the layer's best alternative and roofline; under it, default / tuned per count.
#pragma once

#include <string>

namespace moekit::bench {

// Throws std::runtime_error when the text is not a moekit-bench JSON (no "records").
std::string render_svg(const std::string& json_text);

// What the picture of a tuned layer is drawn from: texts, and the names that stand for
// their files in errors ("NAME:LINE: why").
struct TunePlotInputs {
  std::string partial_text, partial_name;  // moekit-tune's OUT.partial
  std::string table_text, table_name;      // its table (table_name empty: none)
  std::string bench_text, bench_name;      // a moekit-bench --tokens JSON (empty name: none)
  std::string op;        // the bench records' op (default: the layer's: FusedMoEFwd or
                         // FusedMoESharedExpertFwd)
  std::string workload;  // their base workload (default: the only one of that op and dtype)
  std::string title;     // the layer's name (default: tune_layer_name(partial_name))
};
// Throws std::runtime_error naming the file (and line) of what does not parse: a partial
// file's line, a table's line or field, a table plan that the partial file did not measure
// at a count it serves, a bench file without records of the layer.
std::string render_tune_svg(const TunePlotInputs& in);
// The layer's name of a partial file: "dir/ds-v3.table.partial" -> "ds-v3".
std::string tune_layer_name(const std::string& partial_path);

// Where the picture of a JSON file goes: FILE.json -> FILE.svg (other names: + ".svg").
std::string svg_path_for(const std::string& json_path);

}  // namespace moekit::bench
