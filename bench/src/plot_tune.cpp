// The tuned layer's picture (plot.h, render_tune_svg): time against token count (both axes
// logarithmic) of the tuned and the default plan under each routing (uniform solid, skewed
// dashed), the bench run's best alternative and roofline; under it default / tuned per count
// with the guardrail's 2% line.
#include "plot_tune.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "plot_axes.h"
#include "plot_run.h"

namespace moekit::bench {
namespace plot {
namespace {

constexpr double kWidth = 760, kPlotL = 74, kPlotR = 24, kTimeH = 300, kRatioH = 120;
const char* const kSkewedDash = "7,4";
const char* const kGuardrailColor = "#cc3311";

std::string us_text(double us) {
  return us > 0 ? format("%.1f us", us) : "not timed";
}

double us_of(const tune::Measurement* m) {
  return m && m->us > 0 ? m->us : -1;
}

const char* dash_of(const std::string& routing) {
  return routing == "uniform" ? "" : kSkewedDash;
}

// The time panel's curves: per routing the default, then the tuned plan; the bench's.
std::vector<Curve> time_curves(const std::vector<RoutingSeries>& series, const BenchSeries* bench,
                               bool table) {
  std::vector<Curve> curves;
  if (bench) {
    Curve roof{"roofline", kRooflineColor, "1.5,3", 1.5, 0};
    Curve alt{"best-alternative", alternative_color(0), "", 1.5, 2.5};
    for (const BenchPoint& p : bench->points) {
      const std::string at = "T=" + std::to_string(p.tokens) + ": ";
      roof.points.emplace_back(p.tokens, p.ideal_us);
      roof.tips.push_back(at + "roofline " + us_text(p.ideal_us));
      alt.points.emplace_back(p.tokens, p.best_alternative_us);
      alt.tips.push_back(at + "best alternative " +
                         (p.best_alternative.empty() ? "-" : p.best_alternative) + " " +
                         us_text(p.best_alternative_us) + " (uniform routing)");
    }
    curves.push_back(roof);
    curves.push_back(alt);
  }
  for (const RoutingSeries& rs : series) {
    Curve def{"default-" + rs.routing, kPageColor, dash_of(rs.routing), 1.5, 2};
    Curve tuned{"tuned-" + rs.routing, kOursColor, dash_of(rs.routing), 2, 3};
    for (const TunedPoint& p : rs.points) {
      const std::string at = "T=" + std::to_string(p.tokens) + " " + rs.routing + ": ";
      def.points.emplace_back(p.tokens, us_of(p.def));
      def.tips.push_back(at + "default " + us_text(us_of(p.def)) +
                         (p.def ? ", " + p.def->plan : ", not measured"));
      tuned.points.emplace_back(p.tokens, us_of(p.tuned));
      tuned.marked.push_back(p.from_entry);
      std::string tip = at + (table ? "tuned " : "fastest candidate ") + us_text(us_of(p.tuned));
      if (p.tuned) tip += ", " + p.tuned->plan + (p.tuned->accurate ? "" : " (inaccurate)");
      tuned.tips.push_back(tip);
    }
    curves.push_back(def);
    curves.push_back(tuned);
  }
  return curves;
}

// default / tuned per count and routing (> 1: the tuned plan is faster).
std::vector<Curve> ratio_curves(const std::vector<RoutingSeries>& series, const char* tuned) {
  std::vector<Curve> curves;
  for (const RoutingSeries& rs : series) {
    Curve c{"speedup-" + rs.routing, kOursColor, dash_of(rs.routing), 1.5, 2.5};
    for (const TunedPoint& p : rs.points) {
      const double d = us_of(p.def), t = us_of(p.tuned);
      const double r = d > 0 && t > 0 ? d / t : -1;
      c.points.emplace_back(p.tokens, r);
      c.tips.push_back("T=" + std::to_string(p.tokens) + " " + rs.routing + ": default / " + tuned +
                       " = " + (r > 0 ? format("%.3f", r) : "-"));
    }
    curves.push_back(c);
  }
  return curves;
}

void draw_series(Svg& svg, const Curve& c, const Axis& x, const Axis& y) {
  svg.open_group("class=\"series\" data-series=\"" + xml_escape(c.name) + "\"");
  draw_curve(svg, c, x, y);
  svg.close_group();
}

// One routing's line of the summary: the mean of default / tuned - 1 over the counts both
// were timed at, and the worst count.
std::string routing_summary(const RoutingSeries& rs) {
  double sum = 0, worst = 0;
  int64_t worst_T = 0;
  size_t n = 0, inaccurate = 0;
  for (const TunedPoint& p : rs.points) {
    const double d = us_of(p.def), t = us_of(p.tuned);
    if (p.tuned && !p.tuned->accurate) ++inaccurate;
    if (!(d > 0 && t > 0)) continue;
    sum += d / t - 1;
    if (n == 0 || d / t < worst) {
      worst = d / t;
      worst_T = p.tokens;
    }
    ++n;
  }
  std::string s = rs.routing + ": ";
  if (n == 0) return s + "nothing timed";
  s += format("%+.1f%%", 100 * sum / double(n)) + " on average over " + std::to_string(n) +
       " counts, worst T=" + std::to_string(worst_T) + " " + format("%+.1f%%", 100 * (worst - 1));
  if (inaccurate) s += ", " + std::to_string(inaccurate) + " counts inaccurate";
  return s;
}

struct Ranges {
  double tmin = 0, tmax = 0, vmin = 0, vmax = 0;
  void add(int64_t t, double v) {
    if (!(v > 0)) return;
    tmin = tmin > 0 ? std::min(tmin, double(t)) : double(t);
    tmax = std::max(tmax, double(t));
    vmin = vmin > 0 ? std::min(vmin, v) : v;
    vmax = std::max(vmax, v);
  }
};

Frame frame_at(double top, double height, const std::string& y_title) {
  return {kPlotL, kWidth - kPlotR, top, top + height, 18, "tokens (log)", y_title};
}

// The guardrail's line (2% slower) and the line at 1 across the ratio panel.
void draw_ratio_marks(Svg& svg, const Frame& f, const Axis& y) {
  svg.line(f.left, y.at(1), f.right, y.at(1), "#555");
  const double slower = 1 / 1.02;
  svg.open_group("class=\"series\" data-series=\"guardrail\"");
  svg.line(f.left, y.at(slower), f.right, y.at(slower), kGuardrailColor, 1, "4,3");
  svg.text(f.right - 4, y.at(slower) - 4, "2% slower", {10, "end", kGuardrailColor});
  svg.close_group();
}

}  // namespace

std::string tune_figure(const TunedLayer& layer, const std::vector<RoutingSeries>& series,
                        const std::vector<TableEntry>* table, const BenchSeries* bench,
                        const TunePlotInputs& in) {
  std::vector<int64_t> counts;
  for (const tune::Measurement& m : layer.ms) counts.push_back(m.tokens);
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  std::string device = bench ? bench->device : "";
  if (table && !table->empty()) device = table->front().device;

  const std::string tuned = table ? "tuned" : "fastest";
  std::vector<HeadingLine> lines = {{layer.shape, {12}}};
  std::string measured = std::to_string(layer.ms.size()) + " measurements at " +
                         std::to_string(counts.size()) + " token counts";
  if (!counts.empty())
    measured += " (" + std::to_string(counts.front()) + "-" + std::to_string(counts.back()) + ")";
  lines.push_back({measured + " · " + in.partial_name, {11, "start", "#555"}});
  if (table) {
    size_t served = 0;
    for (int64_t T : counts)
      served += std::any_of(table->begin(), table->end(),
                            [T](const TableEntry& e) { return e.serves(T); });
    lines.push_back({"table " + in.table_name + ": " + std::to_string(table->size()) +
                         " entries of this layer, serving " + std::to_string(served) + " of " +
                         std::to_string(counts.size()) + " counts (the default elsewhere)",
                     {11, "start", "#555"}});
  } else {
    lines.push_back({"no table given: 'fastest' is the fastest accurate candidate per count",
                     {11, "start", "#555"}});
  }
  std::string summary;
  for (const RoutingSeries& rs : series)
    summary += (summary.empty() ? "default / " + tuned + " - 1: " : " · ") + routing_summary(rs);
  if (!summary.empty()) lines.push_back({summary, {11, "start", "#555"}});
  lines.push_back({bench ? "bench " + in.bench_name + ": " + bench->op + " " + bench->workload +
                               " (uniform routing): the best alternative and the roofline"
                         : "no bench run given: no alternative, no roofline",
                   {11, "start", "#555"}});

  std::vector<LegendEntry> legend = {
      {LegendEntry::kLine, "tuned", table ? "tuned (marked: a table entry)" : "fastest candidate",
       kOursColor},
      {LegendEntry::kLine, "default", "default plan (the planner's)", kPageColor}};
  if (bench) {
    legend.push_back(
        {LegendEntry::kLine, "best-alternative", "best alternative", alternative_color(0)});
    legend.push_back({LegendEntry::kDotted, "roofline", "roofline (ideal time)", kRooflineColor});
  }
  legend.push_back(
      {LegendEntry::kNote, "routing", "solid: uniform routing, dashed: skewed", "#555"});

  Svg svg;
  const std::string title =
      "moekit-tune · " + in.title + " · " + (device.empty() ? "unknown GPU" : device);
  double y0 = draw_heading(svg, title, lines, legend, kWidth) + 6;

  const std::vector<Curve> curves = time_curves(series, bench, table != nullptr);
  const std::vector<Curve> ratios = ratio_curves(series, tuned.c_str());
  Ranges time, ratio;
  for (const Curve& c : curves)
    for (const auto& [t, v] : c.points) time.add(t, v);
  for (const Curve& c : ratios)
    for (const auto& [t, v] : c.points) ratio.add(t, v);
  if (time.vmax <= 0) {
    svg.text(kPlotL, y0 + 30, "nothing timed yet", {12, "start", "#888"});
    return svg.finish(kWidth, y0 + 50);
  }
  Axis x = log_axis(time.tmin, std::max(time.tmax, 2 * time.tmin), 2, 7);
  Axis y = log_axis(time.vmin, time.vmax, 10, 6);
  const Frame tf = frame_at(y0 + 8, kTimeH, "time (us, log)");
  x.p0 = tf.left;
  x.p1 = tf.right;
  y.p0 = tf.bottom;
  y.p1 = tf.top;
  svg.open_group("class=\"panel\" data-panel=\"time\"");
  draw_frame(svg, tf, x, y);
  for (const Curve& c : curves) draw_series(svg, c, x, y);
  svg.close_group();

  const double lo = std::min(ratio.vmin > 0 ? ratio.vmin : 1.0, 1 / 1.02),
               hi = std::max(ratio.vmax, 1.0) + 0.005;
  Axis r = range_axis(lo - 0.005, hi, 4);
  const Frame rf = frame_at(tf.bottom + 56, kRatioH, "default / " + tuned);
  r.p0 = rf.bottom;
  r.p1 = rf.top;
  svg.open_group("class=\"panel\" data-panel=\"ratio\"");
  draw_frame(svg, rf, x, r);
  draw_ratio_marks(svg, rf, r);
  for (const Curve& c : ratios) draw_series(svg, c, x, r);
  svg.close_group();
  return svg.finish(kWidth, rf.bottom + 44);
}

}  // namespace plot

std::string render_tune_svg(const TunePlotInputs& in) {
  const plot::TunedLayer layer = plot::read_tuned_layer(in.partial_text, in.partial_name);
  std::vector<plot::TableEntry> table;
  if (!in.table_name.empty()) table = plot::read_table_entries(in.table_text, in.table_name, layer);
  plot::BenchSeries bench;
  if (!in.bench_name.empty()) bench = plot::read_bench_series(in, layer);
  const std::vector<plot::RoutingSeries> series =
      plot::tuned_series(layer, in.table_name.empty() ? nullptr : &table);
  TunePlotInputs named = in;
  if (named.title.empty()) named.title = tune_layer_name(in.partial_name);
  return plot::tune_figure(layer, series, in.table_name.empty() ? nullptr : &table,
                           in.bench_name.empty() ? nullptr : &bench, named);
}

std::string tune_layer_name(const std::string& partial_path) {
  std::string name = partial_path.substr(partial_path.find_last_of('/') + 1);
  for (const std::string ext : {".partial", ".table"})
    if (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0)
      name.erase(name.size() - ext.size());
  return name;
}

}  // namespace moekit::bench
