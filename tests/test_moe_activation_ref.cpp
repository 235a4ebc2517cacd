// CPU tests of the references' activations and biases (docs/moe.md "Activations") on
// hand-made weights whose projections are known: gate j = x_j, up j = x_j / 2 (in the
// layout of each activation: gate rows then up rows, interleaved for swiglu_oai, one row
// for relu2), w_down the identity; x crosses the swiglu clamps. The GPU tests trust these
// references, so their layouts, clamps and bias rows are checked here against formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/host_dtype.h"
#include "mlp/activation.h"
#include "moekit/reference.h"
#include "reference/host_tensor.h"

namespace moekit {
namespace {

constexpr int64_t kH = 8;
const double kX[kH] = {-9.0, -3.0, -0.5, 0.0, 0.7, 2.0, 7.5, 12.0};

double expected_act(Activation a, double g, double u) {
  const double pi = 3.14159265358979323846;
  switch (a) {
    case Activation::kSiluAndMul:
      return g / (1 + std::exp(-g)) * u;
    case Activation::kGeluAndMul:
      return 0.5 * g * (1 + std::erf(g / std::sqrt(2.0))) * u;
    case Activation::kGeluTanhAndMul:
      return 0.5 * g * (1 + std::tanh(std::sqrt(2 / pi) * (g + 0.044715 * g * g * g))) * u;
    case Activation::kRelu2:
      return g > 0 ? g * g : 0.0;
    case Activation::kSwigluOai: {
      const double gc = std::min(g, 7.0), uc = std::max(-7.0, std::min(u, 7.0));
      return gc / (1 + std::exp(-1.702 * gc)) * (uc + 1);
    }
    default:
      return 0;
  }
}

// w_gate_up rows of one expert: gate j picks x_j, up j picks x_j / 2.
HostTensor gate_up_weights(Activation a, double scale) {
  const bool gated = a != Activation::kRelu2, inter = a == Activation::kSwigluOai;
  HostTensor w(DType::kF32, {gated ? 2 * kH : kH, kH});
  for (int64_t j = 0; j < kH; ++j) {
    const int64_t g = inter ? 2 * j : j, u = inter ? 2 * j + 1 : kH + j;
    w.set(g * kH + j, scale);
    if (gated) w.set(u * kH + j, 0.5 * scale);
  }
  return w;
}

// The bias of gate/up row r (f32): distinct per row, so a bias read from the wrong row shows.
double gate_up_bias_of(int64_t r, int64_t e) {
  return 0.1 * static_cast<double>(r % 5) - 0.2 + 0.3 * static_cast<double>(e);
}

const Activation kActs[] = {Activation::kSiluAndMul, Activation::kGeluAndMul,
                            Activation::kGeluTanhAndMul, Activation::kRelu2,
                            Activation::kSwigluOai};

TEST(ActivationReference, DenseMlpMatchesTheFormulas) {
  for (Activation a : kActs) {
    for (bool biases : {false, true}) {
      SCOPED_TRACE(std::string(detail::activation_name(a)) + (biases ? " with biases" : ""));
      HostTensor x(DType::kF32, {1, kH});
      for (int64_t h = 0; h < kH; ++h) x.set(h, kX[h]);
      HostTensor wgu = gate_up_weights(a, 1.0);
      HostTensor wd(DType::kF32, {kH, kH});
      for (int64_t h = 0; h < kH; ++h) wd.set(h * kH + h, 1.0);
      const int64_t rows = detail::gate_up_rows(a, kH);
      HostTensor bgu(DType::kF32, {rows}), bd(DType::kF32, {kH});
      for (int64_t r = 0; r < rows; ++r) bgu.set(r, gate_up_bias_of(r, 0));
      for (int64_t h = 0; h < kH; ++h) bd.set(h, 0.25 * static_cast<double>(h));
      HostTensor out(DType::kF32, {1, kH});
      SharedExpertMLPArgs args;
      args.hidden_states = x.view();
      args.w_gate_up = wgu.view();
      args.w_down = wd.view();
      args.activation = a;
      if (biases) {
        args.gate_up_bias = bgu.view();
        args.down_bias = bd.view();
      }
      args.output = out.view();
      reference::shared_expert_mlp(args);
      const bool inter = a == Activation::kSwigluOai;
      for (int64_t j = 0; j < kH; ++j) {
        double g = kX[j], u = kX[j] / 2;
        if (biases) {
          g += gate_up_bias_of(inter ? 2 * j : j, 0);
          u += gate_up_bias_of(inter ? 2 * j + 1 : kH + j, 0);
        }
        const double want = expected_act(a, g, u) + (biases ? 0.25 * static_cast<double>(j) : 0.0);
        EXPECT_NEAR(out.at(j), want, 1e-5 * (1 + std::fabs(want))) << "column " << j;
      }
    }
  }
}

// Two experts (scaled weights, per-expert bias rows), one token routed to both: the sum
// weighs each expert's biased output (its down bias included) by the route's weight.
TEST(ActivationReference, RoutedExpertsTakeEachExpertsBiasRows) {
  for (Activation a : kActs) {
    SCOPED_TRACE(detail::activation_name(a));
    const int64_t rows = detail::gate_up_rows(a, kH);
    HostTensor x(DType::kF32, {1, kH});
    for (int64_t h = 0; h < kH; ++h) x.set(h, kX[h]);
    HostTensor wgu(DType::kF32, {2, rows, kH}), wd(DType::kF32, {2, kH, kH});
    HostTensor bgu(DType::kF32, {2, rows}), bd(DType::kF32, {2, kH});
    for (int64_t e = 0; e < 2; ++e) {
      const HostTensor one = gate_up_weights(a, e == 0 ? 1.0 : -0.5);
      for (int64_t i = 0; i < rows * kH; ++i) wgu.set(e * rows * kH + i, one.at(i));
      for (int64_t h = 0; h < kH; ++h) wd.set(e * kH * kH + h * kH + h, 1.0);
      for (int64_t r = 0; r < rows; ++r) bgu.set(e * rows + r, gate_up_bias_of(r, e));
      for (int64_t h = 0; h < kH; ++h) bd.set(e * kH + h, e == 0 ? 1.0 : -2.0);
    }
    HostTensor w(DType::kF32, {1, 3}), ids(DType::kI32, {1, 3}), out(DType::kF32, {1, kH});
    w.set(0, 0.25);
    w.set(1, 0.75);
    w.set(2, 5.0);
    ids.as<int32_t>()[0] = 1;
    ids.as<int32_t>()[1] = 0;
    ids.as<int32_t>()[2] = -1;  // no route: adds nothing, its bias neither
    FusedMoEExpertsArgs args;
    args.hidden_states = x.view();
    args.w_gate_up = wgu.view();
    args.w_down = wd.view();
    args.gate_up_bias = bgu.view();
    args.down_bias = bd.view();
    args.activation = a;
    args.topk_weights = w.view();
    args.topk_ids = ids.view();
    args.output = out.view();
    reference::fused_moe_experts(args);
    const bool inter = a == Activation::kSwigluOai;
    for (int64_t j = 0; j < kH; ++j) {
      double want = 0;
      for (int64_t e = 0; e < 2; ++e) {
        const double s = e == 0 ? 1.0 : -0.5;
        const double g = s * kX[j] + gate_up_bias_of(inter ? 2 * j : j, e);
        const double u = s * kX[j] / 2 + gate_up_bias_of(inter ? 2 * j + 1 : kH + j, e);
        want += (e == 0 ? 0.75 : 0.25) * (expected_act(a, g, u) + (e == 0 ? 1.0 : -2.0));
      }
      EXPECT_NEAR(out.at(j), want, 1e-5 * (1 + std::fabs(want))) << "column " << j;
    }
  }
}

// round_routes (the sorted path's stored rows): each route's output is rounded to the op's
// dtype before the weighted sum; without it only the sum is. One bf16 expert whose down
// projection scales by 0.3, so the route outputs are not bf16 values.
TEST(ReferenceRoutes, RoundRoutesRoundsEachRouteBeforeTheWeightedSum) {
  HostTensor x(DType::kBF16, {1, kH});
  for (int64_t h = 0; h < kH; ++h) x.set(h, kX[h]);
  const HostTensor wgu32 = gate_up_weights(Activation::kSiluAndMul, 1.0);
  HostTensor wgu(DType::kBF16, {1, 2 * kH, kH}), wd(DType::kBF16, {1, kH, kH});
  for (int64_t i = 0; i < 2 * kH * kH; ++i) wgu.set(i, wgu32.at(i));
  for (int64_t h = 0; h < kH; ++h) wd.set(h * kH + h, 0.3);
  HostTensor w(DType::kF32, {1, 1}), ids(DType::kI32, {1, 1});
  w.set(0, 1.0 / 3.0);
  ids.as<int32_t>()[0] = 0;
  const double wt = static_cast<double>(static_cast<float>(1.0 / 3.0));
  const double d = host::round_to(DType::kBF16, 0.3);
  for (bool round_routes : {false, true}) {
    HostTensor out(DType::kBF16, {1, kH});
    FusedMoEExpertsArgs args;
    args.hidden_states = x.view();
    args.w_gate_up = wgu.view();
    args.w_down = wd.view();
    args.topk_weights = w.view();
    args.topk_ids = ids.view();
    args.output = out.view();
    reference::fused_moe_experts(args, reference::Fp8Activations::kAsGiven, round_routes);
    int differ = 0;
    for (int64_t j = 0; j < kH; ++j) {
      const double g = x.at(j), u = x.at(j) / 2;
      const double y =
          d * host::round_to(DType::kBF16, expected_act(Activation::kSiluAndMul, g, u));
      const double unrounded = host::round_to(DType::kBF16, wt * y);
      const double rounded = host::round_to(DType::kBF16, wt * host::round_to(DType::kBF16, y));
      EXPECT_EQ(out.at(j), round_routes ? rounded : unrounded) << "column " << j;
      differ += rounded != unrounded;
    }
    EXPECT_GT(differ, 0) << "the case does not tell the two apart";
  }
}

}  // namespace
}  // namespace moekit
