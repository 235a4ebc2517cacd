// GPU tests of FP8 weights past the decode kernels (docs/moe.md "Quantized weights"): the
// sorted path (FP8 pre-permute, the contiguous FP8 GEMMs with silu_and_mul, the activation
// quantized, the combine), moe_expert_mlp on ragged layouts and the dense shared expert on one
// group, in every scheme (per tensor with static scales too), bf16 and f16, T = 129 and 300
// (the routed FP8 direct kernels take T <= 128; the dense shared expert's, T <= 64: 65), and
// fused_moe_experts (sorted at any T) at T = 0 and 1, -1 / out-of-range ids, empty experts and
// one expert, an expert map with i64 ids and the router weight on the input, the 128 x 128
// and 128 x 256 tiles, widths off the tiles, scales of extreme magnitude (2^-30 .. 2^30, with
// compensating data). Against the CPU references quantizing
// the activations as the kernels do (Fp8Activations::kQuantized), at the fp8 tolerance (the
// GPU reference too, as the bench checks these rows); poisoned outputs, NaN-free results,
// padding rows untouched.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "reference/fp8_quant_ref.h"
#include "reference/gpu_reference.h"
#include "support/gpu.h"
#include "test_moe_common.h"

namespace moekit {
namespace {

using moetest::Ids;
using reference::Fp8Activations;
using testing::DeviceTensor;
using testing::DeviceWorkspace;

constexpr QuantScheme kSchemes[] = {QuantScheme::kFp8PerTensor, QuantScheme::kFp8PerChannel,
                                    QuantScheme::kFp8Block128};

// e4m3 weights ~ N(0, 1) codes and scales of `scheme` around 1 / sqrt(cols) (count 0: no E
// axis), the dequantized weights ~ N(0, 1 / cols); gate_up_mag / down_mag multiply each
// matrix's scales (extreme magnitudes).
struct Fp8Set {
  HostTensor wgu, wd, sgu, sd;
  Fp8Set(std::mt19937_64& rng, QuantScheme scheme, int64_t count, int64_t H, int64_t F,
         double gate_up_mag = 1.0, double down_mag = 1.0) {
    wgu = codes(rng, count, 2 * F, H);
    wd = codes(rng, count, H, F);
    sgu = scales(rng, scheme, count, 2 * F, H, gate_up_mag);
    sd = scales(rng, scheme, count, H, F, down_mag);
  }
  static std::vector<int64_t> shape(int64_t count, std::vector<int64_t> dims) {
    if (count > 0) dims.insert(dims.begin(), count);
    return dims;
  }
  static HostTensor codes(std::mt19937_64& rng, int64_t count, int64_t rows, int64_t cols) {
    HostTensor w(DType::kFP8E4M3, shape(count, {rows, cols}));
    std::normal_distribution<double> n(0.0, 1.0);
    for (int64_t i = 0; i < w.numel(); ++i)
      w.as<uint8_t>()[i] = host::float_to_fp8e4m3(static_cast<float>(n(rng)));
    return w;
  }
  static HostTensor scales(std::mt19937_64& rng, QuantScheme scheme, int64_t count, int64_t rows,
                           int64_t cols, double mag) {
    std::vector<int64_t> dims;
    if (scheme == QuantScheme::kFp8PerTensor && count == 0) dims = {1};
    if (scheme == QuantScheme::kFp8PerChannel) dims = {rows};
    if (scheme == QuantScheme::kFp8Block128) dims = {(rows + 127) / 128, (cols + 127) / 128};
    HostTensor s(DType::kF32, shape(count, dims));
    std::uniform_real_distribution<double> u(0.5, 1.5);
    for (int64_t i = 0; i < s.numel(); ++i) s.set(i, mag * u(rng) / std::sqrt(double(cols)));
    return s;
  }
};

// Device copies of a weight set and its WeightQuant (static per-tensor activation scales
// when `static_scales`: around the activations' amax / 448, for gate/up inputs ~ N(0, x_mag^2)
// and F-wide activations of magnitude act_mag).
struct DeviceFp8 {
  DeviceTensor wgu, wd, sgu, sd, agu, adn;
  HostTensor hagu, hadn;
  QuantScheme scheme;
  bool static_scales;
  DeviceFp8(const Fp8Set& w, QuantScheme s, bool stat, double x_mag = 1.0, double act_mag = 1.0)
      : wgu(w.wgu), wd(w.wd), sgu(w.sgu), sd(w.sd), scheme(s), static_scales(stat) {
    hagu = HostTensor(DType::kF32, {1});
    hadn = HostTensor(DType::kF32, {1});
    hagu.set(0, 4.0 * x_mag / 448.0);
    hadn.set(0, 3.0 * act_mag / 448.0);
    agu = DeviceTensor(hagu);
    adn = DeviceTensor(hadn);
  }
  WeightQuant device() const {
    WeightQuant q;
    q.scheme = scheme;
    q.w_gate_up_scale = sgu.view();
    q.w_down_scale = sd.view();
    if (static_scales) {
      q.a_gate_up_scale = agu.view();
      q.a_down_scale = adn.view();
    }
    return q;
  }
  WeightQuant host(const Fp8Set& w) const {
    WeightQuant q;
    q.scheme = scheme;
    q.w_gate_up_scale = w.sgu.view();
    q.w_down_scale = w.sd.view();
    if (static_scales) {
      q.a_gate_up_scale = hagu.view();
      q.a_down_scale = hadn.view();
    }
    return q;
  }
};

void expect_fp8_close(const HostTensor& out, const HostTensor& ref, const std::string& what) {
  const Tolerance tol = tolerance_for(DType::kFP8E4M3);
  const Accuracy acc = compare(out.view(), ref.view(), tol);
  EXPECT_EQ(acc.nonfinite, 0) << what;
  EXPECT_TRUE(acc.pass(tol)) << what << ": " << acc.str() << " over " << acc.count;
}

// shared_expert_mlp on the planner's plan, which must be the FP8 GEMMs (two_gemms).
void run_on_the_fp8_gemms(SharedExpertMLPArgs a) {
  ASSERT_EQ(plan_shared_expert_mlp(a).path, MlpPath::kTwoGemms);
  DeviceWorkspace ws(shared_expert_mlp_workspace_size(a));
  a.workspace = ws.get();
  shared_expert_mlp(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

struct SortedCase {
  DType dt;
  int64_t T, E, K;
  Ids ids;
  bool indexed;  // indexed_expert_mlp (sorted past T = 128 with FP8), else fused_moe_experts
  // Engine inputs: ids over E_global = 3E experts (i64) mapped by a shuffled expert map;
  // apply_router_weight_on_input (K = 1).
  bool engine = false;
  bool apply = false;
  // Widths off the 128 tiles (H = 144, F = 80: per-tensor and per-channel only, block scales
  // take whole 128 x 128 blocks); 0: H = 256, F = 128.
  int64_t H = 0, F = 0;
  // Extreme magnitudes with compensating data: x ~ N(0, 2^(2 x_exp)), the gate/up and down
  // weight scales times 2^gate_up_exp and 2^down_exp (the static activation scales follow x
  // and the F-wide activation, ~ 2^(2 (x_exp + gate_up_exp))); 0: as drawn.
  int x_exp = 0, gate_up_exp = 0, down_exp = 0;
  // >= 256 rows an expert (>= 80 with block scales): the planner's fp8_sm90 128x256 tiles
  // (asserted; gate/up 128x128 with a static a_down_scale, an e4m3 c with a c_scale).
  bool wide = false;
};

std::string name(QuantScheme s, bool stat, const SortedCase& c) {
  const bool extreme = c.x_exp != 0 || c.gate_up_exp != 0 || c.down_exp != 0;
  const std::string mags = " x 2^" + std::to_string(c.x_exp) + " scales 2^" +
                           std::to_string(c.gate_up_exp) + " / 2^" + std::to_string(c.down_exp);
  return std::string(quant_scheme_name(s)) + (stat ? " static" : "") + " " + dtype_name(c.dt) +
         (c.H ? " H=" + std::to_string(c.H) + " F=" + std::to_string(c.F) : std::string()) +
         " T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) + " K=" + std::to_string(c.K) +
         " ids=" + moetest::ids_name(c.ids) + (c.indexed ? " indexed" : " fused_moe_experts") +
         (c.engine ? " map+i64" : "") + (c.apply ? " apply" : "") +
         (extreme ? mags : std::string()) + (c.wide ? " wide" : "");
}

// An expert map placing this rank's `local` experts among `global` ids at random (-1: other
// ranks' experts).
HostTensor random_expert_map(std::mt19937_64& rng, int64_t global, int64_t local) {
  HostTensor map(DType::kI32, {global});
  std::vector<int32_t> perm(static_cast<size_t>(global));
  for (int64_t i = 0; i < global; ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t i = 0; i < global; ++i) map.as<int32_t>()[i] = -1;
  for (int64_t l = 0; l < local; ++l) map.as<int32_t>()[perm[l]] = static_cast<int32_t>(l);
  return map;
}

// The routed-experts ops on the sorted path against the quantizing reference (the FP8 GEMMs),
// or the plain one where the plan is the weight-only GEMMs.
void check_sorted(QuantScheme scheme, bool stat, const SortedCase& c, uint64_t seed) {
  const std::string what = name(scheme, stat, c);
  SCOPED_TRACE(what);
  const int64_t H = c.H ? c.H : 256, F = c.F ? c.F : 128;
  std::mt19937_64 rng(seed);
  const HostTensor x = moetest::normal(rng, c.dt, {c.T, H}, std::ldexp(1.0, c.x_exp));
  const Fp8Set w(rng, scheme, c.E, H, F, std::ldexp(1.0, c.gate_up_exp),
                 std::ldexp(1.0, c.down_exp));
  const HostTensor tw = moetest::make_topk_weights(rng, c.T, c.K);
  const int64_t E_ids = c.engine ? 3 * c.E : c.E;
  const HostTensor ids32 = moetest::make_ids(rng, c.T, c.K, E_ids, c.ids);
  const HostTensor map = random_expert_map(rng, E_ids, c.E);
  HostTensor ids = ids32;
  if (c.engine) {
    ids = HostTensor(DType::kI64, ids32.shape());
    for (int64_t i = 0; i < ids32.numel(); ++i) ids.as<int64_t>()[i] = ids32.as<int32_t>()[i];
  }
  // The static scales: x's magnitude, and the F-wide activation's (gate/up outputs squared).
  const DeviceFp8 dw(w, scheme, stat, std::ldexp(1.0, c.x_exp),
                     std::ldexp(1.0, 2 * (c.x_exp + c.gate_up_exp)));
  DeviceTensor dx(x), dtw(tw), dids(ids), dmap(map), dout(c.dt, {c.T, H});  // poisoned
  FusedMoEExpertsArgs a;
  a.hidden_states = dx.view();
  a.w_gate_up = dw.wgu.view();
  a.w_down = dw.wd.view();
  a.quant = dw.device();
  a.topk_weights = dtw.view();
  a.topk_ids = dids.view();
  a.output = dout.view();
  if (c.engine) a.expert_map = dmap.view();
  a.apply_router_weight_on_input = c.apply;
  const LayerPlan plan = c.indexed ? plan_indexed_expert_mlp(a) : plan_fused_moe_experts(a);
  ASSERT_EQ(plan.routed, RoutedPath::kSorted);
  ASSERT_EQ(plan.experts.path, MlpPath::kTwoGemms) << to_string(plan);
  // Few routes an expert at F <= 128 (per channel / per tensor, bf16): the weight-only GEMMs,
  // which quantize no rows (the reference as given, the dtype's tolerance); else the FP8 GEMMs.
  const bool weight_only = plan.experts.gate_up.kernel == GemmKernel::kDecodePersistent;
  if (c.wide) {
    ASSERT_EQ(plan.experts.down.kernel, GemmKernel::kFp8Sm90) << to_string(plan);
    EXPECT_EQ(plan.experts.down.tile_n, 256) << to_string(plan);
    EXPECT_EQ(plan.experts.gate_up.tile_n, stat ? 128 : 256) << to_string(plan);
  }
  const Fp8Activations acts = weight_only ? Fp8Activations::kAsGiven : Fp8Activations::kQuantized;
  const auto expect_near = [&](const HostTensor& got, const HostTensor& want,
                               const std::string& label) {
    if (!weight_only) return expect_fp8_close(got, want, label);
    const Tolerance tol = tolerance_for(c.dt);
    const Accuracy acc = compare(got.view(), want.view(), tol);
    EXPECT_EQ(acc.nonfinite, 0) << label;
    EXPECT_TRUE(acc.pass(tol)) << label << ": " << acc.str() << " over " << acc.count;
  };
  DeviceWorkspace ws(c.indexed ? indexed_expert_mlp_workspace_size(a)
                               : fused_moe_experts_workspace_size(a));
  a.workspace = ws.get();
  c.indexed ? indexed_expert_mlp(a, nullptr) : fused_moe_experts(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor out = dout.download();
  // Deterministic: a rerun into a fresh poison gives the same bytes.
  ASSERT_EQ(cudaMemset(dout.data(), 0xFF, out.nbytes()), cudaSuccess);
  c.indexed ? indexed_expert_mlp(a, nullptr) : fused_moe_experts(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor again = dout.download();
  EXPECT_EQ(std::memcmp(again.data(), out.data(), out.nbytes()), 0) << "not deterministic";
  HostTensor ref(c.dt, {c.T, H});
  FusedMoEExpertsArgs h;
  h.hidden_states = x.view();
  h.w_gate_up = w.wgu.view();
  h.w_down = w.wd.view();
  h.quant = dw.host(w);
  h.topk_weights = tw.view();
  h.topk_ids = ids.view();
  h.output = ref.view();
  if (c.engine) h.expert_map = map.view();
  h.apply_router_weight_on_input = c.apply;
  reference::fused_moe_experts(h, acts);
  expect_near(out, ref, what + (weight_only ? " (weight-only)" : ""));
  // The plain GPU reference (the bench's check of these rows) quantizes the same way.
  FusedMoEExpertsArgs g = a;
  DeviceTensor gout(c.dt, {c.T, H});
  DeviceWorkspace gws(gpu_reference::fused_moe_experts_scratch_bytes(g));
  g.workspace = gws.get();
  g.output = gout.view();
  gpu_reference::fused_moe_experts(g, nullptr, nullptr, false, acts);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_near(gout.download(), ref, what + " (gpu_reference)");
}

TEST(MoEFp8SortedGpu, RoutedExpertsMatchTheQuantizingReference) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 31000;
  const DType b = DType::kBF16, h = DType::kF16;
  const SortedCase cases[] = {
      {b, 129, 16, 8, Ids::kMixed, true},
      {b, 300, 9, 4, Ids::kMinusOne, true},
      {h, 300, 16, 2, Ids::kFewExperts, true},  // empty experts
      {b, 130, 8, 4, Ids::kOneExpert, true},
      {h, 129, 7, 3, Ids::kOutOfRange, true},
      {b, 5, 6, 2, Ids::kDistinct, false},  // fused_moe_experts sorts any T
      {b, 300, 64, 8, Ids::kDuplicates, false},
      // The engine inputs on the sorted FP8 path.
      {b, 200, 8, 4, Ids::kMixed, true, /*engine=*/true},
      {h, 129, 8, 1, Ids::kMinusOne, true, /*engine=*/true, /*apply=*/true},
      {b, 70, 5, 1, Ids::kDistinct, false, /*engine=*/false, /*apply=*/true},
  };
  // fused_moe_experts at T = 0 and 1 (f16: the FP8 GEMMs in every scheme, where bf16
  // per-tensor / per-channel layers take the weight-only GEMMs); >= 256 rows an expert (the
  // 128 x 256 tiles in every scheme, empty experts and -1 ids); extreme scales with
  // compensating data (bf16: x of 2^+-20 overflows or flushes in f16): huge x and down scales
  // with tiny gate/up scales (F-wide activations ~2^-20), and the reverse (~2^20), on 128 x 128
  // and 128 x 256 tiles (block scales: the act quantized in the gate/up epilogue).
  SortedCase edges[] = {
      {h, 0, 6, 2, Ids::kDistinct, false},     {h, 1, 6, 2, Ids::kDistinct, false},
      {b, 520, 4, 2, Ids::kMinusOne, true},    {b, 300, 9, 4, Ids::kMixed, false},
      {b, 520, 4, 2, Ids::kFewExperts, false},
  };
  edges[2].wide = edges[4].wide = true;
  edges[3].x_exp = 20;
  edges[3].gate_up_exp = -30;
  edges[3].down_exp = 20;
  edges[4].x_exp = -20;
  edges[4].gate_up_exp = 30;
  edges[4].down_exp = -20;
  for (QuantScheme s : kSchemes) {
    for (const SortedCase& c : cases) check_sorted(s, false, c, ++seed);
    for (const SortedCase& c : edges) check_sorted(s, false, c, ++seed);
  }
  // Widths off the tiles (n and k tails of both FP8 GEMMs), row-wise schemes; block scales on
  // odd counts of whole blocks (H = 384: a 128 x 256 down tile half past n, 3 k blocks of
  // gate/up).
  SortedCase odd{b, 150, 8, 4, Ids::kMixed, false};
  odd.H = 144;
  odd.F = 80;
  for (QuantScheme s : {QuantScheme::kFp8PerTensor, QuantScheme::kFp8PerChannel}) {
    check_sorted(s, false, odd, ++seed);
    odd.indexed = true;
    check_sorted(s, false, odd, ++seed);
    odd.indexed = false;
  }
  SortedCase odd_blocks{b, 200, 8, 4, Ids::kMixed, true};
  odd_blocks.H = 384;
  odd_blocks.F = 128;
  odd_blocks.wide = true;
  check_sorted(QuantScheme::kFp8Block128, false, odd_blocks, ++seed);
  // Static per-tensor activation scales: on the FP8 GEMMs, at T = 0 and 1, on 128 x 256 down
  // tiles, of extreme magnitude (2^-27 .. 2^13 here); and on the weight-only GEMMs (T = 5,
  // bf16), which do not read them.
  for (const SortedCase& c :
       {cases[0], cases[1], cases[2], cases[5], edges[0], edges[1], edges[2], edges[3], edges[4]})
    check_sorted(QuantScheme::kFp8PerTensor, true, c, ++seed);
}

// A layer with FP8 routed (rw) and shared (sw) weights: the device args over the device copies
// (top-4, renormalized; the caller sets the routing) and the host args of the reference over
// the host tensors, into `ref`.
struct Fp8LayerArgs {
  const Fp8Set &rw, &sw;
  const DeviceFp8 &drw, &dsw;
  FusedMoESharedExpertArgs device(const TensorView& x, const TensorView& logits,
                                  const TensorView& out) const {
    FusedMoESharedExpertArgs a;
    a.moe.hidden_states = x;
    a.moe.gating_output = logits;
    a.moe.params.top_k = 4;
    a.moe.params.renormalize = true;
    a.moe.w_gate_up = drw.wgu.view();
    a.moe.w_down = drw.wd.view();
    a.moe.quant = drw.device();
    a.moe.output = out;
    a.shared_w_gate_up = dsw.wgu.view();
    a.shared_w_down = dsw.wd.view();
    a.shared_quant = dsw.device();
    return a;
  }
  FusedMoESharedExpertArgs host(FusedMoESharedExpertArgs r, const HostTensor& x,
                                const HostTensor& logits, HostTensor& ref) const {
    r.moe.hidden_states = x.view();
    r.moe.gating_output = logits.view();
    r.moe.w_gate_up = rw.wgu.view();
    r.moe.w_down = rw.wd.view();
    r.moe.quant = drw.host(rw);
    r.moe.output = ref.view();
    r.moe.workspace = {};
    r.shared_w_gate_up = sw.wgu.view();
    r.shared_w_down = sw.wd.view();
    r.shared_quant = dsw.host(sw);
    return r;
  }
};

// The layer past the decode kernels: routed (sorted) and shared (one-group GEMMs) both FP8,
// grouped sigmoid routing with a bias; T = 129 and 300; an f16 layer with a bf16-free output
// and an expert map (T = 300). Then the routed layer alone (fused_moe) on the same inputs.
TEST(MoEFp8SortedGpu, LayerWithSharedExpertMatchesTheQuantizingReference) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 32000;
  const int64_t H = 256, E = 16, F = 128, S = 256;
  for (QuantScheme routed : kSchemes) {
    for (const auto& [T, dt] : {std::pair<int64_t, DType>{129, DType::kBF16}, {300, DType::kF16}}) {
      const QuantScheme shared = routed == QuantScheme::kFp8Block128 ? QuantScheme::kFp8PerChannel
                                                                     : QuantScheme::kFp8Block128;
      const std::string what = std::string(quant_scheme_name(routed)) + " + shared " +
                               quant_scheme_name(shared) + " " + dtype_name(dt) +
                               " T=" + std::to_string(T) + (T == 300 ? " map" : "");
      SCOPED_TRACE(what);
      std::mt19937_64 rng(++seed);
      // T = 300: this rank's E experts among 3E routed ones (an expert map; the routes to
      // other ranks' experts are -1 ids past the routing).
      const bool with_map = T == 300;
      const int64_t E_ids = with_map ? 3 * E : E;
      const HostTensor x = moetest::normal(rng, dt, {T, H}, 1.0);
      const HostTensor logits = moetest::normal(rng, DType::kF32, {T, E_ids}, 1.0);
      const HostTensor bias = moetest::normal(rng, DType::kF32, {E_ids}, 0.1);
      const HostTensor map = random_expert_map(rng, E_ids, E);
      const Fp8Set rw(rng, routed, E, H, F), sw(rng, shared, 0, H, S);
      const DeviceFp8 drw(rw, routed, false), dsw(sw, shared, false);
      DeviceTensor dx(x), dl(logits), db(bias), dmap(map), dout(dt, {T, H});
      const Fp8LayerArgs layer{rw, sw, drw, dsw};
      FusedMoESharedExpertArgs a = layer.device(dx.view(), dl.view(), dout.view());
      a.moe.correction_bias = db.view();
      if (with_map) a.moe.expert_map = dmap.view();
      a.moe.params.scoring_func = ScoringFunc::kSigmoid;
      a.moe.params.num_expert_group = 4;
      a.moe.params.topk_group = 2;
      const LayerPlan plan = plan_fused_moe_shared_expert(a);
      ASSERT_EQ(plan.routed, RoutedPath::kSorted) << to_string(plan);
      ASSERT_EQ(plan.shared.path, MlpPath::kTwoGemms) << to_string(plan);
      DeviceWorkspace ws(fused_moe_shared_expert_workspace_size(a));
      a.moe.workspace = ws.get();
      fused_moe_shared_expert(a, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      HostTensor ref(dt, {T, H});
      FusedMoESharedExpertArgs r = layer.host(a, x, logits, ref);
      r.moe.correction_bias = bias.view();
      r.moe.expert_map = with_map ? map.view() : TensorView{};
      reference::fused_moe_shared_expert(r, Fp8Activations::kQuantized, Fp8Activations::kQuantized);
      expect_fp8_close(dout.download(), ref, what);

      // The routed layer alone (fused_moe) on the same inputs, into a fresh poisoned output.
      DeviceTensor dout2(dt, {T, H});
      a.moe.output = dout2.view();
      const LayerPlan routed_plan = plan_fused_moe(a.moe);
      ASSERT_EQ(routed_plan.routed, RoutedPath::kSorted) << to_string(routed_plan);
      DeviceWorkspace ws2(fused_moe_workspace_size(a.moe));
      a.moe.workspace = ws2.get();
      fused_moe(a.moe, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      HostTensor ref2(dt, {T, H});
      r.moe.output = ref2.view();
      reference::fused_moe(r.moe, Fp8Activations::kQuantized);
      expect_fp8_close(dout2.download(), ref2, what + " fused_moe");
    }
  }
}

// Past 64 tokens the routed experts can stay on the FP8 direct kernels (per channel / per
// tensor, F <= 768, T*K <= 8E: docs/moe.md) while the shared expert runs its FP8 GEMMs: the
// layer against the reference with the routed activations as given and the shared ones
// quantized; 64 experts at top-4, T = 65 and 128, a block-scaled shared expert. F = 144 keeps
// the direct kernels; F = 128 (from 2 routes an expert) takes the weight-only GEMMs
// (fp8_weight_only_beats_direct), its activations as given too.
TEST(MoEFp8SortedGpu, LayerWithSharedGemmsBesideRoutedDirectKernels) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 32500;
  const int64_t H = 256, E = 64, S = 256;
  const QuantScheme shared = QuantScheme::kFp8Block128;
  for (const auto& [F, path] :
       {std::pair<int64_t, RoutedPath>{144, RoutedPath::kDirect}, {128, RoutedPath::kSorted}}) {
    for (QuantScheme routed : {QuantScheme::kFp8PerChannel, QuantScheme::kFp8PerTensor}) {
      for (int64_t T : {65, 128}) {
        const std::string what = std::string(quant_scheme_name(routed)) +
                                 " F=" + std::to_string(F) + " T=" + std::to_string(T);
        SCOPED_TRACE(what);
        std::mt19937_64 rng(++seed);
        const HostTensor x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
        const HostTensor logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
        const Fp8Set rw(rng, routed, E, H, F), sw(rng, shared, 0, H, S);
        const DeviceFp8 drw(rw, routed, false), dsw(sw, shared, false);
        DeviceTensor dx(x), dl(logits), dout(DType::kBF16, {T, H});
        const Fp8LayerArgs layer{rw, sw, drw, dsw};
        FusedMoESharedExpertArgs a = layer.device(dx.view(), dl.view(), dout.view());
        const LayerPlan plan = plan_fused_moe_shared_expert(a);
        ASSERT_EQ(plan.routed, path) << to_string(plan);
        ASSERT_EQ(plan.shared.path, MlpPath::kTwoGemms) << to_string(plan);
        DeviceWorkspace ws(fused_moe_shared_expert_workspace_size(a));
        a.moe.workspace = ws.get();
        fused_moe_shared_expert(a, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        HostTensor ref(DType::kBF16, {T, H});
        const FusedMoESharedExpertArgs r = layer.host(a, x, logits, ref);
        reference::fused_moe_shared_expert(r, Fp8Activations::kAsGiven, Fp8Activations::kQuantized);
        expect_fp8_close(dout.download(), ref, what);
      }
    }
  }
}

// shared_expert_mlp past T = 64 (one group of T rows), bf16 and f16 outputs, static scales;
// widths off the tiles (per tensor / per channel: H = 144, S = 80; blocks: S = 128), and
// extreme scales with compensating data as in the routed test above (bf16): huge x and down
// scales with tiny gate/up scales (static scales of 2^13 and 2^-27 per tensor), and the
// reverse on 300 rows (fp8_sm90 128x256 in every scheme).
TEST(MoEFp8SortedGpu, SharedExpertMlpPastTheDecodeKernel) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 33000;
  struct DenseCase {
    int64_t T;
    DType dt;
    bool stat;
    bool odd = false;
    int x_exp = 0, gate_up_exp = 0, down_exp = 0;
  };
  for (QuantScheme s : kSchemes) {
    const bool per_tensor = s == QuantScheme::kFp8PerTensor;
    const bool block = s == QuantScheme::kFp8Block128;
    for (const DenseCase& c : {DenseCase{65, DType::kBF16, false},
                               {300, DType::kF16, false},
                               {129, DType::kBF16, per_tensor},
                               {97, DType::kBF16, per_tensor, true, 20, -30, 20},
                               {300, DType::kBF16, false, false, -20, 30, -20}}) {
      const int64_t T = c.T, H = c.odd && !block ? 144 : 384;
      const int64_t S = !c.odd ? 256 : block ? 128 : 80;
      const DType dt = c.dt;
      const std::string what = std::string(quant_scheme_name(s)) + (c.stat ? " static " : " ") +
                               dtype_name(dt) + " T=" + std::to_string(T) +
                               " H=" + std::to_string(H) + " S=" + std::to_string(S) + " x 2^" +
                               std::to_string(c.x_exp) + " scales 2^" +
                               std::to_string(c.gate_up_exp) + " / 2^" + std::to_string(c.down_exp);
      SCOPED_TRACE(what);
      std::mt19937_64 rng(++seed);
      const HostTensor x = moetest::normal(rng, dt, {T, H}, std::ldexp(1.0, c.x_exp));
      const Fp8Set w(rng, s, 0, H, S, std::ldexp(1.0, c.gate_up_exp), std::ldexp(1.0, c.down_exp));
      const DeviceFp8 dw(w, s, c.stat, std::ldexp(1.0, c.x_exp),
                         std::ldexp(1.0, 2 * (c.x_exp + c.gate_up_exp)));
      DeviceTensor dx(x), dout(dt, {T, H});
      SharedExpertMLPArgs a;
      a.hidden_states = dx.view();
      a.w_gate_up = dw.wgu.view();
      a.w_down = dw.wd.view();
      a.quant = dw.device();
      a.output = dout.view();
      ASSERT_NO_FATAL_FAILURE(run_on_the_fp8_gemms(a));
      HostTensor ref(dt, {T, H});
      SharedExpertMLPArgs h = a;
      h.hidden_states = x.view();
      h.w_gate_up = w.wgu.view();
      h.w_down = w.wd.view();
      h.quant = dw.host(w);
      h.output = ref.view();
      reference::shared_expert_mlp(h, Fp8Activations::kQuantized);
      expect_fp8_close(dout.download(), ref, what);
    }
  }
}

// A shared expert with fp8_block128 weights whose row r holds one e4m3 value, kRowCodes[r %
// 13] (13 is coprime to the 128-row blocks, so rows of a block differ), and random 128 x 128
// block scales: its reference is sums over blocks (no S*H product), so it scales to weights
// of 2^32 elements.
struct RowCodedSharedExpert {
  static constexpr float kRowCodes[13] = {1.f,    -0.75f, 1.5f,   -1.25f,  0.5f,  2.f, -1.f,
                                          0.875f, -1.5f,  1.125f, -0.625f, 1.75f, -2.f};
  int64_t H, S;
  HostTensor sgu, sd;  // [2S/128, H/128], [H/128, S/128]
  RowCodedSharedExpert(std::mt19937_64& rng, int64_t h, int64_t s)
      : H(h), S(s), sgu(DType::kF32, {2 * s / 128, h / 128}), sd(DType::kF32, {h / 128, s / 128}) {
    std::uniform_real_distribution<double> u(0.5, 1.5);
    for (int64_t i = 0; i < sgu.numel(); ++i) sgu.set(i, u(rng) / std::sqrt(double(H)));
    for (int64_t i = 0; i < sd.numel(); ++i) sd.set(i, u(rng) / std::sqrt(double(S)));
  }
  static float row_value(int64_t r) { return kRowCodes[r % 13]; }
  static HostTensor weights(int64_t rows, int64_t cols) {
    HostTensor w(DType::kFP8E4M3, {rows, cols});
    for (int64_t r = 0; r < rows; ++r)
      std::memset(w.as<uint8_t>() + r * cols, host::float_to_fp8e4m3(row_value(r)),
                  static_cast<size_t>(cols));
    return w;
  }
  HostTensor w_gate_up() const { return weights(2 * S, H); }
  HostTensor w_down() const { return weights(H, S); }

  // Per row and 128-column block: the sum of v's values quantized per 128-column group
  // (e4m3 code times its group's scale), as the FP8 GEMM path quantizes its inputs.
  static std::vector<double> quantized_block_sums(const HostTensor& v) {
    const int64_t rows = v.shape()[0], cols = v.shape()[1], groups = cols / 128;
    std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
    std::vector<float> sc(static_cast<size_t>(rows * groups));
    reference::quantize_fp8_rows(v.view(), detail::Fp8ActScales::kGroup128, 0.f, q.data(),
                                 sc.data());
    std::vector<double> sums(static_cast<size_t>(rows * groups), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        sums[r * groups + c / 128] +=
            double(host::fp8e4m3_to_float(q[r * cols + c])) * sc[r * groups + c / 128];
    return sums;
  }

  // out [T, H] bf16 of x [T, H] bf16: the gate/up sums, silu(gate) * up rounded to bf16,
  // quantized likewise, the down sums.
  HostTensor reference(const HostTensor& x) const {
    const int64_t T = x.shape()[0], KB = H / 128, SB = S / 128;
    const std::vector<double> xsum = quantized_block_sums(x);
    HostTensor act(DType::kBF16, {T, S}), out(DType::kBF16, {T, H});
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < S; ++j) {
        double g = 0, up = 0;
        for (int64_t kb = 0; kb < KB; ++kb) {
          g += sgu.at((j / 128) * KB + kb) * xsum[t * KB + kb];
          up += sgu.at(((S + j) / 128) * KB + kb) * xsum[t * KB + kb];
        }
        g *= row_value(j);
        up *= row_value(S + j);
        act.set(t * S + j, g / (1.0 + std::exp(-g)) * up);
      }
    }
    const std::vector<double> asum = quantized_block_sums(act);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        double o = 0;
        for (int64_t sb = 0; sb < SB; ++sb) o += sd.at((h / 128) * SB + sb) * asum[t * SB + sb];
        out.set(t * H + h, o * row_value(h));
      }
    }
    return out;
  }
};

// The block-sum reference above is the quantizing CPU reference's value (small shape, CPU).
TEST(MoEFp8SortedRef, RowCodedSharedExpertReferenceIsTheQuantizingReference) {
  std::mt19937_64 rng(35001);
  const int64_t T = 3, H = 384, S = 512;
  const RowCodedSharedExpert w(rng, H, S);
  const HostTensor x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
  const HostTensor wgu = w.w_gate_up(), wd = w.w_down();
  HostTensor ref(DType::kBF16, {T, H});
  SharedExpertMLPArgs h;
  h.hidden_states = x.view();
  h.w_gate_up = wgu.view();
  h.w_down = wd.view();
  h.quant.scheme = QuantScheme::kFp8Block128;
  h.quant.w_gate_up_scale = w.sgu.view();
  h.quant.w_down_scale = w.sd.view();
  h.output = ref.view();
  reference::shared_expert_mlp(h, Fp8Activations::kQuantized);
  const HostTensor got = w.reference(x);
  const Tolerance tol = tolerance_for(DType::kBF16);
  const Accuracy acc = compare(got.view(), ref.view(), tol);
  EXPECT_EQ(acc.nonfinite, 0);
  EXPECT_TRUE(acc.pass(tol)) << acc.str() << " over " << acc.count;
}

// A shared expert whose weights are past the FP8 direct kernel's 32-bit offsets, T = 2
// (S = 65536, H = 32768: 2*S*H = 2^32, 6 GiB of e4m3): planned on the FP8 GEMMs, which read
// every row where it lies (a wrapped offset reads another row's value).
TEST(MoEFp8SortedGpu, SharedExpertPastThe32BitOffsetsRunsTheFp8Gemms) {
  MOEKIT_REQUIRE_GPU();
  constexpr int64_t T = 2, H = 32768, S = 65536;
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < (size_t{7} << 30)) GTEST_SKIP() << "needs 7 GiB of device memory";
  std::mt19937_64 rng(35000);
  const RowCodedSharedExpert w(rng, H, S);
  const HostTensor x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
  DeviceTensor dx(x), dsgu(w.sgu), dsd(w.sd), dout(DType::kBF16, {T, H});  // out poisoned
  DeviceTensor dwgu(w.w_gate_up()), dwd(w.w_down());
  SharedExpertMLPArgs a;
  a.hidden_states = dx.view();
  a.w_gate_up = dwgu.view();
  a.w_down = dwd.view();
  a.quant.scheme = QuantScheme::kFp8Block128;
  a.quant.w_gate_up_scale = dsgu.view();
  a.quant.w_down_scale = dsd.view();
  a.output = dout.view();
  ASSERT_NO_FATAL_FAILURE(run_on_the_fp8_gemms(a));
  expect_fp8_close(dout.download(), w.reference(x), "S=65536 H=32768 T=2");
}

// moe_expert_mlp with FP8 weights: ragged counts with empty experts on alignments 1 and 8
// (padding rows NaN in the input, untouched in the output), in place, every scheme. Then every
// expert empty (only NaN padding rows), one row in all, and the first counts on widths off the
// tiles (per tensor / per channel: H = 144, F = 80; blocks: H = 384) and over 256 rows an
// expert (fp8_sm90 128x256, asserted), with extreme scales and compensating data as in the
// routed test above (the odd widths with static per-tensor scales).
TEST(MoEFp8SortedGpu, ExpertMlpOnRaggedLayouts) {
  MOEKIT_REQUIRE_GPU();
  constexpr int64_t E = 6;
  struct RaggedCase {
    int alignment;
    bool in_place;
    std::vector<int64_t> counts;  // rows per expert
    bool odd = false;             // the widths off the tiles
    bool stat = false;            // static per-tensor activation scales
    int x_exp = 0, gate_up_exp = 0, down_exp = 0;
    bool wide = false;  // >= 256 rows an expert: fp8_sm90 128x256 for both GEMMs
  };
  const auto run = [&](QuantScheme s, const RaggedCase& c, uint64_t seed) {
    const bool block = s == QuantScheme::kFp8Block128;
    const bool stat = c.stat && s == QuantScheme::kFp8PerTensor;
    const int64_t H = !c.odd ? 256 : block ? 384 : 144, F = c.odd && !block ? 80 : 128;
    std::string counts;
    for (int64_t n : c.counts) counts += (counts.empty() ? "" : ",") + std::to_string(n);
    const std::string what = std::string(quant_scheme_name(s)) + (stat ? " static" : "") +
                             " alignment=" + std::to_string(c.alignment) +
                             (c.in_place ? " in place" : "") + " counts {" + counts +
                             "} H=" + std::to_string(H) + " F=" + std::to_string(F) + " x 2^" +
                             std::to_string(c.x_exp) + " scales 2^" +
                             std::to_string(c.gate_up_exp) + " / 2^" + std::to_string(c.down_exp);
    SCOPED_TRACE(what);
    std::mt19937_64 rng(seed);
    const moetest::RaggedRows rows =
        moetest::ragged_rows(E, c.alignment, [&](int64_t e) { return c.counts[e]; });
    HostTensor x = moetest::normal(rng, DType::kBF16, {rows.P, H}, std::ldexp(1.0, c.x_exp));
    // Padding rows hold NaN: never read (their quantization is skipped), never mixed in.
    for (int64_t r = 0; r < rows.P; ++r) {
      if (r < static_cast<int64_t>(rows.expert_of_row.size()) && rows.expert_of_row[r] >= 0)
        continue;
      for (int64_t col = 0; col < H; ++col) x.set(r * H + col, std::nan(""));
    }
    const Fp8Set w(rng, s, E, H, F, std::ldexp(1.0, c.gate_up_exp), std::ldexp(1.0, c.down_exp));
    const DeviceFp8 dw(w, s, stat, std::ldexp(1.0, c.x_exp),
                       std::ldexp(1.0, 2 * (c.x_exp + c.gate_up_exp)));
    DeviceTensor dx(x), dmeta(rows.meta), dout(DType::kBF16, {rows.P, H});
    ExpertMLPArgs a;
    a.expert_input = dx.view();
    a.layout_metadata = dmeta.view();
    a.layout = PermutedLayout::contiguous(c.alignment);
    a.w_gate_up = dw.wgu.view();
    a.w_down = dw.wd.view();
    a.quant = dw.device();
    a.expert_output = c.in_place ? dx.view() : dout.view();
    if (c.wide) {
      const MlpPlan plan = plan_expert_mlp(a);
      EXPECT_EQ(plan.gate_up.kernel, GemmKernel::kFp8Sm90) << to_string(plan);
      EXPECT_EQ(plan.gate_up.tile_n, stat ? 128 : 256) << to_string(plan);
      EXPECT_EQ(plan.down.tile_n, 256) << to_string(plan);
    }
    DeviceWorkspace ws(expert_mlp_workspace_size(a));
    a.workspace = ws.get();
    HostTensor ref = c.in_place ? x : dout.download();  // padding rows: as they were
    moe_expert_mlp(a, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const HostTensor got = c.in_place ? dx.download() : dout.download();
    ExpertMLPArgs h = a;
    h.expert_input = x.view();
    h.layout_metadata = rows.meta.view();
    h.w_gate_up = w.wgu.view();
    h.w_down = w.wd.view();
    h.quant = dw.host(w);
    h.expert_output = ref.view();
    reference::moe_expert_mlp(h, Fp8Activations::kQuantized);
    // Rows in the groups match the reference; padding rows are untouched (poison, or the
    // input in place).
    std::vector<int64_t> data_rows;
    for (int64_t r = 0; r < rows.P; ++r) {
      const bool data =
          r < static_cast<int64_t>(rows.expert_of_row.size()) && rows.expert_of_row[r] >= 0;
      if (data) {
        data_rows.push_back(r);
      } else {
        EXPECT_EQ(std::memcmp(static_cast<const char*>(got.data()) + r * H * 2,
                              static_cast<const char*>(ref.data()) + r * H * 2, H * 2),
                  0)
            << "padding row " << r << " written";
      }
    }
    const int64_t n = static_cast<int64_t>(data_rows.size());
    HostTensor g(DType::kBF16, {n, H}), rf(DType::kBF16, {n, H});
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(static_cast<char*>(g.data()) + i * H * 2,
                  static_cast<const char*>(got.data()) + data_rows[i] * H * 2, H * 2);
      std::memcpy(static_cast<char*>(rf.data()) + i * H * 2,
                  static_cast<const char*>(ref.data()) + data_rows[i] * H * 2, H * 2);
    }
    expect_fp8_close(g, rf, what);
  };
  const std::vector<int64_t> ragged = {37, 0, 129, 1, 0, 70};  // empty and one-row experts
  uint64_t seed = 34000;
  for (QuantScheme s : kSchemes) {
    for (int alignment : {1, 8}) {
      for (bool in_place : {false, true}) run(s, RaggedCase{alignment, in_place, ragged}, ++seed);
    }
  }
  RaggedCase edges[] = {
      {8, false, {0, 0, 0, 0, 0, 0}},
      {1, true, {0, 0, 1, 0, 0, 0}},
      {1, false, ragged, true, true, 20, -30, 20},
      {1, false, {600, 0, 300, 1, 0, 900}, false, false, -20, 30, -20, true},
  };
  seed = 34500;
  for (QuantScheme s : kSchemes) {
    for (const RaggedCase& c : edges) run(s, c, ++seed);
  }
}

}  // namespace
}  // namespace moekit
