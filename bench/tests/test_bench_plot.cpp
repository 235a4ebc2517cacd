// CPU tests of the benchmark's pictures (plot.h) on what the bench writes: the JSON of
// render_json, not a file. check_plot.py checks the SVG of saved runs as XML.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "plot.h"
#include "plot_test_support.h"
#include "report.h"
#include "svg.h"

namespace moekit::bench {
namespace {

RowResult row(const std::string& op, const std::string& workload, double ours_ms) {
  RowResult r;
  r.op = op;
  r.workload = r.base_workload = workload;
  r.dtype = "bf16";
  r.ours_ms = ours_ms;
  r.page_ms = ours_ms * 1.25;
  r.cost = {1e9, 1e8};
  r.sol = classify(r.cost, false, Ceilings{}, ours_ms);
  r.checked = r.acc_pass = true;
  return r;
}

RunMeta meta() {
  RunMeta m;
  m.device = "NVIDIA H200";
  m.commit = "abc1234";
  m.date = "2026-12-02 10:00 UTC";
  return m;
}

TEST(Plot, SvgGoesNextToTheJson) {
  EXPECT_EQ(svg_path_for("out/full.json"), "out/full.svg");
  EXPECT_EQ(svg_path_for("run.results"), "run.results.svg");
  EXPECT_EQ(svg_path_for(".json"), ".json.svg");
}

TEST(Plot, WriterEscapesTextAndRefusesNonFiniteCoordinates) {
  EXPECT_EQ(xml_escape("a<b & \"c\">'"), "a&lt;b &amp; &quot;c&quot;&gt;&apos;");
  EXPECT_EQ(svg_num(-0.04), "0.0");
  EXPECT_EQ(svg_num(12.345), "12.3");
  EXPECT_THROW(svg_num(std::nan("")), std::logic_error);
  EXPECT_THROW(svg_num(std::numeric_limits<double>::infinity()), std::logic_error);
}

TEST(Plot, TableRunHasAPanelPerOpAndTheRunInItsTitle) {
  std::vector<RowResult> rows = {row("MoEGroupedGemmFwd", "a", 1.0),
                                 row("MoEGroupedGemmFwd", "b", 2),
                                 row("FusedTopKFwd", "t<32>", 0.003)};
  rows[0].alternatives = {{"cublas", 1.5, "", false}, {"ref-cuda", -1, "too slow", false}};
  rows[1].acc_pass = false;
  const std::string svg = render_svg(render_json(rows, meta()));
  EXPECT_EQ(count(svg, "class=\"panel\""), 3u);  // the overview and one per op
  EXPECT_EQ(count(svg, "data-op=\"MoEGroupedGemmFwd\""), 1u);
  EXPECT_EQ(count(svg, "data-op=\"FusedTopKFwd\""), 1u);
  EXPECT_NE(svg.find("<title>moekit-bench · NVIDIA H200 · commit abc1234 · 2026-12-02 10:00 UTC"),
            std::string::npos);
  for (const char* series : {"page", "cublas", "ref-cuda", "sol", "accuracy-fail"})
    EXPECT_NE(svg.find("data-series=\"" + std::string(series) + "\""), std::string::npos) << series;
  EXPECT_NE(svg.find("t&lt;32&gt; bf16"), std::string::npos);  // escaped
  EXPECT_NE(svg.find(">✗ b bf16<"), std::string::npos);        // the accuracy failure
  EXPECT_NE(svg.find("cublas 1.500 ms / moekit 1.000 ms = 1.500"), std::string::npos);
  EXPECT_NE(svg.find(">1.25<"), std::string::npos);  // page / ours
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

// A row that was not measured (null times) and one timed as inf (written as null) draw
// as "not measured", without a coordinate from them.
TEST(Plot, RowsWithoutTimesAreShownNotDrawn) {
  std::vector<RowResult> rows = {
      row("FusedMoEFwd", "ok", 1.0), row("FusedMoEFwd", "lost", -1),
      row("FusedMoEFwd", "inf", std::numeric_limits<double>::infinity())};
  rows[1].status = "error: CUDA context lost";
  const std::string svg = render_svg(render_json(rows, meta()));
  EXPECT_NE(svg.find("error: CUDA context lost"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"panel\""), 1u);  // one op: no overview
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf\""), std::string::npos);
}

TEST(Plot, TokensRunDrawsTimeAgainstTokensPerWorkload) {
  std::vector<RowResult> rows;
  for (int64_t t : {1, 2, 4, 8}) {
    RowResult r = row("FusedMoEFwd", "w@T=" + std::to_string(t), 0.01 * double(t));
    r.base_workload = "w";
    r.tokens = t;
    r.alternatives = {{"cublas-mlp", 0.02 * double(t), "", false}};
    rows.push_back(r);
  }
  const std::string svg = render_svg(render_json(rows, meta()));
  EXPECT_EQ(count(svg, "class=\"panel\""), 1u);
  EXPECT_NE(svg.find("data-workload=\"w\" data-dtype=\"bf16\""), std::string::npos);
  EXPECT_EQ(count(svg, ": moekit "), 4u);  // one point per token count, with its tooltip
  for (const char* series : {"moekit", "cublas-mlp", "roofline", "page"})
    EXPECT_NE(svg.find("data-series=\"" + std::string(series) + "\""), std::string::npos) << series;
  EXPECT_NE(svg.find(">tokens<"), std::string::npos);
}

TEST(Plot, RefusesWhatIsNotARun) {
  EXPECT_THROW(render_svg("{\"ops\": []}"), std::runtime_error);
  EXPECT_THROW(render_svg("not json"), std::runtime_error);
  EXPECT_NE(render_svg("{\"records\": []}").find("no rows in this run"), std::string::npos);
}

}  // namespace
}  // namespace moekit::bench
