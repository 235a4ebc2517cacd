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
#pragma once

#include <string>

namespace moekit::bench {

// Throws std::runtime_error when the text is not a moekit-bench JSON (no "records").
std::string render_svg(const std::string& json_text);

// Where the picture of a JSON file goes: FILE.json -> FILE.svg (other names: + ".svg").
std::string svg_path_for(const std::string& json_path);

}  // namespace moekit::bench
