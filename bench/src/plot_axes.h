// The line charts' parts (plot_tokens.cpp, plot_tune.cpp): axes, their frame and curves of
// (token count, value) points. Host code only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "svg.h"

namespace moekit::bench::plot {

// Data range [lo, hi] onto pixels [p0, p1], linear or logarithmic, with its ticks.
struct Axis {
  double lo = 0, hi = 1, p0 = 0, p1 = 1;
  bool log = false;
  std::vector<double> ticks;
  double at(double v) const;
};

// 0 to about `hi` in steps of 1, 2, 2.5 or 5 times a power of ten (no 2.5 when `integer`),
// about `target_ticks` of them.
Axis linear_axis(double hi, double target_ticks, bool integer);
// About [lo, hi] (rounded out to its steps) in steps of 1, 2, 2.5 or 5 times a power of ten.
Axis range_axis(double lo, double hi, double target_ticks);
// Powers of `base` around [lo, hi], at most `max_ticks` of them labelled.
Axis log_axis(double lo, double hi, double base, size_t max_ticks);
// "0.25", "1e-5" (not "1e-05").
std::string ms_tick(double v);

// A plot area: the grid at each tick with its labels, the axes and their titles.
struct Frame {
  double left = 0, right = 0, top = 0, bottom = 0;
  double label_x = 0;  // where the vertical title goes
  std::string x_title, y_title;
};
void draw_frame(Svg& svg, const Frame& f, const Axis& x, const Axis& y);

struct Curve {
  std::string name, color, dash;
  double width = 1.5, marker = 2.5;
  std::vector<std::pair<int64_t, double>> points;  // tokens, value (<= 0: a gap)
  std::vector<std::string> tips;                   // one per point
  bool diamonds = false;                           // diamond markers (else circles)
  std::vector<bool> marked;                        // empty: a marker at every point
};
// The line through the points (broken at gaps), then a marker per point with its tooltip.
void draw_curve(Svg& svg, const Curve& c, const Axis& x, const Axis& y);

}  // namespace moekit::bench::plot
