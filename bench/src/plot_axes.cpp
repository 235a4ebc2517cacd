#include "plot_axes.h"

#include <algorithm>
#include <cmath>

#include "plot_run.h"

namespace moekit::bench::plot {
namespace {

// 1, 2, 2.5 or 5 times a power of ten (no 2.5 for token counts), about `target` per range.
double nice_step(double range, double target, bool integer) {
  const double raw = range / target, mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0})
    if (m * mag >= raw && !(integer && m == 2.5)) return m * mag;
  return 10 * mag;
}

}  // namespace

double Axis::at(double v) const {
  const double t = log ? std::log(v / lo) / std::log(hi / lo) : (v - lo) / (hi - lo);
  return p0 + (p1 - p0) * t;
}

Axis linear_axis(double hi, double target_ticks, bool integer) {
  Axis a;
  a.lo = 0;
  double step = nice_step(hi > 0 ? hi : 1, target_ticks, integer);
  if (integer) step = std::max(1.0, step);
  const int n = static_cast<int>(std::ceil(hi / step - 1e-9));
  a.hi = std::max(1, n) * step;
  for (int i = 0; i <= std::max(1, n); ++i) a.ticks.push_back(i * step);
  return a;
}

Axis range_axis(double lo, double hi, double target_ticks) {
  Axis a;
  const double step = nice_step(hi > lo ? hi - lo : 1, target_ticks, false);
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  a.lo = first * step;
  a.hi = std::max(first + 1, last) * step;
  for (double i = first; i <= std::max(first + 1, last) + 1e-9; ++i) a.ticks.push_back(i * step);
  return a;
}

Axis log_axis(double lo, double hi, double base, size_t max_ticks) {
  Axis a;
  a.log = true;
  const double elo = std::floor(std::log(lo) / std::log(base) + 1e-9);
  double ehi = std::ceil(std::log(hi) / std::log(base) - 1e-9);
  if (ehi <= elo) ehi = elo + 1;
  a.lo = std::pow(base, elo);
  a.hi = std::pow(base, ehi);
  const size_t count = static_cast<size_t>(ehi - elo) + 1;
  const size_t every = (count + max_ticks - 1) / max_ticks;
  for (size_t i = 0; i < count; i += every) a.ticks.push_back(std::pow(base, elo + double(i)));
  return a;
}

std::string ms_tick(double v) {
  if (v == 0 || v >= 1e-3) return format("%g", v);
  std::string s = format("%.0e", v);
  const size_t e = s.find("e-0");
  return e == std::string::npos ? s : s.erase(e + 2, 1);
}

void draw_frame(Svg& svg, const Frame& f, const Axis& x, const Axis& y) {
  for (double v : y.ticks) {
    svg.line(f.left, y.at(v), f.right, y.at(v), "#e3e3e3");
    svg.text(f.left - 5, y.at(v) + 3.5, ms_tick(v), {10, "end", "#444"});
  }
  for (double v : x.ticks) {
    svg.line(x.at(v), f.top, x.at(v), f.bottom, "#e3e3e3");
    svg.text(x.at(v), f.bottom + 14, format("%g", v), {10, "middle", "#444"});
  }
  svg.line(f.left, f.bottom, f.right, f.bottom, "#555");
  svg.line(f.left, f.top, f.left, f.bottom, "#555");
  svg.vtext(f.label_x, (f.top + f.bottom) / 2, f.y_title, {11, "middle", "#333"});
  svg.text((f.left + f.right) / 2, f.bottom + 32, f.x_title, {11, "middle", "#333"});
}

void draw_curve(Svg& svg, const Curve& c, const Axis& x, const Axis& y) {
  std::vector<std::pair<double, double>> run;
  auto flush = [&] {
    if (c.width > 0) svg.polyline(run, c.color, c.width, c.dash);
    run.clear();
  };
  for (size_t i = 0; i < c.points.size(); ++i) {
    const auto [t, v] = c.points[i];
    if (v <= 0) {
      flush();
      continue;
    }
    run.emplace_back(x.at(double(t)), y.at(v));
  }
  flush();
  for (size_t i = 0; i < c.points.size(); ++i) {
    const auto [t, v] = c.points[i];
    if (v <= 0 || c.marker <= 0 || (!c.marked.empty() && !c.marked[i])) continue;
    const double px = x.at(double(t)), py = y.at(v);
    if (c.diamonds)
      svg.diamond(px, py, c.marker, c.color, c.tips[i]);
    else
      svg.circle(px, py, c.marker, c.color, c.tips[i]);
  }
}

}  // namespace moekit::bench::plot
