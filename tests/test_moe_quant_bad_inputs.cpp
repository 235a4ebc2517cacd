// Quantized weights (moekit/quant.h) on the CPU: every rejection of a WeightQuant that does
// not fit the weights (scheme vs dtype, scale dtypes and shapes, K not a multiple of the
// block, static activation scales off per-tensor, plans that cannot run FP8 weights), with
// the exact argument and message; the plans FP8 weights get (past the decode kernels the
// FP8 GEMMs, refused off sm_90 devices); and valid FP8 calls getting through every check to
// the launch target on a machine without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bad_inputs_table.h"
#include "core/device.h"
#include "moekit/moekit.h"

namespace moekit {
namespace {

constexpr int64_t kT = 4, kH = 256, kE = 8, kF = 128, kK = 2;

int64_t blocks(int64_t n) {
  return (n + 127) / 128;
}

// The scales of `scheme` for experts of hidden size H and width F (`experts`: the E axis).
WeightQuant quant_for(QuantScheme scheme, int64_t E, int64_t H, int64_t F, bool experts = true) {
  WeightQuant q;
  q.scheme = scheme;
  const auto with_e = [&](std::initializer_list<int64_t> dims) {
    std::vector<int64_t> shape;
    if (experts) shape.push_back(E);
    shape.insert(shape.end(), dims);
    return make_view(slot(g_next_slot++ % 48), kF32, static_cast<int>(shape.size()), shape.data());
  };
  switch (scheme) {
    case QuantScheme::kNone:
      break;
    case QuantScheme::kFp8PerTensor:
      q.w_gate_up_scale = experts ? with_e({}) : fake(kF32, {1});
      q.w_down_scale = experts ? with_e({}) : fake(kF32, {1});
      break;
    case QuantScheme::kFp8PerChannel:
      q.w_gate_up_scale = with_e({2 * F});
      q.w_down_scale = with_e({H});
      break;
    case QuantScheme::kFp8Block128:
      q.w_gate_up_scale = with_e({blocks(2 * F), blocks(H)});
      q.w_down_scale = with_e({blocks(H), blocks(F)});
      break;
  }
  return q;
}

void fp8_experts(FusedMoEExpertsArgs& a, QuantScheme scheme, int64_t T, int64_t H, int64_t F) {
  a.hidden_states = fake(kBF, {T, H});
  a.w_gate_up = fake(kFP8, {kE, 2 * F, H});
  a.w_down = fake(kFP8, {kE, H, F});
  a.quant = quant_for(scheme, kE, H, F);
  a.topk_weights = fake(kF32, {T, kK});
  a.topk_ids = fake(kI32, {T, kK});
  a.output = fake(kBF, {T, H});
}

FusedMoEExpertsArgs fp8_experts_valid() {
  FusedMoEExpertsArgs a;
  fp8_experts(a, QuantScheme::kFp8Block128, kT, kH, kF);
  a.workspace = fake_ws();
  return a;
}

// bf16 weights without a scheme and without scales (a row then gives one scale back).
void unquantized(FusedMoEExpertsArgs& a) {
  a.w_gate_up.dtype = kBF;
  a.w_down.dtype = kBF;
  a.quant = WeightQuant{};
}

std::vector<Row<FusedMoEExpertsArgs>> quant_rows() {
  return {
      {"scheme", [](auto& a) { a.quant.scheme = static_cast<QuantScheme>(9); }, "quant.scheme",
       "a QuantScheme: kNone, kFp8PerTensor, kFp8PerChannel or kFp8Block128", "value 9"},
      {"dtype", [](auto& a) { a.quant = WeightQuant{}; }, "w_gate_up",
       "bf16 / f16 weights (e4m3 weights need a FP8 scheme in quant.scheme)",
       "fp8e4m3[8, 256, 256] with quant.scheme none"},
      {"dtype", [](auto& a) { a.w_gate_up.dtype = kBF; }, "w_gate_up",
       "fp8e4m3 weights (quant.scheme fp8_block128)", "bf16[8, 256, 256]"},
      {"dtype", [](auto& a) { a.w_down.dtype = kBF; }, "w_down",
       "fp8e4m3 weights (quant.scheme fp8_block128)", "bf16[8, 256, 128]"},
      {"weight shape",
       [](auto& a) {
         a.w_down = fake(kFP8, {kE, kH, 64});
       },
       "w_down", "shape [8, 256, 128]", "fp8e4m3[8, 256, 64]"},
      {"misaligned", [](auto& a) { a.w_gate_up = shifted(a.w_gate_up, 8); }, "w_gate_up",
       "data aligned to 16 bytes", "pointer 0x"},
      {"block", [](auto& a) { fp8_experts(a, QuantScheme::kFp8Block128, kT, 192, kF); },
       "w_gate_up",
       "H (the last dim) a multiple of 128 (fp8_block128: whole 128 x 128 scale blocks)",
       "fp8e4m3[8, 256, 192]"},
      {"block", [](auto& a) { fp8_experts(a, QuantScheme::kFp8Block128, kT, kH, 64); }, "w_gate_up",
       "F (half the gate+up rows) a multiple of 128", "fp8e4m3[8, 128, 256]"},
      {"chunk", [](auto& a) { fp8_experts(a, QuantScheme::kFp8PerChannel, kT, 24, 64); },
       "w_gate_up", "H (the last dim) a multiple of 16 (e4m3 rows of whole 16-byte chunks)",
       "fp8e4m3[8, 128, 24]"},
      {"chunk", [](auto& a) { fp8_experts(a, QuantScheme::kFp8PerTensor, kT, 64, 24); },
       "w_gate_up", "F (half the gate+up rows) a multiple of 16", "fp8e4m3[8, 48, 64]"},
      {"scale dtype", [](auto& a) { a.quant.w_gate_up_scale.dtype = kBF; }, "quant.w_gate_up_scale",
       "dtype f32", "bf16[8, 2, 2]"},
      {"scale shape",
       [](auto& a) {
         a.quant.w_gate_up_scale = fake(kF32, {8, 2, 1});
       },
       "quant.w_gate_up_scale", "shape [8, 2, 2]", "f32[8, 2, 1]"},
      {"scale shape",
       [](auto& a) {
         a.quant.w_down_scale = fake(kF32, {8, 1, 2});
       },
       "quant.w_down_scale", "shape [8, 2, 1]", "f32[8, 1, 2]"},
      {"scale shape",
       [](auto& a) {
         a.quant = quant_for(QuantScheme::kFp8PerChannel, kE, kH, kF);
         a.quant.w_down_scale = fake(kF32, {8, 128});
       },
       "quant.w_down_scale", "shape [8, 256]", "f32[8, 128]"},
      {"scale shape",
       [](auto& a) {
         a.quant = quant_for(QuantScheme::kFp8PerTensor, kE, kH, kF);
         a.quant.w_gate_up_scale = fake(kF32, {1});
       },
       "quant.w_gate_up_scale", "shape [8]", "f32[1]"},
      {"scale missing", [](auto& a) { a.quant.w_down_scale = TensorView{}; }, "quant.w_down_scale",
       "f32 tensor of shape [8, 2, 1]", "an undefined tensor"},
      {"activation scale", [](auto& a) { a.quant.a_gate_up_scale = fake(kF32, {1}); },
       "quant.a_gate_up_scale", "static activation scales go with fp8_per_tensor only",
       "f32[1] with quant.scheme fp8_block128"},
      {"activation scale", [](auto& a) { a.quant.a_down_scale = fake(kF32, {1}); },
       "quant.a_down_scale", "static activation scales go with fp8_per_tensor only",
       "f32[1] with quant.scheme fp8_block128"},
      {"activation scale",
       [](auto& a) {
         a.quant = quant_for(QuantScheme::kFp8PerTensor, kE, kH, kF);
         a.quant.a_gate_up_scale = fake(kF32, {2});
       },
       "quant.a_gate_up_scale", "shape [1]", "f32[2]"},
      {"activation scale",
       [](auto& a) {
         a.quant = quant_for(QuantScheme::kFp8PerTensor, kE, kH, kF);
         a.quant.a_down_scale = fake(kF32, {2});
       },
       "quant.a_down_scale", "shape [1]", "f32[2]"},
      {"scale without scheme",
       [](auto& a) {
         a.hidden_states = fake(kBF, {kT, kH});
         a.w_gate_up.dtype = kBF;
         a.w_down.dtype = kBF;
         a.quant.scheme = QuantScheme::kNone;
       },
       "quant.w_gate_up_scale", "no tensor without a FP8 scheme (quant.scheme none)",
       "f32[8, 2, 2] with quant.scheme none"},
      {"scale without scheme",
       [](auto& a) {
         unquantized(a);
         a.quant.w_down_scale = fake(kF32, {8, 2, 1});
       },
       "quant.w_down_scale", "no tensor without a FP8 scheme (quant.scheme none)",
       "f32[8, 2, 1] with quant.scheme none"},
      {"scale without scheme",
       [](auto& a) {
         unquantized(a);
         a.quant.a_gate_up_scale = fake(kF32, {1});
       },
       "quant.a_gate_up_scale", "no tensor without a FP8 scheme (quant.scheme none)",
       "f32[1] with quant.scheme none"},
      {"scale without scheme",
       [](auto& a) {
         unquantized(a);
         a.quant.a_down_scale = fake(kF32, {1});
       },
       "quant.a_down_scale", "no tensor without a FP8 scheme (quant.scheme none)",
       "f32[1] with quant.scheme none"},
      {"null", [](auto& a) { a.quant.w_gate_up_scale.data = nullptr; }, "quant.w_gate_up_scale",
       "a non-null data pointer", "nullptr"},
      {"overlap", [](auto& a) { a.output = at(a.output, a.quant.w_down_scale.data); }, "output",
       "memory disjoint from 'quant.w_down_scale'", "sharing"},
      {"overlap",
       [](auto& a) {
         a.quant = quant_for(QuantScheme::kFp8PerTensor, kE, kH, kF);
         a.quant.a_down_scale = fake(kF32, {1});
         a.output = at(a.output, a.quant.a_down_scale.data);
       },
       "output", "memory disjoint from 'quant.a_down_scale'", "sharing"},
  };
}

// A forced sorted plan with a bf16 expert-MLP plan (the chain): FP8 weights run two FP8 GEMMs.
const LayerPlan* sorted_chain_plan() {
  static LayerPlan plan = [] {
    LayerPlan p;
    p.routed = RoutedPath::kSorted;
    p.experts.path = MlpPath::kChain;
    return p;
  }();
  return &plan;
}

// Past the decode kernels FP8 weights run the FP8 GEMMs, on sm_90 devices only: `query` (a
// plan or workspace query, no launch) plans them there, and elsewhere is refused saying so.
void expect_fp8_gemms_or_refusal(const std::function<void()>& query) {
  if (detail::device_props().sm90()) {
    EXPECT_NO_THROW(query());
    return;
  }
  try {
    query();
    ADD_FAILURE() << "no error without an sm_90 device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_sm90 needs an sm_90 device"), std::string::npos)
        << e.what();
  }
}

TEST(QuantBadInputs, IndexedExpertMlp) {
  auto rows = quant_rows();
  rows.push_back({"plan", [](auto& a) { a.plan = sorted_chain_plan(); }, "plan",
                  "a plan that can run these arguments",
                  "(the FP8 expert MLP: FP8 weights run two FP8 GEMMs (two_gemms), not chain"});
  run_table<FusedMoEExpertsArgs>(
      "indexed_expert_mlp", fp8_experts_valid,
      [](const IndexedExpertMLPArgs& a) { indexed_expert_mlp(a, nullptr); }, rows);
  FusedMoEExpertsArgs past = fp8_experts_valid();
  fp8_experts(past, QuantScheme::kFp8Block128, 129, kH, kF);
  expect_fp8_gemms_or_refusal([&] { indexed_expert_mlp_workspace_size(past); });
}

// A sorted plan whose weight-only FP8 GEMMs (per-channel / per-tensor weights on bf16 rows)
// have a down tile decode_persistent does not run: checked as the gate/up GEMM's.
const LayerPlan* weight_only_bad_down_plan() {
  static LayerPlan plan = [] {
    LayerPlan p;
    p.routed = RoutedPath::kSorted;
    p.experts.gate_up = {GemmKernel::kDecodePersistent, 32, 256};
    p.experts.down = {GemmKernel::kDecodePersistent, 32, 64};
    return p;
  }();
  return &plan;
}

TEST(QuantBadInputs, FusedMoeExpertsRunsTheFp8Gemms) {
  run_table<FusedMoEExpertsArgs>(
      "fused_moe_experts", fp8_experts_valid,
      [](const FusedMoEExpertsArgs& a) { fused_moe_experts(a, nullptr); },
      {{"plan", [](auto& a) { a.plan = sorted_chain_plan(); }, "plan",
        "a plan that can run these arguments", "FP8 weights run two FP8 GEMMs (two_gemms)"},
       {"plan",
        [](auto& a) {
          a.quant = quant_for(QuantScheme::kFp8PerChannel, kE, kH, kF);
          a.plan = weight_only_bad_down_plan();
        },
        "plan", "a plan that can run these arguments",
        "(the FP8 expert MLP: the weight-only FP8 down GEMM: decode_persistent runs 32x128 "
        "tiles)"}});
  expect_fp8_gemms_or_refusal([] { plan_fused_moe_experts(fp8_experts_valid()); });
  const auto candidates = fused_moe_experts_plan_candidates(fp8_experts_valid());
  EXPECT_EQ(candidates.empty(), !detail::device_props().sm90());
  for (const LayerPlan& c : candidates) EXPECT_EQ(c.experts.path, MlpPath::kTwoGemms);
}

// moe_expert_mlp's and shared_expert_mlp's valid FP8 arguments under `scheme`.
ExpertMLPArgs fp8_expert_mlp_valid(QuantScheme scheme) {
  ExpertMLPArgs a;
  a.expert_input = fake(kBF, {16, kH});
  a.layout_metadata = fake(kI32, {kE});
  a.w_gate_up = fake(kFP8, {kE, 2 * kF, kH});
  a.w_down = fake(kFP8, {kE, kH, kF});
  a.quant = quant_for(scheme, kE, kH, kF);
  a.expert_output = fake(kBF, {16, kH});
  a.workspace = fake_ws();
  return a;
}

SharedExpertMLPArgs fp8_dense_valid(QuantScheme scheme) {
  SharedExpertMLPArgs a;
  a.hidden_states = fake(kBF, {kT, kH});
  a.w_gate_up = fake(kFP8, {2 * kF, kH});
  a.w_down = fake(kFP8, {kH, kF});
  a.quant = quant_for(scheme, 1, kH, kF, /*experts=*/false);
  a.output = fake(kBF, {kT, kH});
  a.workspace = fake_ws();
  return a;
}

TEST(QuantBadInputs, ExpertMlpRunsTheFp8Gemms) {
  const auto valid = [] { return fp8_expert_mlp_valid(QuantScheme::kFp8PerChannel); };
  static MlpPlan chain;
  chain.path = MlpPath::kChain;
  // The FP8 GEMMs' plans: fp8_sm90 neither splits k nor swaps tail tiles (refused before the
  // device is asked whether it runs fp8_sm90 at all).
  static MlpPlan split, swap;
  split.gate_up = {GemmKernel::kFp8Sm90, 128, 128, /*split=*/2};
  split.down = {GemmKernel::kFp8Sm90, 128, 128};
  swap.gate_up = {GemmKernel::kFp8Sm90, 128, 256, 1, GemmSchedule::kStatic, /*swap_tails=*/true};
  swap.down = split.down;
  run_table<ExpertMLPArgs>(
      "moe_expert_mlp", valid, [](const ExpertMLPArgs& a) { moe_expert_mlp(a, nullptr); },
      {{"dtype",
        [](auto& a) {
          a.expert_input.dtype = kF16;
          a.expert_output.dtype = kF16;
        },
        "expert_input",
        "bf16 with FP8 weights (quant.scheme fp8_per_channel: the FP8 GEMMs write "
        "bf16 rows)",
        "f16[16, 256]"},
       {"scale shape",
        [](auto& a) {
          a.quant.w_down_scale = fake(kF32, {8, 128});
        },
        "quant.w_down_scale", "shape [8, 256]", "f32[8, 128]"},
       {"plan", [](auto& a) { a.plan = &chain; }, "plan", "a plan that can run these arguments",
        "FP8 weights run two FP8 GEMMs (two_gemms), not chain"},
       {"plan", [](auto& a) { a.plan = &split; }, "plan", "a plan that can run these arguments",
        "(the FP8 gate_up GEMM: fp8_sm90 does not split k)"},
       {"plan", [](auto& a) { a.plan = &swap; }, "plan", "a plan that can run these arguments",
        "(the FP8 gate_up GEMM: swap_tails runs on the bf16 / f16 SM90 kernels only)"}});
  expect_fp8_gemms_or_refusal([&] { plan_expert_mlp(valid()); });
}

FusedMoESharedExpertArgs fp8_layer_valid() {
  FusedMoESharedExpertArgs a;
  a.moe.hidden_states = fake(kBF, {kT, kH});
  a.moe.gating_output = fake(kF32, {kT, kE});
  a.moe.params.top_k = kK;
  a.moe.w_gate_up = fake(kFP8, {kE, 2 * kF, kH});
  a.moe.w_down = fake(kFP8, {kE, kH, kF});
  a.moe.quant = quant_for(QuantScheme::kFp8Block128, kE, kH, kF);
  a.moe.output = fake(kBF, {kT, kH});
  a.moe.workspace = fake_ws();
  a.shared_w_gate_up = fake(kFP8, {2 * kF, kH});
  a.shared_w_down = fake(kFP8, {kH, kF});
  a.shared_quant = quant_for(QuantScheme::kFp8PerChannel, 1, kH, kF, /*experts=*/false);
  return a;
}

TEST(QuantBadInputs, FusedMoeSharedExpert) {
  std::vector<Row<FusedMoESharedExpertArgs>> rows = {
      {"scale shape",
       [](auto& a) {
         a.shared_quant.w_down_scale = fake(kF32, {8, 256});
       },
       "shared_quant.w_down_scale", "shape [256]", "f32[8, 256]"},
      {"dtype", [](auto& a) { a.shared_quant = WeightQuant{}; }, "shared_w_gate_up",
       "e4m3 weights need a FP8 scheme", "with quant.scheme none"},
      {"scheme", [](auto& a) { a.shared_quant.scheme = static_cast<QuantScheme>(4); },
       "shared_quant.scheme", "a QuantScheme: kNone", "value 4"},
      {"scheme without weights",
       [](auto& a) {
         a.shared_w_gate_up = TensorView{};
         a.shared_w_down = TensorView{};
       },
       "shared_quant", "scheme none without shared weights", "scheme fp8_per_channel"},
      {"plan",
       [](auto& a) {
         static LayerPlan sorted;
         sorted.has_shared = true;
         a.moe.plan = &sorted;
       },
       "plan", "a plan that can run these arguments",
       "(the FP8 expert MLP: the FP8 gate_up GEMM: decode runs bf16 / f16 inputs only)"},
  };
  run_table<FusedMoESharedExpertArgs>(
      "fused_moe_shared_expert", fp8_layer_valid,
      [](const FusedMoESharedExpertArgs& a) { fused_moe_shared_expert(a, nullptr); }, rows);
  // Past T = 128: both FP8 parts on the FP8 GEMMs; the shared expert alone in FP8 too.
  FusedMoESharedExpertArgs a = fp8_layer_valid();
  a.moe.hidden_states = fake(kBF, {129, kH});
  a.moe.gating_output = fake(kF32, {129, kE});
  a.moe.output = fake(kBF, {129, kH});
  expect_fp8_gemms_or_refusal([&] { fused_moe_shared_expert_workspace_size(a); });
  a.moe.w_gate_up.dtype = kBF;
  a.moe.w_down.dtype = kBF;
  a.moe.quant = WeightQuant{};
  expect_fp8_gemms_or_refusal([&] { fused_moe_shared_expert_workspace_size(a); });
}

// A shared expert past the decode kernel's 32-bit weight offsets at T = 1: S = 65536,
// H = 32768 (2*S*H = 2^32; (S + 8) * H > INT32_MAX would wrap them).
constexpr int64_t kWideH = 32768, kWideS = 65536;
void wide_shared_expert(SharedExpertMLPArgs& a) {
  a.hidden_states = fake(kBF, {1, kWideH});
  a.w_gate_up = fake(kFP8, {2 * kWideS, kWideH});
  a.w_down = fake(kFP8, {kWideH, kWideS});
  a.quant = quant_for(QuantScheme::kFp8Block128, 1, kWideH, kWideS, /*experts=*/false);
  a.output = fake(kBF, {1, kWideH});
}

TEST(QuantBadInputs, SharedExpertMlp) {
  const auto valid = [] { return fp8_dense_valid(QuantScheme::kFp8Block128); };
  static MlpPlan decode;  // the FP8 direct kernel's dense plan
  decode.path = MlpPath::kDirect;
  decode.split_gate_up = 1;
  decode.split_down = 1;
  run_table<SharedExpertMLPArgs>(
      "shared_expert_mlp", valid,
      [](const SharedExpertMLPArgs& a) { shared_expert_mlp(a, nullptr); },
      {{"scale shape",
        [](auto& a) {
          a.quant.w_gate_up_scale = fake(kF32, {8, 2, 2});
        },
        "quant.w_gate_up_scale", "shape [2, 2]", "f32[8, 2, 2]"},
       {"plan",
        [](auto& a) {
          static MlpPlan gemv;
          gemv.path = MlpPath::kGemv;
          a.plan = &gemv;
        },
        "plan", "a plan that can run these arguments",
        "FP8 weights at T <= 64 and 2*S*H < 2^31 run on the FP8 direct kernel"},
       {"plan",
        [](auto& a) {
          wide_shared_expert(a);
          a.plan = &decode;
        },
        "plan", "a plan that can run these arguments",
        "FP8 weights past the FP8 direct kernel (2*S*H = 4294967296 >= 2^31: its weight "
        "offsets are 32-bit): FP8 weights run two FP8 GEMMs (two_gemms), not direct"}});
  SharedExpertMLPArgs wide = valid();
  wide_shared_expert(wide);
  EXPECT_EQ(plan_shared_expert_mlp(wide).path, MlpPath::kTwoGemms);
  for (const MlpPlan& m : shared_expert_mlp_plan_candidates(wide))
    EXPECT_EQ(m.path, MlpPath::kTwoGemms) << to_string(m);
  expect_fp8_gemms_or_refusal([&] { shared_expert_mlp_workspace_size(wide); });
  SharedExpertMLPArgs past = valid();
  past.hidden_states = fake(kBF, {65, kH});
  past.output = fake(kBF, {65, kH});
  expect_fp8_gemms_or_refusal([&] { shared_expert_mlp_workspace_size(past); });
  EXPECT_EQ(to_string(plan_shared_expert_mlp(valid())),
            to_string(shared_expert_mlp_plan_candidates(valid()).at(0)));
}

TEST(QuantBadInputs, Fp8PlansAreTheDecodeKernels) {
  EXPECT_EQ(plan_indexed_expert_mlp(fp8_experts_valid()).routed, RoutedPath::kDirect);
  // The planner's pick first; on an sm_90 device the sorted path's FP8 GEMMs follow.
  const auto cands = indexed_expert_mlp_plan_candidates(fp8_experts_valid());
  ASSERT_GE(cands.size(), 1u);
  EXPECT_EQ(cands[0].routed, RoutedPath::kDirect);
  for (size_t i = 1; i < cands.size(); ++i) {
    EXPECT_TRUE(cands[i].routed == RoutedPath::kDirect ||
                cands[i].experts.gate_up.kernel == GemmKernel::kFp8Sm90)
        << to_string(cands[i]);
  }
  // The layer takes the direct path for FP8 even where bf16 would sort (T > 32).
  FusedMoESharedExpertArgs a = fp8_layer_valid();
  a.moe.hidden_states = fake(kBF, {64, kH});
  a.moe.gating_output = fake(kF32, {64, kE});
  a.moe.output = fake(kBF, {64, kH});
  const LayerPlan plan = plan_fused_moe_shared_expert(a);
  EXPECT_EQ(plan.routed, RoutedPath::kDirect);
  EXPECT_TRUE(plan.has_shared);
  EXPECT_EQ(plan.shared.path, MlpPath::kDirect);
  EXPECT_EQ(plan.shared.split_gate_up, 1);
  EXPECT_EQ(plan.shared.split_down, 1);
  EXPECT_GT(fused_moe_shared_expert_workspace_size(a), 0u);
}

// FP8 weights run silu_and_mul without biases (the FP8 kernels' one epilogue): another
// activation or a bias is refused, naming it, by the calls and the workspace queries.
TEST(QuantBadInputs, Fp8WithAnotherActivationOrABias) {
  const char* why =
      "with FP8 weights (scheme fp8_block128: the FP8 kernels run silu_and_mul "
      "without biases)";
  const std::string act = std::string("silu_and_mul ") + why;
  const std::string bias = std::string("no bias ") + why;
  const std::vector<Row<FusedMoEExpertsArgs>> rows = {
      {"fp8", [](auto& a) { a.activation = Activation::kGeluAndMul; }, "activation", act.c_str(),
       "gelu_and_mul"},
      {"fp8", [](auto& a) { a.activation = Activation::kSwigluOai; }, "activation", act.c_str(),
       "swiglu_oai"},
      {"fp8", [](auto& a) { a.activation = Activation::kRelu2; }, "activation", act.c_str(),
       "relu2"},
      {"fp8",
       [](auto& a) {
         a.gate_up_bias = fake(kF32, {kE, 2 * kF});
       },
       "gate_up_bias", bias.c_str(), "f32[8, 256]"},
      {"fp8",
       [](auto& a) {
         a.down_bias = fake(kBF, {kE, kH});
       },
       "down_bias", bias.c_str(), "bf16[8, 256]"},
  };
  run_table<FusedMoEExpertsArgs>(
      "indexed_expert_mlp", fp8_experts_valid,
      [](const IndexedExpertMLPArgs& a) { indexed_expert_mlp(a, nullptr); }, rows);
  run_table<FusedMoEExpertsArgs>(
      "indexed_expert_mlp", fp8_experts_valid,
      [](const IndexedExpertMLPArgs& a) { indexed_expert_mlp_workspace_size(a); }, rows);
  // The layer: the routed experts' (fp8_block128) and the shared expert's (fp8_per_channel,
  // routed bf16: the shared expert alone refuses them).
  const std::string shared_why =
      " with FP8 weights (scheme fp8_per_channel: the FP8 kernels run silu_and_mul without "
      "biases)";
  const std::string shared_act = "silu_and_mul" + shared_why;
  const std::string shared_bias = "no bias" + shared_why;
  const auto bf16_routed = [](FusedMoESharedExpertArgs& a) {
    a.moe.w_gate_up.dtype = kBF;
    a.moe.w_down.dtype = kBF;
    a.moe.quant = WeightQuant{};
  };
  const std::vector<Row<FusedMoESharedExpertArgs>> layer_rows = {
      {"fp8", [](auto& a) { a.moe.activation = Activation::kGeluTanhAndMul; }, "activation",
       act.c_str(), "gelu_tanh_and_mul"},
      {"fp8",
       [](auto& a) {
         a.moe.down_bias = fake(kF32, {kE, kH});
       },
       "down_bias", bias.c_str(), "f32[8, 256]"},
      {"fp8",
       [&](auto& a) {
         bf16_routed(a);
         a.moe.activation = Activation::kGeluAndMul;
       },
       "activation", shared_act.c_str(), "gelu_and_mul"},
      {"fp8",
       [&](auto& a) {
         bf16_routed(a);
         a.shared_gate_up_bias = fake(kF32, {2 * kF});
       },
       "shared_gate_up_bias", shared_bias.c_str(), "f32[256]"},
      {"fp8",
       [&](auto& a) {
         bf16_routed(a);
         a.shared_down_bias = fake(kBF, {kH});
       },
       "shared_down_bias", shared_bias.c_str(), "bf16[256]"},
  };
  run_table<FusedMoESharedExpertArgs>(
      "fused_moe_shared_expert", fp8_layer_valid,
      [](const FusedMoESharedExpertArgs& a) { fused_moe_shared_expert(a, nullptr); }, layer_rows);
  run_table<FusedMoESharedExpertArgs>(
      "fused_moe_shared_expert", fp8_layer_valid,
      [](const FusedMoESharedExpertArgs& a) { plan_fused_moe_shared_expert(a); }, layer_rows);
  run_table<FusedMoEArgs>(
      "fused_moe", [] { return fp8_layer_valid().moe; },
      [](const FusedMoEArgs& a) { fused_moe_workspace_size(a); },
      {{"fp8", [](auto& a) { a.activation = Activation::kRelu2; }, "activation", act.c_str(),
        "relu2"}});
  // The dense MLP and moe_expert_mlp (which refuses FP8 weights anyway: the activation first).
  const auto dense_valid = [] { return fp8_dense_valid(QuantScheme::kFp8Block128); };
  run_table<SharedExpertMLPArgs>(
      "shared_expert_mlp", dense_valid,
      [](const SharedExpertMLPArgs& a) { shared_expert_mlp(a, nullptr); },
      {{"fp8", [](auto& a) { a.activation = Activation::kSwigluOai; }, "activation", act.c_str(),
        "swiglu_oai"},
       {"fp8", [](auto& a) { a.gate_up_bias = fake(kBF, {2 * kF}); }, "gate_up_bias", bias.c_str(),
        "bf16[256]"}});
  run_table<SharedExpertMLPArgs>(
      "shared_expert_mlp", dense_valid,
      [](const SharedExpertMLPArgs& a) { shared_expert_mlp_workspace_size(a); },
      {{"fp8", [](auto& a) { a.down_bias = fake(kF32, {kH}); }, "down_bias", bias.c_str(),
        "f32[256]"}});
  const auto mlp_valid = [] { return fp8_expert_mlp_valid(QuantScheme::kFp8Block128); };
  run_table<ExpertMLPArgs>("moe_expert_mlp", mlp_valid,
                           [](const ExpertMLPArgs& a) { moe_expert_mlp(a, nullptr); },
                           {{"fp8", [](auto& a) { a.activation = Activation::kGeluAndMul; },
                             "activation", act.c_str(), "gelu_and_mul"}});
}

// FP8 weights with the engine inputs (an expert map, i64 ids, the router weight on the input):
// valid, the direct (FP8 direct) path planned, stopping at the launch target.
TEST(QuantBadInputs, Fp8WithEngineInputsIsValid) {
  constexpr int64_t kGlobal = 2 * kE;
  FusedMoEExpertsArgs e = fp8_experts_valid();
  e.topk_ids = fake(kI64, {kT, kK});
  e.expert_map = fake(kI32, {kGlobal});
  EXPECT_EQ(plan_indexed_expert_mlp(e).routed, RoutedPath::kDirect);
  EXPECT_GT(indexed_expert_mlp_workspace_size(e), 0u);
  FusedMoEExpertsArgs one = fp8_experts_valid();
  one.topk_ids = fake(kI32, {kT, 1});
  one.topk_weights = fake(kF32, {kT, 1});
  one.apply_router_weight_on_input = true;
  EXPECT_EQ(plan_indexed_expert_mlp(one).routed, RoutedPath::kDirect);
  FusedMoESharedExpertArgs l = fp8_layer_valid();
  l.moe.gating_output = fake(kF32, {kT, kGlobal});
  l.moe.expert_map = fake(kI32, {kGlobal});
  l.moe.params.top_k = 1;
  l.moe.apply_router_weight_on_input = true;
  EXPECT_EQ(plan_fused_moe_shared_expert(l).routed, RoutedPath::kDirect);
  EXPECT_GT(fused_moe_shared_expert_workspace_size(l), 0u);
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is present: valid calls would launch";
  expect_no_device("indexed_expert_mlp", [&] { indexed_expert_mlp(e, nullptr); });
  expect_no_device("indexed_expert_mlp", [&] { indexed_expert_mlp(one, nullptr); });
  expect_no_device("fused_moe", [&] { fused_moe(l.moe, nullptr); });
  expect_no_device("fused_moe_shared_expert", [&] { fused_moe_shared_expert(l, nullptr); });
}

TEST(QuantBadInputs, SchemeNamesRoundTrip) {
  for (QuantScheme s : {QuantScheme::kNone, QuantScheme::kFp8PerTensor, QuantScheme::kFp8PerChannel,
                        QuantScheme::kFp8Block128}) {
    QuantScheme back = QuantScheme::kNone;
    ASSERT_TRUE(parse_quant_scheme(quant_scheme_name(s), &back)) << quant_scheme_name(s);
    EXPECT_EQ(back, s);
  }
  QuantScheme unchanged = QuantScheme::kFp8Block128;
  EXPECT_FALSE(parse_quant_scheme("fp8", &unchanged));
  EXPECT_EQ(unchanged, QuantScheme::kFp8Block128);
}

// The scale layouts of moekit/quant.h's table, with and without the E axis.
TEST(QuantBadInputs, WeightScaleShapesFollowTheTable) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(weight_scale_shape(QuantScheme::kNone, 4, 256, 384), V{});
  EXPECT_EQ(weight_scale_shape(QuantScheme::kFp8PerTensor, 4, 256, 384), (V{4}));
  EXPECT_EQ(weight_scale_shape(QuantScheme::kFp8PerTensor, 0, 256, 384, false), (V{1}));
  EXPECT_EQ(weight_scale_shape(QuantScheme::kFp8PerChannel, 4, 256, 384), (V{4, 256}));
  EXPECT_EQ(weight_scale_shape(QuantScheme::kFp8PerChannel, 0, 256, 384, false), (V{256}));
  EXPECT_EQ(weight_scale_shape(QuantScheme::kFp8Block128, 4, 256, 384), (V{4, 2, 3}));
  EXPECT_EQ(weight_scale_shape(QuantScheme::kFp8Block128, 0, 257, 129, false), (V{3, 2}));
  try {
    weight_scale_shape(static_cast<QuantScheme>(4), 4, 256, 384);
    ADD_FAILURE() << "no error for an unknown scheme";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown QuantScheme (value 4)"), std::string::npos)
        << e.what();
  }
}

// Valid FP8 calls of every scheme pass every check and stop at the launch target.
TEST(QuantBadInputs, ValidFp8CallsStopAtTheLaunchTarget) {
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is present: valid calls would launch";
  for (QuantScheme s :
       {QuantScheme::kFp8PerTensor, QuantScheme::kFp8PerChannel, QuantScheme::kFp8Block128}) {
    SCOPED_TRACE(quant_scheme_name(s));
    FusedMoEExpertsArgs e = fp8_experts_valid();
    e.quant = quant_for(s, kE, kH, kF);
    if (s == QuantScheme::kFp8PerTensor) e.quant.a_gate_up_scale = fake(kF32, {1});
    expect_no_device("indexed_expert_mlp", [&] { indexed_expert_mlp(e, nullptr); });
    FusedMoESharedExpertArgs l = fp8_layer_valid();
    l.moe.quant = quant_for(s, kE, kH, kF);
    l.shared_quant = quant_for(s, 1, kH, kF, /*experts=*/false);
    expect_no_device("fused_moe", [&] { fused_moe(l.moe, nullptr); });
    expect_no_device("fused_moe_shared_expert", [&] { fused_moe_shared_expert(l, nullptr); });
    expect_no_device("shared_expert_mlp", [&] { shared_expert_mlp(fp8_dense_valid(s), nullptr); });
  }
}

// Valid FP8 calls that run the FP8 GEMMs: without a GPU they pass every argument check and
// are refused for want of an sm_90 device (the path they plan needs one). (moe_expert_mlp plans
// after its memory checks; fused_moe_experts before them, and its arguments are those of
// indexed_expert_mlp above, which get to the launch target.)
TEST(QuantBadInputs, ValidFp8GemmCallsStopAtTheSm90Check) {
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is present: valid calls would launch";
  const auto expect_sm90_refusal = [](const char* op, const std::function<void()>& call) {
    try {
      call();
      ADD_FAILURE() << op << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(
          msg.rfind(
              std::string("moekit::") + op + ": argument 'w_gate_up': expected FP8 weights on ", 0),
          0u)
          << msg;
      EXPECT_NE(msg.find("fp8_sm90 needs an sm_90 device"), std::string::npos) << msg;
    }
  };
  for (QuantScheme s : {QuantScheme::kFp8PerChannel, QuantScheme::kFp8Block128}) {
    SCOPED_TRACE(quant_scheme_name(s));
    expect_sm90_refusal("moe_expert_mlp",
                        [&] { moe_expert_mlp(fp8_expert_mlp_valid(s), nullptr); });
  }
  expect_sm90_refusal("fused_moe_experts", [] { fused_moe_experts(fp8_experts_valid(), nullptr); });
}

}  // namespace
}  // namespace moekit
