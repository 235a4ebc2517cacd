// The table run's picture: per op, ours against the page and each alternative (ratio bars
// on a log axis centred on 1) and the SOL of every row.
#include <algorithm>
#include <cmath>

#include "plot_run.h"
#include "report.h"

namespace moekit::bench::plot {
namespace {

// One bar row: series 0 is the page, series 1.. the run's alternatives in order.
struct BarRow {
  std::string label;
  std::vector<double> ratios;     // the other's time / ours, -1: none
  std::vector<std::string> tips;  // per series: the numbers behind the bar
  double sol = -1;
  std::string sol_tip;
  std::string not_measured;  // the status of a row that was not measured
  bool acc_fail = false;
};

struct BarPanel {
  std::string op, title, stats;
  std::vector<BarRow> rows;
};

// Horizontal geometry of a panel; rows are kRowH (or taller with many series) high.
struct BarLayout {
  double label_w = 0, row_h = 17;
  static constexpr double kRowFont = 12, kPad = 10, kNumW = 66, kRatioW = 220, kGap = 16,
                          kSolW = 56, kSolTextW = 34, kStatsLineH = 13, kFoot = 20;
  double width() const { return 2 * kPad + label_w + kNumW + kRatioW + kGap + kSolW + kSolTextW; }
  std::vector<std::string> stats_lines(const std::string& stats) const {
    return wrap(stats, 10.5, width() - 2 * kPad);
  }
  // Title, the stats lines, the tick labels, then the rows.
  double head(const std::string& stats) const {
    return 39 + kStatsLineH * static_cast<double>(stats_lines(stats).size());
  }
  double height(const BarPanel& p) const {
    return head(p.stats) + static_cast<double>(p.rows.size()) * row_h + kFoot;
  }
};

// The log axis of the ratio bars: 1 in the middle, 1/extent .. extent across.
struct LogAxis {
  double x0, width, extent;
  double x(double ratio) const {
    const double r = std::clamp(ratio, 1 / extent, extent);
    return x0 + width / 2 * (1 + std::log(r) / std::log(extent));
  }
};

const double kNiceSteps[] = {1.25, 1.5, 2, 3};
// The widest axis: a naive reference 30-1000x slower would leave a level row's bar a pixel
// long; bars past it are cut at the end, with an arrowhead (the tooltip has the value).
constexpr double kMaxExtent = 3;

double nice_extent(double worst) {
  for (double e : kNiceSteps)
    if (worst <= e) return e;
  return kMaxExtent;
}

bool past_axis(double ratio) {
  return ratio > kMaxExtent || (ratio > 0 && ratio < 1 / kMaxExtent);
}

std::string tick_label(double v) {
  return v >= 1 ? format("%g", v) : format("%.2g", v);
}

std::string ratio_tip(const std::string& row, const std::string& series, double other_ms,
                      double ours_ms) {
  return row + ": " + series + " " + format_ms(other_ms) + " ms / moekit " + format_ms(ours_ms) +
         " ms = " + format("%.3f", other_ms / ours_ms);
}

BarRow record_row(const Record& r, const std::vector<std::string>& alts) {
  BarRow row;
  row.label = r.workload + " " + r.dtype;
  const std::string name = r.op + " " + row.label;
  if (!r.measured()) {
    row.not_measured = r.status.empty() ? "not measured" : r.status;
    return row;
  }
  row.acc_fail = r.accuracy == "fail";
  auto add = [&](const std::string& series, double other_ms) {
    const bool has = other_ms > 0;
    row.ratios.push_back(has ? other_ms / r.ours_ms : -1);
    row.tips.push_back(has ? ratio_tip(name, series, other_ms, r.ours_ms) : "");
  };
  add("page", r.page_ms);
  for (const std::string& a : alts) add(a, r.alternative_ms(a));
  row.sol = r.sol;
  if (r.sol >= 0)
    row.sol_tip = name + ": SOL " + format("%.1f%%", 100 * r.sol) + " (ideal " +
                  format_ms(r.ideal_ms) + " ms / moekit " + format_ms(r.ours_ms) + " ms)";
  return row;
}

std::string panel_stats(const std::vector<const Record*>& recs,
                        const std::vector<std::string>& alts) {
  std::vector<double> page;
  for (const Record* r : recs)
    if (r->measured() && r->page_ms > 0) page.push_back(r->page_ms / r->ours_ms);
  std::string s = std::to_string(recs.size()) + (recs.size() == 1 ? " row" : " rows");
  if (!page.empty()) {
    const auto ahead = std::count_if(page.begin(), page.end(), [](double q) { return q >= 1; });
    s += " · page/ours geomean " + format("%.3f", geomean(page)) + ", " + std::to_string(ahead) +
         " at or under the page";
  }
  for (const std::string& a : alts) {
    std::vector<double> q;
    for (const Record* r : recs)
      if (r->measured() && r->alternative_ms(a) > 0) q.push_back(r->alternative_ms(a) / r->ours_ms);
    if (!q.empty()) s += " · " + a + "/ours " + format("%.2f", geomean(q));
  }
  return s;
}

// A summary row over `recs`: each series' geometric mean and the median SOL.
BarRow geomean_row(const std::string& name, const std::vector<const Record*>& recs,
                   const std::vector<std::string>& series) {
  BarRow row;
  row.label = name + " (" + std::to_string(recs.size()) + ")";
  std::vector<double> sols;
  for (const Record* r : recs)
    if (r->measured()) {
      if (r->sol >= 0) sols.push_back(r->sol);
      row.acc_fail = row.acc_fail || r->accuracy == "fail";
    }
  for (const std::string& s : series) {
    std::vector<double> q;
    for (const Record* r : recs) {
      const double other = s == "page" ? r->page_ms : r->alternative_ms(s);
      if (r->measured() && other > 0) q.push_back(other / r->ours_ms);
    }
    row.ratios.push_back(geomean(q));
    row.tips.push_back(q.empty()
                           ? ""
                           : name + ": " + s + "/moekit geomean " + format("%.3f", geomean(q)) +
                                 " over " + std::to_string(q.size()) + " rows");
  }
  if (!sols.empty()) {
    std::sort(sols.begin(), sols.end());
    const size_t m = sols.size();
    row.sol = m % 2 ? sols[m / 2] : (sols[m / 2 - 1] + sols[m / 2]) / 2;
    row.sol_tip = name + ": median SOL " + format("%.1f%%", 100 * row.sol);
  } else if (std::none_of(recs.begin(), recs.end(),
                          [](const Record* r) { return r->measured(); })) {
    row.not_measured = "no row measured";
  }
  return row;
}

// The overview: one row per op and one over all rows.
BarPanel overview_panel(const std::vector<std::string>& ops, const std::vector<Record>& records,
                        const std::vector<std::string>& alts) {
  BarPanel p;
  p.op = "all";
  p.title = "All ops";
  p.stats = "bars: geometric means over the op's rows · SOL: the median row";
  std::vector<std::string> series = {"page"};
  series.insert(series.end(), alts.begin(), alts.end());
  std::vector<const Record*> all;
  for (const Record& r : records) all.push_back(&r);
  for (const std::string& op : ops) {
    std::vector<const Record*> recs;
    for (const Record* r : all)
      if (r->op == op) recs.push_back(r);
    p.rows.push_back(geomean_row(op, recs, series));
  }
  p.rows.push_back(geomean_row("all rows", all, series));
  return p;
}

void draw_ticks(Svg& svg, const LogAxis& axis, double top, double bottom) {
  std::vector<double> ticks = {1};
  double last_hi = 1, last_lo = 1;
  for (double t : kNiceSteps) {
    if (t > axis.extent) break;
    // Thinned: a tick at least 30 px from the last one drawn on its side.
    if (axis.x(t) - axis.x(last_hi) >= 30) {
      ticks.push_back(t);
      last_hi = t;
    }
    if (axis.x(1 / last_lo) - axis.x(1 / t) >= 30) {
      ticks.push_back(1 / t);
      last_lo = t;
    }
  }
  for (double t : ticks) {
    const double x = axis.x(t);
    if (t != 1) svg.line(x, top, x, bottom, "#dddddd");
    svg.text(x, top - 5, tick_label(t), {10, "middle", "#444"});
  }
}

void draw_row(Svg& svg, const BarRow& row, const BarLayout& lay, const LogAxis& axis, double x0,
              double y, size_t series) {
  const double base = y + lay.row_h / 2 + 4;
  const char* label_color = !row.not_measured.empty() ? "#888" : row.acc_fail ? "#c0392b" : "#222";
  const double label_right = x0 + BarLayout::kPad + lay.label_w - 6;
  svg.text(label_right, base,
           fit((row.acc_fail ? "✗ " : "") + row.label, BarLayout::kRowFont, lay.label_w - 6),
           {BarLayout::kRowFont, "end", label_color});
  if (!row.not_measured.empty()) {
    svg.text(axis.x0, base, fit(row.not_measured, 10, axis.width + BarLayout::kGap + 90),
             {10, "start", "#888"});
    return;
  }
  const double page = row.ratios.empty() ? -1 : row.ratios[0];
  svg.text(axis.x0 - 18, base, page > 0 ? format("%.2f", page) : "-",
           {BarLayout::kRowFont, "end",
            page <= 0   ? "#888"
            : page >= 1 ? "#1b7837"
                        : "#b2182b"});
  const double slot = (lay.row_h - 4) / static_cast<double>(series);
  for (size_t s = 0; s < row.ratios.size(); ++s) {
    if (row.ratios[s] <= 0) continue;
    const double a = axis.x(1), b = axis.x(row.ratios[s]), top = y + 2 + slot * double(s);
    const std::string color = s == 0 ? kPageColor : alternative_color(s - 1);
    svg.rect(std::min(a, b), top, std::max(1.0, std::abs(b - a)), slot, color, row.tips[s]);
    if (past_axis(row.ratios[s])) {
      const double dir = b > a ? 1 : -1, mid = top + slot / 2, half = std::max(3.0, slot / 2 + 1);
      svg.polygon({{b, mid - half}, {b + dir * 6, mid}, {b, mid + half}}, color, row.tips[s]);
    }
  }
  if (row.sol >= 0) {
    const double sx = axis.x0 + axis.width + BarLayout::kGap;
    svg.rect(sx, y + 3, BarLayout::kSolW, lay.row_h - 6, "#e6e6e6");
    svg.rect(sx, y + 3, BarLayout::kSolW * std::min(row.sol, 1.0), lay.row_h - 6, kRooflineColor,
             row.sol_tip);
    svg.text(sx + BarLayout::kSolW + 4, base, format("%.0f%%", 100 * row.sol), {11});
  }
}

void draw_panel(Svg& svg, const BarPanel& p, const BarLayout& lay, double x0, double y0,
                size_t series) {
  svg.open_group("class=\"panel\" data-op=\"" + xml_escape(p.op) + "\"");
  const double w = lay.width(), inner = w - 2 * BarLayout::kPad;
  svg.text(x0 + BarLayout::kPad, y0 + 15, fit(p.title, 13, inner), {13, "start", "#111", true});
  double line_y = y0 + 17;
  for (const std::string& line : lay.stats_lines(p.stats)) {
    line_y += BarLayout::kStatsLineH;
    svg.text(x0 + BarLayout::kPad, line_y, line, {10.5, "start", "#555"});
  }
  double worst = 1.1;
  for (const BarRow& r : p.rows)
    for (double q : r.ratios)
      if (q > 0) worst = std::max({worst, q, 1 / q});
  const LogAxis axis{x0 + BarLayout::kPad + lay.label_w + BarLayout::kNumW, BarLayout::kRatioW,
                     nice_extent(worst)};
  const double top = y0 + lay.head(p.stats),
               bottom = top + static_cast<double>(p.rows.size()) * lay.row_h;
  for (size_t i = 0; i < p.rows.size(); i += 2)  // zebra first, under the grid
    if (i + 1 < p.rows.size())
      svg.rect(x0 + BarLayout::kPad, top + static_cast<double>(i + 1) * lay.row_h, inner, lay.row_h,
               "#f3f3f3");
  draw_ticks(svg, axis, top, bottom);
  svg.text(axis.x0 - 18, top - 5, "page/ours", {10, "end", "#444"});
  const double sx = axis.x0 + axis.width + BarLayout::kGap;
  svg.text(sx, top - 5, "SOL", {10, "start", "#444"});
  for (size_t i = 0; i < p.rows.size(); ++i)
    draw_row(svg, p.rows[i], lay, axis, x0, top + static_cast<double>(i) * lay.row_h, series);
  svg.line(axis.x(1), top - 2, axis.x(1), bottom, "#333", 1.2);
  svg.text(axis.x(1) - 6, bottom + 13, "← moekit slower", {10, "end", "#555"});
  svg.text(axis.x(1) + 6, bottom + 13, "moekit faster →", {10, "start", "#555"});
  svg.text(sx, bottom + 13, "ideal / ours", {10, "start", "#555"});
  svg.close_group();
}

}  // namespace

std::string ops_figure(const Run& run) {
  std::vector<std::string> ops;
  for (const Record& r : run.records)
    if (std::find(ops.begin(), ops.end(), r.op) == ops.end()) ops.push_back(r.op);
  const std::vector<std::string>& alts = run.alternative_names;
  std::vector<BarPanel> panels;
  if (ops.size() > 1) panels.push_back(overview_panel(ops, run.records, alts));
  for (const std::string& op : ops) {
    BarPanel p;
    p.op = p.title = op;
    std::vector<const Record*> recs;
    for (const Record& r : run.records)
      if (r.op == op) {
        recs.push_back(&r);
        p.rows.push_back(record_row(r, alts));
      }
    p.stats = panel_stats(recs, alts);
    panels.push_back(std::move(p));
  }

  BarLayout lay;
  const size_t series = 1 + alts.size();
  lay.row_h = std::max(17.0, 5.0 + 4.0 * static_cast<double>(series));
  double widest = 0;
  for (const BarPanel& p : panels)
    for (const BarRow& r : p.rows)
      widest =
          std::max(widest, text_width((r.acc_fail ? "✗ " : "") + r.label, BarLayout::kRowFont));
  lay.label_w = std::clamp(widest + 12, 120.0, 280.0);

  std::vector<double> heights;
  size_t rows = 0;
  for (const BarPanel& p : panels) {
    heights.push_back(lay.height(p));
    rows += p.rows.size();
  }
  const bool two_columns = rows > 36;
  const size_t split = two_columns ? split_in_two(heights) : panels.size();
  const double margin = 8,
               width = std::max(kMinFigureWidth, (two_columns ? 2 : 1) * lay.width() + 2 * margin);

  std::vector<double> page;
  size_t ahead = 0, measured = 0;
  for (const Record& r : run.records) {
    measured += r.measured();
    if (r.measured() && r.page_ms > 0) {
      page.push_back(r.page_ms / r.ours_ms);
      ahead += page.back() >= 1;
    }
  }
  std::string summary = std::to_string(run.records.size()) + " rows (" + std::to_string(measured) +
                        " measured) · " + accuracy_summary(run.records);
  if (!page.empty())
    summary += " · geomean page/ours " + format("%.3f", geomean(page)) + " over " +
               std::to_string(page.size()) + " rows, " + std::to_string(ahead) +
               " at or under the page (> 1: moekit faster)";

  std::vector<LegendEntry> legend = {
      {LegendEntry::kBar, "page", "seed page: its time / moekit's", kPageColor}};
  for (size_t i = 0; i < alts.size(); ++i)
    legend.push_back(
        {LegendEntry::kBar, alts[i], alts[i] + ": its time / moekit's", alternative_color(i)});
  legend.push_back(
      {LegendEntry::kBar, "sol", "SOL: ideal time / moekit's (roofline share)", kRooflineColor});
  bool any_fail = false;
  for (const Record& r : run.records) any_fail = any_fail || (r.measured() && r.accuracy == "fail");
  if (any_fail) legend.push_back({LegendEntry::kMark, "accuracy-fail", "accuracy fail", "#c0392b"});
  bool any_cut = false;
  for (const Record& r : run.records) {
    if (!r.measured()) continue;
    any_cut = any_cut || past_axis(r.page_ms / r.ours_ms);
    for (const auto& alt : r.alternatives) any_cut = any_cut || past_axis(alt.second / r.ours_ms);
  }
  if (any_cut)
    legend.push_back({LegendEntry::kNote, "cut",
                      "▸ a bar past " + format("%g", kMaxExtent) + "x, cut (hover: its value)",
                      ""});
  if (alts.empty())
    legend.push_back({LegendEntry::kNote, "no-alternatives", "(no alternatives in this run)", ""});

  Svg svg;
  const double top = draw_header(svg, run, summary, legend, width) + 4;
  double y = top, column_bottom = top;
  for (size_t i = 0; i < panels.size(); ++i) {
    if (i == split) y = top;
    const double x = margin + (i >= split ? lay.width() : 0);
    draw_panel(svg, panels[i], lay, x, y, series);
    y += heights[i];
    column_bottom = std::max(column_bottom, y);
  }
  if (panels.empty()) svg.text(margin + 10, top + 20, "no rows in this run", {12});
  return svg.finish(width, column_bottom + 10);
}

}  // namespace moekit::bench::plot
