// GPU tests of the MLP activations and biases (docs/moe.md "Activations") against the CPU
// references: every activation, without biases, with f32 biases and with biases in the
// op's dtype, on the routed ops (ragged counts, empty experts, all routes to one expert,
// -1 and out-of-range ids, T = 0 and 1, H and F that are no tile multiples), the expert
// MLP on a padded layout (padding rows untouched), the dense shared-expert MLP and the
// whole layers. Outputs are poisoned: every element must be written.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mlp/activation.h"
#include "moekit/moe.h"
#include "moekit/reference.h"
#include "support/gpu.h"
#include "test_moe_common.h"
#include "test_moe_gpu_common.h"

namespace moekit {
namespace {

using detail::activation_name;
using detail::gate_up_rows;
using moetest::expect_close;
using moetest::Ids;
using moetest::kPoison;
using moetest::sync_ok;
using testing::DeviceTensor;
using testing::DeviceWorkspace;

const Activation kActivations[] = {Activation::kSiluAndMul, Activation::kGeluTanhAndMul,
                                   Activation::kGeluAndMul, Activation::kRelu2,
                                   Activation::kSwigluOai};

// Which biases a case adds: none, f32 ones, or ones in the op's dtype.
enum class Bias { kNone, kF32, kDtype };
const Bias kBiases[] = {Bias::kNone, Bias::kF32, Bias::kDtype};

const char* bias_name(Bias b) {
  return b == Bias::kNone ? "no bias" : b == Bias::kF32 ? "f32 biases" : "dtype biases";
}

// One MLP's weights and biases on the host and the device; E = 0: dense (no expert axis).
struct MlpWeights {
  HostTensor wgu, wd, bgu, bd;
  DeviceTensor dwgu, dwd, dbgu, dbd;
  MlpWeights(std::mt19937_64& rng, DType dt, int64_t E, int64_t H, int64_t F, Activation act,
             Bias bias) {
    const int64_t rows = gate_up_rows(act, F);
    auto shape = [E](std::vector<int64_t> s) {
      if (E > 0) s.insert(s.begin(), E);
      return s;
    };
    wgu = moetest::normal(rng, dt, shape({rows, H}), 1.0 / std::sqrt(double(H)));
    wd = moetest::normal(rng, dt, shape({H, F}), 1.0 / std::sqrt(double(F)));
    dwgu = DeviceTensor(wgu);
    dwd = DeviceTensor(wd);
    if (bias == Bias::kNone) return;
    const DType bdt = bias == Bias::kF32 ? DType::kF32 : dt;
    bgu = moetest::normal(rng, bdt, shape({rows}), 0.5);
    bd = moetest::normal(rng, bdt, shape({H}), 0.5);
    dbgu = DeviceTensor(bgu);
    dbd = DeviceTensor(bd);
  }
  bool biased() const { return bgu.dtype() != DType::kUndefined; }
  // The device (or host) views into args with these fields.
  template <class Args>
  void device(Args& a) const {
    a.w_gate_up = dwgu.view();
    a.w_down = dwd.view();
    if (biased()) {
      a.gate_up_bias = dbgu.view();
      a.down_bias = dbd.view();
    }
  }
  template <class Args>
  void host(Args& a) const {
    a.w_gate_up = wgu.view();
    a.w_down = wd.view();
    if (biased()) {
      a.gate_up_bias = bgu.view();
      a.down_bias = bd.view();
    }
  }
};

// ---- fused_moe_experts / indexed_expert_mlp ----

struct RoutedCase {
  DType dt;
  int64_t T, H, E, F, K;
  Ids ids;
};

TEST(MoEActivationGpu, RoutedExpertsMatchReference) {
  MOEKIT_REQUIRE_GPU();
  const DType b = DType::kBF16, h = DType::kF16;
  const RoutedCase cases[] = {
      {b, 0, 128, 8, 64, 2, Ids::kDistinct},   {b, 1, 256, 16, 96, 4, Ids::kDistinct},
      {h, 37, 136, 16, 72, 4, Ids::kMixed},    {b, 64, 128, 8, 64, 4, Ids::kOneExpert},
      {b, 70, 264, 16, 40, 6, Ids::kMinusOne}, {h, 50, 128, 32, 64, 8, Ids::kFewExperts},
      {b, 130, 256, 16, 128, 4, Ids::kMixed},
  };
  uint64_t seed = 7000;
  for (Activation act : kActivations) {
    for (Bias bias : kBiases) {
      for (const RoutedCase& c : cases) {
        const std::string name = std::string(activation_name(act)) + ", " + bias_name(bias) + ", " +
                                 dtype_name(c.dt) + " T=" + std::to_string(c.T) +
                                 " H=" + std::to_string(c.H) + " E=" + std::to_string(c.E) +
                                 " F=" + std::to_string(c.F) + " K=" + std::to_string(c.K) +
                                 " ids=" + moetest::ids_name(c.ids);
        SCOPED_TRACE(name);
        std::mt19937_64 rng(++seed);
        HostTensor x = moetest::normal(rng, c.dt, {c.T, c.H}, 1.0);
        MlpWeights m(rng, c.dt, c.E, c.H, c.F, act, bias);
        HostTensor w = moetest::make_topk_weights(rng, c.T, c.K);
        HostTensor ids = moetest::make_ids(rng, c.T, c.K, c.E, c.ids);
        HostTensor ref(c.dt, {c.T, c.H});
        FusedMoEExpertsArgs r;
        r.hidden_states = x.view();
        m.host(r);
        r.activation = act;
        r.topk_weights = w.view();
        r.topk_ids = ids.view();
        r.output = ref.view();
        reference::fused_moe_experts(r);
        DeviceTensor dx(x), dw(w), dids(ids);
        for (bool indexed : {false, true}) {
          DeviceTensor out(c.dt, {c.T, c.H}, kPoison);
          FusedMoEExpertsArgs a;
          a.hidden_states = dx.view();
          m.device(a);
          a.activation = act;
          a.topk_weights = dw.view();
          a.topk_ids = dids.view();
          a.output = out.view();
          // The general path: sorted at every T (the direct kernels run silu_and_mul only).
          const LayerPlan plan = indexed ? plan_indexed_expert_mlp(a) : plan_fused_moe_experts(a);
          if (act != Activation::kSiluAndMul || bias != Bias::kNone)
            EXPECT_EQ(plan.routed, RoutedPath::kSorted) << to_string(plan);
          DeviceWorkspace ws(indexed ? indexed_expert_mlp_workspace_size(a)
                                     : fused_moe_experts_workspace_size(a));
          a.workspace = ws.get();
          if (indexed) {
            indexed_expert_mlp(a, nullptr);
          } else {
            fused_moe_experts(a, nullptr);
          }
          sync_ok();
          expect_close(out.download(), ref, c.dt,
                       std::string(indexed ? "indexed_expert_mlp " : "fused_moe_experts ") + name);
        }
      }
    }
  }
}

// ---- moe_expert_mlp: padded layout, empty experts, in place ----

TEST(MoEActivationGpu, ExpertMLPMatchesReferenceAndLeavesPaddingUntouched) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 7500;
  for (Activation act : kActivations) {
    for (Bias bias : kBiases) {
      for (DType dt : {DType::kBF16, DType::kF16}) {
        const int64_t E = 9, H = 136, F = 72;
        const int alignment = dt == DType::kBF16 ? 8 : 1;
        SCOPED_TRACE(std::string(activation_name(act)) + ", " + bias_name(bias) + ", " +
                     dtype_name(dt));
        std::mt19937_64 rng(++seed);
        std::uniform_int_distribution<int64_t> count(0, 30);
        moetest::RaggedRows rows = moetest::ragged_rows(
            E, alignment, [&](int64_t e) { return (e % 3 == 1) ? int64_t{0} : count(rng); });
        const int64_t P = rows.P;
        HostTensor x = moetest::normal(rng, dt, {P, H}, 1.0);
        MlpWeights m(rng, dt, E, H, F, act, bias);
        DeviceTensor dx(x), dmeta(rows.meta);
        DeviceTensor out(dt, {P, H}, kPoison);
        ExpertMLPArgs a;
        a.expert_input = dx.view();
        a.layout_metadata = dmeta.view();
        a.layout = PermutedLayout::contiguous(alignment);
        m.device(a);
        a.activation = act;
        a.expert_output = out.view();
        DeviceWorkspace ws(expert_mlp_workspace_size(a));
        a.workspace = ws.get();
        moe_expert_mlp(a, nullptr);
        sync_ok();
        HostTensor got = out.download();
        HostTensor ref(dt, {P, H});
        ExpertMLPArgs r = a;
        r.expert_input = x.view();
        r.layout_metadata = rows.meta.view();
        m.host(r);
        r.expert_output = ref.view();
        reference::moe_expert_mlp(r);
        std::vector<uint8_t> mask(static_cast<size_t>(P));
        for (int64_t row = 0; row < P; ++row) mask[row] = rows.expert_of_row[row] >= 0;
        expect_close(got, ref, dt, "moe_expert_mlp", mask.data());
        const uint8_t* bytes = static_cast<const uint8_t*>(got.data());
        for (int64_t row = 0; row < P; ++row) {
          if (mask[row]) continue;
          for (int64_t i = 0; i < H * 2; ++i) {
            if (bytes[row * H * 2 + i] != kPoison) {
              ADD_FAILURE() << "padding row " << row << " was written";
              break;
            }
          }
        }
        // In place (expert_output == expert_input) gives the same rows.
        a.expert_output = dx.view();
        moe_expert_mlp(a, nullptr);
        sync_ok();
        expect_close(dx.download(), ref, dt, "moe_expert_mlp in place", mask.data());
      }
    }
  }
}

// ---- shared_expert_mlp ----

TEST(MoEActivationGpu, SharedExpertMLPMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 7800;
  for (Activation act : kActivations) {
    for (Bias bias : kBiases) {
      for (int64_t T : {0, 1, 37, 200}) {
        const DType dt = T % 2 ? DType::kF16 : DType::kBF16;
        const int64_t H = 136, S = 72;
        SCOPED_TRACE(std::string(activation_name(act)) + ", " + bias_name(bias) +
                     ", T=" + std::to_string(T));
        std::mt19937_64 rng(++seed);
        HostTensor x = moetest::normal(rng, dt, {T, H}, 1.0);
        MlpWeights m(rng, dt, 0, H, S, act, bias);
        DeviceTensor dx(x);
        DeviceTensor out(dt, {T, H}, kPoison);
        SharedExpertMLPArgs a;
        a.hidden_states = dx.view();
        m.device(a);
        a.activation = act;
        a.output = out.view();
        DeviceWorkspace ws(shared_expert_mlp_workspace_size(a));
        a.workspace = ws.get();
        shared_expert_mlp(a, nullptr);
        sync_ok();
        HostTensor ref(dt, {T, H});
        SharedExpertMLPArgs r = a;
        r.hidden_states = x.view();
        m.host(r);
        r.output = ref.view();
        reference::shared_expert_mlp(r);
        expect_close(out.download(), ref, dt, "shared_expert_mlp");
      }
    }
  }
}

// ---- fused_moe and fused_moe_shared_expert ----

TEST(MoEActivationGpu, LayersMatchReference) {
  MOEKIT_REQUIRE_GPU();
  struct Case {
    Activation act;
    Bias bias;
    int64_t T, H, E, F, K, S;  // S = 0: fused_moe
  };
  const Case cases[] = {
      {Activation::kSwigluOai, Bias::kDtype, 1, 256, 16, 128, 4, 0},
      {Activation::kSwigluOai, Bias::kF32, 40, 256, 16, 128, 4, 0},
      {Activation::kGeluAndMul, Bias::kNone, 0, 128, 8, 64, 2, 64},
      {Activation::kGeluAndMul, Bias::kF32, 33, 136, 12, 72, 3, 96},
      {Activation::kGeluTanhAndMul, Bias::kDtype, 1, 128, 8, 64, 2, 64},
      {Activation::kRelu2, Bias::kDtype, 70, 128, 8, 64, 4, 128},
      {Activation::kRelu2, Bias::kNone, 5, 264, 9, 40, 2, 0},
      {Activation::kSiluAndMul, Bias::kF32, 17, 128, 8, 64, 2, 64},
      // fused_moe (no shared expert) with the other activations, past the direct path too,
      // and T = 0 on each kind of layer.
      {Activation::kGeluTanhAndMul, Bias::kF32, 90, 128, 8, 64, 2, 0},
      {Activation::kSiluAndMul, Bias::kDtype, 9, 128, 8, 64, 2, 0},
      {Activation::kGeluAndMul, Bias::kDtype, 300, 136, 12, 72, 3, 0},
      {Activation::kSwigluOai, Bias::kF32, 0, 256, 16, 128, 4, 0},
      {Activation::kSwigluOai, Bias::kDtype, 70, 256, 16, 128, 4, 64},
      {Activation::kRelu2, Bias::kF32, 0, 128, 8, 64, 4, 128},
  };
  uint64_t seed = 8100;
  for (const Case& c : cases) {
    const DType dt = DType::kBF16;
    const std::string name = std::string(c.S ? "fused_moe_shared_expert " : "fused_moe ") +
                             activation_name(c.act) + ", " + bias_name(c.bias) +
                             " T=" + std::to_string(c.T) + " E=" + std::to_string(c.E);
    SCOPED_TRACE(name);
    std::mt19937_64 rng(++seed);
    HostTensor x = moetest::normal(rng, dt, {c.T, c.H}, 1.0);
    HostTensor logits = moetest::normal(rng, DType::kF32, {c.T, c.E}, 1.0);
    MlpWeights m(rng, dt, c.E, c.H, c.F, c.act, c.bias);
    const bool shared = c.S > 0;
    MlpWeights sm(rng, dt, 0, c.H, shared ? c.S : 8, c.act, c.bias);
    DeviceTensor dx(x), dlogits(logits);
    DeviceTensor out(dt, {c.T, c.H}, kPoison);
    FusedMoESharedExpertArgs a;
    a.moe.hidden_states = dx.view();
    a.moe.gating_output = dlogits.view();
    a.moe.params.top_k = static_cast<int>(c.K);
    a.moe.params.renormalize = true;
    m.device(a.moe);
    a.moe.activation = c.act;
    a.moe.output = out.view();
    if (shared) {
      a.shared_w_gate_up = sm.dwgu.view();
      a.shared_w_down = sm.dwd.view();
      if (sm.biased()) {
        a.shared_gate_up_bias = sm.dbgu.view();
        a.shared_down_bias = sm.dbd.view();
      }
    }
    FusedMoESharedExpertArgs r = a;
    HostTensor ref(dt, {c.T, c.H});
    r.moe.hidden_states = x.view();
    r.moe.gating_output = logits.view();
    m.host(r.moe);
    r.moe.output = ref.view();
    if (shared) {
      r.shared_w_gate_up = sm.wgu.view();
      r.shared_w_down = sm.wd.view();
      if (sm.biased()) {
        r.shared_gate_up_bias = sm.bgu.view();
        r.shared_down_bias = sm.bd.view();
      }
    }
    if (shared) {
      DeviceWorkspace ws(fused_moe_shared_expert_workspace_size(a));
      a.moe.workspace = ws.get();
      fused_moe_shared_expert(a, nullptr);
      sync_ok();
      reference::fused_moe_shared_expert(r);
    } else {
      DeviceWorkspace ws(fused_moe_workspace_size(a.moe));
      a.moe.workspace = ws.get();
      fused_moe(a.moe, nullptr);
      sync_ok();
      reference::fused_moe(r.moe);
    }
    expect_close(out.download(), ref, dt, name);
  }
}

}  // namespace
}  // namespace moekit
