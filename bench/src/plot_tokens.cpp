// The --tokens run's picture: per op, workload and dtype, time against token count for
// moekit, each alternative and the roofline (the ideal time); the page at its own count.
#include <algorithm>
#include <cmath>

#include "plot_axes.h"
#include "plot_run.h"
#include "report.h"

namespace moekit::bench::plot {
namespace {

struct TokenPanel {
  std::string op, workload, dtype;
  std::vector<const Record*> records;  // by token count
};

constexpr double kPanelW = 400, kPlotL = 66, kPlotR = 18, kPlotT = 46, kPlotH = 190, kPlotB = 44;

std::vector<Curve> panel_curves(const TokenPanel& p, const std::vector<std::string>& alts) {
  Curve roof{"roofline", kRooflineColor, "5,3", 1.5, 0, {}, {}};
  Curve ours{"moekit", kOursColor, "", 2, 3, {}, {}};
  Curve page{"page", kPageColor, "", 0, 4.5, {}, {}, true, {}};
  std::vector<Curve> alt_curves;
  for (size_t i = 0; i < alts.size(); ++i)
    alt_curves.push_back({alts[i], alternative_color(i), "", 1.5, 2.5, {}, {}});
  for (const Record* r : p.records) {
    const std::string at = "T=" + std::to_string(r->tokens) + ": ";
    roof.points.emplace_back(r->tokens, r->ideal_ms > 0 ? r->ideal_ms : -1);
    roof.tips.emplace_back();
    const bool m = r->measured();
    ours.points.emplace_back(r->tokens, m ? r->ours_ms : -1);
    ours.tips.push_back(at + "moekit " + format_ms(r->ours_ms) + " ms, ideal " +
                        format_ms(r->ideal_ms) + " ms (SOL " + format("%.0f%%", 100 * r->sol) +
                        ")");
    if (r->page_ms > 0) {
      page.points.emplace_back(r->tokens, r->page_ms);
      page.tips.push_back(at + "page " + format_ms(r->page_ms) + " ms");
    }
    for (Curve& c : alt_curves) {
      const double ms = m ? r->alternative_ms(c.name) : -1;
      c.points.emplace_back(r->tokens, ms);
      c.tips.push_back(at + c.name + " " + format_ms(ms) + " ms");
    }
  }
  std::vector<Curve> curves = {roof};
  curves.insert(curves.end(), alt_curves.begin(), alt_curves.end());
  curves.push_back(ours);
  curves.push_back(page);
  return curves;
}

void draw_panel(Svg& svg, const TokenPanel& p, const std::vector<std::string>& alts, double x0,
                double y0) {
  svg.open_group("class=\"panel\" data-op=\"" + xml_escape(p.op) + "\" data-workload=\"" +
                 xml_escape(p.workload) + "\" data-dtype=\"" + xml_escape(p.dtype) + "\"");
  svg.text(x0 + 10, y0 + 16, fit(p.op, 13, kPanelW - 20), {13, "start", "#111", true});
  svg.text(x0 + 10, y0 + 31, fit(p.workload + " " + p.dtype, 11, kPanelW - 20),
           {11, "start", "#444"});
  const std::vector<Curve> curves = panel_curves(p, alts);
  double ymin = 0, ymax = 0;
  int64_t tmin = 0, tmax = 0;
  for (const Curve& c : curves)
    for (const auto& [t, ms] : c.points) {
      if (ms <= 0) continue;
      ymin = ymin > 0 ? std::min(ymin, ms) : ms;
      ymax = std::max(ymax, ms);
      tmin = tmin > 0 ? std::min(tmin, t) : t;
      tmax = std::max(tmax, t);
    }
  const double left = x0 + kPlotL, right = x0 + kPanelW - kPlotR, top = y0 + kPlotT,
               bottom = top + kPlotH;
  if (ymax <= 0 || tmax <= 0) {
    svg.text(left, top + 20, "no measured row", {11, "start", "#888"});
    svg.close_group();
    return;
  }
  Axis x = tmax >= 64 * std::max<int64_t>(tmin, 1)
               ? log_axis(double(std::max<int64_t>(tmin, 1)), double(tmax), 2, 7)
               : linear_axis(double(tmax), 6, true);
  Axis y = ymax > 30 * ymin ? log_axis(ymin, ymax, 10, 6) : linear_axis(ymax * 1.05, 5, false);
  x.p0 = left;
  x.p1 = right;
  y.p0 = bottom;
  y.p1 = top;
  draw_frame(svg,
             {left, right, top, bottom, x0 + 14, x.log ? "tokens (log)" : "tokens",
              y.log ? "time (ms, log)" : "time (ms)"},
             x, y);
  for (const Curve& c : curves) draw_curve(svg, c, x, y);
  svg.close_group();
}

}  // namespace

std::string tokens_figure(const Run& run) {
  std::vector<TokenPanel> panels;
  std::vector<int64_t> counts;
  size_t rows = 0;
  for (const Record& r : run.records) {
    if (r.tokens < 0) continue;  // not a token-shaped row: nothing to place it at
    ++rows;
    if (std::find(counts.begin(), counts.end(), r.tokens) == counts.end())
      counts.push_back(r.tokens);
    auto it = std::find_if(panels.begin(), panels.end(), [&](const TokenPanel& p) {
      return p.op == r.op && p.workload == r.base_workload && p.dtype == r.dtype;
    });
    if (it == panels.end()) it = panels.insert(panels.end(), {r.op, r.base_workload, r.dtype, {}});
    it->records.push_back(&r);
  }
  for (TokenPanel& p : panels)
    std::stable_sort(p.records.begin(), p.records.end(),
                     [](const Record* a, const Record* b) { return a->tokens < b->tokens; });
  std::sort(counts.begin(), counts.end());

  std::string summary =
      std::to_string(rows) + " rows at " + std::to_string(counts.size()) + " token counts";
  if (!counts.empty())
    summary += " (" + std::to_string(counts.front()) + "-" + std::to_string(counts.back()) + ")";
  summary += " · " + accuracy_summary(run.records) + " · one panel per op, workload and dtype";
  std::vector<LegendEntry> legend = {{LegendEntry::kLine, "moekit", "moekit", kOursColor}};
  for (size_t i = 0; i < run.alternative_names.size(); ++i)
    legend.push_back({LegendEntry::kLine, run.alternative_names[i], run.alternative_names[i],
                      alternative_color(i)});
  legend.push_back({LegendEntry::kDashed, "roofline",
                    "roofline: ideal time, max(FLOPs / peak, bytes / read bandwidth)",
                    kRooflineColor});
  legend.push_back(
      {LegendEntry::kDiamond, "page", "seed page (at its own token count)", kPageColor});

  const size_t columns = std::clamp<size_t>(panels.size(), 1, 3);
  const double margin = 8, panel_h = kPlotT + kPlotH + kPlotB,
               width = std::max(kMinFigureWidth, double(columns) * kPanelW + 2 * margin);
  Svg svg;
  const double top = draw_header(svg, run, summary, legend, width) + 4;
  for (size_t i = 0; i < panels.size(); ++i)
    draw_panel(svg, panels[i], run.alternative_names, margin + double(i % columns) * kPanelW,
               top + double(i / columns) * panel_h);
  const size_t grid_rows = (panels.size() + columns - 1) / columns;
  if (panels.empty()) svg.text(margin + 10, top + 20, "no token-shaped rows in this run", {12});
  return svg.finish(width, top + double(std::max<size_t>(grid_rows, 1)) * panel_h + 10);
}

}  // namespace moekit::bench::plot
