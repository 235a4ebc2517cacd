// CPU tests of the benchmark's workload list: parsing, the 132 seed rows, filters,
// the quick subset, shape expressions and --tokens re-shaping.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <stdexcept>

#include "workload.h"

namespace moekit::bench {
namespace {

const std::vector<Workload>& seed() {
  static const std::vector<Workload> w = parse_workloads(builtin_workloads_json());
  return w;
}

const Workload& find(const std::string& op, const std::string& name) {
  for (const Workload& w : seed())
    if (w.op == op && w.name == name) return w;
  throw std::runtime_error("no workload " + op + "/" + name);
}

std::vector<int64_t> shape(const Workload& w, const std::string& t) {
  const TensorSpec* s = w.tensor(t);
  if (!s) throw std::runtime_error("no tensor " + t + " in " + w.name);
  return s->shape;
}

TEST(SeedWorkloads, AllRowsOfTheTwelveOpsArePresent) {
  std::vector<Row> rows = expand_rows(seed());
  EXPECT_EQ(rows.size(), 132u);
  std::map<std::string, int> per_op;
  for (const Row& r : rows) ++per_op[r.w.op];
  const std::map<std::string, int> expected = {
      {"FusedMoEFwd", 9},        {"FusedMoESharedExpertFwd", 23}, {"FusedTopKFwd", 17},
      {"MoEPrePermuteFwd", 7},   {"MoEPermuteAlignFwd", 12},      {"MoEPostPermuteFwd", 9},
      {"MoEGroupedGemmFwd", 11}, {"MoEGroupedGemmFP8Fwd", 14},    {"MoEExpertMLPFwd", 8},
      {"FusedMoEExpertsFwd", 8}, {"IndexedExpertMLPFwd", 8},      {"SharedExpertMLPFwd", 6},
  };
  EXPECT_EQ(per_op, expected);
  // Every seed row carries the page's own device time.
  for (const Row& r : rows) {
    ASSERT_TRUE(r.page.has_value()) << r.w.op << " " << r.w.name << " " << r.dtype;
    EXPECT_GT(r.page->ours_ms, 0) << r.w.name;
  }
}

TEST(SeedWorkloads, ShapesAndParamsAsThePageGivesThem) {
  const Workload& k = find("FusedMoESharedExpertFwd", "kimi-k2-t32");
  EXPECT_EQ(shape(k, "hidden_states"), (std::vector<int64_t>{32, 7168}));
  EXPECT_EQ(shape(k, "w_gate_up"), (std::vector<int64_t>{384, 4096, 7168}));
  EXPECT_EQ(shape(k, "w_down"), (std::vector<int64_t>{384, 7168, 2048}));
  EXPECT_EQ(shape(k, "shared_w_gate_up"), (std::vector<int64_t>{36864, 7168}));
  EXPECT_EQ(shape(k, "shared_w_down"), (std::vector<int64_t>{7168, 18432}));
  EXPECT_EQ(k.tensor("gating_output")->dtype, "f32");
  EXPECT_EQ(k.param("scoring_func"), "sigmoid");
  EXPECT_DOUBLE_EQ(k.float_param("routed_scaling_factor", 0), 2.827);
  EXPECT_TRUE(k.bool_param("renormalize", false));

  const Workload& g = find("FusedMoEFwd", "ds-v3-grouped-prefill");
  EXPECT_EQ(g.int_param("num_expert_group", 0), 8);
  EXPECT_EQ(g.int_param("topk_group", 0), 4);
  EXPECT_EQ(g.int_param("top_k", 0), 8);

  const Workload& f = find("MoEGroupedGemmFP8Fwd", "kimi-k2-dec-b256-down");
  EXPECT_EQ(shape(f, "a"), (std::vector<int64_t>{48, 256, 2048}));
  EXPECT_EQ(shape(f, "a_scale"), (std::vector<int64_t>{48, 256, 16}));
  EXPECT_EQ(shape(f, "b_scale"), (std::vector<int64_t>{48, 56, 16}));
  EXPECT_EQ(f.int_param("T", 0), 256);
  EXPECT_EQ(f.dtypes, (std::vector<std::string>{"fp8e4m3"}));

  const Workload& s = find("MoEGroupedGemmFwd", "ds-v3-decode-swiglu");
  EXPECT_EQ(s.param("activation"), "silu_and_mul");
  EXPECT_EQ(shape(s, "b"), (std::vector<int64_t>{256, 4096, 7168}));

  const Workload& p = find("MoEPostPermuteFwd", "decode-t32");
  EXPECT_EQ(p.dtypes, (std::vector<std::string>{"f16", "bf16", "f16/f16", "bf16/bf16"}));
  EXPECT_EQ(shape(p, "inverse_indices"), (std::vector<int64_t>{64}));

  const Workload& a = find("MoEPermuteAlignFwd", "kimi-k2-t4096");
  EXPECT_EQ(a.int_param("num_experts", 0), 384);
  EXPECT_EQ(shape(a, "topk_ids"), (std::vector<int64_t>{4096, 8}));

  const Workload& t = find("FusedTopKFwd", "ds-v3-grouped-t64");
  EXPECT_EQ(t.dtypes, (std::vector<std::string>{"bf16", "f16", "f32"}));
  EXPECT_DOUBLE_EQ(t.results.at("f32").ours_ms, 0.00362);
  EXPECT_DOUBLE_EQ(t.results.at("f32").alternatives_ms.at("vllm"), 0.00435);
}

TEST(SeedWorkloads, MaskedRowsDefaultToThreeQuartersOfCapacity) {
  // ds-v3-ep8-masked gives no T: the page's 372 TFLOP/s at 0.4851 ms is 3072 rows.
  const Workload& m = find("MoEGroupedGemmFwd", "ds-v3-ep8-masked");
  EXPECT_EQ(masked_total_rows(m), 3072);
  EXPECT_EQ(masked_total_rows(find("MoEGroupedGemmFP8Fwd", "ds-v3-e8-up-masked")), 768);
}

TEST(Workloads, ShapeExpressions) {
  EXPECT_EQ(eval_dim("4096"), 4096);
  EXPECT_EQ(eval_dim("2 * 2048"), 4096);
  EXPECT_EQ(eval_dim("(512 + 512) * 8 / 2"), 4096);
  EXPECT_EQ(eval_dim("10-3-2"), 5);
  EXPECT_THROW(eval_dim("T * 8"), std::invalid_argument);
  EXPECT_THROW(eval_dim("4 /0"), std::invalid_argument);
  EXPECT_THROW(eval_dim("(4"), std::invalid_argument);
  EXPECT_THROW(eval_dim(""), std::invalid_argument);
}

TEST(Workloads, UserFilesNeedNoPageFigures) {
  const char* text = R"({"ops": [{"op": "SharedExpertMLPFwd", "workloads": [
      {"name": "mine", "tensors": {"hidden_states": {"shape": ["7", "2 * 64"]},
       "w_gate_up": {"shape": [256, 128]}, "w_down": {"shape": ["128", "128"]}},
       "dtypes": ["bf16", "f16"]}]}]})";
  std::vector<Workload> w = parse_workloads(text);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(shape(w[0], "hidden_states"), (std::vector<int64_t>{7, 128}));
  std::vector<Row> rows = expand_rows(w);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_FALSE(rows[0].page.has_value());
}

TEST(Workloads, MalformedFilesNameTheProblem) {
  EXPECT_THROW(parse_workloads("{"), std::runtime_error);
  EXPECT_THROW(parse_workloads(R"({"ops": 3})"), std::runtime_error);
  try {
    parse_workloads(R"({"ops": [{"op": "X", "workloads": [{"name": "w1", "tensors": {}}]}]})");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("X/w1"), std::string::npos) << e.what();
  }
}

TEST(Workloads, FiltersAreCommaSeparatedSubstrings) {
  std::vector<Row> rows = expand_rows(seed());
  auto count = [&](Filters f) {
    int n = 0;
    for (const Row& r : rows) n += row_matches(r, f);
    return n;
  };
  EXPECT_EQ(count({"FusedTopK", "", ""}), 17);
  EXPECT_EQ(count({"FusedTopK", "", "f32"}), 3);
  EXPECT_EQ(count({"", "", "fp8"}), 14);
  EXPECT_EQ(count({"PrePermute,PostPermute", "", ""}), 16);
  EXPECT_EQ(count({"", "kimi-k2-t512", ""}), 1 + 1 + 3 + 1 + 1);  // incl. the -bias rows
  EXPECT_EQ(count({"", "", ""}), 132);
}

TEST(Workloads, QuickSubsetCoversEveryOp) {
  std::vector<Row> q = quick_subset(expand_rows(seed()));
  std::set<std::string> ops;
  for (const Row& r : q) ops.insert(r.w.op);
  EXPECT_EQ(ops.size(), 12u);
  EXPECT_GE(q.size(), 20u);
  EXPECT_LE(q.size(), 26u);
}

TEST(Tokens, ParsesListsAndRanges) {
  EXPECT_EQ(parse_token_list("1-4,31,33"), (std::vector<int64_t>{1, 2, 3, 4, 31, 33}));
  EXPECT_EQ(parse_token_list("8"), (std::vector<int64_t>{8}));
  EXPECT_EQ(parse_token_list("3,1-3"), (std::vector<int64_t>{3, 1, 2}));  // duplicates dropped
  EXPECT_EQ(parse_token_list("1-16").size(), 16u);
  EXPECT_THROW(parse_token_list(""), std::invalid_argument);
  EXPECT_THROW(parse_token_list("0"), std::invalid_argument);
  EXPECT_THROW(parse_token_list("4-2"), std::invalid_argument);
  EXPECT_THROW(parse_token_list("1,,2"), std::invalid_argument);
  EXPECT_THROW(parse_token_list("a-3"), std::invalid_argument);
  EXPECT_THROW(parse_token_list("-3"), std::invalid_argument);
}

TEST(Tokens, ReshapesTokenTensorsAndKeepsWeights) {
  const Workload& w = find("FusedMoEFwd", "qwen3-235b-decode");
  EXPECT_EQ(token_count(w), 512);
  std::optional<Workload> s = with_tokens(w, 16);
  ASSERT_TRUE(s);
  EXPECT_EQ(shape(*s, "hidden_states"), (std::vector<int64_t>{16, 4096}));
  EXPECT_EQ(shape(*s, "gating_output"), (std::vector<int64_t>{16, 128}));
  EXPECT_EQ(shape(*s, "w_gate_up"), (std::vector<int64_t>{128, 3072, 4096}));
  EXPECT_TRUE(s->results.empty());  // the page's figures are for T=512
  EXPECT_FALSE(with_tokens(w, 512)->results.empty());

  const Workload& e = find("IndexedExpertMLPFwd", "ds-v3-t32");
  std::optional<Workload> e3 = with_tokens(e, 3);
  EXPECT_EQ(shape(*e3, "topk_ids"), (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(shape(*e3, "topk_weights"), (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(shape(*e3, "output"), (std::vector<int64_t>{3, 7168}));

  // PostPermute: the permuted buffer and inverse indices scale with T*K.
  std::optional<Workload> p = with_tokens(find("MoEPostPermuteFwd", "ds-v3-ep8-t100"), 5);
  EXPECT_EQ(shape(*p, "expert_output"), (std::vector<int64_t>{40, 7168}));
  EXPECT_EQ(shape(*p, "inverse_indices"), (std::vector<int64_t>{40}));
  EXPECT_EQ(shape(*p, "topk_weights"), (std::vector<int64_t>{5, 8}));

  // Masked FP8: the page's T is scaled; the buffers keep their capacity.
  std::optional<Workload> f = with_tokens(find("MoEGroupedGemmFP8Fwd", "ds-v3-dec-b64-up"), 7);
  EXPECT_EQ(f->int_param("T", 0), 7);
  EXPECT_EQ(shape(*f, "a"), (std::vector<int64_t>{32, 64, 7168}));

  // Permuted-layout ops: the routed row count.
  std::optional<Workload> g = with_tokens(find("MoEGroupedGemmFwd", "ds-v3-decode-down"), 100);
  EXPECT_EQ(shape(*g, "a"), (std::vector<int64_t>{100, 2048}));
}

TEST(Tokens, ExpandsEveryTokenShapedRow) {
  std::vector<Row> rows = expand_token_rows(seed(), {1, 2});
  EXPECT_EQ(rows.size(), 2 * 132u);  // every seed workload has a token dimension
  EXPECT_EQ(rows[0].tokens, 1);
  EXPECT_EQ(rows[0].display_name(), rows[0].w.name + "@T=1");
}

}  // namespace
}  // namespace moekit::bench
