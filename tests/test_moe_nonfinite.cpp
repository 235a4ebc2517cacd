// The MoE ops with NaN / Inf in the activations, the routing weights, the logits and one
// weight element of an expert (IEEE arithmetic, no check), on the paths each op takes
// (expert MLP: the planner's GEMMs, then every candidate that runs one plan for both
// GEMMs: the decode tiles, sm90 and the SM90 chains; dense MLP: GEMV, direct, stream-K,
// the GEMMs; routed layers: the indexed and the sorted path). Each run against a clean run of the
// same inputs: a NaN reaches NaN exactly where the math says (a token row, an expert's rows, a
// column), an Inf reaches non-finite elements, and every other element keeps the clean run's bits
// (padding rows their poison). Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gemm/grouped_gemm.h"
#include "gemm/sm90/device.h"
#include "mlp/streamk_mlp.h"
#include "moekit/moe.h"
#include "moekit/routing.h"
#include "support/gpu.h"
#include "support/nonfinite.h"
#include "test_dense_mlp_common.h"
#include "test_moe_common.h"

namespace moekit {
namespace {

using dense_mlp_test::kPoison;
using dense_mlp_test::ScopedKnob;
using dense_mlp_test::sync_ok;
using testing::DeviceTensor;
using testing::DeviceWorkspace;
using testing::NonFinite;
using testing::Reach;

// Element (row, col) of a [rows, cols] tensor.
void poison(HostTensor& t, int64_t row, int64_t col, NonFinite v) {
  testing::set_nonfinite(t, row * t.shape().back() + col, v);
}

// ---- moe_expert_mlp ----

struct ExpertMlpInputs {
  DType dt;
  int64_t E, H, F;
  moetest::RaggedRows rows;
  HostTensor x, wgu, wd;
};

// Device copies of the inputs and the op's args over them (the output poisoned).
struct ExpertMlpDevice {
  DeviceTensor dx, dmeta, dwgu, dwd, out;
  ExpertMLPArgs a;
  ExpertMlpDevice(const ExpertMlpInputs& in, const HostTensor& x, const HostTensor& wgu,
                  const HostTensor& wd, int alignment)
      : dx(x), dmeta(in.rows.meta), dwgu(wgu), dwd(wd), out(in.dt, {in.rows.P, in.H}, kPoison) {
    a.expert_input = dx.view();
    a.layout_metadata = dmeta.view();
    a.layout = PermutedLayout::contiguous(alignment);
    a.w_gate_up = dwgu.view();
    a.w_down = dwd.view();
    a.expert_output = out.view();
  }
};

HostTensor run_expert_mlp(const ExpertMlpInputs& in, const HostTensor& x, const HostTensor& wgu,
                          const HostTensor& wd, int alignment, const MlpPlan* plan) {
  ExpertMlpDevice d(in, x, wgu, wd, alignment);
  DeviceWorkspace ws(expert_mlp_workspace_size(d.a));
  d.a.workspace = ws.get();
  d.a.plan = plan;
  moe_expert_mlp(d.a, nullptr);
  sync_ok();
  return d.out.download();
}

// The expert MLP's candidate plans that run one plan for both GEMMs (the chains among them).
std::vector<MlpPlan> same_plan_candidates(const ExpertMlpInputs& in, int alignment) {
  const ExpertMlpDevice d(in, in.x, in.wgu, in.wd, alignment);
  std::vector<MlpPlan> plans;
  for (const MlpPlan& p : expert_mlp_plan_candidates(d.a)) {
    if (p.gate_up == p.down) plans.push_back(p);
  }
  return plans;
}

TEST(MoENonFiniteGpu, ExpertMlpOnEveryPath) {
  MOEKIT_REQUIRE_GPU();
  struct Case {
    DType dt;
    int64_t E, H, F, max_count;
    int alignment;
  };
  const Case cases[] = {{DType::kBF16, 8, 264, 136, 300, 8}, {DType::kF16, 6, 136, 200, 200, 1}};
  uint64_t seed = 2840;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + " E=" + std::to_string(c.E));
    std::mt19937_64 rng(++seed);
    std::uniform_int_distribution<int64_t> count(1, c.max_count);
    ExpertMlpInputs in{c.dt, c.E, c.H, c.F, {}, {}, {}, {}};
    in.rows = moetest::ragged_rows(c.E, c.alignment,
                                   [&](int64_t e) { return e == 4 ? int64_t{0} : count(rng); });
    in.x = moetest::normal(rng, c.dt, {in.rows.P, c.H}, 1.0);
    in.wgu = moetest::normal(rng, c.dt, {c.E, 2 * c.F, c.H}, 1.0 / std::sqrt(double(c.H)));
    in.wd = moetest::normal(rng, c.dt, {c.E, c.H, c.F}, 1.0 / std::sqrt(double(c.F)));

    HostTensor x = in.x, wgu = in.wgu, wd = in.wd;
    testing::ReachMap reach(in.rows.P, c.H);
    std::uniform_int_distribution<int64_t> col_h(0, c.H - 1), col_f(0, c.F - 1);
    int valid = 0;
    for (int64_t r = 0; r < in.rows.P; ++r) {
      if (in.rows.expert_of_row[r] < 0) continue;
      if (valid % 9 == 0) {
        poison(x, r, col_h(rng), valid % 18 ? NonFinite::kNegativeNan : NonFinite::kNan);
        reach.mark_row(r, Reach::kNan);
      } else if (valid % 9 == 4) {
        poison(x, r, col_h(rng), NonFinite::kNegInf);
        reach.mark_row(r, Reach::kNonFinite);
      }
      ++valid;
    }
    // Expert 0: a NaN in a gate row (its act column NaN, then every output of its rows);
    // expert 1: an Inf in an up row (every output non-finite); expert 2: a NaN in w_down
    // (one output column); expert 3: an Inf in w_down (one column non-finite).
    const int64_t h2 = col_h(rng), h3 = col_h(rng);
    poison(wgu, 0 * 2 * c.F + col_f(rng), col_h(rng), NonFinite::kNan);
    poison(wgu, 1 * 2 * c.F + c.F + col_f(rng), col_h(rng), NonFinite::kPosInf);
    poison(wd, 2 * c.H + h2, col_f(rng), NonFinite::kNan);
    poison(wd, 3 * c.H + h3, col_f(rng), NonFinite::kNegInf);
    for (int64_t r = 0; r < in.rows.P; ++r) {
      const int e = in.rows.expert_of_row[r];
      if (e == 0) reach.mark_row(r, Reach::kNan);
      if (e == 1) reach.mark_row(r, Reach::kNonFinite);
      if (e == 2) reach.mark(r, h2, Reach::kNan);
      if (e == 3) reach.mark(r, h3, Reach::kNonFinite);
    }
    // The planner's plan, then every candidate with one plan for both GEMMs.
    const std::vector<MlpPlan> plans = same_plan_candidates(in, c.alignment);
    ASSERT_GE(plans.size(), 3u);  // on an H200: the decode tiles, sm90 and its chain
    for (size_t i = 0; i <= plans.size(); ++i) {
      const MlpPlan* plan = i == 0 ? nullptr : &plans[i - 1];
      const HostTensor clean = run_expert_mlp(in, in.x, in.wgu, in.wd, c.alignment, plan);
      const HostTensor got = run_expert_mlp(in, x, wgu, wd, c.alignment, plan);
      testing::expect_reach(
          got, clean, reach,
          "moe_expert_mlp, " + (plan ? to_string(*plan) : std::string("planner")));
    }
  }
}

// ---- shared_expert_mlp ----

// The op under `plan` (nullptr: the planner's) on device copies of `in` (poisoned output
// and workspace).
HostTensor run_shared(const dense_mlp_test::MlpCase& c, const dense_mlp_test::MlpInputs& in,
                      const MlpPlan* plan) {
  dense_mlp_test::MlpDevice d(c, in);
  d.args.plan = plan;
  shared_expert_mlp(d.args, nullptr);
  sync_ok();
  return d.out.download();
}

TEST(MoENonFiniteGpu, SharedExpertMlpOnEveryPath) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 2850;
  for (int64_t T : {1, 16, 48, 200}) {
    const dense_mlp_test::MlpCase c{DType::kBF16, T, 264, 136};
    SCOPED_TRACE(dense_mlp_test::name(c));
    const dense_mlp_test::MlpInputs clean(c, ++seed);
    dense_mlp_test::MlpInputs bad = clean;
    std::mt19937_64 rng(seed);
    testing::ReachMap reach(T, c.H);
    std::uniform_int_distribution<int64_t> col_h(0, c.H - 1), col_s(0, c.S - 1);
    for (int64_t t = 0; t < T; ++t) {
      if (t % 5 == 1) {
        poison(bad.x, t, col_h(rng), NonFinite::kNan);
        reach.mark_row(t, Reach::kNan);
      } else if (t % 5 == 3) {
        poison(bad.x, t, col_h(rng), NonFinite::kPosInf);
        reach.mark_row(t, Reach::kNonFinite);
      }
    }
    // w_down elements: one output column NaN, another non-finite, for every token.
    const int64_t h_nan = col_h(rng), h_inf = (h_nan + 1 + col_h(rng) % (c.H - 1)) % c.H;
    poison(bad.wd, h_nan, col_s(rng), NonFinite::kNan);
    poison(bad.wd, h_inf, col_s(rng), NonFinite::kPosInf);
    reach.mark_col(h_nan, Reach::kNan);
    reach.mark_col(h_inf, Reach::kNonFinite);
    // The planner's plan, then each path's plan where that path runs the shape.
    testing::expect_reach(run_shared(c, bad, nullptr), run_shared(c, clean, nullptr), reach,
                          "shared_expert_mlp, the planner's plan");
    const dense_mlp_test::MlpDevice probe(c, clean);
    for (MlpPath path : {MlpPath::kStreamK, MlpPath::kTwoGemms, MlpPath::kDirect, MlpPath::kGemv}) {
      MlpPlan plan;
      if (!dense_mlp_test::plan_on_path(path, probe.args, &plan)) continue;
      testing::expect_reach(run_shared(c, bad, &plan), run_shared(c, clean, &plan), reach,
                            "shared_expert_mlp, " + to_string(plan));
    }
  }
}

// ---- fused_moe_experts and indexed_expert_mlp ----

HostTensor run_routed(const HostTensor& x, const HostTensor& wgu, const HostTensor& wd,
                      const HostTensor& w, const HostTensor& ids, bool indexed) {
  const int64_t T = x.shape()[0], H = x.shape()[1];
  DeviceTensor dx(x), dwgu(wgu), dwd(wd), dw(w), dids(ids), out(x.dtype(), {T, H}, kPoison);
  FusedMoEExpertsArgs a;
  a.hidden_states = dx.view();
  a.w_gate_up = dwgu.view();
  a.w_down = dwd.view();
  a.topk_weights = dw.view();
  a.topk_ids = dids.view();
  a.output = out.view();
  DeviceWorkspace ws(indexed ? indexed_expert_mlp_workspace_size(a)
                             : fused_moe_experts_workspace_size(a));
  a.workspace = ws.get();
  indexed ? indexed_expert_mlp(a, nullptr) : fused_moe_experts(a, nullptr);
  sync_ok();
  return out.download();
}

// Tokens with a valid route (an id in [0, E)) to expert e.
std::vector<bool> routed_to(const HostTensor& ids, int64_t E, int e) {
  const int64_t T = ids.shape()[0], K = ids.shape()[1];
  std::vector<bool> hit(static_cast<size_t>(T), false);
  for (int64_t i = 0; i < T * K; ++i) {
    const int32_t id = ids.as<int32_t>()[i];
    if (id == e && e < E) hit[i / K] = true;
  }
  return hit;
}

TEST(MoENonFiniteGpu, RoutedExpertsOnBothPaths) {
  MOEKIT_REQUIRE_GPU();
  const DType dt = DType::kBF16;
  const int64_t H = 256, E = 16, F = 128, K = 4;
  uint64_t seed = 2860;
  for (int64_t T : {24, 150}) {
    std::mt19937_64 rng(++seed);
    const HostTensor x0 = moetest::normal(rng, dt, {T, H}, 1.0);
    const HostTensor wgu0 = moetest::normal(rng, dt, {E, 2 * F, H}, 1.0 / std::sqrt(double(H)));
    const HostTensor wd0 = moetest::normal(rng, dt, {E, H, F}, 1.0 / std::sqrt(double(F)));
    const HostTensor w0 = moetest::make_topk_weights(rng, T, K);
    const HostTensor ids = moetest::make_ids(rng, T, K, E, moetest::Ids::kMixed);
    HostTensor x = x0, wgu = wgu0, wd = wd0, w = w0;
    testing::ReachMap reach(T, H);
    std::uniform_int_distribution<int64_t> col_h(0, H - 1), col_f(0, F - 1);
    const auto valid = [&](int64_t i) {
      const int32_t id = ids.as<int32_t>()[i];
      return id >= 0 && id < E;
    };
    // A token without a valid route gets zeros whatever its row holds: nothing reaches it.
    std::vector<bool> has_route(static_cast<size_t>(T), false);
    for (int64_t i = 0; i < T * K; ++i) has_route[i / K] = has_route[i / K] || valid(i);
    for (int64_t t = 0; t < T; ++t) {
      if (t % 6 == 1) {
        poison(x, t, col_h(rng), NonFinite::kNan);
        if (has_route[t]) reach.mark_row(t, Reach::kNan);
      } else if (t % 6 == 3) {
        poison(x, t, col_h(rng), NonFinite::kPosInf);
        if (has_route[t]) reach.mark_row(t, Reach::kNonFinite);
      }
      for (int64_t k = 0; k < K; ++k) {  // routing weights: NaN, Inf, and NaN on dropped routes
        const int64_t i = t * K + k;
        if (!valid(i)) {
          w.set(i, NAN);  // reaches nothing
        } else if (t % 6 == 5 && k == 0) {
          w.set(i, NAN);
          reach.mark_row(t, Reach::kNan);
        } else if (t % 12 == 2 && k == 1) {
          w.set(i, INFINITY);
          reach.mark_row(t, Reach::kNonFinite);
        }
      }
    }
    // Expert 3: a NaN in a gate row (its tokens' rows NaN); expert 5: a NaN in w_down (one
    // column of its tokens).
    const int64_t h5 = col_h(rng);
    poison(wgu, 3 * 2 * F + col_f(rng), col_h(rng), NonFinite::kNan);
    poison(wd, 5 * H + h5, col_f(rng), NonFinite::kNan);
    const std::vector<bool> to3 = routed_to(ids, E, 3), to5 = routed_to(ids, E, 5);
    for (int64_t t = 0; t < T; ++t) {
      if (to3[t]) reach.mark_row(t, Reach::kNan);
      if (to5[t]) reach.mark(t, h5, Reach::kNan);
    }
    ASSERT_GT(reach.count(Reach::kNone), 0);
    for (bool indexed : {true, false}) {
      const std::string what = std::string(indexed ? "indexed_expert_mlp" : "fused_moe_experts") +
                               " T=" + std::to_string(T);
      const HostTensor clean = run_routed(x0, wgu0, wd0, w0, ids, indexed);
      const HostTensor got = run_routed(x, wgu, wd, w, ids, indexed);
      testing::expect_reach(got, clean, reach, what);
    }
  }
}

// ---- fused_moe and fused_moe_shared_expert ----

struct LayerInputs {
  HostTensor x, logits, bias, wgu, wd, sgu, sd;
};

// The layer's output (shared: with the shared expert), and the ids its routing picks.
HostTensor run_layer(const LayerInputs& in, const TopKParams& p, bool bias, bool shared,
                     HostTensor* ids_out) {
  const int64_t T = in.x.shape()[0], H = in.x.shape()[1];
  DeviceTensor dx(in.x), dlogits(in.logits), dbias(in.bias), dwgu(in.wgu), dwd(in.wd), dsgu(in.sgu),
      dsd(in.sd), out(in.x.dtype(), {T, H}, kPoison);
  FusedMoESharedExpertArgs a;
  a.moe.hidden_states = dx.view();
  a.moe.gating_output = dlogits.view();
  if (bias) a.moe.correction_bias = dbias.view();
  a.moe.params = p;
  a.moe.w_gate_up = dwgu.view();
  a.moe.w_down = dwd.view();
  a.moe.output = out.view();
  if (shared) {
    a.shared_w_gate_up = dsgu.view();
    a.shared_w_down = dsd.view();
  }
  DeviceWorkspace ws(shared ? fused_moe_shared_expert_workspace_size(a)
                            : fused_moe_workspace_size(a.moe));
  a.moe.workspace = ws.get();
  shared ? fused_moe_shared_expert(a, nullptr) : fused_moe(a.moe, nullptr);
  sync_ok();
  // The routing the layer ran (fused_topk is deterministic): the same op on the same logits.
  DeviceTensor dw(DType::kF32, {T, p.top_k}), dids(DType::kI32, {T, p.top_k});
  FusedTopKArgs r;
  r.gating_output = dlogits.view();
  if (bias) r.correction_bias = dbias.view();
  r.params = p;
  r.topk_weights = dw.view();
  r.topk_ids = dids.view();
  fused_topk(r, nullptr);
  sync_ok();
  *ids_out = dids.download();
  return out.download();
}

TEST(MoENonFiniteGpu, FusedLayersWithNonFiniteLogitsAndWeights) {
  MOEKIT_REQUIRE_GPU();
  struct Case {
    int64_t T, H, E, F, K, S;
    bool grouped;  // sigmoid + bias, 8 groups, top 4, renormalized, x2.5; else softmax
  };
  const Case cases[] = {
      {16, 256, 64, 128, 8, 128, true},    // the direct path
      {100, 256, 64, 128, 8, 128, false},  // the permuted path
      {1200, 264, 32, 200, 4, 0, false},   // ~150 routed rows per expert: the SM90 chain
      // Odd E past 512 (32-slot routing rows, the chunked route sort) and E = 1024.
      {16, 64, 513, 32, 8, 64, false},   // the direct path
      {100, 64, 513, 32, 8, 0, false},   // the permuted path
      {300, 128, 1024, 64, 8, 0, true},  // the permuted path, 8 groups of 128
  };
  const DType dt = DType::kBF16;
  uint64_t seed = 2870;
  for (const Case& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                 (c.grouped ? " grouped sigmoid" : " softmax"));
    std::mt19937_64 rng(++seed);
    const int64_t S = c.S > 0 ? c.S : 8;
    LayerInputs clean;
    clean.x = moetest::normal(rng, dt, {c.T, c.H}, 1.0);
    clean.logits = moetest::normal(rng, DType::kF32, {c.T, c.E}, 1.0);
    clean.bias = moetest::normal(rng, DType::kF32, {c.E}, 0.1);
    clean.wgu = moetest::normal(rng, dt, {c.E, 2 * c.F, c.H}, 1.0 / std::sqrt(double(c.H)));
    clean.wd = moetest::normal(rng, dt, {c.E, c.H, c.F}, 1.0 / std::sqrt(double(c.F)));
    clean.sgu = moetest::normal(rng, dt, {2 * S, c.H}, 1.0 / std::sqrt(double(c.H)));
    clean.sd = moetest::normal(rng, dt, {c.H, S}, 1.0 / std::sqrt(double(S)));
    TopKParams p;
    p.top_k = static_cast<int>(c.K);
    if (c.grouped) {
      p.scoring_func = ScoringFunc::kSigmoid;
      p.renormalize = true;
      p.num_expert_group = 8;
      p.topk_group = 4;
      p.routed_scaling_factor = 2.5f;
    }
    const bool shared = c.S > 0;
    HostTensor clean_ids;
    const HostTensor base = run_layer(clean, p, c.grouped, shared, &clean_ids);

    LayerInputs bad = clean;
    testing::ReachMap reach(c.T, c.H);
    std::uniform_int_distribution<int64_t> col_h(0, c.H - 1), col_e(0, c.E - 1);
    for (int64_t t = 0; t < c.T; ++t) {
      if (t % 7 == 1) {  // a NaN logit: every weight of the row NaN (softmax or renormalized)
        poison(bad.logits, t, col_e(rng), t % 14 == 1 ? NonFinite::kNan : NonFinite::kNegativeNan);
        reach.mark_row(t, Reach::kNan);
      } else if (t % 7 == 3 && !c.grouped) {  // softmax of a +Inf logit: NaN weights
        poison(bad.logits, t, col_e(rng), NonFinite::kPosInf);
        reach.mark_row(t, Reach::kNan);
      } else if (t % 7 == 5) {
        poison(bad.x, t, col_h(rng), NonFinite::kNan);
        reach.mark_row(t, Reach::kNan);
      }
    }
    // A NaN in w_down of an expert token 0 routes to: one column of its tokens. With the
    // shared expert, a NaN in its w_down: one column of every token.
    const int e = clean_ids.as<int32_t>()[0];
    const int64_t h_routed = col_h(rng), h_shared = col_h(rng);
    poison(bad.wd, e * c.H + h_routed, 0, NonFinite::kNan);
    if (shared) {
      poison(bad.sd, h_shared, S - 1, NonFinite::kNan);
      reach.mark_col(h_shared, Reach::kNan);
    }
    HostTensor ids;
    const HostTensor got = run_layer(bad, p, c.grouped, shared, &ids);
    const std::vector<bool> to_e = routed_to(ids, c.E, e);
    for (int64_t t = 0; t < c.T; ++t)
      if (to_e[t]) reach.mark(t, h_routed, Reach::kNan);
    int64_t moved = 0;  // ids that changed outside the poisoned-logit rows: none may
    for (int64_t t = 0; t < c.T; ++t) {
      if (t % 7 == 1 || (t % 7 == 3 && !c.grouped)) continue;
      for (int64_t k = 0; k < c.K; ++k)
        moved += ids.as<int32_t>()[t * c.K + k] != clean_ids.as<int32_t>()[t * c.K + k];
    }
    EXPECT_EQ(moved, 0) << "routing changed in rows with finite logits";
    ASSERT_GT(reach.count(Reach::kNone), 0);
    testing::expect_reach(got, base, reach, shared ? "fused_moe_shared_expert" : "fused_moe");
  }
}

}  // namespace
}  // namespace moekit
