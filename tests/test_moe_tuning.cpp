// Tuning tables (include/moekit/tuning.h, src/moe/tuning_table.h): the format's parse and
// every rejection (file, line, field), the writer's round trip, the guardrail's edges, the
// registry's lookup (bucket edges, stale entries, load order, clear) and the built-in
// tables, on the CPU with an H200's properties. On a GPU: the layer ops use a loaded entry.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "moe/tuning_table.h"
#include "moekit/error.h"
#include "moekit/moe.h"
#include "moekit/tuning.h"
#include "support/gpu.h"
#include "test_moe_planner_common.h"

namespace moekit {
namespace {

const char* kHeader =
    "device | op | dtype | E | H | F | top_k | routing | S | experts | tokens | plan | time_us | "
    "default_us\n";

// ds-v3's layer with its shared expert; qwen3-30b's without.
const char* kDsV3 =
    "NVIDIA H200 | fused_moe_shared_expert | bf16 | 256 | 7168 | 2048 | 8 | sigmoid groups 8/4 | "
    "2048 | all | ";
const char* kQwen30 =
    "NVIDIA H200 | fused_moe | bf16 | 128 | 2048 | 768 | 8 | softmax | 0 | all | ";

detail::TuningDevice h200() {
  return {"NVIDIA H200", detail::GemmDevice(detail::h200_props())};
}

// A candidate of the layer at T that is not the planner's plan (a tuned pick).
std::string other_candidate(const TuningShape& shape, int64_t T, size_t skip = 0) {
  const detail::GemmDevice d(detail::h200_props());
  const detail::LayerProblem p = detail::tuning_problem(shape, T);
  const LayerPlan planned = detail::plan_layer(p, d);
  for (const LayerPlan& c : detail::layer_plan_candidates(p, d))
    if (c != planned && skip-- == 0) return to_string(c);
  return "";
}

TuningShape qwen30_shape() {
  TuningShape s;
  s.op = "fused_moe";
  s.dtype = "bf16";
  s.E = 128;
  s.H = 2048;
  s.F = 768;
  s.top_k = 8;
  s.routing = "softmax";
  return s;
}

std::vector<detail::ParsedEntry> parse(const std::string& body, bool check = true) {
  const detail::TuningDevice d = h200();
  return detail::parse_tuning_table(std::string("# a comment\n\n") + kHeader + body, "t.table",
                                    check ? &d : nullptr);
}

TEST(TuningTable, ParsesEntries) {
  const std::string sorted = other_candidate(qwen30_shape(), 512);
  ASSERT_FALSE(sorted.empty());
  const auto entries =
      parse(std::string(kQwen30) + "1-16,24 | direct | 10.5 | 11\n" + kQwen30 + "512 | " + sorted +
            " | 90 | 95.25\n" + kDsV3 + "1-2 | direct + shared direct{split 8/4} | 30 | 31\n");
  ASSERT_EQ(entries.size(), 3u);
  const TuningEntry& e = entries[0].entry;
  EXPECT_EQ(e.device, "NVIDIA H200");
  EXPECT_TRUE(e.shape == qwen30_shape());
  EXPECT_EQ(e.experts, "all");
  ASSERT_EQ(e.tokens.size(), 2u);
  EXPECT_EQ(e.tokens[0].lo, 1);
  EXPECT_EQ(e.tokens[0].hi, 16);
  EXPECT_EQ(e.tokens[1].lo, 24);
  EXPECT_EQ(e.tokens[1].hi, 24);
  EXPECT_EQ(e.plan, "direct");
  EXPECT_EQ(e.time_us, 10.5);
  EXPECT_EQ(e.default_us, 11);
  EXPECT_EQ(e.source, "t.table:4");
  EXPECT_EQ(to_string(entries[1].plan), sorted);
  EXPECT_EQ(entries[2].entry.shape.routing, "sigmoid groups 8/4");
  EXPECT_EQ(entries[2].entry.shape.S, 2048);
  EXPECT_TRUE(entries[2].plan.has_shared);
}

TEST(TuningTable, WriterRoundTrips) {
  std::vector<TuningEntry> in;
  for (const auto& p : parse(std::string(kQwen30) + "1-16,24,32 | direct | 10.5 | 11.125\n" +
                             kDsV3 + "3 | direct + shared direct{split 8/4} | 30 | 31\n"))
    in.push_back(p.entry);
  const std::string text = detail::format_tuning_table(in);
  const detail::TuningDevice d = h200();
  const auto back = detail::parse_tuning_table(text, "w", &d);
  ASSERT_EQ(back.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(back[i].entry.plan, in[i].plan);
    EXPECT_EQ(detail::format_token_ranges(back[i].entry.tokens),
              detail::format_token_ranges(in[i].tokens));
    EXPECT_EQ(back[i].entry.time_us, in[i].time_us);
    EXPECT_EQ(back[i].entry.default_us, in[i].default_us);
    EXPECT_TRUE(back[i].entry.shape == in[i].shape);
  }
  EXPECT_EQ(detail::format_tuning_table({}).find(kHeader) != std::string::npos, true);
}

// FP8 weights: the scheme follows the dtype in its column, keys a shape of its own, and the
// entry's plan must run FP8 weights (the FP8 GEMMs on the sorted path, not the bf16 ones).
TEST(TuningTable, Fp8WeightsKeyTheirOwnShape) {
  TuningShape fp8 = qwen30_shape();
  fp8.quant = QuantScheme::kFp8PerChannel;
  const std::string q =
      "NVIDIA H200 | fused_moe | bf16 fp8_per_channel | 128 | 2048 | 768 | 8 | softmax | 0 | all "
      "| ";
  const std::string sorted = other_candidate(fp8, 32);
  ASSERT_NE(sorted.find("fp8_sm90"), std::string::npos) << sorted;
  const auto entries = parse(q + "1-16 | direct | 10 | 11\n" + q + "32 | " + sorted +
                             " | 90 | 95\n" + kQwen30 + "1-16 | direct | 10 | 11\n");
  ASSERT_EQ(entries.size(), 3u);  // one count range on two shapes: no overlap
  EXPECT_TRUE(entries[0].entry.shape == fp8);
  EXPECT_FALSE(entries[0].entry.shape == qwen30_shape());
  EXPECT_EQ(detail::tuning_dtype_field(fp8), "bf16 fp8_per_channel");
  std::vector<TuningEntry> in = {entries[0].entry, entries[1].entry};
  const detail::TuningDevice d = h200();
  const auto back = detail::parse_tuning_table(detail::format_tuning_table(in), "w", &d);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(back[1].entry.shape == fp8);
  EXPECT_EQ(back[1].entry.plan, sorted);
  // The bf16 shape's sorted plan (bf16 GEMMs) cannot run FP8 weights.
  const std::string bf16_sorted = other_candidate(qwen30_shape(), 32);
  try {
    parse(q + "32 | " + bf16_sorted + " | 90 | 95\n");
    ADD_FAILURE() << "accepted " << bf16_sorted << " for FP8 weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.table:4: field 'plan'"), std::string::npos) << e.what();
  }
  // The registry keys on the scheme.
  clear_tuning_tables();
  const std::string t = "Test GPU" + q.substr(std::string("NVIDIA H200").size());
  detail::add_tuning_table(parse(t + "32 | " + sorted + " | 1 | 2\n", false));
  const detail::GemmDevice g(detail::h200_props());
  LayerPlan plan;
  EXPECT_TRUE(detail::tuned_layer_plan("Test GPU", fp8, 32, g, &plan));
  EXPECT_EQ(to_string(plan), sorted);
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", qwen30_shape(), 32, g, &plan));
  TuningShape block = fp8;
  block.quant = QuantScheme::kFp8Block128;
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", block, 32, g, &plan));
  clear_tuning_tables();
}

// A table keys the weights' scheme, not a call's static activation scales: an FP8 per-tensor
// entry whose gate/up GEMM is fp8_sm90 128x256 cannot write the e4m3 act that a given
// a_down_scale asks for, so the lookup checks the call's own problem and skips it then.
TEST(TuningTable, AnEntryTheCallCannotRunIsSkipped) {
  TuningShape tensor = qwen30_shape();
  tensor.quant = QuantScheme::kFp8PerTensor;
  const std::string fast = "sorted two_gemms{gate_up: fp8_sm90 128x256, down: fp8_sm90 128x256}";
  clear_tuning_tables();
  detail::add_tuning_table(parse(
      "Test GPU | fused_moe | bf16 fp8_per_tensor | 128 | 2048 | 768 | 8 | softmax | 0 | all | "
      "4096 | " +
          fast + " | 1 | 2\n",
      false));
  const detail::GemmDevice g(detail::h200_props());
  detail::LayerProblem call = detail::tuning_problem(tensor, 4096);
  EXPECT_EQ(detail::layer_plan_rejection(detail::plan_layer(call, g), call, g), "");
  LayerPlan plan;
  EXPECT_TRUE(detail::tuned_layer_plan("Test GPU", tensor, 4096, g, &plan, &call));
  EXPECT_EQ(to_string(plan), fast);
  call.s.static_act = true;  // the call gives a_down_scale
  EXPECT_NE(detail::layer_plan_rejection(plan, call, g).find("no c_scale"), std::string::npos);
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", tensor, 4096, g, &plan, &call));
  EXPECT_TRUE(detail::tuned_layer_plan("Test GPU", tensor, 4096, g, &plan));  // the table's own
  clear_tuning_tables();
}

TEST(TuningTable, TokenRanges) {
  EXPECT_EQ(detail::format_token_ranges(detail::token_ranges({1, 2, 3, 5, 8, 9})), "1-3,5,8-9");
  EXPECT_EQ(detail::format_token_ranges(detail::token_ranges({})), "");
}

struct Bad {
  std::string body;
  const char* error;
};

TEST(TuningTable, RejectionsNameFileLineAndField) {
  const std::string q = kQwen30;
  const std::string ok = " | direct | 10 | 11\n";
  const std::string sorted128 = other_candidate(qwen30_shape(), 128);
  const Bad kBad[] = {
      {q + "1" + " | direct | 10\n", "t.table:4: expected 14 '|'-separated fields, got 13"},
      {" | fused_moe | bf16 | 128 | 2048 | 768 | 8 | softmax | 0 | all | 1" + ok,
       "t.table:4: field 'device': expected a device name"},
      {"NVIDIA H200 | moe | bf16 | 128 | 2048 | 768 | 8 | softmax | 0 | all | 1" + ok,
       "field 'op': expected 'fused_moe' or 'fused_moe_shared_expert', got 'moe'"},
      {"NVIDIA H200 | fused_moe | fp8 | 128 | 2048 | 768 | 8 | softmax | 0 | all | 1" + ok,
       "field 'dtype': expected 'bf16' or 'f16', then the weights' scheme if FP8 "
       "(fp8_per_tensor, fp8_per_channel, fp8_block128), got 'fp8'"},
      {"NVIDIA H200 | fused_moe | bf16 none | 128 | 2048 | 768 | 8 | softmax | 0 | all | 1" + ok,
       "field 'dtype'"},
      {"NVIDIA H200 | fused_moe | bf16 fp8 | 128 | 2048 | 768 | 8 | softmax | 0 | all | 1" + ok,
       "got 'bf16 fp8'"},
      {"NVIDIA H200 | fused_moe | bf16 fp8_block128 x | 128 | 2048 | 768 | 8 | softmax | 0 | all | "
       "1" +
           ok,
       "field 'dtype'"},
      {"NVIDIA H200 | fused_moe | bf16 | 0 | 2048 | 768 | 8 | softmax | 0 | all | 1" + ok,
       "field 'E': expected experts >= 1, got '0'"},
      {"NVIDIA H200 | fused_moe | bf16 | 128 | 2k | 768 | 8 | softmax | 0 | all | 1" + ok,
       "field 'H': expected a hidden size >= 1, got '2k'"},
      {"NVIDIA H200 | fused_moe | bf16 | 128 | 2048 | -768 | 8 | softmax | 0 | all | 1" + ok,
       "field 'F': expected an intermediate size >= 1"},
      {"NVIDIA H200 | fused_moe | bf16 | 128 | 2048 | 768 | 129 | softmax | 0 | all | 1" + ok,
       "field 'top_k': expected top_k in [1, E], got '129'"},
      {"NVIDIA H200 | fused_moe | bf16 | 128 | 2048 | 768 | 8 | topk | 0 | all | 1" + ok,
       "field 'routing': expected 'softmax' or 'sigmoid'"},
      {"NVIDIA H200 | fused_moe | bf16 | 128 | 2048 | 768 | 8 | softmax groups 3/1 | 0 | all | 1" +
           ok,
       "field 'routing': expected 'softmax' or 'sigmoid', optionally ' groups G/TG' (G divides E"},
      {"NVIDIA H200 | fused_moe | bf16 | 128 | 2048 | 768 | 8 | softmax groups 8/9 | 0 | all | 1" +
           ok,
       "got 'softmax groups 8/9'"},
      {"NVIDIA H200 | fused_moe | bf16 | 128 | 2048 | 768 | 8 | softmax | 512 | all | 1" + ok,
       "field 'S': expected 0 (fused_moe has no shared expert), got '512'"},
      {"NVIDIA H200 | fused_moe | bf16 | 128 | 2048 | 768 | 8 | softmax | 0 | 0-63 | 1" + ok,
       "field 'experts': expected 'all' or 'lo-hi' with hi - lo + 1 = E, got '0-63'"},
      {q + "0" + ok, "field 'tokens': expected ascending token counts and ranges"},
      {q + "8-4" + ok, "field 'tokens': expected ascending"},
      {q + "1-8,8" + ok, "got '1-8,8'"},
      {q + "1,,2" + ok, "field 'tokens'"},
      {q + "1 | direkt | 10 | 11\n",
       "field 'plan': expected a layer plan (to_string's form): at character 1: expected a "
       "routed path"},
      {q + "128 | direct | 10 | 11\n",
       "t.table:4: field 'plan': expected a plan this build can run for the shape at T = 128 on "
       "NVIDIA H200"},
      {q + "1-100 | direct | 10 | 11\n", "at T = 100"},
      {q + "1 | direct + shared gemv | 10 | 11\n", "the layer has no shared expert"},
      {q + "1 | direct | 0 | 11\n", "field 'time_us': expected a time in microseconds > 0"},
      {q + "1 | direct | 10 | nan\n", "field 'default_us': expected a time in microseconds > 0"},
      {q + "1-8" + ok + q + "9,10" + ok + q + "12,8" + ok, "t.table:6: field 'tokens'"},
      {q + "1-8" + ok + q + "9-10" + ok + q + "2-3,11" + ok,
       "t.table:6: field 'tokens': expected counts no other entry of this device and shape serves "
       "(t.table:4 serves 1-8)"},
  };
  for (const Bad& b : kBad) {
    try {
      parse(b.body);
      ADD_FAILURE() << "accepted: " << b.body;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.error), std::string::npos)
          << e.what() << "\n  wanted: " << b.error;
    }
  }
  EXPECT_FALSE(sorted128.empty());
}

TEST(TuningTable, HeaderAndDeviceChecks) {
  EXPECT_THROW(detail::parse_tuning_table("", "e", nullptr), Error);
  try {
    detail::parse_tuning_table("# c\ndevice | op\n", "h.table", nullptr);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h.table:2: the header: expected 'device | op | dtype"),
              std::string::npos)
        << e.what();
  }
  // Another device's entry is parsed, not checked against this device; the same
  // counts on two devices do not overlap.
  const std::string other =
      "Other GPU | fused_moe | bf16 | 128 | 2048 | 768 | 8 | softmax | 0 | all | 128 | direct | 1 "
      "| 2\n";
  EXPECT_EQ(parse(other).size(), 1u);
  EXPECT_EQ(parse(other + kQwen30 + "128 | " + other_candidate(qwen30_shape(), 128) + " | 1 | 2\n")
                .size(),
            2u);
  // Unchecked (null device): only the text.
  EXPECT_EQ(parse(std::string(kQwen30) + "128 | direct | 10 | 11\n", false).size(), 1u);
}

TEST(TuningGuardrail, Edges) {
  // Exactly 1% faster on average and exactly 2% slower at one count: accepted.
  const double slow = 1.02, fast = 1 / (2 * 1.01 - 1 / 1.02);
  GuardrailVerdict v = guardrail({{1, slow * 100, 100}, {2, fast * 100, 100}});
  EXPECT_NEAR(v.mean_speedup, 0.01, 1e-12);
  EXPECT_TRUE(v.accepted) << v.reason;
  EXPECT_NEAR(v.worst_ratio, 1.02, 1e-12);
  // Just over 2% slower at one count, however fast the rest.
  v = guardrail({{1, 102.01, 100}, {2, 10, 100}});
  EXPECT_FALSE(v.accepted);
  EXPECT_NE(v.reason.find("T = 1 is 2.0% slower"), std::string::npos) << v.reason;
  // Just under 1% faster on average.
  v = guardrail({{4, 100 / 1.0099, 100}});
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.reason, "under 1% faster on average");
  // Equal times: 0%.
  EXPECT_FALSE(guardrail({{4, 100, 100}}).accepted);
  // A count not measured (either time), or none at all.
  v = guardrail({{1, 50, 100}, {2, 0, 100}});
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.reason, "T = 2 not measured");
  EXPECT_FALSE(guardrail({{1, 50, -1}}).accepted);
  EXPECT_EQ(guardrail({}).reason, "no token count measured");
  // The mean is over counts (each weighs the same), not over time.
  v = guardrail({{1, 50, 100}, {2, 1010, 1000}});
  EXPECT_TRUE(v.accepted) << v.reason;
  EXPECT_NEAR(v.mean_speedup, (1.0 + (1000 / 1010.0 - 1)) / 2, 1e-12);
}

TEST(TuningRegistry, LookupBucketEdgesStaleEntriesOrderAndClear) {
  clear_tuning_tables();
  const TuningShape shape = qwen30_shape();
  const detail::GemmDevice d(detail::h200_props());
  const std::string pick = other_candidate(shape, 512), pick2 = other_candidate(shape, 512, 1);
  ASSERT_FALSE(pick2.empty());
  // A device no built-in table names, so that only these entries match.
  const std::string q = "Test GPU" + std::string(kQwen30).substr(std::string("NVIDIA H200").size());
  // 1-16 direct (stale from T = 50 on? no: direct runs to 64 here), 256-512 a sorted pick, 40
  // direct named where it cannot run at T = 80 (a stale entry: the planner's plan instead).
  detail::add_tuning_table(parse(q + "2-16 | direct | 1 | 2\n" + q + "256-512 | " + pick +
                                     " | 1 | 2\n" + q + "80 | direct | 1 | 2\n",
                                 false));
  LayerPlan plan;
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", shape, 1, d, &plan));
  EXPECT_TRUE(detail::tuned_layer_plan("Test GPU", shape, 2, d, &plan));
  EXPECT_EQ(to_string(plan), "direct");
  EXPECT_TRUE(detail::tuned_layer_plan("Test GPU", shape, 16, d, &plan));
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", shape, 17, d, &plan));
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", shape, 255, d, &plan));
  EXPECT_TRUE(detail::tuned_layer_plan("Test GPU", shape, 256, d, &plan));
  EXPECT_EQ(to_string(plan), pick);
  EXPECT_TRUE(detail::tuned_layer_plan("Test GPU", shape, 512, d, &plan));
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", shape, 513, d, &plan));
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", shape, 80, d, &plan)) << to_string(plan);
  // Another device, another shape: no match.
  EXPECT_FALSE(detail::tuned_layer_plan("Other GPU", shape, 2, d, &plan));
  TuningShape grouped = shape;
  grouped.routing = "softmax groups 8/4";
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", grouped, 2, d, &plan));
  // A later table comes first.
  detail::add_tuning_table(parse(q + "300 | " + pick2 + " | 1 | 2\n", false));
  EXPECT_TRUE(detail::tuned_layer_plan("Test GPU", shape, 300, d, &plan));
  EXPECT_EQ(to_string(plan), pick2);
  EXPECT_TRUE(detail::tuned_layer_plan("Test GPU", shape, 301, d, &plan));
  EXPECT_EQ(to_string(plan), pick);
  const std::vector<TuningEntry> listed = tuning_entries();
  ASSERT_GE(listed.size(), 4u);
  EXPECT_EQ(listed[0].plan, pick2);
  EXPECT_TRUE(detail::tuning_tables_present());
  clear_tuning_tables();
  EXPECT_EQ(detail::tuning_tables_present(), !detail::builtin_tuning_tables().empty());
  EXPECT_FALSE(detail::tuned_layer_plan("Test GPU", shape, 2, d, &plan));
  EXPECT_EQ(tuning_entries().size(), listed.size() - 4);
}

TEST(TuningRegistry, PublicLoadNamesTheFile) {
  clear_tuning_tables();
  const size_t builtin = tuning_entries().size();
  const std::string path = ::testing::TempDir() + "moekit_tuning_test.table";
  {
    std::ofstream out(path);
    out << kHeader << kQwen30 << "1-4 | direct | 1 | 2\n" << kQwen30 << "5 | direct | x | 2\n";
  }
  try {
    load_tuning_table(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":3: field 'time_us'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(tuning_entries().size(), builtin) << "a refused table added entries";
  {
    std::ofstream out(path);
    out << kHeader << kQwen30 << "1-4 | direct | 1 | 2\n";
  }
  load_tuning_table(path);
  ASSERT_EQ(tuning_entries().size(), builtin + 1);
  EXPECT_EQ(tuning_entries()[0].source, path + ":2");
  load_tuning_table_text(std::string(kHeader) + kQwen30 + "1-4 | direct | 1 | 2\n", "mine");
  EXPECT_EQ(tuning_entries()[0].source, "mine:2");
  clear_tuning_tables();
  std::remove(path.c_str());
  EXPECT_THROW(load_tuning_table(path), Error);
}

// Every built-in table parses and names plans this build can run for its shapes (checked on
// its device, where this test knows the device's properties).
TEST(TuningRegistry, BuiltinTablesParseAndNameCandidates) {
  for (const detail::BuiltinTable& t : detail::builtin_tuning_tables()) {
    const detail::TuningDevice d = h200();
    EXPECT_NO_THROW(detail::parse_tuning_table(t.text, t.name, &d)) << t.name;
  }
}

// Qwen3-30B's layer at T tokens (null data: the planners read shapes), weights in `w`.
FusedMoEArgs qwen30_args(int64_t T, DType w = DType::kBF16) {
  FusedMoEArgs a;
  a.hidden_states = planner_test::null_view(DType::kBF16, {T, 2048});
  a.gating_output = planner_test::null_view(DType::kF32, {T, 128});
  a.w_gate_up = planner_test::null_view(w, {128, 2 * 768, 2048});
  a.w_down = planner_test::null_view(w, {128, 2048, 768});
  a.params.top_k = 8;
  return a;
}

// On a GPU the layer op's plan query takes a loaded entry of the current device, and leaves
// it for the planner's once the tables are cleared.
TEST(TuningRegistry, LayerOpsUseLoadedEntriesGpu) {
  MOEKIT_REQUIRE_GPU();
  clear_tuning_tables();
  FusedMoEArgs a = qwen30_args(512);
  const LayerPlan planned = plan_fused_moe(a);
  const std::vector<LayerPlan> all = fused_moe_plan_candidates(a);
  const LayerPlan* other = nullptr;
  for (const LayerPlan& c : all)
    if (c != planned) other = &c;
  ASSERT_NE(other, nullptr);
  const std::string name = detail::device_name();
  load_tuning_table_text(std::string(kHeader) + name +
                         " | fused_moe | bf16 | 128 | 2048 | 768 | 8 | softmax | 0 | all | 512 | " +
                         to_string(*other) + " | 1 | 2\n");
  EXPECT_EQ(plan_fused_moe(a), *other);
  const FusedMoEArgs a511 = qwen30_args(511);
  const LayerPlan planned511 = plan_fused_moe(a511);
  clear_tuning_tables();
  EXPECT_EQ(plan_fused_moe(a511), planned511);
  EXPECT_EQ(plan_fused_moe(a), planned);
}

// FP8 weights (per channel) at T = 32: the planner's FP8 direct path, replaced by a loaded
// entry's sorted path on the FP8 GEMMs; the bf16 layer of the same sizes keeps its plan.
TEST(TuningRegistry, Fp8LayerUsesItsLoadedEntryGpu) {
  MOEKIT_REQUIRE_GPU();
  clear_tuning_tables();
  FusedMoEArgs a = qwen30_args(32, DType::kFP8E4M3);
  a.quant.scheme = QuantScheme::kFp8PerChannel;
  a.quant.w_gate_up_scale = planner_test::null_view(DType::kF32, {128, 2 * 768});
  a.quant.w_down_scale = planner_test::null_view(DType::kF32, {128, 2048});
  const LayerPlan planned = plan_fused_moe(a);
  ASSERT_EQ(to_string(planned), "direct");
  const LayerPlan* sorted = nullptr;
  const std::vector<LayerPlan> all = fused_moe_plan_candidates(a);
  for (const LayerPlan& c : all)
    if (c.routed == RoutedPath::kSorted) sorted = &c;
  ASSERT_NE(sorted, nullptr);
  const FusedMoEArgs bf16 = qwen30_args(32);
  const LayerPlan bf16_planned = plan_fused_moe(bf16);
  load_tuning_table_text(std::string(kHeader) + detail::device_name() +
                         " | fused_moe | bf16 fp8_per_channel | 128 | 2048 | 768 | 8 | softmax | 0 "
                         "| all | 32 | " +
                         to_string(*sorted) + " | 1 | 2\n");
  EXPECT_EQ(plan_fused_moe(a), *sorted);
  EXPECT_EQ(plan_fused_moe(bf16), bf16_planned);
  clear_tuning_tables();
  EXPECT_EQ(plan_fused_moe(a), planned);
}

}  // namespace
}  // namespace moekit
