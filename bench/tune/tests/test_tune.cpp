// moekit-tune's host-side core (bench/tune/tune.h) on the CPU: the command line, the default
// counts, the skew's alpha search, the bench row, the partial file's round trip and its
// rejections, the candidates a dry run lists, and the step from synthetic timings to table
// entries (winners, buckets, the guardrail under both routings).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "moe/tuning_table.h"
#include "tune.h"

namespace moekit::tune {
namespace {

TuneOptions parse(std::vector<std::string> args) {
  return parse_tune_options(args);
}

const std::vector<std::string> kQwen30 = {"--model",  "qwen3-30b", "--experts",      "128",
                                          "--hidden", "2048",      "--intermediate", "768",
                                          "--top-k",  "8"};

std::vector<std::string> with(std::vector<std::string> more) {
  std::vector<std::string> a = kQwen30;
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(TuneOptions, ParsesAModel) {
  const TuneOptions o =
      parse(with({"--routing", "grouped", "--scoring", "sigmoid", "--groups", "8", "--topk-group",
                  "4", "--shared", "2048", "--local-experts", "16-31", "--tokens", "1-4,64,32",
                  "--out", "x.table", "--no-skew", "--dry-run"}));
  EXPECT_EQ(o.model, "qwen3-30b");
  EXPECT_EQ(o.local_experts(), 16);
  EXPECT_EQ(o.experts_field(), "16-31");
  EXPECT_EQ(o.op(), "fused_moe_shared_expert");
  EXPECT_EQ(o.tokens, (std::vector<int64_t>{1, 2, 3, 4, 32, 64}));
  EXPECT_EQ(o.partial_path(), "x.table.partial");
  EXPECT_FALSE(o.skewed);
  EXPECT_TRUE(o.dry_run);
  EXPECT_EQ(o.finalists, 4);
  EXPECT_EQ(o.screen_ms, 20);
  const TuneOptions f = parse(with({"--finalists", "0", "--screen-ms", "5"}));
  EXPECT_EQ(f.finalists, 0);
  EXPECT_EQ(f.screen_ms, 5);
  const TuningShape s = o.shape();
  EXPECT_EQ(s.E, 16);
  EXPECT_EQ(s.routing, "sigmoid groups 8/4");
  EXPECT_EQ(s.S, 2048);
  const TuneOptions d = parse(kQwen30);
  EXPECT_EQ(d.tokens, default_token_counts());
  EXPECT_EQ(d.op(), "fused_moe");
  EXPECT_EQ(d.shape().routing, "softmax");
  EXPECT_EQ(d.experts_field(), "all");
  EXPECT_TRUE(parse({"--help"}).help);
}

TEST(TuneOptions, RejectsWithTheOptionNamed) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--experts", "128"}, "--experts, --hidden and --intermediate are required"},
      {with({"--top-k", "0"}), "--top-k: expected an integer >= 1, got '0'"},
      {with({"--top-k", "129"}), "--top-k: expected at most --experts"},
      {with({"--dtype", "fp8"}), "--dtype: expected bf16 or f16"},
      {with({"--routing", "topk"}), "--routing: expected softmax, sigmoid or grouped"},
      {with({"--routing", "grouped"}), "--routing grouped goes with --groups"},
      {with({"--routing", "grouped", "--groups", "3", "--topk-group", "1"}), "G dividing E"},
      {with({"--local-experts", "16"}), "--local-experts: expected LO-HI"},
      {with({"--local-experts", "120-130"}), "HI < --experts"},
      {with({"--tokens", "4-2"}), "--tokens: expected an integer >= 4, got '2'"},
      {with({"--tokens", ""}), "--tokens"},
      {with({"--max-ms", "-1"}), "--max-ms: expected a number > 0"},
      {with({"--finalists", "-1"}), "--finalists: expected an integer >= 0"},
      {with({"--screen-ms", "0"}), "--screen-ms: expected a number > 0"},
      {with({"--bogus"}), "unknown option '--bogus'"},
      {with({"--out"}), "--out: expected a value"},
  };
  for (const auto& [args, what] : bad) {
    try {
      parse(args);
      ADD_FAILURE() << "accepted: " << args.back();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

TEST(TuneCounts, Default) {
  const std::vector<int64_t> t = default_token_counts();
  ASSERT_EQ(t.size(), 31u);
  EXPECT_EQ(t[0], 1);
  EXPECT_EQ(t[15], 16);
  EXPECT_EQ(t[16], 24);
  EXPECT_EQ(t.back(), 16384);
}

TEST(TuneSkew, AlphaGivesTheBusiestExpertTwiceTheMean) {
  for (auto [E, K] : {std::pair<int64_t, int>{128, 8}, {256, 8}, {16, 2}}) {
    const double alpha = skew_alpha_for(E, K, 2.0, 4096, 7);
    EXPECT_GT(alpha, 0) << E;
    EXPECT_NEAR(expert_load_ratio(E, K, alpha, 4096, 7), 2.0, 0.02) << E;
    // More skew, a busier top expert (the search's premise).
    EXPECT_GT(expert_load_ratio(E, K, alpha * 2, 4096, 7), 2.0) << E;
    EXPECT_LT(expert_load_ratio(E, K, alpha / 2, 4096, 7), 2.0) << E;
  }
  // A target uniform routing already meets: no skew.
  EXPECT_EQ(skew_alpha_for(128, 8, 1.0, 4096, 7), 0);
}

TEST(TuneRow, IsTheBenchRowOfTheLayer) {
  const TuneOptions o = parse(with({"--shared", "1024", "--local-experts", "0-31",
                                    "--correction-bias", "--scoring", "sigmoid"}));
  const bench::Row r = layer_row(o, 24);
  EXPECT_EQ(r.w.op, "FusedMoESharedExpertFwd");
  EXPECT_EQ(r.w.tensor("hidden_states")->shape, (std::vector<int64_t>{24, 2048}));
  EXPECT_EQ(r.w.tensor("gating_output")->shape, (std::vector<int64_t>{24, 32}));
  EXPECT_EQ(r.w.tensor("w_gate_up")->shape, (std::vector<int64_t>{32, 1536, 2048}));
  EXPECT_EQ(r.w.tensor("shared_w_down")->shape, (std::vector<int64_t>{2048, 1024}));
  EXPECT_NE(r.w.tensor("correction_bias"), nullptr);
  EXPECT_EQ(r.w.param("scoring_func"), "sigmoid");
  EXPECT_EQ(r.w.param("top_k"), "8");
  EXPECT_EQ(layer_row(parse(kQwen30), 1).w.op, "FusedMoEFwd");
}

TEST(TuneDryRun, ListsTheCandidatesPerCount) {
  // Without a GPU: arch 0's candidates, the library's plan among them.
  const TuneOptions o = parse(kQwen30);
  for (int64_t T : {1, 512}) {
    LayerPlan planned;
    const std::vector<LayerPlan> all = layer_candidates(o, T, &planned);
    ASSERT_FALSE(all.empty());
    bool found = false;
    for (const LayerPlan& p : all) found |= p == planned;
    EXPECT_TRUE(found) << to_string(planned);
  }
}

// FP8 weights (--weight-quant): the shape's scheme, the bench row's weight_quant (its e4m3
// weights and scales), the partial file's header, a table entry's options, and candidates
// that run FP8 weights (shared expert included).
TEST(TuneFp8, TheSchemeReachesShapeRowPartialAndCandidates) {
  const TuneOptions o = parse(with({"--weight-quant", "fp8_per_channel", "--shared", "512"}));
  EXPECT_EQ(o.quant, QuantScheme::kFp8PerChannel);
  EXPECT_EQ(o.shape().quant, QuantScheme::kFp8PerChannel);
  EXPECT_EQ(layer_row(o, 8).w.param("weight_quant"), "fp8_per_channel");
  EXPECT_EQ(layer_row(parse(kQwen30), 8).w.param("weight_quant", "none"), "none");
  EXPECT_NE(partial_header(o).find(" bf16 fp8_per_channel E=128 "), std::string::npos)
      << partial_header(o);
  EXPECT_NE(partial_header(o), partial_header(parse(with({"--shared", "512"}))));
  TuningEntry e;
  e.shape = o.shape();
  e.source = "t.table:2";
  EXPECT_EQ(options_for_entry(e).quant, QuantScheme::kFp8PerChannel);
  EXPECT_EQ(parse(with({"--weight-quant", "none"})).quant, QuantScheme::kNone);
  for (const char* q : {"fp8_per_tensor", "fp8_per_channel", "fp8_block128"}) {
    const TuneOptions f = parse(with({"--weight-quant", q, "--shared", "512"}));
    for (int64_t T : {1, 64}) {
      LayerPlan planned;
      const std::vector<LayerPlan> all = layer_candidates(f, T, &planned);
      ASSERT_FALSE(all.empty()) << q << " T=" << T;
      for (const LayerPlan& p : all)
        EXPECT_EQ(to_string(p).find("sm90 "), std::string::npos) << q << ": " << to_string(p);
    }
  }
  EXPECT_THROW(parse(with({"--weight-quant", "int4"})), std::invalid_argument);
}

TEST(TunePartial, RoundTripsAndRefusesOtherRuns) {
  const TuneOptions o = parse(kQwen30);
  const std::vector<Measurement> ms = {
      {1, "uniform", "direct", 12.5, true, true},
      {1, "skewed", "sorted two_gemms{gate_up: decode 32x128, down: decode 32x128}", -1, false,
       false},
  };
  std::string text = partial_header(o) + "\n";
  for (const Measurement& m : ms) text += format_measurement(m) + "\n";
  const std::vector<Measurement> back = read_partial(text, partial_header(o), "p");
  ASSERT_EQ(back.size(), 2u);
  for (size_t i = 0; i < ms.size(); ++i) {
    EXPECT_EQ(back[i].tokens, ms[i].tokens);
    EXPECT_EQ(back[i].routing, ms[i].routing);
    EXPECT_EQ(back[i].plan, ms[i].plan);
    EXPECT_EQ(back[i].us, ms[i].us);
    EXPECT_EQ(back[i].accurate, ms[i].accurate);
    EXPECT_EQ(back[i].is_default, ms[i].is_default);
  }
  const TuneOptions other = parse(with({"--shared", "64"}));
  EXPECT_THROW(read_partial(text, partial_header(other), "p"), std::runtime_error);
  const auto refused = [&](const std::string& line, const std::string& what) {
    try {
      read_partial(partial_header(o) + "\n" + line + "\n", partial_header(o), "p");
      ADD_FAILURE() << line;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused("1 | uniform | direct | 1.0", "p:2: expected 6 '|'-separated fields, got 4");
  refused("1 | uniform | direkt | 1.0 | accurate | -", "p:2: plan: at character 1");
  refused("1 | sideways | direct | 1.0 | accurate | -", "p:2: expected 'T | uniform/skewed");
  refused("x | uniform | direct | 1.0 | accurate | -", "p:2: tokens");
  // A step's screening summary is a comment line.
  EXPECT_EQ(
      read_partial(text + "# screened T=1 uniform: 46 candidates\n", partial_header(o), "p").size(),
      2u);
}

// Screening keeps the default (even inaccurate or slow), the other routing's finalists when
// accurate, and the n fastest accurate timed others; never an inaccurate or failed one.
TEST(TuneScreen, PicksTheDefaultTheKeptAndTheFastestAccurate) {
  const auto m = [](const std::string& plan, double us, bool accurate, bool is_default) {
    return Measurement{8, "uniform", plan, us, accurate, is_default};
  };
  const std::vector<Measurement> screened = {
      m("d", 50, true, true),  m("a", 10, true, false), m("b", 9, false, false),
      m("c", 30, true, false), m("e", -1, true, false), m("f", 20, true, false),
      m("g", 20, true, false), m("k", 90, true, false), m("x", 99, false, false)};
  EXPECT_EQ(pick_finalists(screened, 2, {}),
            (std::vector<bool>{true, true, false, false, false, true, false, false, false}));
  // Ties keep the candidate order; a kept plan costs no slot; an inaccurate kept one is out.
  EXPECT_EQ(pick_finalists(screened, 3, {"k", "x"}),
            (std::vector<bool>{true, true, false, false, false, true, true, true, false}));
  EXPECT_EQ(pick_finalists(screened, 0, {}), std::vector<bool>(screened.size(), true));
  std::vector<Measurement> slow_default = screened;
  slow_default[0].accurate = false;
  EXPECT_TRUE(pick_finalists(slow_default, 1, {})[0]);
}

// Synthetic timings: plan A wins 1-4 by 10%, plan B wins 8 by 5% uniform but is 3% slower
// skewed, plan C wins 16 and 24 by 0.5% only; the default elsewhere.
TEST(TuneBuild, BucketsWinnersUnderTheGuardrail) {
  const TuneOptions o = parse(kQwen30);
  const std::string D = "direct",
                    A = "sorted two_gemms{gate_up: decode 32x128, down: decode "
                        "32x128}",
                    B = "sorted chain{gate_up: sm90 128x256 dynamic, down: sm90 128x256 dynamic}",
                    C = "sorted two_gemms{gate_up: sm90 128x256, down: sm90 128x256}";
  std::vector<Measurement> ms;
  const auto add = [&](int64_t T, const std::string& plan, double uni, double skew, bool def,
                       bool accurate = true) {
    ms.push_back({T, "uniform", plan, uni, accurate, def});
    ms.push_back({T, "skewed", plan, skew, accurate, def});
  };
  for (int64_t T : {1, 2, 3, 4}) {
    add(T, D, 100, 100, true);
    add(T, A, 90, 90, false);
  }
  add(8, D, 100, 100, true);
  add(8, B, 95, 103, false);
  add(8, A, 80, 80, false, /*accurate=*/false);  // fastest but wrong: never chosen
  for (int64_t T : {16, 24}) {
    add(T, D, 100, 100, true);
    add(T, C, 99.5, 99.5, false);
  }
  std::vector<std::string> log;
  const std::vector<TuningEntry> entries = build_entries(o, "NVIDIA H200", ms, &log);
  ASSERT_EQ(entries.size(), 1u) << ::testing::PrintToString(log);
  EXPECT_EQ(entries[0].plan, A);
  EXPECT_EQ(detail::format_token_ranges(entries[0].tokens), "1-4");
  EXPECT_NEAR(entries[0].time_us, 90, 1e-9);
  EXPECT_NEAR(entries[0].default_us, 100, 1e-9);
  EXPECT_EQ(entries[0].device, "NVIDIA H200");
  EXPECT_TRUE(entries[0].shape == o.shape());
  const std::string all = ::testing::PrintToString(log);
  EXPECT_NE(all.find("8: " + B + " refused (skewed: T = 8 is 3.0% slower"), std::string::npos)
      << all;
  EXPECT_NE(all.find("16,24: " + C + " refused (skewed: under 1% faster on average)"),
            std::string::npos)
      << all;
  // The written table parses back (not checked against candidates: the plans are made up).
  EXPECT_EQ(detail::parse_tuning_table(detail::format_tuning_table(entries), "t", nullptr).size(),
            1u);
}

TEST(TuneBuild, AFailedBucketKeepsTheCountsThatPassAlone) {
  const TuneOptions o = parse(with({"--no-skew"}));
  const std::string D = "direct",
                    A = "sorted two_gemms{gate_up: decode 32x128, down: decode 32x128}";
  std::vector<Measurement> ms;
  // A wins 1 (by 25%) and 2 (by 0.2%): the pair passes on average, one entry.
  for (int64_t T : {1, 2}) {
    ms.push_back({T, "uniform", D, 100, true, true});
    ms.push_back({T, "uniform", A, T == 1 ? 80 : 99.8, true, false});
  }
  std::vector<TuningEntry> e = build_entries(o, "dev", ms, nullptr);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(detail::format_token_ranges(e[0].tokens), "1-2");
  // An unmeasured default at one count of the bucket: that count is left to the default.
  ms.push_back({3, "uniform", A, 50, true, false});
  ms.push_back({3, "uniform", D, -1, true, true});
  e = build_entries(o, "dev", ms, nullptr);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(detail::format_token_ranges(e[0].tokens), "1-2");
}

TEST(TuneVerify, OptionsTakeNoLayer) {
  EXPECT_TRUE(parse({"--verify-builtin"}).verify_builtin);
  EXPECT_EQ(parse({"--verify", "t.table", "--seed", "3"}).verify_file, "t.table");
  EXPECT_THROW(parse({"--verify-builtin", "--verify", "t.table"}), std::invalid_argument);
  EXPECT_THROW(parse(with({"--verify-builtin"})), std::invalid_argument);
  EXPECT_THROW(parse({"--verify"}), std::invalid_argument);
}

TuningEntry entry(const std::string& routing, std::vector<TokenRange> tokens) {
  TuningEntry e;
  e.device = "NVIDIA H200";
  e.shape = {"fused_moe_shared_expert", "f16", 256, 7168, 2048, 8, routing, 2048};
  e.tokens = tokens;
  e.source = "t.table:3";
  return e;
}

TEST(TuneVerify, AnEntrysLayerAndCounts) {
  const TuneOptions o = options_for_entry(entry("sigmoid groups 8/4", {{1, 16}, {24, 24}}));
  EXPECT_EQ(o.shape(), entry("sigmoid groups 8/4", {}).shape);
  EXPECT_EQ(o.scoring, "sigmoid");
  EXPECT_EQ(o.groups, 8);
  EXPECT_EQ(o.topk_group, 4);
  EXPECT_EQ(layer_row(o, 16).w.op, "FusedMoESharedExpertFwd");
  EXPECT_EQ(layer_row(o, 16).w.tensor("gating_output")->shape, (std::vector<int64_t>{16, 256}));
  EXPECT_EQ(options_for_entry(entry("softmax", {})).groups, 0);
  EXPECT_EQ(verify_counts(entry("softmax", {{1, 16}, {24, 24}, {32, 64}})),
            (std::vector<int64_t>{1, 16, 24, 32, 64}));
  for (const char* bad : {"topk", "softmax groups 8", "sigmoid groups 8/4 x", "softmax  "})
    EXPECT_THROW(options_for_entry(entry(bad, {})), std::invalid_argument) << bad;
}

}  // namespace
}  // namespace moekit::tune
