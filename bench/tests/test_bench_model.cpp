// CPU tests of the FLOP / byte model and the SOL / bound classification, on rows
// computed by hand (and checked against the page's own SOL figures).
#include <gtest/gtest.h>

#include <stdexcept>

#include "model.h"
#include "workload.h"

namespace moekit::bench {
namespace {

Row row(const std::string& op, const std::string& name, const std::string& dtype) {
  static const std::vector<Row> rows = expand_rows(parse_workloads(builtin_workloads_json()));
  for (const Row& r : rows)
    if (r.w.op == op && r.w.name == name && r.dtype == dtype) return r;
  throw std::runtime_error("no row " + op + "/" + name + "/" + dtype);
}

const Ceilings kPage{4.5, 760.0, 1395.0, "page"};  // what the page's SOL figures imply

TEST(CostModel, GroupedGemmDecodeMlpUp) {
  Row r = row("MoEGroupedGemmFwd", "ds-v3-decode-mlp-up", "bf16");
  Cost c = op_cost(r, {4096, 256});
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 4096 * 4096 * 7168);  // 240.5 GFLOP
  // a + all 256 experts' b + c + layout metadata
  EXPECT_DOUBLE_EQ(c.bytes, 58720256.0 + 15032385536.0 + 33554432.0 + 1024.0);
  Sol s = classify(c, false, kPage, 3.4318);
  EXPECT_EQ(s.bound, "mem");
  EXPECT_NEAR(s.sol, 0.98, 0.005);  // the page: 98%
  // Defaults are every row routed and every expert active.
  Cost d = op_cost(r, RoutingStats{});
  EXPECT_DOUBLE_EQ(d.bytes, c.bytes);
}

TEST(CostModel, SwigluOutputIsHalfTheWeightRows) {
  Row r = row("MoEGroupedGemmFwd", "ds-v3-decode-swiglu", "bf16");
  Dims d = row_dims(r);
  EXPECT_TRUE(d.swiglu);
  EXPECT_EQ(d.N, 2048);
  Cost c = op_cost(r, {4096, 256});
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 4096 * 4096 * 7168);
  EXPECT_DOUBLE_EQ(c.bytes, 58720256.0 + 15032385536.0 + 4096.0 * 2048 * 2 + 1024.0);
}

TEST(CostModel, OnlyActiveExpertsCountAndSharedExpertAdds) {
  Row r = row("FusedMoESharedExpertFwd", "kimi-k2-t1", "bf16");
  Cost c = op_cost(r, {8, 8});
  EXPECT_DOUBLE_EQ(c.flops, 6.0 * 8 * 2048 * 7168 + 6.0 * 1 * 18432 * 7168);
  // x and out, 8 experts' weights, f32 gating, bias, the shared expert's weights
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * 7168 * 2 + 8.0 * 3 * 2048 * 7168 * 2 + 384 * 4.0 + 384 * 4.0 +
                                3.0 * 18432 * 7168 * 2);
  Sol s = classify(c, false, kPage, 0.3858);
  EXPECT_EQ(s.bound, "mem");
  EXPECT_NEAR(s.sol, 0.86, 0.005);  // the page: 86%
  // kimi-k2-t32 at the page's 98% implies ~107 active experts.
  Cost c32 = op_cost(row("FusedMoESharedExpertFwd", "kimi-k2-t32", "bf16"), {256, 107});
  EXPECT_NEAR(classify(c32, false, kPage, 2.3044).sol, 0.98, 0.01);
}

TEST(CostModel, FusedMoeExpertsCountsRoutes) {
  Row r = row("FusedMoEExpertsFwd", "qwen3-235b-decode", "bf16");
  Cost c = op_cost(r, {4096, 128});
  EXPECT_DOUBLE_EQ(c.flops, 6.0 * 4096 * 1536 * 4096);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * 512 * 4096 * 2 + 512 * 8 * 8.0 + 128.0 * 3 * 1536 * 4096 * 2);
  EXPECT_NEAR(c.flops / (1.1971e-3) / 1e12, 129, 0.5);  // the page's TFLOP/s
}

TEST(CostModel, PrePermuteIsLatencyBound) {
  Row r = row("MoEPrePermuteFwd", "ds-v3-ep8-t100", "bf16");
  Cost c = op_cost(r, {800, 32});
  EXPECT_DOUBLE_EQ(c.flops, 0);
  EXPECT_DOUBLE_EQ(c.bytes, 1433600.0 + 3200 + 11468800 + 128 + 3200);
  Sol s = classify(c, false, kPage, 0.00762);
  EXPECT_EQ(s.bound, "lat");
  EXPECT_NEAR(s.sol, 0.38, 0.005);  // the page: 38%
}

TEST(CostModel, PostPermuteOutputDtype) {
  Row r = row("MoEPostPermuteFwd", "ds-v3-ep8-t100", "bf16");
  Cost c = op_cost(r, {800, -1});
  EXPECT_DOUBLE_EQ(c.bytes, 800.0 * 7168 * 2 + 100 * 8 * 8.0 + 100.0 * 7168 * 2);
  EXPECT_NEAR(classify(c, false, kPage, 0.00614).sol, 0.47, 0.005);  // the page: 47%
}

TEST(CostModel, SharedExpertMlpIsComputeBoundAtT512) {
  Row r = row("SharedExpertMLPFwd", "kimi-k2-t512", "bf16");
  Cost c = op_cost(r, {});
  EXPECT_DOUBLE_EQ(c.flops, 6.0 * 512 * 18432 * 7168);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * 512 * 7168 * 2 + 3.0 * 18432 * 7168 * 2);
  Sol s = classify(c, false, kPage, 0.6036);
  EXPECT_EQ(s.bound, "comp");
  EXPECT_NEAR(s.sol, 0.88, 0.01);  // the page: 88%
}

// A FusedMoEFwd row of bench/workloads/fp8.json's form: e4m3 weights and their scales.
Row fp8_layer_row(const std::string& quant) {
  const std::string json = R"({"ops": [{"op": "FusedMoEFwd", "workloads": [{"name": "ds-v3-fp8",
    "tensors": {"hidden_states": {"shape": ["1", "7168"]},
                "gating_output": {"shape": ["1", "256"], "dtype": "f32"},
                "w_gate_up": {"shape": ["256", "4096", "7168"], "dtype": "fp8e4m3"},
                "w_down": {"shape": ["256", "7168", "2048"], "dtype": "fp8e4m3"}},
    "params": {"top_k": "8", "weight_quant": ")" +
                           quant + R"("}, "dtypes": ["bf16"]}]}]})";
  return expand_rows(parse_workloads(json)).at(0);
}

TEST(CostModel, Fp8WeightRowsCountE4m3BytesAndScales) {
  const Row block = fp8_layer_row("fp8_block128");
  EXPECT_TRUE(weight_quant_fp8(block));
  const Cost c = op_cost(block, {8, 8});
  // 8 active experts: 3*F*H e4m3 bytes and (32*56 + 56*16) f32 block scales each; x in and
  // out (bf16); the logits (f32).
  const double per_expert = 3.0 * 2048 * 7168 + (32.0 * 56 + 56.0 * 16) * 4;
  EXPECT_DOUBLE_EQ(c.bytes, 8 * per_expert + 2.0 * 7168 * 2 + 256.0 * 4);
  EXPECT_DOUBLE_EQ(weight_scale_bytes(fp8_layer_row("fp8_per_channel"), 7168, 2048),
                   (2.0 * 2048 + 7168) * 4);
  EXPECT_DOUBLE_EQ(weight_scale_bytes(fp8_layer_row("fp8_per_tensor"), 7168, 2048), 8.0);
  EXPECT_FALSE(weight_quant_fp8(row("FusedMoEFwd", "qwen3-235b-decode", "bf16")));
}

TEST(CostModel, Fp8MaskedUsesTheFp8Peak) {
  Row r = row("MoEGroupedGemmFP8Fwd", "ds-v3-e8-up-masked", "fp8e4m3");
  EXPECT_TRUE(uses_fp8_peak(r.w.op));
  Dims d = row_dims(r);
  EXPECT_TRUE(d.masked);
  EXPECT_EQ(d.T, 768);
  Cost c = op_cost(r, {768, 8});
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 768 * 4096 * 7168);
  EXPECT_DOUBLE_EQ(c.bytes, 768.0 * 7168 + 768 * 56 * 4.0 + 8 * (4096.0 * 7168 + 32 * 56 * 4) +
                                768.0 * 4096 * 2 + 8 * 4);
  Sol s = classify(c, true, kPage, 0.0743);
  EXPECT_EQ(s.bound, "mem");
  EXPECT_NEAR(s.sol, 0.74, 0.005);  // the page: 74%
  // The same FLOPs against the bf16 peak would be slower (comp time grows).
  EXPECT_GT(classify(c, false, kPage, 0).comp_ms, s.comp_ms);
  // Default stats for a masked row: min(T, capacity) rows.
  EXPECT_EQ(full_routing(r).routed_rows, 768);
}

TEST(CostModel, PermuteAlignCountsPaddedOutputs) {
  Row r = row("MoEPermuteAlignFwd", "kimi-k2-t4096", "i32");
  Cost c = op_cost(r, {});
  const double routes = 4096 * 8, sorted = routes + 384 * 63, blocks = 890;
  EXPECT_DOUBLE_EQ(c.bytes, routes * 4 + sorted * 4 + blocks * 4 + 4);
}

TEST(CostModel, TopKReadsLogitsInTheRowDtype) {
  Cost bf = op_cost(row("FusedTopKFwd", "kimi-k2-t512-bias", "bf16"), {});
  Cost f32 = op_cost(row("FusedTopKFwd", "kimi-k2-t512-bias", "f32"), {});
  EXPECT_DOUBLE_EQ(bf.bytes, 512 * 384 * 2.0 + 384 * 4 + 512 * 8 * 8.0);
  EXPECT_DOUBLE_EQ(f32.bytes - bf.bytes, 512 * 384 * 2.0);
}

// SharedExpertMLP ds-v3-t32 (89 MB, ideal 19.6 us at 4.53 TB/s) is timed as a graph of
// back-to-back calls on every GPU: on one that measured 4.44 TB/s its ideal (20.2 us)
// crossed the 20 us line and the row ran L2-flushed, 25% slower (session 13).
TEST(Classify, TimingModeGoesByTheNominalCeilings) {
  Row r = row("SharedExpertMLPFwd", "ds-v3-t32", "bf16");
  Cost c = op_cost(r, {});
  EXPECT_LT(timing_ideal_ms(c, false), 0.020);
  EXPECT_GT(classify(c, false, Ceilings{4.44, 784.0, 1428.0, "slow read"}, 0).ideal_ms, 0.020);
  EXPECT_DOUBLE_EQ(timing_ideal_ms(c, false), classify(c, false, Ceilings{}, 0).ideal_ms);
}

TEST(Classify, BoundsAndLatency) {
  Ceilings c{4.0, 800.0, 1600.0, "test"};
  // 4 GB at 4 TB/s = 1 ms; 0.4 TFLOP at 800 TFLOP/s = 0.5 ms -> memory bound.
  Sol m = classify({4e11, 4e9}, false, c, 2.0);
  EXPECT_EQ(m.bound, "mem");
  EXPECT_DOUBLE_EQ(m.ideal_ms, 1.0);
  EXPECT_DOUBLE_EQ(m.sol, 0.5);
  Sol k = classify({1.6e12, 4e9}, false, c, 2.0);
  EXPECT_EQ(k.bound, "comp");
  EXPECT_DOUBLE_EQ(k.ideal_ms, 2.0);
  EXPECT_DOUBLE_EQ(classify({1.6e12, 4e9}, true, c, 0).ideal_ms, 1.0);
  // Under 5 us ideal: latency.
  EXPECT_EQ(classify({0, 1.9e7}, false, c, 0.01).bound, "lat");
  EXPECT_EQ(classify({0, 2.1e7}, false, c, 0.01).bound, "mem");
  EXPECT_DOUBLE_EQ(classify({0, 4e9}, false, c, 0).sol, 0);  // not measured
}

}  // namespace
}  // namespace moekit::bench
