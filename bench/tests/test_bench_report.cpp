// CPU tests of the benchmark's outputs (JSON schema, markdown, table), the merge of
// externally measured alternatives, and the command line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "cli.h"
#include "report.h"

namespace moekit::bench {
namespace {

std::vector<RowResult> sample_rows() {
  RowResult a;
  a.op = "MoEGroupedGemmFwd";
  a.workload = a.base_workload = "ds-v3-decode-mlp-up";
  a.dtype = "bf16";
  a.ours_ms = 3.5;
  a.alternatives = {{"cublas", 4.2, "", false},
                    {"ref-cuda", 40.0, "", false},
                    {"cublas-grouped", -1, "rejected", false}};
  a.page_ms = 3.4318;
  a.cost = {2.4e11, 1.5e10};
  a.sol = classify(a.cost, false, Ceilings{}, a.ours_ms);
  a.active_experts = 256;
  a.num_experts = 256;
  a.routed_rows = 4096;
  a.checked = true;
  a.acc_pass = true;
  a.rel_l2 = 3e-3;
  a.err_ratio = 0;
  a.reference = "gpu-f32";
  a.plan = "sm90_pairs 128x256 dynamic";
  RowResult b;
  b.op = "FusedTopKFwd";
  b.workload = b.base_workload = "qwen3-235b-t32";
  b.dtype = "bf16";
  b.status = "not implemented in this build";
  return {a, b};
}

RunMeta meta() {
  RunMeta m;
  m.device = "NVIDIA H200";
  m.device_uuid = "GPU-0";
  m.commit = "abc1234";
  m.date = "2026-12-02";
  return m;
}

TEST(Report, LaunchFloorOncePerFileAndInTheHeader) {
  RunMeta m = meta();
  nlohmann::json j = nlohmann::json::parse(render_json(sample_rows(), m));
  EXPECT_TRUE(j["launch_floor_ms"].is_null());  // not measured
  EXPECT_NE(render_table(sample_rows(), m).find("launch floor: not measured"), std::string::npos);
  m.launch_floor_ms = 0.00185;
  m.launch_floor_grid_ms = 0.0021;
  m.launch_floor_grid_blocks = 132;
  j = nlohmann::json::parse(render_json(sample_rows(), m));
  EXPECT_DOUBLE_EQ(j["launch_floor_ms"].get<double>(), 0.00185);
  EXPECT_DOUBLE_EQ(j["launch_floor_grid_ms"].get<double>(), 0.0021);
  EXPECT_EQ(j["launch_floor_grid_blocks"], 132);
  EXPECT_FALSE(j["records"][0].contains("launch_floor_ms"));
  const std::string table = render_table(sample_rows(), m);
  EXPECT_NE(table.find("1 block 0.001850 ms, 132 x 1024 threads 0.002100 ms"), std::string::npos)
      << table.substr(0, 400);
  EXPECT_NE(render_markdown(sample_rows(), m).find("launch floor"), std::string::npos);
}

// The MOEKIT_* knobs set for a run are saved with it (they change what is measured).
TEST(Report, RecordsTheLibraryKnobsOfTheRun) {
  const char* env[] = {"PATH=/bin", "MOEKIT_B_KNOB=256", "XMOEKIT_NOT=1", "MOEKIT_A_KNOB=2",
                       nullptr};
  RunMeta m = meta();
  m.knobs = moekit_knobs(env);
  ASSERT_EQ(m.knobs, (std::vector<std::string>{"MOEKIT_A_KNOB=2", "MOEKIT_B_KNOB=256"}));
  nlohmann::json j = nlohmann::json::parse(render_json(sample_rows(), m));
  EXPECT_EQ(j["knobs"], nlohmann::json({"MOEKIT_A_KNOB=2", "MOEKIT_B_KNOB=256"}));
  const std::string line = "knobs: MOEKIT_A_KNOB=2 MOEKIT_B_KNOB=256";
  EXPECT_NE(render_table(sample_rows(), m).find(line), std::string::npos);
  EXPECT_NE(render_markdown(sample_rows(), m).find(line), std::string::npos);
  const char* none[] = {"HOME=/root", nullptr};
  m.knobs = moekit_knobs(none);
  EXPECT_TRUE(m.knobs.empty());
  EXPECT_TRUE(nlohmann::json::parse(render_json(sample_rows(), m))["knobs"].empty());
  EXPECT_NE(render_table(sample_rows(), m).find("knobs: none (library defaults)"),
            std::string::npos);
}

TEST(Report, RatioIsTheFastestAlternativeOverOurs) {
  std::vector<RowResult> rows = sample_rows();
  EXPECT_DOUBLE_EQ(rows[0].best_alt_ms(), 4.2);
  EXPECT_EQ(rows[0].best_alt_name(), "cublas");
  EXPECT_DOUBLE_EQ(rows[0].ratio(), 1.2);
  EXPECT_DOUBLE_EQ(rows[1].ratio(), -1);
}

TEST(Report, JsonHasTheSchemaFieldsOncePerRecordAndFile) {
  nlohmann::json j = nlohmann::json::parse(render_json(sample_rows(), meta()));
  EXPECT_EQ(j["device"], "NVIDIA H200");
  EXPECT_EQ(j["commit"], "abc1234");
  EXPECT_EQ(j["date"], "2026-12-02");
  ASSERT_TRUE(j["ceilings"].contains("read_tbps"));
  ASSERT_EQ(j["records"].size(), 2u);
  const auto& r = j["records"][0];
  for (const char* key : {"op", "workload", "dtype", "ours_ms", "alternatives", "page_ms", "sol",
                          "bound", "active_experts", "rel_l2", "err_ratio"})
    EXPECT_TRUE(r.contains(key)) << key;
  EXPECT_EQ(r["op"], "MoEGroupedGemmFwd");
  EXPECT_DOUBLE_EQ(r["ours_ms"].get<double>(), 3.5);
  EXPECT_DOUBLE_EQ(r["alternatives"]["cublas"].get<double>(), 4.2);
  EXPECT_TRUE(r["alternatives"]["cublas-grouped"].is_null());
  EXPECT_EQ(r["alternative_notes"]["cublas-grouped"], "rejected");
  EXPECT_EQ(r["active_experts"], 256);
  EXPECT_EQ(r["accuracy"], "pass");
  EXPECT_EQ(r["bound"], "mem");
  EXPECT_FALSE(j["records"][0].contains("device"));  // once per file
  const auto& s = j["records"][1];
  EXPECT_TRUE(s["ours_ms"].is_null());
  EXPECT_EQ(s["status"], "not implemented in this build");
  EXPECT_EQ(s["accuracy"], "unchecked");
}

TEST(Report, TableAndMarkdownShowEveryRow) {
  std::string t = render_table(sample_rows(), meta());
  EXPECT_NE(t.find("MoEGroupedGemmFwd"), std::string::npos);
  EXPECT_NE(t.find("ds-v3-decode-mlp-up"), std::string::npos);
  EXPECT_NE(t.find("1.20x"), std::string::npos);
  EXPECT_NE(t.find("256/256"), std::string::npos);
  EXPECT_NE(t.find("not implemented"), std::string::npos);
  std::string md = render_markdown(sample_rows(), meta());
  EXPECT_NE(md.find("### FusedTopKFwd"), std::string::npos);
  EXPECT_NE(md.find("| ds-v3-decode-mlp-up | bf16 | 1.20x | 3.500 |"), std::string::npos) << md;
}

// Every row names its plan; ops without a planner (and rows not run) show "-".
TEST(Report, EveryRowShowsItsPlan) {
  std::vector<RowResult> rows = sample_rows();
  RowResult layer = rows[0];
  layer.op = "FusedMoEFwd";
  layer.workload = "ds-v3-t512";
  layer.plan =
      "sorted chain{gate_up: sm90 128x128 dynamic, down: sm90 128x128 dynamic} + shared "
      "two_gemms{gate_up: decode 32x128, down: decode_splitk 32x128 split4}";
  rows.push_back(layer);
  nlohmann::json j = nlohmann::json::parse(render_json(rows, meta()));
  EXPECT_EQ(j["records"][0]["plan"], "sm90_pairs 128x256 dynamic");
  EXPECT_EQ(j["records"][1]["plan"], "-");
  EXPECT_EQ(j["records"][2]["plan"], layer.plan);  // the full line
  EXPECT_FALSE(j["records"][0].contains("candidates"));
  EXPECT_FALSE(j["records"][0].contains("forced_candidate"));
  const std::string md = render_markdown(rows, meta());
  EXPECT_NE(md.find("| Plan | Notes |"), std::string::npos) << md;
  EXPECT_NE(md.find("| pass 3.0e-03/0.0e+00 | sm90_pairs 128x256 dynamic | "), std::string::npos)
      << md;
  EXPECT_NE(md.find("| " + layer.plan + " | "), std::string::npos) << md;
  EXPECT_NE(md.find("| - | not implemented in this build |"), std::string::npos) << md;
  // The plain table shows the compact form, in a column as wide as the op's widest plan.
  const std::string t = render_table(rows, meta());
  EXPECT_NE(t.find("sm90_pairs 128x256 dyn  cublas 4.200"), std::string::npos) << t;
  EXPECT_NE(t.find("sorted chain{sm90 128x128 dyn} + shared two_gemms{decode 32x128 / "
                   "decode_splitk 32x128 split4}  cublas"),
            std::string::npos)
      << t;
  EXPECT_EQ(t.find("gate_up:"), std::string::npos);
}

TEST(Report, CompactPlanKeepsTheKernelsAndShortensTheRest) {
  EXPECT_EQ(compact_plan("-"), "-");
  EXPECT_EQ(compact_plan("decode 32x128"), "decode 32x128");
  EXPECT_EQ(compact_plan("sm90 128x256 dynamic"), "sm90 128x256 dyn");
  EXPECT_EQ(compact_plan("chain{gate_up: sm90 128x256 dynamic, down: sm90 128x128}"),
            "chain{sm90 128x256 dyn / sm90 128x128}");
  EXPECT_EQ(compact_plan("sorted two_gemms{gate_up: decode 32x128, down: decode 32x128} + shared "
                         "two_gemms{gate_up: sm90 128x64, down: sm90 128x64}"),
            "sorted two_gemms{decode 32x128} + shared two_gemms{sm90 128x64}");
  EXPECT_EQ(compact_plan("direct + shared direct{split 4/2}"), "direct + shared direct{split 4/2}");
}

// --candidates: one line per candidate (plan, ms, ratio to the default plan, accuracy).
TEST(Report, CandidatesInEveryRendering) {
  std::vector<RowResult> rows = sample_rows();
  CandidateTime c0{0, "sm90_pairs 128x256 dynamic", 3.5, true, true, 3e-3, 0, ""};
  CandidateTime c1{1, "sm90 128x128", 4.2, true, false, 0.5, 0.9, ""};
  CandidateTime c2{2, "decode 32x128", -1, false, false, -1, -1, "failed: no"};
  rows[0].candidates = {c0, c1, c2};
  nlohmann::json j = nlohmann::json::parse(render_json(rows, meta()));
  const auto& cands = j["records"][0]["candidates"];
  ASSERT_EQ(cands.size(), 3u);
  EXPECT_EQ(cands[1]["index"], 1);
  EXPECT_EQ(cands[1]["plan"], "sm90 128x128");
  EXPECT_DOUBLE_EQ(cands[1]["ms"].get<double>(), 4.2);
  EXPECT_DOUBLE_EQ(cands[1]["over_default"].get<double>(), 1.2);
  EXPECT_EQ(cands[1]["accuracy"], "fail");
  EXPECT_TRUE(cands[2]["ms"].is_null());
  EXPECT_EQ(cands[2]["accuracy"], "unchecked");
  EXPECT_EQ(cands[2]["note"], "failed: no");
  const std::string t = render_table(rows, meta());
  EXPECT_NE(t.find("    candidate 0: sm90_pairs 128x256 dynamic  3.500 ms  1.000x  acc pass  "
                   "(the planner's)"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("    candidate 1: sm90 128x128  4.200 ms  1.200x  ACC FAIL 5.0e-01\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("    candidate 2: decode 32x128  not timed  failed: no"), std::string::npos);
  const std::string md = render_markdown(rows, meta());
  EXPECT_NE(md.find("- ds-v3-decode-mlp-up bf16: candidate 1: sm90 128x128  4.200 ms  1.200x"),
            std::string::npos)
      << md;
  rows[0].candidates.clear();
  rows[0].forced_candidate = 1;
  j = nlohmann::json::parse(render_json(rows, meta()));
  EXPECT_EQ(j["records"][0]["forced_candidate"], 1);
}

TEST(Report, FormatsTimesToFourDigits) {
  EXPECT_EQ(format_ms(3.43184), "3.432");
  EXPECT_EQ(format_ms(0.00326), "0.003260");
  EXPECT_EQ(format_ms(12.8296), "12.83");
  EXPECT_EQ(format_ms(-1), "-");
}

TEST(Report, MergesExternalAlternatives) {
  std::vector<RowResult> rows = sample_rows();
  std::vector<std::string> unmatched;
  int n = merge_extra_alternatives(rows, R"({"records": [
      {"op": "MoEGroupedGemmFwd", "workload": "ds-v3-decode-mlp-up", "dtype": "bf16",
       "alternatives": {"torch-grouped-mm": 3.9, "cublas": 4.0}},
      {"op": "MoEGroupedGemmFwd", "workload": "nope", "dtype": "bf16", "name": "x", "ms": 1}]})",
                                   &unmatched);
  EXPECT_EQ(n, 2);
  ASSERT_EQ(unmatched.size(), 1u);
  EXPECT_DOUBLE_EQ(rows[0].best_alt_ms(), 3.9);
  EXPECT_EQ(rows[0].best_alt_name(), "torch-grouped-mm");
  bool renamed = false;
  for (const AltTime& a : rows[0].alternatives) renamed |= a.name == "cublas-ext" && a.external;
  EXPECT_TRUE(renamed);
  // A plain array of name/ms records works too.
  n = merge_extra_alternatives(rows, R"([{"op": "MoEGroupedGemmFwd",
      "workload": "ds-v3-decode-mlp-up", "dtype": "bf16", "name": "triton", "ms": 2.0}])");
  EXPECT_EQ(n, 1);
  EXPECT_DOUBLE_EQ(rows[0].ratio(), 2.0 / 3.5);
  EXPECT_THROW(merge_extra_alternatives(rows, "{\"x\": 1}"), std::runtime_error);
  EXPECT_THROW(merge_extra_alternatives(rows, "[{\"op\": \"a\"}]"), std::runtime_error);
}

TEST(Cli, ParsesFiltersAndValues) {
  Options o =
      parse_options({"--op", "Grouped", "--dtype=bf16", "--tokens", "1-3,8", "--quick", "--json",
                     "out.json", "--skew", "0.5", "--random-counts", "--rounds", "5"});
  EXPECT_EQ(o.filters.op, "Grouped");
  EXPECT_EQ(o.filters.dtype, "bf16");
  EXPECT_EQ(o.tokens, (std::vector<int64_t>{1, 2, 3, 8}));
  EXPECT_TRUE(o.quick);
  EXPECT_TRUE(o.random_counts);
  EXPECT_EQ(o.json_path, "out.json");
  EXPECT_DOUBLE_EQ(o.skew_alpha, 0.5);
  EXPECT_EQ(o.rounds, 5);
  Options k = parse_options({"--skip-alternatives", "ref-cuda,cublaslt", "--alternatives=cublas"});
  EXPECT_EQ(k.alt_skip, "ref-cuda,cublaslt");
  EXPECT_EQ(k.alt_filter, "cublas");
  EXPECT_THROW(parse_options({"--bogus"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--json"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--tokens", "5-1"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--rounds", "x"}), std::invalid_argument);
  EXPECT_FALSE(usage().empty());
}

TEST(Cli, ParsesThePlanCandidateFlags) {
  Options d = parse_options({});
  EXPECT_FALSE(d.candidates);
  EXPECT_EQ(d.candidate, -1);
  EXPECT_TRUE(parse_options({"--candidates"}).candidates);
  EXPECT_EQ(parse_options({"--candidate", "3"}).candidate, 3);
  EXPECT_EQ(parse_options({"--candidate=0"}).candidate, 0);
  EXPECT_FALSE(parse_options({"--candidate=0"}).candidates);
  EXPECT_THROW(parse_options({"--candidate"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--candidate", "-1"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--candidate", "1.5"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--candidate", "x"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--candidates", "--candidate", "1"}), std::invalid_argument);
  EXPECT_NE(usage().find("--candidates"), std::string::npos);
  EXPECT_NE(usage().find("--candidate I"), std::string::npos);
}

}  // namespace
}  // namespace moekit::bench
