#include "plot_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "report.h"

namespace moekit::bench::plot {

using json = nlohmann::json;

const char* const kPageColor = "#4477aa";
const char* const kOursColor = "#222222";
const char* const kRooflineColor = "#8c8c8c";

std::string alternative_color(size_t i) {
  // Paul Tol's "bright" scheme without its blue (the page's): told apart with colour
  // blindness too.
  static const char* const colors[] = {"#ee6677", "#228833", "#ccbb44",
                                       "#66ccee", "#aa3377", "#bb5500"};
  return colors[i % (sizeof colors / sizeof colors[0])];
}

double Record::alternative_ms(const std::string& name) const {
  for (const auto& [n, ms] : alternatives)
    if (n == name) return ms;
  return -1;
}

namespace {

double number(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return -1;
  double v = j[key].get<double>();
  return std::isfinite(v) ? v : -1;
}

std::string text(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

}  // namespace

Run parse_run(const std::string& json_text) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("records") || !doc["records"].is_array())
    throw std::runtime_error("not a moekit-bench JSON (no \"records\" array)");
  Run run;
  run.device = text(doc, "device");
  run.commit = text(doc, "commit");
  run.date = text(doc, "date");
  run.options = text(doc, "options");
  if (doc.contains("knobs") && doc["knobs"].is_array())
    for (const json& k : doc["knobs"])
      if (k.is_string()) run.knobs.push_back(k.get<std::string>());
  if (doc.contains("ceilings")) {
    run.read_tbps = number(doc["ceilings"], "read_tbps");
    run.bf16_tflops = number(doc["ceilings"], "bf16_tflops");
    run.fp8_tflops = number(doc["ceilings"], "fp8_tflops");
  }
  run.launch_floor_ms = number(doc, "launch_floor_ms");
  for (const json& r : doc["records"]) {
    if (!r.is_object()) continue;
    Record rec;
    rec.op = text(r, "op");
    rec.workload = text(r, "workload");
    rec.base_workload = text(r, "base_workload");
    if (rec.base_workload.empty()) rec.base_workload = rec.workload;
    rec.dtype = text(r, "dtype");
    rec.status = text(r, "status");
    rec.accuracy = text(r, "accuracy");
    if (r.contains("tokens") && r["tokens"].is_number_integer())
      rec.tokens = r["tokens"].get<int64_t>();
    run.tokens_run = run.tokens_run || rec.tokens >= 0;
    rec.ours_ms = number(r, "ours_ms");
    rec.page_ms = number(r, "page_ms");
    rec.ideal_ms = number(r, "ideal_ms");
    rec.sol = number(r, "sol");
    if (r.contains("alternatives") && r["alternatives"].is_object()) {
      const json& alts = r["alternatives"];
      for (auto it = alts.begin(); it != alts.end(); ++it) {
        rec.alternatives.emplace_back(it.key(), number(alts, it.key().c_str()));
        if (std::find(run.alternative_names.begin(), run.alternative_names.end(), it.key()) ==
            run.alternative_names.end())
          run.alternative_names.push_back(it.key());
      }
    }
    run.records.push_back(std::move(rec));
  }
  return run;
}

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

double geomean(const std::vector<double>& xs) {
  if (xs.empty()) return -1;
  double s = 0;
  for (double x : xs) s += std::log(x);
  return std::exp(s / static_cast<double>(xs.size()));
}

std::string fit(const std::string& text, double size, double width) {
  if (text_width(text, size) <= width) return text;
  std::string cut = text;
  while (!cut.empty() && text_width(cut + "…", size) > width) {
    cut.pop_back();
    while (!cut.empty() && (static_cast<unsigned char>(cut.back()) & 0xC0) == 0x80) cut.pop_back();
    if (!cut.empty() && (static_cast<unsigned char>(cut.back()) & 0xC0) == 0xC0) cut.pop_back();
  }
  return cut + "…";
}

std::string accuracy_summary(const std::vector<Record>& records) {
  std::map<std::string, int> counts;
  for (const Record& r : records)
    if (r.measured()) ++counts[r.accuracy.empty() ? "unknown" : r.accuracy];
  std::string s = "accuracy:";
  for (const char* k : {"pass", "fail", "unchecked", "unknown"})
    if (counts.count(k)) s += (s.back() == ':' ? " " : ", ") + std::to_string(counts[k]) + " " + k;
  return s.back() == ':' ? s + " -" : s;
}

size_t split_in_two(const std::vector<double>& heights) {
  double total = 0;
  for (double h : heights) total += h;
  size_t best = heights.size();
  double best_tallest = total, first = 0;
  for (size_t k = 0; k <= heights.size(); ++k) {
    double tallest = std::max(first, total - first);
    if (tallest < best_tallest) {
      best_tallest = tallest;
      best = k;
    }
    if (k < heights.size()) first += heights[k];
  }
  return best;
}

namespace {

std::string facts_line(const Run& run) {
  std::string s;
  auto add = [&s](const std::string& part) { s += (s.empty() ? "" : " · ") + part; };
  if (run.read_tbps > 0)
    add("ceilings: read " + format("%.2f", run.read_tbps) + " TB/s, bf16 " +
        format("%.0f", run.bf16_tflops) + ", fp8 " + format("%.0f", run.fp8_tflops) + " TFLOP/s");
  if (run.launch_floor_ms > 0)
    add("launch floor " + format("%.2f", run.launch_floor_ms * 1e3) + " us");
  std::string knobs = "knobs:";
  for (const std::string& k : run.knobs) knobs += " " + k;
  add(run.knobs.empty() ? "knobs: none" : knobs);
  return s;
}

void draw_legend_mark(Svg& svg, const LegendEntry& e, double x, double y) {
  switch (e.kind) {
    case LegendEntry::kBar:
      svg.rect(x, y - 9, 18, 10, e.color);
      break;
    case LegendEntry::kLine:
      svg.line(x, y - 4, x + 18, y - 4, e.color, 2);
      svg.circle(x + 9, y - 4, 3, e.color);
      break;
    case LegendEntry::kDashed:
      svg.line(x, y - 4, x + 18, y - 4, e.color, 2, "5,3");
      break;
    case LegendEntry::kDotted:
      svg.line(x, y - 4, x + 18, y - 4, e.color, 2, "1.5,3");
      break;
    case LegendEntry::kDiamond:
      svg.diamond(x + 9, y - 4, 5, e.color);
      break;
    case LegendEntry::kMark:
      svg.text(x + 9, y, "✗", {12, "middle", e.color.c_str(), true});
      break;
    case LegendEntry::kNote:
      break;
  }
}

}  // namespace

std::vector<std::string> wrap(const std::string& text, double size, double width) {
  std::vector<std::string> lines;
  std::string line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t space = text.find(' ', pos);
    if (space == std::string::npos) space = text.size();
    const std::string word = text.substr(pos, space - pos);
    pos = space + 1;
    if (!line.empty() && text_width(line + " " + word, size) > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) lines.push_back(fit(line, size, width));
  return lines;
}

double draw_header(Svg& svg, const Run& run, const std::string& summary,
                   const std::vector<LegendEntry>& legend, double width) {
  std::vector<HeadingLine> lines = {{summary, {12}}, {facts_line(run), {11, "start", "#555"}}};
  if (!run.options.empty()) lines.push_back({"command: " + run.options, {11, "start", "#555"}});
  return draw_heading(svg,
                      "moekit-bench · " + (run.device.empty() ? "unknown GPU" : run.device) +
                          " · commit " + (run.commit.empty() ? "unknown" : run.commit) + " · " +
                          (run.date.empty() ? "undated" : run.date),
                      lines, legend, width);
}

double draw_heading(Svg& svg, const std::string& title, const std::vector<HeadingLine>& lines,
                    const std::vector<LegendEntry>& legend, double width) {
  const double left = 14, usable = width - 2 * left;
  svg.title(title);
  svg.text(left, 24, fit(title, 15, usable), {15, "start", "#111", true});
  double y = 26;
  for (const HeadingLine& line : lines)
    for (const std::string& l : wrap(line.text, line.style.size, usable)) {
      y += line.style.size + 4;
      svg.text(left, y, l, line.style);
    }
  y += 22;
  svg.open_group("class=\"legend\"");
  double x = left;
  for (const LegendEntry& e : legend) {
    const double mark = e.kind == LegendEntry::kNote ? 0 : 24;
    const double w = mark + text_width(e.label, 11.5) + 18;
    if (x > left && x + w > width - left) {
      x = left;
      y += 18;
    }
    svg.open_group("class=\"legend-entry\" data-series=\"" + xml_escape(e.series) + "\"");
    draw_legend_mark(svg, e, x, y);
    svg.text(x + mark, y, e.label, {11.5, "start", e.kind == LegendEntry::kNote ? "#555" : "#222"});
    svg.close_group();
    x += w;
  }
  svg.close_group();
  return y + 14;
}

}  // namespace moekit::bench::plot
