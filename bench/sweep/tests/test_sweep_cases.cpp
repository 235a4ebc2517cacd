// CPU tests of the random sweep's case generator (bench/sweep/sweep_case.h): a seed names
// the same cases every time, the draws cover every op, path family, forced value and MLP
// activation, no drawn case breaks a limit of the library's validation, and a case's spec
// line reproduces it.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "sweep_case.h"

namespace moekit::sweep {
namespace {

constexpr int64_t kDraws = 10000;  // the default run's size

const std::vector<SweepCase>& drawn() {
  static const std::vector<SweepCase> cases = [] {
    std::vector<SweepCase> v;
    for (int64_t i = 0; i < kDraws; ++i) v.push_back(draw_case(7, i, default_limits()));
    return v;
  }();
  return cases;
}

TEST(SweepCases, ASeedNamesTheSameCases) {
  for (int64_t i = 0; i < 300; ++i) {
    EXPECT_EQ(format_spec(draw_case(7, i, default_limits())), format_spec(drawn()[i]));
    EXPECT_EQ(drawn()[i].index, i);
    EXPECT_EQ(static_cast<int>(drawn()[i].op), i % kOpCount);
  }
  int same = 0;
  for (int64_t i = 0; i < 300; ++i) {
    same += format_spec(draw_case(8, i, default_limits())) == format_spec(drawn()[i]);
  }
  EXPECT_LT(same, 5) << "another seed draws other cases";
}

TEST(SweepCases, EveryDrawnCaseIsValid) {
  for (const Limits& lim : {default_limits(), large_limits()}) {
    for (int64_t i = 0; i < kDraws; ++i) {
      const SweepCase c =
          lim.max_flops == default_limits().max_flops ? drawn()[i] : draw_case(3, i, lim);
      EXPECT_EQ(invalid_reason(c), "") << format_spec(c);
      // Within the caps, unless only T (never shrunk) keeps it above them.
      if (case_flops(c) > lim.max_flops || case_bytes(c) > lim.max_bytes) {
        EXPECT_TRUE((c.H <= 16 || c.N <= 8) && c.E == 1) << format_spec(c);
      }
    }
  }
}

TEST(SweepCases, CoversEveryOpFamilyAndForcedValue) {
  std::map<int, std::set<std::string>> families;
  std::set<int> gemm_plans, fp8_plans, mlp_plans, dense_paths;
  std::set<int> routed_paths;
  for (const SweepCase& c : drawn()) {
    families[static_cast<int>(c.op)].insert(c.family);
    if (c.op == Op::kGroupedGemm) gemm_plans.insert(c.knobs.gemm_plan);
    if (c.op == Op::kGroupedGemmFp8) fp8_plans.insert(c.knobs.fp8_plan);
    if (c.op == Op::kExpertMlp) mlp_plans.insert(c.knobs.mlp_plan);
    if (c.op == Op::kSharedExpertMlp) dense_paths.insert(c.knobs.dense_path);
    if (c.op == Op::kFusedMoe) routed_paths.insert(c.knobs.routed_path);
  }
  for (int op = 0; op < kOpCount; ++op) {
    const std::vector<std::string>& want = op_families(static_cast<Op>(op));
    EXPECT_EQ(families[op], std::set<std::string>(want.begin(), want.end()))
        << op_name(static_cast<Op>(op));
  }
  // The planner's plan and forced candidates (indices taken modulo the candidates).
  EXPECT_GE(gemm_plans.size(), 14u);
  EXPECT_EQ(fp8_plans, (std::set<int>{-1, 0, 1, 2, 3}));
  EXPECT_GE(mlp_plans.size(), 14u);
  EXPECT_EQ(dense_paths, (std::set<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(routed_paths, (std::set<int>{0, 1, 2}));
}

TEST(SweepCases, CoversTheEdges) {
  std::map<std::string, int> seen;
  for (const SweepCase& c : drawn()) {
    seen["T=0"] += c.T == 0;
    seen["T=1"] += c.T == 1;
    seen["T>=32768"] += c.T >= 32768;
    seen["E=1"] += c.E == 1 && c.op != Op::kPostPermute && c.op != Op::kSharedExpertMlp;
    seen["E odd > 1"] += c.E > 1 && c.E % 2 == 1;
    seen["E=512 topk"] += c.E == 512 && c.op == Op::kFusedTopK;
    seen["E=512 permute"] += c.E == 512 && c.op == Op::kPrePermute;
    seen["E=1024 gemm"] += c.E == 1024 && c.op == Op::kGroupedGemm;
    seen["E>512 indexed"] += c.E > 512 && c.op == Op::kIndexedExpertMlp;
    seen["E=1024 topk"] += c.E == 1024 && c.op == Op::kFusedTopK;
    seen["E=1024 permute"] += c.E == 1024 && c.op == Op::kPermuteAlign;
    seen["E odd >512 topk"] += c.E > 512 && c.E % 2 == 1 && c.op == Op::kFusedTopK;
    seen["E odd >512 pre-permute"] += c.E > 512 && c.E % 2 == 1 && c.op == Op::kPrePermute;
    seen["E>512 fused_moe_experts"] += c.E > 512 && c.op == Op::kFusedMoeExperts;
    seen["E>512 sorted layer"] += c.E > 512 && c.op == Op::kFusedMoe && c.T * c.K > 16 * c.E;
    seen["K=16"] += c.K == 16;
    seen["K>E"] += c.K > c.E && c.op == Op::kFusedMoeExperts;
    seen["H%16=8"] += c.H % 16 == 8;
    seen["H%128!=0"] += c.H % 128 != 0 && c.H > 128;
    seen["H=0 gemm"] += c.H == 0 && c.op == Op::kGroupedGemm;
    seen["f16"] += c.dtype == DType::kF16;
    seen["f32 in"] += c.dtype == DType::kF32;
    seen["f32 out gemm"] += c.out == DType::kF32 && c.op == Op::kGroupedGemm;
    seen["masked"] += c.masked && c.op == Op::kGroupedGemm;
    if (c.masked && c.T > 0) {  // max_m holds the busiest expert: every row fits
      int64_t rows = 0;
      for (int64_t n : expert_counts(c)) rows += n;
      seen["masked, every row in"] += rows == c.T;
      seen["masked, max_m above the busiest"] += c.max_m > c.T / c.E + 1;
    }
    seen["alignment>1"] += c.alignment > 1;
    seen["odd alignment"] += c.alignment % 2 == 1 && c.alignment > 1;
    seen["silu"] += c.silu;
    seen["skewed"] += c.route == Route::kSkewed;
    seen["one_expert"] += c.route == Route::kOneExpert;
    seen["few_experts"] += c.route == Route::kFewExperts;
    seen["all -1"] += c.drop_pm == 1000;
    seen["-1"] += c.drop_pm > 0;
    seen["repeats"] += c.dup_pm > 0;
    seen["out of range"] += c.oor_pm > 0;
    seen["groups"] += c.groups > 0;
    seen["ties"] += c.levels > 0;
    seen["bias"] += c.bias;
    seen["sigmoid"] += c.sigmoid;
    seen["no shared"] += c.op == Op::kFusedMoeSharedExpert && c.S == 0;
    seen["no workspace"] += !c.workspace;
    seen["expert map"] += c.ep_ranks > 1 && c.op == Op::kFusedMoeExperts;
    seen["expert map, direct"] += c.ep_ranks > 1 && c.op == Op::kIndexedExpertMlp && c.T <= 64;
    seen["expert map, fused_moe"] += c.ep_ranks > 1 && c.op == Op::kFusedMoe;
    seen["expert map, shared-expert layer"] +=
        c.ep_ranks > 1 && c.op == Op::kFusedMoeSharedExpert && c.S > 0;
    seen["expert map, layer with a bias"] += c.ep_ranks > 1 && c.op == Op::kFusedMoe && c.bias;
    seen["i64 ids"] += c.ids64;
    seen["on_input experts"] += c.on_input && c.op == Op::kIndexedExpertMlp;
    seen["on_input layer"] += c.on_input && c.op == Op::kFusedMoe;
    const bool general = general_mlp(c);
    seen["general, on_input"] += general && c.on_input;
    seen["general, expert map"] += general && c.ep_ranks > 1;
    seen["general, i64 ids"] += general && c.ids64;
    seen["general, T=0"] += general && c.T == 0;
    seen["general, T=1"] += general && c.T == 1;
    seen["general, padded expert_mlp"] += general && c.op == Op::kExpertMlp && c.alignment > 1;
    seen["general, forced direct (falls back)"] += general && c.knobs.routed_path == 1;
    seen["general, forced dense path (falls back)"] += general && c.knobs.dense_path == 4;
    seen["general, forced expert-MLP plan"] += general && c.knobs.mlp_plan >= 0;
    seen["general, no shared expert"] += general && c.op == Op::kFusedMoeSharedExpert && c.S == 0;
    seen["shared bias, silu routed"] += c.shared_down_bias != DType::kUndefined && !general;
    seen["relu2 shared expert"] += c.act == Activation::kRelu2 && c.S > 0;
    seen["gpt-oss layer"] +=
        c.op == Op::kFusedMoe && c.H == 2880 && c.K == 4 && c.act == Activation::kSwigluOai &&
        c.gate_up_bias != DType::kUndefined && c.down_bias != DType::kUndefined;
    seen["gpt-oss shape, silu"] += c.H == 2880 && c.K == 4 && !general;
    seen["H%128=64 indexed"] += c.H % 128 == 64 && c.op == Op::kIndexedExpertMlp;
  }
  for (const auto& [what, n] : seen) EXPECT_GT(n, 0) << what;
}

// Every activation on every MLP op, biases of both dtypes on both GEMMs, only on MLP ops.
TEST(SweepCases, CoversEveryActivationAndBias) {
  std::map<Op, std::set<Activation>> acts;
  std::map<std::string, int> seen;
  int mlp = 0, general = 0;
  for (const SweepCase& c : drawn()) {
    const bool biased = c.gate_up_bias != DType::kUndefined || c.down_bias != DType::kUndefined ||
                        c.shared_gate_up_bias != DType::kUndefined ||
                        c.shared_down_bias != DType::kUndefined;
    if (!mlp_op(c.op)) {
      EXPECT_TRUE(c.act == Activation::kSiluAndMul && !biased) << format_spec(c);
      continue;
    }
    ++mlp;
    general += general_mlp(c);
    acts[c.op].insert(c.act);
    const std::string op = op_name(c.op);
    const auto bias = [&](const char* what, DType b) {
      if (b == DType::kF32) ++seen[op + " " + what + " f32"];
      if (b != DType::kUndefined && b == c.dtype) ++seen[op + " " + what + " dtype"];
    };
    bias("gate_up_bias", c.gate_up_bias);
    bias("down_bias", c.down_bias);
    seen[op + " biased " + activation_key(c.act)] += biased;
    if (c.op == Op::kFusedMoeSharedExpert) {
      bias("shared_gate_up_bias", c.shared_gate_up_bias);
      bias("shared_down_bias", c.shared_down_bias);
    }
  }
  const Activation all[] = {Activation::kSiluAndMul, Activation::kGeluTanhAndMul,
                            Activation::kGeluAndMul, Activation::kRelu2, Activation::kSwigluOai};
  for (Op op : {Op::kExpertMlp, Op::kFusedMoeExperts, Op::kIndexedExpertMlp, Op::kFusedMoe,
                Op::kFusedMoeSharedExpert, Op::kSharedExpertMlp}) {
    EXPECT_EQ(acts[op], std::set<Activation>(std::begin(all), std::end(all))) << op_name(op);
    for (const char* what : {"gate_up_bias", "down_bias"}) {
      for (const char* dt : {" f32", " dtype"})
        EXPECT_GT(seen[std::string(op_name(op)) + " " + what + dt], 0) << op_name(op) << what << dt;
    }
    for (Activation a : all)
      EXPECT_GT(seen[std::string(op_name(op)) + " biased " + activation_key(a)], 0)
          << op_name(op) << " " << activation_key(a);
  }
  for (const char* what : {"shared_gate_up_bias f32", "shared_gate_up_bias dtype",
                           "shared_down_bias f32", "shared_down_bias dtype"})
    EXPECT_GT(seen[std::string("fused_moe_shared_expert ") + what], 0) << what;
  // The fused silu kernels keep most cases; the general path a large share.
  EXPECT_GT(general, mlp / 4);
  EXPECT_LT(general, mlp * 2 / 3);
}

// The case's spec line holds `fields` and parses back to the case (returned).
SweepCase spec_round_trip(const SweepCase& c, std::initializer_list<const char*> fields) {
  const std::string spec = format_spec(c);
  for (const char* field : fields)
    EXPECT_NE(spec.find(field), std::string::npos) << field << " in " << spec;
  SweepCase back;
  std::string error;
  EXPECT_TRUE(parse_spec(spec, &back, &error)) << error;
  EXPECT_EQ(back, c);
  return back;
}

// A moe_grouped_gemm_fp8 case with silu_and_mul (contiguous rows, bf16 out).
SweepCase fp8_silu_gemm(int64_t H, int64_t N, int64_t E, Fp8Scales scales) {
  SweepCase g;
  g.op = Op::kGroupedGemmFp8;
  g.dtype = DType::kFP8E4M3;
  g.H = H;
  g.N = N;
  g.E = E;
  g.silu = true;
  g.fp8_scales = scales;
  return g;
}

// FP8 weights: every scheme on every MLP op (silu_and_mul without biases), static
// activation scales, the shared expert's own scheme; the FP8 GEMM's layouts, scale modes,
// silu_and_mul and e4m3 output; none of it elsewhere.
TEST(SweepCases, CoversFp8WeightsAndTheFp8GemmModes) {
  std::map<std::string, int> seen;
  int mlp = 0, fp8 = 0;
  for (const SweepCase& c : drawn()) {
    const std::string op = op_name(c.op);
    if (c.op == Op::kGroupedGemmFp8) {
      seen[op + (c.masked ? " masked" : " contiguous")] += 1;
      seen[op + " contiguous alignment>1"] += !c.masked && c.alignment > 1;
      seen[op + " contiguous tail"] += !c.masked && c.tail > 0;
      seen[op + " " + fp8_scales_key(c.fp8_scales)] += 1;
      seen[op + " silu " + fp8_scales_key(c.fp8_scales)] += c.silu;
      seen[op + " e4m3 out"] += c.out == DType::kFP8E4M3;
      seen[op + " e4m3 out silu"] += c.out == DType::kFP8E4M3 && c.silu;
      if (c.silu && c.fp8_scales == Fp8Scales::kBlock) {
        EXPECT_EQ(c.N % 64, 0) << format_spec(c);
      }
    } else {
      EXPECT_EQ(c.fp8_scales, Fp8Scales::kBlock) << format_spec(c);
      EXPECT_NE(c.out, DType::kFP8E4M3) << format_spec(c);
    }
    if (!mlp_op(c.op)) {
      EXPECT_FALSE(fp8_weights(c)) << format_spec(c);
      continue;
    }
    ++mlp;
    fp8 += c.quant != QuantScheme::kNone;
    if (c.quant != QuantScheme::kNone) {
      EXPECT_FALSE(general_mlp(c)) << format_spec(c);
      const int64_t u = c.quant == QuantScheme::kFp8Block128 ? 128 : 16;
      EXPECT_TRUE(c.H % u == 0 && c.N % u == 0) << format_spec(c);
      seen[op + " " + activation_label(c)] += 1;
      seen[op + " fp8 T>64"] += c.T > 64;
      seen[op + " fp8 T<=64"] += c.T > 0 && c.T <= 64;
    }
    seen[op + " static scales"] += c.static_act != 0;
    seen["static_act=" + std::to_string(c.static_act)] += 1;
    if (c.shared_quant != QuantScheme::kNone) {
      seen["shared " + std::string(activation_label(c))] += 1;
      seen["shared fp8, routed bf16"] += c.quant == QuantScheme::kNone;
    }
    seen["fp8 on_input"] += c.quant != QuantScheme::kNone && c.on_input;
    seen["fp8 expert map"] += c.quant != QuantScheme::kNone && c.ep_ranks > 1;
    seen["fp8 i64 ids"] += c.quant != QuantScheme::kNone && c.ids64;
    seen["fp8 forced direct"] += c.quant != QuantScheme::kNone && c.knobs.routed_path == 1;
    seen["fp8 forced sorted"] += c.quant != QuantScheme::kNone && c.knobs.routed_path == 2;
    seen["fp8 forced dense path"] += c.quant != QuantScheme::kNone && c.knobs.dense_path > 0;
    seen["fp8 forced expert-MLP plan"] += c.quant != QuantScheme::kNone && c.knobs.mlp_plan >= 0;
    seen["fp8 E>1024 indexed"] += c.quant != QuantScheme::kNone && c.E > 1024;
  }
  for (Op op : {Op::kExpertMlp, Op::kFusedMoeExperts, Op::kIndexedExpertMlp, Op::kFusedMoe,
                Op::kFusedMoeSharedExpert, Op::kSharedExpertMlp}) {
    const std::string name = op_name(op);
    for (const char* q : {"fp8_per_tensor", "fp8_per_channel", "fp8_block128"})
      EXPECT_GT(seen[name + " silu_and_mul+" + q], 0) << name << " " << q;
    EXPECT_GT(seen[name + " static scales"], 0) << name;
    if (op != Op::kExpertMlp) {
      EXPECT_GT(seen[name + " fp8 T>64"], 0) << name;
      EXPECT_GT(seen[name + " fp8 T<=64"], 0) << name;
    }
  }
  for (const char* what : {"moe_grouped_gemm_fp8 masked",
                           "moe_grouped_gemm_fp8 contiguous",
                           "moe_grouped_gemm_fp8 contiguous alignment>1",
                           "moe_grouped_gemm_fp8 contiguous tail",
                           "moe_grouped_gemm_fp8 block",
                           "moe_grouped_gemm_fp8 per_channel",
                           "moe_grouped_gemm_fp8 per_tensor",
                           "moe_grouped_gemm_fp8 silu block",
                           "moe_grouped_gemm_fp8 silu per_channel",
                           "moe_grouped_gemm_fp8 silu per_tensor",
                           "moe_grouped_gemm_fp8 e4m3 out",
                           "moe_grouped_gemm_fp8 e4m3 out silu",
                           "static_act=1",
                           "static_act=2",
                           "static_act=3",
                           "shared silu_and_mul+fp8_block128",
                           "shared fp8, routed bf16",
                           "fp8 on_input",
                           "fp8 expert map",
                           "fp8 i64 ids",
                           "fp8 forced direct",
                           "fp8 forced sorted",
                           "fp8 forced dense path",
                           "fp8 forced expert-MLP plan",
                           "fp8 E>1024 indexed"})
    EXPECT_GT(seen[what], 0) << what;
  // About a third of the silu_and_mul cases without biases (35%), no more.
  EXPECT_GT(fp8, mlp / 10);
  EXPECT_LT(fp8, mlp / 3);
}

TEST(SweepCases, Fp8FieldsRoundTrip) {
  SweepCase c;
  c.op = Op::kFusedMoeSharedExpert;
  c.H = c.N = c.S = 128;
  c.quant = QuantScheme::kFp8PerTensor;
  c.shared_quant = QuantScheme::kFp8Block128;
  c.static_act = 2;
  ASSERT_EQ(invalid_reason(c), "");
  SweepCase back =
      spec_round_trip(c, {" quant=fp8_per_tensor", " shared_quant=fp8_block128", " static_act=2"});
  std::string error;
  EXPECT_EQ(back.shared_quant, QuantScheme::kFp8Block128);
  EXPECT_EQ(activation_label(c), "silu_and_mul+fp8_per_tensor(static)");

  SweepCase g = fp8_silu_gemm(256, 64, 3, Fp8Scales::kPerTensor);
  g.out = DType::kFP8E4M3;
  g.alignment = 8;
  g.tail = 5;
  ASSERT_EQ(invalid_reason(g), "");
  spec_round_trip(g, {" fp8_scales=per_tensor", " out=fp8e4m3"});
  EXPECT_EQ(fp8_gemm_label(g), "contiguous+per_tensor+silu+e4m3");
  for (Fp8Scales s : {Fp8Scales::kBlock, Fp8Scales::kPerChannel}) {
    g.fp8_scales = s;
    ASSERT_TRUE(parse_spec(format_spec(g), &back, &error)) << error;
    EXPECT_EQ(back.fp8_scales, s);
  }
  // The defaults print nothing.
  EXPECT_EQ(format_spec(SweepCase()).find("quant="), std::string::npos);
  EXPECT_EQ(format_spec(SweepCase()).find("fp8_scales="), std::string::npos);
  EXPECT_EQ(format_spec(SweepCase()).find("static_act="), std::string::npos);
  EXPECT_FALSE(parse_spec("op=fused_moe quant=int8", &back, &error));
  EXPECT_FALSE(parse_spec("op=moe_grouped_gemm_fp8 fp8_scales=row", &back, &error));
}

TEST(SweepCases, InvalidFp8CasesAreNamed) {
  SweepCase m;
  m.op = Op::kFusedMoe;
  m.T = 4;
  m.E = 8;
  m.K = 2;
  m.H = m.N = 128;
  m.quant = QuantScheme::kFp8Block128;
  ASSERT_EQ(invalid_reason(m), "");
  m.N = 64;  // not whole 128 x 128 blocks
  EXPECT_NE(invalid_reason(m), "");
  m.quant = QuantScheme::kFp8PerChannel;  // 16 is enough
  EXPECT_EQ(invalid_reason(m), "");
  m.H = 72;
  EXPECT_NE(invalid_reason(m), "");
  m.H = 128;
  m.act = Activation::kGeluAndMul;  // the FP8 kernels run silu_and_mul only
  EXPECT_NE(invalid_reason(m), "");
  m.act = Activation::kSiluAndMul;
  m.down_bias = DType::kF32;  // and no bias
  EXPECT_NE(invalid_reason(m), "");
  m.down_bias = DType::kUndefined;
  m.static_act = 1;  // static activation scales: fp8_per_tensor only
  EXPECT_NE(invalid_reason(m), "");
  m.quant = QuantScheme::kFp8PerTensor;
  EXPECT_EQ(invalid_reason(m), "");
  m.static_act = 4;
  EXPECT_NE(invalid_reason(m), "");
  m.static_act = 0;
  m.shared_quant = QuantScheme::kFp8PerTensor;  // no shared expert on fused_moe
  EXPECT_NE(invalid_reason(m), "");
  m.op = Op::kFusedMoeSharedExpert;
  m.S = 0;
  EXPECT_NE(invalid_reason(m), "");
  m.S = 48;
  EXPECT_EQ(invalid_reason(m), "");
  m.shared_gate_up_bias = DType::kF32;
  EXPECT_NE(invalid_reason(m), "");
  m.shared_gate_up_bias = DType::kUndefined;
  m.shared_quant = QuantScheme::kFp8Block128;  // S = 48: not whole blocks
  EXPECT_NE(invalid_reason(m), "");
  SweepCase x;  // moe_expert_mlp: bf16 with FP8 weights
  x.op = Op::kExpertMlp;
  x.T = 10;
  x.E = 2;
  x.H = x.N = 32;
  x.quant = QuantScheme::kFp8PerChannel;
  ASSERT_EQ(invalid_reason(x), "");
  x.dtype = x.out = DType::kF16;
  EXPECT_NE(invalid_reason(x), "");
  SweepCase o = drawn()[static_cast<int>(Op::kPrePermute)];  // no MLP
  o.quant = QuantScheme::kFp8PerChannel;
  EXPECT_NE(invalid_reason(o), "");
  o = drawn()[static_cast<int>(Op::kGroupedGemm)];  // the FP8 GEMM's fields on another op
  o.fp8_scales = Fp8Scales::kPerTensor;
  EXPECT_NE(invalid_reason(o), "");
  SweepCase g = fp8_silu_gemm(128, 96, 2, Fp8Scales::kPerChannel);
  ASSERT_EQ(invalid_reason(g), "");
  g.fp8_scales = Fp8Scales::kBlock;  // silu_and_mul with block scales: N % 64
  EXPECT_NE(invalid_reason(g), "");
  g.N = 128;
  EXPECT_EQ(invalid_reason(g), "");
  g.out = DType::kF16;
  EXPECT_NE(invalid_reason(g), "");
}

TEST(SweepCases, GateUpRowsFollowTheActivation) {
  SweepCase c;
  c.op = Op::kFusedMoe;
  for (Activation a : {Activation::kSiluAndMul, Activation::kGeluTanhAndMul,
                       Activation::kGeluAndMul, Activation::kSwigluOai}) {
    c.act = a;
    EXPECT_EQ(gate_up_rows(c, 40), 80) << activation_key(a);
  }
  c.act = Activation::kRelu2;
  EXPECT_EQ(gate_up_rows(c, 40), 40);
  EXPECT_TRUE(general_mlp(c));
  c.act = Activation::kSiluAndMul;
  EXPECT_FALSE(general_mlp(c));
  c.down_bias = DType::kF32;
  EXPECT_TRUE(general_mlp(c));
  EXPECT_EQ(activation_label(c), "silu_and_mul+bias");
}

TEST(SweepCases, ActivationFieldsRoundTrip) {
  SweepCase c;
  c.op = Op::kFusedMoeSharedExpert;
  c.dtype = c.out = DType::kF16;
  c.S = 64;
  c.act = Activation::kSwigluOai;
  c.gate_up_bias = DType::kF32;
  c.down_bias = DType::kF16;
  c.shared_gate_up_bias = DType::kF16;
  c.shared_down_bias = DType::kF32;
  SweepCase back = spec_round_trip(c, {" act=swiglu_oai", " gate_up_bias=f32", " down_bias=f16",
                                       " shared_gate_up_bias=f16", " shared_down_bias=f32"});
  std::string error;
  EXPECT_EQ(back.act, Activation::kSwigluOai);
  EXPECT_EQ(back.down_bias, DType::kF16);
  EXPECT_EQ(back.shared_down_bias, DType::kF32);
  for (Activation a : {Activation::kGeluTanhAndMul, Activation::kGeluAndMul, Activation::kRelu2}) {
    c.act = a;
    ASSERT_TRUE(parse_spec(format_spec(c), &back, &error)) << error;
    EXPECT_EQ(back.act, a);
  }
  // The defaults (silu_and_mul, no bias) print nothing.
  EXPECT_EQ(format_spec(SweepCase()).find("act="), std::string::npos);
  EXPECT_EQ(format_spec(SweepCase()).find("bias="), std::string::npos);
}

TEST(SweepCases, SpecLinesRoundTrip) {
  for (const SweepCase& c : drawn()) {
    SweepCase back;
    std::string error;
    ASSERT_TRUE(parse_spec(format_spec(c), &back, &error)) << error << ": " << format_spec(c);
    SweepCase want = c;
    want.index = -1;  // a spec names the case, not its place in a sequence
    EXPECT_EQ(back, want) << format_spec(c);
  }
}

TEST(SweepCases, BadSpecsAreRefused) {
  SweepCase c;
  std::string error;
  EXPECT_FALSE(parse_spec("T=3", &c, &error));
  EXPECT_NE(error.find("op"), std::string::npos);
  EXPECT_FALSE(parse_spec("op=fused_moe colour=3", &c, &error));
  EXPECT_NE(error.find("colour"), std::string::npos);
  EXPECT_FALSE(parse_spec("op=fused_moe T=x", &c, &error));
  EXPECT_FALSE(parse_spec("op=no_such_op", &c, &error));
  EXPECT_FALSE(parse_spec("op=fused_moe dtype=f64", &c, &error));
  EXPECT_FALSE(parse_spec("op=fused_moe gemm_plan", &c, &error));
  ASSERT_TRUE(parse_spec("op=moe_grouped_gemm T=5 gemm_plan=3", &c, &error));
  EXPECT_EQ(c.knobs.gemm_plan, 3);
  EXPECT_FALSE(parse_spec("op=fused_moe act=none", &c, &error));  // not an MLP activation
  EXPECT_FALSE(parse_spec("op=fused_moe act=swish", &c, &error));
  EXPECT_FALSE(parse_spec("op=fused_moe down_bias=f64", &c, &error));
}

TEST(SweepCases, InvalidCasesAreNamed) {
  SweepCase c = drawn()[static_cast<int>(Op::kFusedTopK)];
  c.K = c.E + 1;
  EXPECT_NE(invalid_reason(c), "");
  c = drawn()[static_cast<int>(Op::kPermuteAlign)];
  c.block_size = 48;
  EXPECT_NE(invalid_reason(c), "");
  c.block_size = 64;
  c.E = 1025;
  EXPECT_NE(invalid_reason(c), "");
  c.E = 1024;  // past the one-launch kernels' 512: valid
  EXPECT_EQ(invalid_reason(c), "");
  c.E = 513;
  EXPECT_EQ(invalid_reason(c), "");
  c = drawn()[static_cast<int>(Op::kGroupedGemm)];
  c.N = 12;
  EXPECT_NE(invalid_reason(c), "");
  c = drawn()[static_cast<int>(Op::kGroupedGemm)];
  c.ep_ranks = 4;  // engine inputs on an op without them
  EXPECT_NE(invalid_reason(c), "");
  // A layer takes a map with ungrouped routing over at most 1024 global experts.
  c = drawn()[static_cast<int>(Op::kFusedMoe)];
  c.groups = c.topk_group = 0;
  c.E = 128;
  c.K = std::min<int64_t>(c.K, 8);
  c.ep_ranks = 8;
  EXPECT_EQ(invalid_reason(c), "");
  EXPECT_EQ(routing_case(c).E, 1024);
  c.ep_ranks = 16;
  EXPECT_EQ(invalid_reason(c), "ep_ranks");
  c.ep_ranks = 2;
  c.groups = 4;
  c.topk_group = 2;
  EXPECT_EQ(invalid_reason(c), "ep_ranks");
  c = drawn()[static_cast<int>(Op::kFusedMoeExperts)];
  c.K = 2;
  c.on_input = true;
  EXPECT_NE(invalid_reason(c), "");

  // Activations and biases: on MLP ops only, biases f32 or the dtype, the shared ones with a
  // shared expert, and the general path's sorted-path expert limit.
  c = drawn()[static_cast<int>(Op::kGroupedGemm)];
  c.act = Activation::kRelu2;
  EXPECT_NE(invalid_reason(c), "");
  c = drawn()[static_cast<int>(Op::kFusedTopK)];
  c.down_bias = DType::kF32;
  EXPECT_NE(invalid_reason(c), "");
  SweepCase m;
  m.op = Op::kSharedExpertMlp;
  m.T = 4;
  m.H = m.N = 64;
  ASSERT_EQ(invalid_reason(m), "");
  m.act = Activation::kNone;
  EXPECT_NE(invalid_reason(m), "");
  m.act = Activation::kGeluAndMul;
  m.gate_up_bias = DType::kF32;
  m.down_bias = DType::kBF16;
  EXPECT_EQ(invalid_reason(m), "");
  m.down_bias = DType::kF16;  // neither f32 nor the case's bf16
  EXPECT_NE(invalid_reason(m), "");
  m.down_bias = DType::kBF16;
  m.shared_down_bias = DType::kF32;  // no shared expert on this op
  EXPECT_NE(invalid_reason(m), "");
  m.op = Op::kFusedMoeSharedExpert;
  m.E = 8;
  m.K = 2;
  m.S = 0;
  EXPECT_NE(invalid_reason(m), "");
  m.S = 32;
  EXPECT_EQ(invalid_reason(m), "");
  SweepCase d;  // past 1024 experts: the direct path only, silu_and_mul without biases
  d.op = Op::kIndexedExpertMlp;
  d.T = 8;
  d.K = 2;
  d.H = d.N = 64;
  d.E = 2048;
  ASSERT_EQ(invalid_reason(d), "");
  d.act = Activation::kSwigluOai;
  EXPECT_NE(invalid_reason(d), "");
  d.act = Activation::kSiluAndMul;
  d.gate_up_bias = DType::kF32;
  EXPECT_NE(invalid_reason(d), "");
}

TEST(SweepCases, ExpertMapHoldsThisRanksExperts) {
  SweepCase c;
  c.op = Op::kIndexedExpertMlp;
  c.ep_ranks = 4;
  c.E = 16;
  c.K = 4;
  c.T = 300;
  for (uint64_t seed = 1; seed < 20; ++seed) {
    c.data_seed = seed;
    const std::vector<int32_t> map = draw_expert_map(c);
    ASSERT_EQ(map.size(), 64u);
    EXPECT_EQ(map, draw_expert_map(c));
    std::set<int32_t> local;
    for (int32_t v : map) {
      EXPECT_GE(v, -1);
      EXPECT_LE(v, 16);  // 16 = E: one entry past the local experts, skipped
      if (v >= 0 && v < 16) local.insert(v);
    }
    EXPECT_GE(local.size(), 15u);
    const std::vector<int32_t> ids = draw_topk_ids(c);
    EXPECT_TRUE(std::all_of(ids.begin(), ids.end(), [](int32_t v) { return v >= -1 && v < 64; }));
    EXPECT_TRUE(std::any_of(ids.begin(), ids.end(), [](int32_t v) { return v >= 16; }));
  }
  c.ep_ranks = 0;
  EXPECT_TRUE(draw_expert_map(c).empty());
}

TEST(SweepCases, TopkIdsFollowTheRoute) {
  SweepCase c;
  c.op = Op::kFusedMoeExperts;
  c.T = 500;
  c.K = 6;
  c.E = 40;
  c.data_seed = 99;
  for (Route r : {Route::kUniform, Route::kSkewed}) {
    c.route = r;
    c.skew_milli = 1000;
    const std::vector<int32_t> ids = draw_topk_ids(c);
    ASSERT_EQ(ids.size(), 3000u);
    EXPECT_EQ(ids, draw_topk_ids(c));
    for (int64_t t = 0; t < c.T; ++t) {
      std::set<int32_t> row(ids.begin() + t * c.K, ids.begin() + (t + 1) * c.K);
      EXPECT_EQ(row.size(), 6u) << "K distinct ids";
      EXPECT_GE(*row.begin(), 0);
      EXPECT_LT(*row.rbegin(), 40);
    }
  }
  c.route = Route::kOneExpert;
  const std::vector<int32_t> one = draw_topk_ids(c);
  EXPECT_EQ(std::set<int32_t>(one.begin(), one.end()).size(), 1u);
  c.route = Route::kUniform;
  c.drop_pm = 1000;
  const std::vector<int32_t> none = draw_topk_ids(c);
  EXPECT_TRUE(std::all_of(none.begin(), none.end(), [](int32_t v) { return v == -1; }));
}

TEST(SweepCases, CountsAndInverseIndices) {
  SweepCase c;
  c.op = Op::kGroupedGemm;
  c.T = 1000;
  c.E = 17;
  c.data_seed = 5;
  for (Route r : {Route::kUniform, Route::kSkewed, Route::kOneExpert, Route::kEqual}) {
    c.route = r;
    c.skew_milli = 2000;
    const std::vector<int64_t> n = expert_counts(c);
    int64_t sum = 0;
    for (int64_t x : n) sum += x;
    EXPECT_EQ(sum, 1000) << route_name(r);
  }
  c.masked = true;
  c.max_m = 20;
  for (int64_t x : expert_counts(c)) EXPECT_LE(x, 20);

  SweepCase p;
  p.op = Op::kPostPermute;
  p.T = 300;
  p.K = 4;
  p.tail = 9;
  p.data_seed = 6;
  const std::vector<int32_t> inv = draw_inverse(p);
  ASSERT_EQ(inv.size(), 1200u);
  EXPECT_EQ(std::set<int32_t>(inv.begin(), inv.end()).size(), 1200u);
  EXPECT_LT(*std::max_element(inv.begin(), inv.end()), 1209);
}

TEST(SweepCases, NearTiesAreAmbiguousExactTiesAreNot) {
  SweepCase c;
  c.op = Op::kFusedTopK;
  c.E = 4;
  c.K = 2;
  const double clear[4] = {3.0, 1.0, 2.0, 0.0};
  EXPECT_TRUE(topk_row_unambiguous(clear, nullptr, c));
  const double exact[4] = {3.0, 2.0, 2.0, 0.0};  // ties go to the lower id on both sides
  EXPECT_TRUE(topk_row_unambiguous(exact, nullptr, c));
  const double near[4] = {3.0, 2.0, 2.0 + 1e-9, 0.0};
  EXPECT_FALSE(topk_row_unambiguous(near, nullptr, c));
  const double past_k[4] = {3.0, 2.0, 1.0, 1.0 + 1e-9};  // the (K+1)-th pair does not matter
  EXPECT_TRUE(topk_row_unambiguous(past_k, nullptr, c));
  c.groups = 2;
  c.topk_group = 1;
  const double groups[4] = {2.0, 0.0, 2.0 + 1e-9, 0.0};  // the kept group is a near-tie
  EXPECT_FALSE(topk_row_unambiguous(groups, nullptr, c));
}

}  // namespace
}  // namespace moekit::sweep
