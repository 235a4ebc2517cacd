// CPU tests of the tuned layer's picture (plot.h, render_tune_svg) on synthetic inputs as
// the tools write them: moekit-tune's partial lines (format_measurement), a table in the
// format of docs/tuning.md, a moekit-bench --tokens JSON (render_json). Times are drawn
// fresh for each run, so the expected tooltips follow them.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "plot.h"
#include "plot_test_support.h"
#include "report.h"
#include "tune_partial.h"

namespace moekit::bench {
namespace {

const std::string kHeader =
    "# moekit-tune partial: fused_moe bf16 E=128 H=2048 F=768 K=8 softmax S=0 experts=all seed=1";
const std::string kTableHeader =
    "device | op | dtype | E | H | F | top_k | routing | S | experts | tokens | plan | time_us | "
    "default_us";
const std::string kDefault = "direct";
const std::string kA = "sorted two_gemms{gate_up: decode_persistent 32x128, down: decode 32x128}";
const std::string kFastButWrong = "sorted two_gemms{gate_up: decode 32x128, down: decode 32x128}";
const std::vector<int64_t> kCounts = {1, 2, 4, 16, 64, 256};

std::string table_line(const std::string& tokens, const std::string& plan,
                       const std::string& E = "128") {
  return "NVIDIA H200 | fused_moe | bf16 | " + E + " | 2048 | 768 | 8 | softmax | 0 | all | " +
         tokens + " | " + plan + " | 10.000 | 11.000";
}

struct Synthetic {
  std::vector<tune::Measurement> ms;
  std::string partial;

  // Per count and routing: the default, kA (faster from 16 on) and an inaccurate faster one.
  explicit Synthetic(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.9, 1.1);
    for (int64_t T : kCounts)
      for (const char* routing : {"uniform", "skewed"}) {
        const double d = (20 + 0.5 * double(T)) * u(rng);
        ms.push_back({T, routing, kDefault, d, true, true});
        ms.push_back({T, routing, kA, d * (T >= 16 ? 0.9 : 1.05), true, false});
        ms.push_back({T, routing, kFastButWrong, d * 0.5, false, false});
      }
    // As moekit-tune writes it: each step's screening summary, a comment, before its lines.
    partial = kHeader + "\n";
    for (size_t i = 0; i < ms.size(); ++i) {
      if (i % 3 == 0)
        partial += "# screened T=" + std::to_string(ms[i].tokens) + " " + ms[i].routing +
                   ": 46 candidates, 40 accurate and timed, 5 finalists\n";
      partial += tune::format_measurement(ms[i]) + "\n";
    }
  }
  double us(int64_t T, const std::string& routing, const std::string& plan) const {
    for (const tune::Measurement& m : ms)
      if (m.tokens == T && m.routing == routing && m.plan == plan) return m.us;
    return -1;
  }
};

std::string bench_json(const std::vector<std::string>& workloads) {
  std::vector<RowResult> rows;
  for (const std::string& w : workloads)
    for (int64_t T : kCounts) {
      RowResult r;
      r.op = "FusedMoEFwd";
      r.base_workload = w;
      r.workload = w + "@T=" + std::to_string(T);
      r.tokens = T;
      r.dtype = "bf16";
      r.ours_ms = 0.03;
      r.cost = {1e9, 1e8};
      r.sol = classify(r.cost, false, Ceilings{}, r.ours_ms);
      r.checked = r.acc_pass = true;
      r.alternatives = {{"cublas-mlp", 0.002 * double(T) + 0.04, "", false},
                        {"torch", T < 16 ? 0.03 : 1.0, "", false}};
      rows.push_back(r);
    }
  RunMeta m;
  m.device = "NVIDIA H200";
  return render_json(rows, m);
}

TunePlotInputs inputs(const Synthetic& s) {
  TunePlotInputs in;
  in.partial_text = s.partial;
  in.partial_name = "out/qwen3-30b.table.partial";
  in.table_text = "# a table\n" + kTableHeader + "\n" + table_line("16,64,256", kA) + "\n" +
                  table_line("1-256", kDefault, "16") + "\n";  // another layer's entry
  in.table_name = "t.table";
  in.bench_text = bench_json({"qwen3-30b", "qwen3-30b-ep8"});
  in.bench_name = "b.json";
  in.workload = "qwen3-30b";
  return in;
}

std::string error_of(const TunePlotInputs& in) {
  try {
    render_tune_svg(in);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PlotTune, DrawsTunedDefaultAlternativeAndRooflinePerRouting) {
  const Synthetic s(std::random_device{}());
  const std::string svg = render_tune_svg(inputs(s));
  for (const char* series :
       {"tuned-uniform", "tuned-skewed", "default-uniform", "default-skewed", "best-alternative",
        "roofline", "speedup-uniform", "speedup-skewed", "guardrail"})
    EXPECT_EQ(count(svg, "class=\"series\" data-series=\"" + std::string(series) + "\""), 1u)
        << series;
  for (const char* legend : {"tuned", "default", "best-alternative", "roofline", "routing"})
    EXPECT_NE(svg.find("legend-entry\" data-series=\"" + std::string(legend) + "\""),
              std::string::npos)
        << legend;
  EXPECT_NE(svg.find("<title>moekit-tune · qwen3-30b · NVIDIA H200</title>"), std::string::npos);
  EXPECT_NE(svg.find("6 token counts (1-256)"), std::string::npos);
  EXPECT_NE(svg.find("1 entries of this layer, serving 3 of 6 counts"), std::string::npos);
  // A default point per count and routing; a tuned marker where the entry serves the count,
  // with the entry's plan and its measured time.
  for (const char* routing : {" uniform: default ", " skewed: default "}) {
    EXPECT_EQ(count(svg, routing + std::string("/ tuned = ")), kCounts.size());  // the ratio
    EXPECT_EQ(count(svg, routing), 2 * kCounts.size());
  }
  EXPECT_EQ(count(svg, ": tuned "), 6u);
  for (const char* routing : {"uniform", "skewed"}) {
    char want[160];
    std::snprintf(want, sizeof want, "T=64 %s: tuned %.1f us, %s", routing, s.us(64, routing, kA),
                  kA.c_str());
    EXPECT_NE(svg.find(want), std::string::npos) << want;
    std::snprintf(want, sizeof want, "T=64 %s: default / tuned = %.3f", routing,
                  s.us(64, routing, kDefault) / s.us(64, routing, kA));
    EXPECT_NE(svg.find(want), std::string::npos) << want;
  }
  // The bench's best alternative per count (torch below 16 tokens, cuBLAS above).
  EXPECT_NE(svg.find("T=4: best alternative torch 30.0 us"), std::string::npos);
  EXPECT_NE(svg.find("T=64: best alternative cublas-mlp 168.0 us"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

// An FP8 layer's dtype is two words in the partial file and the table ("bf16 fp8_per_tensor":
// activations, then the weights' scheme); its bench records carry the activations' dtype.
TEST(PlotTune, Fp8LayerMatchesItsTableAndBenchRecords) {
  Synthetic s(std::random_device{}());
  const std::string fp8_header =
      "# moekit-tune partial: fused_moe bf16 fp8_per_tensor E=128 H=2048 F=768 K=8 softmax S=0 "
      "experts=all seed=1";
  s.partial.replace(0, kHeader.size(), fp8_header);
  TunePlotInputs in = inputs(s);
  std::string fp8_line = table_line("16,64,256", kA);
  fp8_line.replace(fp8_line.find("| bf16 |"), 8, "| bf16 fp8_per_tensor |");
  in.table_text = kTableHeader + "\n" + fp8_line + "\n" + table_line("1-4", kDefault) + "\n";
  const std::string svg = render_tune_svg(in);
  // The bf16 layer's entry (same E, H, F) is another layer's: not counted.
  EXPECT_NE(svg.find("1 entries of this layer, serving 3 of 6 counts"), std::string::npos);
  EXPECT_EQ(count(svg, ": tuned "), 6u);
  EXPECT_NE(svg.find("T=64: best alternative cublas-mlp 168.0 us"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"series\" data-series=\"roofline\""), 1u);
  // A dtype word where E= belongs, or none at all, is refused.
  in.partial_text =
      "# moekit-tune partial: fused_moe E=128 H=2048 F=768 K=8 softmax S=0 "
      "experts=all seed=1\n";
  EXPECT_NE(error_of(in).find("expected 'OP DTYPE E=.."), std::string::npos) << error_of(in);
}

TEST(PlotTune, WithoutTableDrawsTheFastestAccurateCandidate) {
  const Synthetic s(std::random_device{}());
  TunePlotInputs in = inputs(s);
  in.table_name.clear();
  in.bench_name.clear();
  const std::string svg = render_tune_svg(in);
  EXPECT_NE(svg.find("no table given"), std::string::npos);
  EXPECT_NE(svg.find("no bench run given"), std::string::npos);
  EXPECT_EQ(svg.find("data-series=\"roofline\""), std::string::npos);
  EXPECT_EQ(svg.find(kFastButWrong), std::string::npos);  // inaccurate: never the pick
  EXPECT_NE(svg.find("T=256 skewed: fastest candidate"), std::string::npos);
  EXPECT_EQ(tune_layer_name("a/b/ds-v3-ep8.table.partial"), "ds-v3-ep8");
  EXPECT_EQ(tune_layer_name("x.partial"), "x");
}

TEST(PlotTune, RejectsMalformedInputNamingFileAndLine) {
  const Synthetic s(std::random_device{}());
  const auto refused = [&](TunePlotInputs in, const std::string& what) {
    const std::string e = error_of(in);
    EXPECT_NE(e.find(what), std::string::npos) << "got: " << e << "\nwant: " << what;
  };
  TunePlotInputs in = inputs(s);
  in.partial_text = "T | uniform\n";
  refused(in, "out/qwen3-30b.table.partial:1: not a moekit-tune partial file");
  in.partial_text = "# moekit-tune partial: fused_moe bf16 E=128\n";
  refused(in, "out/qwen3-30b.table.partial:1: expected 'OP DTYPE E=..");
  in.partial_text = kHeader + "\n1 | uniform | direct | 1.0 | accurate | default\n1 | uniform\n";
  refused(in, "out/qwen3-30b.table.partial:3: expected 6 '|'-separated fields, got 2");
  in.partial_text = kHeader + "\n1 | uniform | direct | fast | accurate | default\n";
  refused(in, "out/qwen3-30b.table.partial:2: us: expected a number, got 'fast'");

  in = inputs(s);
  in.table_text = "device | op | tokens\n";
  refused(in, "t.table:1: expected the table's header");
  in.table_text = kTableHeader + "\n" + table_line("16", kA) + " | extra\n";
  refused(in, "t.table:2: expected 14 '|'-separated fields, got 15");
  in.table_text = "# c\n" + kTableHeader + "\n" + table_line("64,16", kA) + "\n";
  refused(in, "t.table:3: field 'tokens': expected ascending counts");
  in.table_text = kTableHeader + "\n" + table_line("16,24", kA) + "\n";  // 24 never measured
  refused(in, "t.table:2: field 'tokens': serves T = 24, which the partial file did not measure");
  in.table_text = kTableHeader + "\n" + table_line("4", "sorted fused") + "\n";
  refused(in, "t.table:2: plan 'sorted fused' serves T = 4 but the partial file has no uniform");

  in = inputs(s);
  in.workload = "ds-v3";
  refused(in,
          "b.json: no --tokens records of FusedMoEFwd bf16 workload 'ds-v3' (there: "
          "qwen3-30b, qwen3-30b-ep8)");
  in.workload.clear();
  refused(in, "b.json: records of several workloads (qwen3-30b, qwen3-30b-ep8): name one");
  in.op = "FusedMoESharedExpertFwd";
  refused(in, "b.json: no --tokens records of FusedMoESharedExpertFwd bf16");
  in.bench_text = "{\"ops\": []}";
  refused(in, "b.json: not a moekit-bench JSON");
}

TEST(PlotTune, PartialFileLinesRoundTrip) {
  tune::Measurement m{24, "skewed", kA, 12.25, true, false}, back;
  std::string why;
  ASSERT_TRUE(tune::parse_measurement(tune::format_measurement(m), &back, &why)) << why;
  EXPECT_EQ(back.tokens, 24);
  EXPECT_EQ(back.routing, "skewed");
  EXPECT_EQ(back.plan, kA);
  EXPECT_EQ(back.us, 12.25);
  EXPECT_TRUE(back.accurate);
  EXPECT_FALSE(back.is_default);
  for (const char* bad :
       {"0 | uniform | direct | 1 | accurate | -", "1 | uniform |  | 1 | accurate | -",
        "1 | uniform | direct | 1 | ok | -", "1.5 | uniform | direct | 1 | accurate | -"})
    EXPECT_FALSE(tune::parse_measurement(bad, &back, &why)) << bad;
}

}  // namespace
}  // namespace moekit::bench
