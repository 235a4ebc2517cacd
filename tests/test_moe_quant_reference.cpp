// CPU tests of the references with quantized weights (docs/moe.md "Quantized weights"): an
// op with FP8 weights and scales matches the same op on f32 weights dequantized here
// (float(w) * scale in each scheme's layout); quantize_activations_e4m3 on hand-checked
// groups, static scales and all-zero rows; the quantized-activation references
// (Fp8Activations::kQuantized) agreeing across the ops; kQuantizedTiesFlipped rounding a
// near-tie activation the other way and nothing else.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/reference.h"
#include "reference/host_tensor.h"
#include "test_moe_common.h"

namespace moekit {
namespace {

// e4m3 codes ~ N(0, 32^2) and the scheme's scales for `count` matrices [rows, cols]; `deq`
// gets float(w) * scale(e, n, k), dequantized independently of the references.
struct Quantized {
  HostTensor w, scale, deq;
};
Quantized quantize(std::mt19937_64& rng, QuantScheme s, int64_t count, int64_t rows, int64_t cols) {
  Quantized q;
  q.w = HostTensor(DType::kFP8E4M3, {count, rows, cols});
  q.deq = HostTensor(DType::kF32, {count, rows, cols});
  const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
  if (s == QuantScheme::kFp8PerTensor) q.scale = HostTensor(DType::kF32, {count});
  if (s == QuantScheme::kFp8PerChannel) q.scale = HostTensor(DType::kF32, {count, rows});
  if (s == QuantScheme::kFp8Block128) q.scale = HostTensor(DType::kF32, {count, rb, cb});
  std::uniform_real_distribution<double> u(0.25, 4.0);
  for (int64_t i = 0; i < q.scale.numel(); ++i) q.scale.set(i, u(rng) / 32 / std::sqrt(cols));
  std::normal_distribution<double> n(0.0, 32.0);
  for (int64_t e = 0; e < count; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) {
        const int64_t i = (e * rows + r) * cols + k;
        q.w.as<uint8_t>()[i] = host::float_to_fp8e4m3(static_cast<float>(n(rng)));
        const int64_t si = s == QuantScheme::kFp8PerTensor    ? e
                           : s == QuantScheme::kFp8PerChannel ? e * rows + r
                                                              : (e * rb + r / 128) * cb + k / 128;
        q.deq.set(i, double(host::fp8e4m3_to_float(q.w.as<uint8_t>()[i])) * q.scale.at(si));
      }
    }
  }
  return q;
}

TEST(QuantReference, Fp8WeightsEqualTheirDequantizedF32Weights) {
  const int64_t T = 5, H = 256, E = 3, F = 128, K = 2;
  for (QuantScheme s :
       {QuantScheme::kFp8PerTensor, QuantScheme::kFp8PerChannel, QuantScheme::kFp8Block128}) {
    SCOPED_TRACE(quant_scheme_name(s));
    std::mt19937_64 rng(7);
    const HostTensor x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
    const Quantized gu = quantize(rng, s, E, 2 * F, H), dn = quantize(rng, s, E, H, F);
    const HostTensor w = moetest::make_topk_weights(rng, T, K);
    const HostTensor ids = moetest::make_ids(rng, T, K, E, moetest::Ids::kMixed);
    HostTensor out_q(DType::kF32, {T, H}), out_f(DType::kF32, {T, H});
    FusedMoEExpertsArgs a;
    a.hidden_states = x.view();
    a.w_gate_up = gu.w.view();
    a.w_down = dn.w.view();
    a.quant.scheme = s;
    a.quant.w_gate_up_scale = gu.scale.view();
    a.quant.w_down_scale = dn.scale.view();
    a.topk_weights = w.view();
    a.topk_ids = ids.view();
    a.output = out_q.view();
    reference::fused_moe_experts(a);
    a.w_gate_up = gu.deq.view();
    a.w_down = dn.deq.view();
    a.quant = WeightQuant{};
    a.output = out_f.view();
    reference::fused_moe_experts(a);
    // Equal up to the f32 rounding of the test's dequantized weights (the reference forms
    // float(w) * scale in f64).
    double norm = 0, diff = 0;
    for (int64_t i = 0; i < out_q.numel(); ++i) {
      norm += out_q.at(i) * out_q.at(i);
      diff += (out_q.at(i) - out_f.at(i)) * (out_q.at(i) - out_f.at(i));
    }
    EXPECT_GT(norm, 0.0);  // not a vacuous pass
    EXPECT_LT(std::sqrt(diff / norm), 1e-6);
  }
}

TEST(QuantReference, ActivationQuantizationGroupsAndScales) {
  // Two rows of 256: row 0 groups of amax 448 and 0.5, row 1 all zeros.
  HostTensor x(DType::kF32, {2, 256}), out(DType::kF32, {2, 256});
  for (int64_t c = 0; c < 128; ++c) x.set(c, c == 5 ? -448.0 : 3.3);
  for (int64_t c = 128; c < 256; ++c) x.set(c, c == 200 ? 0.5 : 0.013);
  reference::quantize_activations_e4m3(QuantScheme::kFp8Block128, x.view(), TensorView{},
                                       out.view());
  EXPECT_EQ(out.at(5), -448.0);  // s = 1: exact
  EXPECT_EQ(out.at(0), 3.25);    // 3.3 -> e4m3 3.25 (3 mantissa bits)
  const float s2 = 0.5f / 448.0f;
  EXPECT_FLOAT_EQ(out.at(200), 0.5f);
  EXPECT_FLOAT_EQ(out.at(130), host::fp8e4m3_to_float(host::float_to_fp8e4m3(0.013f / s2)) * s2);
  for (int64_t c = 256; c < 512; ++c) EXPECT_EQ(out.at(c), 0.0) << c;  // amax 0: no NaN
  // Per channel: one scale per row (row 0's amax 448 also rounds row 0's small values).
  reference::quantize_activations_e4m3(QuantScheme::kFp8PerChannel, x.view(), TensorView{},
                                       out.view());
  EXPECT_EQ(out.at(200), 0.5);  // 0.5 is exact at s = 1
  EXPECT_EQ(out.at(130), host::fp8e4m3_to_float(host::float_to_fp8e4m3(0.013f)));
  // Per tensor, a static scale of 2: x / 2 saturates at 448 (-448 * 2 = -896).
  HostTensor s(DType::kF32, {1});
  s.set(0, 2.0);
  reference::quantize_activations_e4m3(QuantScheme::kFp8PerTensor, x.view(), s.view(), out.view());
  EXPECT_EQ(out.at(5), -448.0);  // -224 exactly representable: -224 * 2
  x.set(5, -2000.0);
  reference::quantize_activations_e4m3(QuantScheme::kFp8PerTensor, x.view(), s.view(), out.view());
  EXPECT_EQ(out.at(5), -896.0);  // saturated to -448, times 2
}

double rel_diff(const HostTensor& a, const HostTensor& b) {
  double norm = 0, diff = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    norm += b.at(i) * b.at(i);
    diff += (a.at(i) - b.at(i)) * (a.at(i) - b.at(i));
  }
  return norm > 0 ? std::sqrt(diff / norm) : 0.0;
}

// Fp8Activations::kQuantized (what the FP8 GEMM paths compute): the same quantized rows through
// the three references that take them (the routed experts, moe_expert_mlp on the routes
// sorted by expert, the dense MLP on one expert), and visibly not the unquantized result.
TEST(QuantReference, QuantizedActivationsAgreeAcrossTheOps) {
  const int64_t T = 9, H = 256, E = 3, F = 128;
  for (QuantScheme s :
       {QuantScheme::kFp8PerTensor, QuantScheme::kFp8PerChannel, QuantScheme::kFp8Block128}) {
    SCOPED_TRACE(quant_scheme_name(s));
    std::mt19937_64 rng(11);
    const HostTensor x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
    const Quantized gu = quantize(rng, s, E, 2 * F, H), dn = quantize(rng, s, E, H, F);
    // Top-1 routes to every expert (t % E), unit weights: each output row is one MLP.
    HostTensor w(DType::kF32, {T, 1}), ids(DType::kI32, {T, 1});
    for (int64_t t = 0; t < T; ++t) {
      w.set(t, 1.0);
      ids.as<int32_t>()[t] = static_cast<int32_t>(t % E);
    }
    WeightQuant q;
    q.scheme = s;
    q.w_gate_up_scale = gu.scale.view();
    q.w_down_scale = dn.scale.view();
    HostTensor routed(DType::kF32, {T, H}), given(DType::kF32, {T, H});
    FusedMoEExpertsArgs a;
    a.hidden_states = x.view();
    a.w_gate_up = gu.w.view();
    a.w_down = dn.w.view();
    a.quant = q;
    a.topk_weights = w.view();
    a.topk_ids = ids.view();
    a.output = routed.view();
    reference::fused_moe_experts(a, reference::Fp8Activations::kQuantized);
    a.output = given.view();
    reference::fused_moe_experts(a);
    EXPECT_GT(rel_diff(routed, given), 1e-3);  // the quantization shows
    EXPECT_LT(rel_diff(routed, given), 0.1);
    // moe_expert_mlp over the rows sorted by expert (alignment 1, no padding).
    HostTensor sorted_x(DType::kBF16, {T, H}), meta(DType::kI32, {E}), out(DType::kF32, {T, H});
    std::vector<int64_t> order;
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t t = e; t < T; t += E) order.push_back(t);
      meta.as<int32_t>()[e] = static_cast<int32_t>(order.size());
    }
    for (int64_t i = 0; i < T; ++i)
      for (int64_t h = 0; h < H; ++h) sorted_x.set(i * H + h, x.at(order[i] * H + h));
    ExpertMLPArgs m;
    m.expert_input = sorted_x.view();
    m.layout_metadata = meta.view();
    m.w_gate_up = gu.w.view();
    m.w_down = dn.w.view();
    m.quant = q;
    m.expert_output = out.view();
    reference::moe_expert_mlp(m, reference::Fp8Activations::kQuantized);
    HostTensor unsorted(DType::kF32, {T, H});
    for (int64_t i = 0; i < T; ++i)
      for (int64_t h = 0; h < H; ++h) unsorted.set(order[i] * H + h, out.at(i * H + h));
    if (s == QuantScheme::kFp8PerTensor) {
      // One scale over all rows either way: the same values.
      EXPECT_LT(rel_diff(unsorted, routed), 1e-12);
    } else {
      EXPECT_EQ(rel_diff(unsorted, routed), 0.0);
    }
  }
}

// A shared expert of one hidden unit and two relu2 activations, per-tensor FP8 with static
// scales: x = 1, gate/up codes 1 and 1.5 (act = 1 and 2.25), down codes 1 and 1, and a_down_scale
// d. Returns the output of `acts`.
double two_unit_mlp(float d, reference::Fp8Activations acts) {
  HostTensor x(DType::kBF16, {1, 1}), wgu(DType::kFP8E4M3, {2, 1}), wd(DType::kFP8E4M3, {1, 2});
  HostTensor one(DType::kF32, {1}), a_down(DType::kF32, {1}), out(DType::kF32, {1, 1});
  x.set(0, 1.0);
  one.set(0, 1.0);
  a_down.set(0, d);
  wgu.as<uint8_t>()[0] = host::float_to_fp8e4m3(1.0f);
  wgu.as<uint8_t>()[1] = host::float_to_fp8e4m3(1.5f);
  wd.as<uint8_t>()[0] = wd.as<uint8_t>()[1] = host::float_to_fp8e4m3(1.0f);
  SharedExpertMLPArgs a;
  a.hidden_states = x.view();
  a.w_gate_up = wgu.view();
  a.w_down = wd.view();
  a.quant.scheme = QuantScheme::kFp8PerTensor;
  a.quant.w_gate_up_scale = one.view();
  a.quant.w_down_scale = one.view();
  a.quant.a_gate_up_scale = one.view();
  a.quant.a_down_scale = a_down.view();
  a.activation = Activation::kRelu2;
  a.output = out.view();
  reference::shared_expert_mlp(a, acts);
  return out.at(0);
}

TEST(QuantReference, TiesFlippedRoundsANearTieTheOtherWayAndNothingElse) {
  using reference::Fp8Activations;
  // act / d: 1 -> 1.0625 (1 + 2^-14), 2^-14 above the midpoint of e4m3's 1 and 1.125;
  // 2.25 -> 2.39, 0.7% above the midpoint of 2.25 and 2.5 (outside the 2^-12 band).
  const float d = static_cast<float>(1.0 / (1.0625 * (1 + 1.0 / 16384)));
  const double base = two_unit_mlp(d, Fp8Activations::kQuantized);
  const double flipped = two_unit_mlp(d, Fp8Activations::kQuantizedTiesFlipped);
  EXPECT_NEAR(base, (1.125 + 2.5) * d, 3.625 * d / 256);  // bf16 output rows
  EXPECT_NEAR(flipped, (1.0 + 2.5) * d, 3.5 * d / 256);
  // Away from every midpoint (1 / d = 1.25 and 2.8125, both on e4m3's grid): no change.
  const float far = 0.8f;
  EXPECT_EQ(two_unit_mlp(far, Fp8Activations::kQuantizedTiesFlipped),
            two_unit_mlp(far, Fp8Activations::kQuantized));
  // kAsGiven does not quantize: the flip has nothing to act on.
  EXPECT_NEAR(two_unit_mlp(d, Fp8Activations::kAsGiven), 3.25, 1e-6);
}

}  // namespace
}  // namespace moekit
