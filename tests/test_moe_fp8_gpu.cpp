// GPU tests of the FP8 direct kernels (docs/moe.md "FP8 direct kernels") against the CPU
// references on the dequantized weights: every scheme, bf16 and f16 activations, odd shapes,
// T = 0, 1 and up to the direct path's 128, -1 / out-of-range ids and empty experts, e4m3
// subnormals, scales of extreme magnitude (2^-40 .. 2^40), static per-tensor activation scales
// (which these kernels do not read); the engine inputs (expert maps,
// i64 ids, apply_router_weight_on_input) on the FP8 path; poisoned outputs, NaN-free results. The
// decode kernels do not quantize activations, so the dtype's own tolerance applies (the reference's
// weights are exactly the kernel's).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "support/gpu.h"
#include "test_moe_common.h"
#include "test_moe_engine_common.h"

namespace moekit {
namespace {

using moetest::Ids;
using testing::DeviceTensor;
using testing::DeviceWorkspace;
using testing::ScopedPdl;

constexpr QuantScheme kSchemes[] = {QuantScheme::kFp8PerTensor, QuantScheme::kFp8PerChannel,
                                    QuantScheme::kFp8Block128};

// e4m3 weights: N(0, 48^2) codes (every binade, some subnormal: about 1 in 400 below 2^-6
// after the /48 shrink of every 50th), saturated to +-448. subnormal: only the 14 nonzero
// subnormal codes (+-k * 2^-9, k = 1..7), so that a dequantization flushing them shows.
HostTensor e4m3_weights(std::mt19937_64& rng, std::vector<int64_t> shape, bool subnormal) {
  HostTensor w(DType::kFP8E4M3, std::move(shape));
  uint8_t* out = w.as<uint8_t>();
  if (subnormal) {
    std::uniform_int_distribution<int> code(1, 14);
    for (int64_t i = 0; i < w.numel(); ++i) {
      const int c = code(rng);
      out[i] = static_cast<uint8_t>(c > 7 ? 0x80 | (c - 7) : c);
    }
    return w;
  }
  // Codes of N(0, 48) samples, and every 50th of N(0, 48) / 2048 (codes near the subnormal
  // range), drawn from pools of 2^16 samples: a 75 MB weight set then costs one 64-bit draw
  // per four codes instead of a normal sample and a conversion each.
  std::normal_distribution<double> n(0.0, 48.0);
  std::vector<uint8_t> pool(1 << 16), tiny(1 << 16);
  for (uint8_t& c : pool) c = host::float_to_fp8e4m3(static_cast<float>(n(rng)));
  for (uint8_t& c : tiny) c = host::float_to_fp8e4m3(static_cast<float>(n(rng) / 2048.0));
  uint64_t bits = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    bits = i % 4 == 0 ? rng() : bits >> 16;
    const size_t j = static_cast<size_t>(bits & 0xffff);
    out[i] = i % 50 == 7 ? tiny[j] : pool[j];
  }
  return w;
}

// Scales of `scheme` for a weight set of `count` matrices [rows, cols] (count 0: no E axis),
// around `base` / 48 / sqrt(cols) (so dequantized weights ~ N(0, base^2 / cols)), each scale
// times 2^u with u uniform in [-spread, spread] (0: no spread).
HostTensor scales(std::mt19937_64& rng, QuantScheme scheme, int64_t count, int64_t rows,
                  int64_t cols, double base, int spread) {
  std::vector<int64_t> shape;
  if (count > 0) shape.push_back(count);
  const int64_t E = count > 0 ? count : 1;
  if (scheme == QuantScheme::kFp8PerTensor && count == 0) shape.push_back(1);
  if (scheme == QuantScheme::kFp8PerChannel) shape.push_back(rows);
  if (scheme == QuantScheme::kFp8Block128) {
    shape.push_back((rows + 127) / 128);
    shape.push_back((cols + 127) / 128);
  }
  HostTensor s(DType::kF32, shape);
  std::uniform_int_distribution<int> u(-spread, spread);
  std::uniform_real_distribution<double> jitter(0.5, 2.0);
  for (int64_t i = 0; i < s.numel(); ++i)
    s.set(i, base / 48.0 / std::sqrt(double(cols)) * jitter(rng) * std::ldexp(1.0, u(rng)));
  (void)E;
  return s;
}

struct Fp8Weights {
  HostTensor wgu, wd, sgu, sd;
  // Optional static per-tensor activation scales ([1] f32 each; dtype kUndefined: none). The
  // FP8 direct kernels and the weight-only GEMMs do not read them (docs/moe.md).
  HostTensor agu, adn;
  void set_static_scales(double gate_up, double down) {
    agu = HostTensor(DType::kF32, {1});
    adn = HostTensor(DType::kF32, {1});
    agu.set(0, gate_up);
    adn.set(0, down);
  }
  bool has_static_scales() const { return agu.dtype() != DType::kUndefined; }
  // count 0: a dense MLP (no E axis). gate_up_base / down_base: the scale bases (extreme
  // magnitudes test the dequantization's range).
  Fp8Weights(std::mt19937_64& rng, QuantScheme scheme, int64_t count, int64_t H, int64_t F,
             double gate_up_base = 1.0, double down_base = 1.0, int spread = 0,
             bool subnormal = false) {
    std::vector<int64_t> gu = {2 * F, H}, dn = {H, F};
    if (count > 0) {
      gu.insert(gu.begin(), count);
      dn.insert(dn.begin(), count);
    }
    wgu = e4m3_weights(rng, gu, subnormal);
    wd = e4m3_weights(rng, dn, subnormal);
    sgu = scales(rng, scheme, count, 2 * F, H, gate_up_base, spread);
    sd = scales(rng, scheme, count, H, F, down_base, spread);
  }
};

WeightQuant quant_of(QuantScheme scheme, const DeviceTensor& sgu, const DeviceTensor& sd) {
  WeightQuant q;
  q.scheme = scheme;
  q.w_gate_up_scale = sgu.view();
  q.w_down_scale = sd.view();
  return q;
}

WeightQuant host_quant_of(QuantScheme scheme, const HostTensor& sgu, const HostTensor& sd) {
  WeightQuant q;
  q.scheme = scheme;
  q.w_gate_up_scale = sgu.view();
  q.w_down_scale = sd.view();
  return q;
}

// w's static activation scales (when set) into q: device copies in agu / adn (the caller's,
// alive while q is used), or w's host tensors (agu == nullptr).
void add_static_scales(WeightQuant& q, const Fp8Weights& w, DeviceTensor* agu = nullptr,
                       DeviceTensor* adn = nullptr) {
  if (!w.has_static_scales()) return;
  if (agu == nullptr) {
    q.a_gate_up_scale = w.agu.view();
    q.a_down_scale = w.adn.view();
    return;
  }
  *agu = DeviceTensor(w.agu);
  *adn = DeviceTensor(w.adn);
  q.a_gate_up_scale = agu->view();
  q.a_down_scale = adn->view();
}

void expect_close(const HostTensor& out, const HostTensor& ref, DType dt, const std::string& what) {
  const Tolerance tol = tolerance_for(dt);
  const Accuracy acc = compare(out.view(), ref.view(), tol);
  EXPECT_EQ(acc.nonfinite, 0) << what;
  EXPECT_TRUE(acc.pass(tol)) << what << ": " << acc.str() << " over " << acc.count;
}

struct Case {
  DType dt;
  int64_t T, H, E, F, K;
  Ids ids;
  double gate_up_base = 1.0, down_base = 1.0;
  int spread = 0;
  bool subnormal = false;  // subnormal e4m3 codes only (scale bases ~2^13 make up for them)
  // Static per-tensor activation scales of 2^-20 (gate/up) and 2^20 (down), which would
  // saturate or flush every activation if read; kFp8PerTensor only.
  bool static_scales = false;
};

std::string name(QuantScheme s, const Case& c) {
  return std::string(quant_scheme_name(s)) + " " + dtype_name(c.dt) + " T=" + std::to_string(c.T) +
         " H=" + std::to_string(c.H) + " E=" + std::to_string(c.E) + " F=" + std::to_string(c.F) +
         " K=" + std::to_string(c.K) + " ids=" + moetest::ids_name(c.ids) +
         " scales=" + std::to_string(c.gate_up_base) + "/" + std::to_string(c.down_base) + "x2^+-" +
         std::to_string(c.spread) + (c.subnormal ? " subnormal codes" : "") +
         (c.static_scales ? " static scales" : "");
}

// The weight-only GEMMs' plan: the sorted path with decode_persistent on e4m3 weights for
// both GEMMs (fp8_weight_only_plan).
bool is_weight_only(const LayerPlan& p) {
  return p.routed == RoutedPath::kSorted && p.experts.path == MlpPath::kTwoGemms &&
         p.experts.gate_up.kernel == GemmKernel::kDecodePersistent &&
         p.experts.down.kernel == GemmKernel::kDecodePersistent;
}

// indexed_expert_mlp with FP8 weights on device copies of host inputs (map optional).
HostTensor run_fp8_indexed(QuantScheme scheme, const HostTensor& x, const Fp8Weights& w,
                           const HostTensor& tw, const HostTensor& ids, const HostTensor* map,
                           bool apply, RoutedPath expected = RoutedPath::kDirect,
                           bool weight_only = false) {
  const int64_t T = x.shape()[0], H = x.shape()[1];
  DeviceTensor dx(x), dwgu(w.wgu), dwd(w.wd), dsgu(w.sgu), dsd(w.sd), dtw(tw), dids(ids);
  DeviceTensor dout(x.dtype(), {T, H}), dmap, dagu, dadn;  // poisoned
  if (map) dmap = DeviceTensor(*map);
  IndexedExpertMLPArgs a;
  a.hidden_states = dx.view();
  a.w_gate_up = dwgu.view();
  a.w_down = dwd.view();
  a.quant = quant_of(scheme, dsgu, dsd);
  add_static_scales(a.quant, w, &dagu, &dadn);
  a.topk_weights = dtw.view();
  a.topk_ids = dids.view();
  a.output = dout.view();
  if (map) a.expert_map = dmap.view();
  a.apply_router_weight_on_input = apply;
  EXPECT_EQ(plan_indexed_expert_mlp(a).routed, expected) << to_string(plan_indexed_expert_mlp(a));
  if (weight_only)
    EXPECT_TRUE(is_weight_only(plan_indexed_expert_mlp(a)))
        << to_string(plan_indexed_expert_mlp(a));
  const size_t bytes = indexed_expert_mlp_workspace_size(a);
  if (T == 0) EXPECT_EQ(bytes, 0u);  // nothing to launch
  DeviceWorkspace ws(bytes);
  a.workspace = ws.get();
  indexed_expert_mlp(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor out = dout.download();
  // Deterministic: a rerun into a fresh poison gives the same bytes.
  EXPECT_EQ(cudaMemset(dout.data(), 0xFF, out.nbytes()), cudaSuccess);
  indexed_expert_mlp(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor again = dout.download();
  EXPECT_EQ(std::memcmp(again.data(), out.data(), out.nbytes()), 0) << "not deterministic";
  return out;
}

// The CPU reference of run_fp8_indexed's call.
HostTensor reference_indexed(QuantScheme scheme, const HostTensor& x, const Fp8Weights& w,
                             const HostTensor& tw, const HostTensor& ids, const HostTensor* map,
                             bool apply) {
  HostTensor ref(x.dtype(), x.shape());
  IndexedExpertMLPArgs h;
  h.hidden_states = x.view();
  h.w_gate_up = w.wgu.view();
  h.w_down = w.wd.view();
  h.quant = host_quant_of(scheme, w.sgu, w.sd);
  add_static_scales(h.quant, w);
  h.topk_weights = tw.view();
  h.topk_ids = ids.view();
  if (map) h.expert_map = map->view();
  h.apply_router_weight_on_input = apply;
  h.output = ref.view();
  reference::indexed_expert_mlp(h);
  return ref;
}

// indexed_expert_mlp on the planner's path (asserted: `expected`; `weight_only`: the weight-only
// GEMMs' plan) against the reference.
void check_indexed(QuantScheme scheme, const Case& c, uint64_t seed,
                   RoutedPath expected = RoutedPath::kDirect, bool weight_only = false) {
  const std::string what = name(scheme, c);
  SCOPED_TRACE(what);
  std::mt19937_64 rng(seed);
  const HostTensor x = moetest::normal(rng, c.dt, {c.T, c.H}, 1.0);
  Fp8Weights w(rng, scheme, c.E, c.H, c.F, c.gate_up_base, c.down_base, c.spread, c.subnormal);
  if (c.static_scales) w.set_static_scales(std::ldexp(1.0, -20), std::ldexp(1.0, 20));
  const HostTensor tw = moetest::make_topk_weights(rng, c.T, c.K);
  const HostTensor ids = moetest::make_ids(rng, c.T, c.K, c.E, c.ids);
  const HostTensor got =
      run_fp8_indexed(scheme, x, w, tw, ids, nullptr, false, expected, weight_only);
  expect_close(got, reference_indexed(scheme, x, w, tw, ids, nullptr, false), c.dt, what);
}

TEST(MoEFp8Gpu, IndexedExpertMlpMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 31;
  for (QuantScheme s : kSchemes) {
    const bool block = s == QuantScheme::kFp8Block128;
    // Odd expert counts and widths (blocks: H and F multiples of 128).
    const int64_t H = block ? 256 : 48, F = block ? 128 : 80;
    for (DType dt : {DType::kBF16, DType::kF16}) {
      for (const Case& c :
           {Case{dt, 1, H, 5, F, 3, Ids::kDistinct}, Case{dt, 7, H, 7, F, 2, Ids::kMixed},
            Case{dt, 33, H, 9, F, 4, Ids::kFewExperts},   // empty experts
            Case{dt, 64, H, 11, F, 8, Ids::kDuplicates},  // 16+ routes / expert
            Case{dt, 13, H, 5, F, 2, Ids::kMinusOne}, Case{dt, 5, H, 5, F, 3, Ids::kOutOfRange}})
        check_indexed(s, c, ++seed);
    }
    // A DeepSeek-like block shape (H = 7168 is 56 blocks; F = 256 two) at T = 1 and 32.
    if (block) {
      check_indexed(s, Case{DType::kBF16, 1, 7168, 16, 256, 8, Ids::kDistinct}, ++seed);
      check_indexed(s, Case{DType::kBF16, 32, 7168, 16, 256, 8, Ids::kMixed}, ++seed);
    }
  }
}

// Past 64 tokens (to T = 128, T*K <= 1024) FP8 weights keep the direct path with per-channel or
// per-tensor scales, F <= 768 and T*K <= 8E (docs/moe.md): 8E exactly, an odd expert count past
// 256 (the decoding PR's qwen3.5-35b shape, narrowed), every route to one expert (128 routes: 16
// chunks of 8, at top-1 with 16 experts), duplicate and -1 ids. F = 144: at F <= 128 bf16 layers
// from 2 routes an expert take the weight-only GEMMs instead (fp8_weight_only_beats_direct).
TEST(MoEFp8Gpu, IndexedExpertMlpPast64Tokens) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 4096;
  for (QuantScheme s : {QuantScheme::kFp8PerChannel, QuantScheme::kFp8PerTensor}) {
    const int64_t H = 112, F = 144;
    for (const Case& c : {Case{DType::kBF16, 65, H, 65, F, 8, Ids::kDistinct},
                          Case{DType::kBF16, 100, H, 257, F, 8, Ids::kMixed},
                          Case{DType::kF16, 128, H, 128, F, 8, Ids::kDuplicates},
                          Case{DType::kBF16, 128, H, 16, F, 1, Ids::kOneExpert},
                          Case{DType::kBF16, 127, H, 127, F, 8, Ids::kMinusOne}})
      check_indexed(s, c, ++seed);
  }
}

// The same counts at F <= 128 with bf16 activations (the shapes the test above had before
// F = 144): the planner takes the weight-only GEMMs from 2 routes an expert
// (fp8_weight_only_beats_direct; bf16 activations as given, as the direct kernels), against
// the reference: an odd expert count past 256, every route to one expert, -1 ids.
TEST(MoEFp8Gpu, IndexedExpertMlpPast64TokensSmallFTakesWeightOnly) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 4160;
  for (QuantScheme s : {QuantScheme::kFp8PerChannel, QuantScheme::kFp8PerTensor}) {
    const int64_t H = 112, F = 80;
    for (const Case& c : {Case{DType::kBF16, 65, H, 65, F, 8, Ids::kDistinct},
                          Case{DType::kBF16, 100, H, 257, 128, 8, Ids::kMixed},
                          Case{DType::kBF16, 128, H, 16, F, 1, Ids::kOneExpert},
                          Case{DType::kBF16, 127, H, 127, F, 8, Ids::kMinusOne}})
      check_indexed(s, c, ++seed, RoutedPath::kSorted, /*weight_only=*/true);
  }
}

TEST(MoEFp8Gpu, ExtremeScalesStayFiniteAndMatch) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 1031;
  for (QuantScheme s : kSchemes) {
    const bool block = s == QuantScheme::kFp8Block128;
    const int64_t H = block ? 384 : 64, F = block ? 256 : 96;
    // Tiny gate/up and huge down scales, and the reverse, compensating (act = silu(gate) * up
    // ~2^-41 and ~2^40, outputs ~1, so every element's error is checked, not only rel_l2);
    // per-row / per-block spreads of 2^+-20 where the scheme has more than one scale per
    // matrix.
    for (const auto& [gu, dn] :
         {std::pair<double, double>{std::ldexp(1.0, -20), std::ldexp(1.0, 40)},
          {std::ldexp(1.0, 20), std::ldexp(1.0, -40)}}) {
      check_indexed(s, Case{DType::kBF16, 9, H, 6, F, 2, Ids::kMixed, gu, dn, 0}, ++seed);
      if (s != QuantScheme::kFp8PerTensor)
        check_indexed(s, Case{DType::kBF16, 9, H, 6, F, 2, Ids::kMixed, 1.0, 1.0, 20}, ++seed);
    }
  }
  // Per tensor with static activation scales of extreme magnitude (2^-20 / 2^20), which the
  // direct kernels do not read: T = 1 and 9 (empty experts), with extreme weight scales too.
  const int64_t H = 64, F = 96;
  for (const auto& [T, gu, dn] : {std::tuple<int64_t, double, double>{1, 1.0, 1.0},
                                  {9, std::ldexp(1.0, -20), std::ldexp(1.0, 40)},
                                  {9, std::ldexp(1.0, 20), std::ldexp(1.0, -40)}}) {
    Case c{DType::kBF16, T, H, 6, F, 2, Ids::kMixed, gu, dn, 0};
    c.static_scales = true;
    check_indexed(QuantScheme::kFp8PerTensor, c, ++seed);
  }
}

// Every weight a subnormal e4m3 code: the exact e4m3 -> bf16 trick and the f16 conversion
// must keep them (a flush to zero would leave ~0 outputs, rel_l2 ~ 1).
TEST(MoEFp8Gpu, SubnormalWeightsAreKept) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 2024;
  for (QuantScheme s : kSchemes) {
    const bool block = s == QuantScheme::kFp8Block128;
    const int64_t H = block ? 256 : 64, F = block ? 128 : 48;
    for (DType dt : {DType::kBF16, DType::kF16}) {
      Case c{dt, 6, H, 5, F, 2, Ids::kMixed, 8192.0, 8192.0, 0};
      c.subnormal = true;
      check_indexed(s, c, ++seed);
    }
  }
}

TEST(MoEFp8Gpu, EmptyBatchesLaunchNothing) {
  MOEKIT_REQUIRE_GPU();
  for (QuantScheme s : kSchemes)
    check_indexed(s, Case{DType::kBF16, 0, 128, 4, 128, 2, Ids::kDistinct}, 5);
  Case with_static{DType::kBF16, 0, 128, 4, 128, 2, Ids::kDistinct};
  with_static.static_scales = true;
  check_indexed(QuantScheme::kFp8PerTensor, with_static, 6);
}

// shared_expert_mlp with FP8 weights (the dense form of the decode kernel, plan asserted):
// T = 0 to 64, odd widths (per tensor / per channel); then bf16 with extreme scales and
// compensating down scales (activations ~2^-41 and ~2^40, outputs ~1), per tensor with
// static activation scales of 2^-20 / 2^20 (not read).
TEST(MoEFp8Gpu, SharedExpertMlpMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  const auto run = [](QuantScheme s, int64_t T, DType dt, double gate_up_base, double down_base,
                      bool stat, uint64_t seed) {
    const bool block = s == QuantScheme::kFp8Block128;
    const int64_t H = block ? 512 : 112, S = block ? 384 : 48;
    SCOPED_TRACE(std::string(quant_scheme_name(s)) + " " + dtype_name(dt) +
                 " T=" + std::to_string(T) + " scales " + std::to_string(gate_up_base) + "/" +
                 std::to_string(down_base) + (stat ? " static scales" : ""));
    std::mt19937_64 rng(seed);
    const HostTensor x = moetest::normal(rng, dt, {T, H}, 1.0);
    Fp8Weights w(rng, s, 0, H, S, gate_up_base, down_base);
    if (stat) w.set_static_scales(std::ldexp(1.0, -20), std::ldexp(1.0, 20));
    DeviceTensor dx(x), dwgu(w.wgu), dwd(w.wd), dsgu(w.sgu), dsd(w.sd), dagu, dadn;
    DeviceTensor dout(dt, {T, H});  // poisoned
    SharedExpertMLPArgs a;
    a.hidden_states = dx.view();
    a.w_gate_up = dwgu.view();
    a.w_down = dwd.view();
    a.quant = quant_of(s, dsgu, dsd);
    add_static_scales(a.quant, w, &dagu, &dadn);
    a.output = dout.view();
    EXPECT_EQ(plan_shared_expert_mlp(a).path, MlpPath::kDirect)
        << to_string(plan_shared_expert_mlp(a));
    DeviceWorkspace ws(shared_expert_mlp_workspace_size(a));
    a.workspace = ws.get();
    shared_expert_mlp(a, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    HostTensor ref(dt, {T, H});
    SharedExpertMLPArgs h = a;
    h.hidden_states = x.view();
    h.w_gate_up = w.wgu.view();
    h.w_down = w.wd.view();
    h.quant = host_quant_of(s, w.sgu, w.sd);
    add_static_scales(h.quant, w);
    h.output = ref.view();
    reference::shared_expert_mlp(h);
    expect_close(dout.download(), ref, dt, "shared_expert_mlp");
  };
  uint64_t seed = 77;
  for (QuantScheme s : kSchemes) {
    for (int64_t T : {0, 1, 2, 31, 64}) {
      for (DType dt : {DType::kBF16, DType::kF16}) run(s, T, dt, 1.0, 1.0, false, ++seed);
    }
  }
  seed = 7700;
  for (QuantScheme s : kSchemes) {
    const bool per_tensor = s == QuantScheme::kFp8PerTensor;
    run(s, 9, DType::kBF16, std::ldexp(1.0, -20), std::ldexp(1.0, 40), per_tensor, ++seed);
    run(s, 33, DType::kBF16, std::ldexp(1.0, 20), std::ldexp(1.0, -40), per_tensor, ++seed);
  }
}

constexpr uint8_t kPoison = 0xFF;  // NaN in bf16 and f16

// The inputs of a FP8 layer (bf16) besides its weights; bias and map optional.
struct LayerInputs {
  HostTensor x, logits;
  const HostTensor* bias = nullptr;
  const HostTensor* map = nullptr;  // expert_map (logits then [T, E_global])
  TopKParams params;
  bool apply = false;  // apply_router_weight_on_input
};

// fused_moe_shared_expert with FP8 routed and shared weights (the schemes of `routed` and
// `shared`) on device copies of the inputs, against the reference; the planner's path
// (asserted: `expected`, the direct path unless named), or the routed plan `forced` names (with the
// planner's plan of the shared expert). Without shared weights (sw == nullptr): fused_moe, the
// routed layer alone.
void check_fp8_layer(QuantScheme routed, QuantScheme shared, const LayerInputs& in,
                     const Fp8Weights& rw, const Fp8Weights* sw, const LayerPlan* forced = nullptr,
                     RoutedPath expected = RoutedPath::kDirect, bool weight_only = false) {
  const int64_t T = in.x.shape()[0], H = in.x.shape()[1];
  DeviceTensor dx(in.x), dl(in.logits), dwgu(rw.wgu), dwd(rw.wd), dsgu(rw.sgu), dsd(rw.sd), swgu,
      swd, ssgu, ssd, db, dmap, dagu, dadn, sagu, sadn;
  if (sw != nullptr) {
    swgu = DeviceTensor(sw->wgu);
    swd = DeviceTensor(sw->wd);
    ssgu = DeviceTensor(sw->sgu);
    ssd = DeviceTensor(sw->sd);
  }
  if (in.bias) db = DeviceTensor(*in.bias);
  if (in.map) dmap = DeviceTensor(*in.map);
  DeviceTensor dout(DType::kBF16, {T, H}, kPoison);
  FusedMoESharedExpertArgs a;
  a.moe.hidden_states = dx.view();
  a.moe.gating_output = dl.view();
  if (in.bias) a.moe.correction_bias = db.view();
  a.moe.params = in.params;
  a.moe.w_gate_up = dwgu.view();
  a.moe.w_down = dwd.view();
  a.moe.quant = quant_of(routed, dsgu, dsd);
  add_static_scales(a.moe.quant, rw, &dagu, &dadn);
  a.moe.output = dout.view();
  if (in.map) a.moe.expert_map = dmap.view();
  a.moe.apply_router_weight_on_input = in.apply;
  if (sw != nullptr) {
    a.shared_w_gate_up = swgu.view();
    a.shared_w_down = swd.view();
    a.shared_quant = quant_of(shared, ssgu, ssd);
    add_static_scales(a.shared_quant, *sw, &sagu, &sadn);
  }
  // A forced routed plan with a shared expert: the planner's shared part beside it.
  LayerPlan plan;
  if (forced != nullptr) {
    plan = *forced;
    if (sw != nullptr) {
      const LayerPlan planned = plan_fused_moe_shared_expert(a);
      plan.has_shared = planned.has_shared;
      plan.shared = planned.shared;
    }
    a.moe.plan = &plan;
  }
  if (T > 0 && forced == nullptr) {
    const LayerPlan planned =
        sw != nullptr ? plan_fused_moe_shared_expert(a) : plan_fused_moe(a.moe);
    ASSERT_EQ(planned.routed, expected) << to_string(planned);
    if (weight_only) ASSERT_TRUE(is_weight_only(planned)) << to_string(planned);
  }
  DeviceWorkspace ws(sw != nullptr ? fused_moe_shared_expert_workspace_size(a)
                                   : fused_moe_workspace_size(a.moe));
  a.moe.workspace = ws.get();
  if (sw != nullptr) {
    fused_moe_shared_expert(a, nullptr);
  } else {
    fused_moe(a.moe, nullptr);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor ref(DType::kBF16, {T, H});
  FusedMoESharedExpertArgs h = a;
  h.moe.hidden_states = in.x.view();
  h.moe.gating_output = in.logits.view();
  h.moe.correction_bias = in.bias ? in.bias->view() : TensorView{};
  h.moe.w_gate_up = rw.wgu.view();
  h.moe.w_down = rw.wd.view();
  h.moe.quant = host_quant_of(routed, rw.sgu, rw.sd);
  add_static_scales(h.moe.quant, rw);
  h.moe.output = ref.view();
  h.moe.expert_map = in.map ? in.map->view() : TensorView{};
  h.moe.workspace = {};
  if (sw != nullptr) {
    h.shared_w_gate_up = sw->wgu.view();
    h.shared_w_down = sw->wd.view();
    h.shared_quant = host_quant_of(shared, sw->sgu, sw->sd);
    add_static_scales(h.shared_quant, *sw);
    reference::fused_moe_shared_expert(h);
  } else {
    reference::fused_moe(h.moe);
  }
  const HostTensor out = dout.download();
  expect_close(out, ref, DType::kBF16, sw != nullptr ? "fused_moe_shared_expert" : "fused_moe");
  // Deterministic: a rerun into a freshly poisoned output gives the same bytes.
  MOEKIT_CUDA_OK(cudaMemset(dout.data(), kPoison, out.nbytes()));
  if (sw != nullptr) {
    fused_moe_shared_expert(a, nullptr);
  } else {
    fused_moe(a.moe, nullptr);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor again = dout.download();
  EXPECT_EQ(std::memcmp(again.data(), out.data(), out.nbytes()), 0) << "not deterministic";
}

// fused_moe_shared_expert: routed experts and the shared expert both FP8 (different schemes),
// grouped sigmoid routing with a bias (DeepSeek-V3's), T up to 64; then both per tensor with
// static activation scales of 2^-20 / 2^20 (which the direct kernels do not read).
TEST(MoEFp8Gpu, FusedMoeSharedExpertMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  const int64_t H = 256, E = 16, F = 128, S = 256;
  const auto run = [&](QuantScheme routed, QuantScheme shared, int64_t T, bool stat,
                       uint64_t seed) {
    SCOPED_TRACE(std::string(quant_scheme_name(routed)) + " + shared " + quant_scheme_name(shared) +
                 " T=" + std::to_string(T) + (stat ? " static scales" : ""));
    std::mt19937_64 rng(seed);
    LayerInputs in;
    in.x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
    in.logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
    const HostTensor bias = moetest::normal(rng, DType::kF32, {E}, 0.1);
    in.bias = &bias;
    Fp8Weights rw(rng, routed, E, H, F), sw(rng, shared, 0, H, S);
    if (stat) {
      rw.set_static_scales(std::ldexp(1.0, -20), std::ldexp(1.0, 20));
      sw.set_static_scales(std::ldexp(1.0, -20), std::ldexp(1.0, 20));
    }
    in.params.top_k = 4;
    in.params.scoring_func = ScoringFunc::kSigmoid;
    in.params.num_expert_group = 4;
    in.params.topk_group = 2;
    in.params.renormalize = true;
    check_fp8_layer(routed, shared, in, rw, &sw);
  };
  uint64_t seed = 4242;
  for (QuantScheme routed : kSchemes) {
    const QuantScheme shared = routed == QuantScheme::kFp8Block128 ? QuantScheme::kFp8PerChannel
                                                                   : QuantScheme::kFp8Block128;
    for (int64_t T : {0, 1, 17, 64}) run(routed, shared, T, false, ++seed);
  }
  seed = 4280;
  for (int64_t T : {0, 1, 64})
    run(QuantScheme::kFp8PerTensor, QuantScheme::kFp8PerTensor, T, true, ++seed);
}

// fused_moe (no shared expert) with FP8 routed weights on the direct path: softmax and
// grouped sigmoid routing, T = 0 (nothing launched, nothing written), 1, 17 and 64.
TEST(MoEFp8Gpu, FusedMoeMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 4300;
  const int64_t H = 256, E = 16, F = 128;
  for (QuantScheme routed : kSchemes) {
    for (int64_t T : {0, 1, 17, 64}) {
      for (bool grouped : {false, true}) {
        SCOPED_TRACE(std::string(quant_scheme_name(routed)) + " T=" + std::to_string(T) +
                     (grouped ? " grouped sigmoid" : " softmax"));
        std::mt19937_64 rng(++seed);
        LayerInputs in;
        in.x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
        in.logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
        const HostTensor bias = moetest::normal(rng, DType::kF32, {E}, 0.1);
        const Fp8Weights rw(rng, routed, E, H, F);
        in.params.top_k = 4;
        in.params.renormalize = true;
        if (grouped) {
          in.bias = &bias;
          in.params.scoring_func = ScoringFunc::kSigmoid;
          in.params.num_expert_group = 4;
          in.params.topk_group = 2;
        }
        check_fp8_layer(routed, QuantScheme::kNone, in, rw, nullptr);
      }
    }
  }
}

// fused_moe past 64 tokens, per-channel and per-tensor routed weights: 64 experts at top-4,
// T = 65, 97 and 128 (the 8E limit exactly), every count's plan asserted `expected`, against
// the reference.
void check_fp8_layers_past_64_tokens(uint64_t seed, int64_t F, RoutedPath expected,
                                     bool weight_only = false) {
  const int64_t H = 256, E = 64;
  for (QuantScheme routed : {QuantScheme::kFp8PerChannel, QuantScheme::kFp8PerTensor}) {
    for (int64_t T : {65, 97, 128}) {
      SCOPED_TRACE(std::string(quant_scheme_name(routed)) + " T=" + std::to_string(T));
      std::mt19937_64 rng(++seed);
      LayerInputs in;
      in.x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
      in.logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
      const Fp8Weights rw(rng, routed, E, H, F);
      in.params.top_k = 4;
      in.params.renormalize = true;
      check_fp8_layer(routed, QuantScheme::kNone, in, rw, nullptr, nullptr, expected, weight_only);
    }
  }
}

// With F <= 768 and T*K <= 8E the direct path runs to T = 128 (docs/moe.md); F = 144, past the
// weight-only GEMMs' F <= 128, which take such counts at F <= 128.
TEST(MoEFp8Gpu, FusedMoeDirectPast64Tokens) {
  MOEKIT_REQUIRE_GPU();
  check_fp8_layers_past_64_tokens(4400, 144, RoutedPath::kDirect);
}

// The same layer at F = 128 (its shape before F = 144): past 64 tokens, from 2 routes an expert,
// the planner takes the weight-only GEMMs (bf16 activations as given).
TEST(MoEFp8Gpu, FusedMoePast64TokensSmallFTakesWeightOnly) {
  MOEKIT_REQUIRE_GPU();
  check_fp8_layers_past_64_tokens(4450, 128, RoutedPath::kSorted, /*weight_only=*/true);
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// The FP8 direct kernels launch with PDL (docs/moe.md "FP8 direct kernels"; down decodes its
// routes and prefetches weights before its wait): fused_moe_shared_expert with FP8 routed and
// shared weights at decode, kRounds calls in one stream over one workspace (each call's routing
// overwrites the ids, activations and down rows the previous call's kernels read), captured as
// a graph with PDL on and off. Replayed back to back, every round's output equals the round run
// alone, bit for bit.
TEST(MoEFp8Gpu, DirectLayerChainWithPdlMatchesPlainBitForBit) {
  MOEKIT_REQUIRE_GPU();
  constexpr int kRounds = 3;
  // A long gate/up (k = H) before a short down (k = F) on a grid of few blocks: down's blocks
  // can start beside gate/up's, where a read of act before down's wait would see the last
  // round's. (At H = 512 a build whose down skipped its wait still passed; at this size it
  // fails, as it should: H100, docs/JOURNAL.md, 2026-12-06.)
  const int64_t H = 4096, E = 16, F = 128, S = 384;
  uint64_t seed = 4400;
  for (int64_t T : {1, 17, 64}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    std::mt19937_64 rng(++seed);
    const Fp8Weights rw(rng, QuantScheme::kFp8Block128, E, H, F);
    const Fp8Weights sw(rng, QuantScheme::kFp8PerChannel, 0, H, S);
    DeviceTensor wgu(rw.wgu), wd(rw.wd), sgu(rw.sgu), sd(rw.sd);
    DeviceTensor swgu(sw.wgu), swd(sw.wd), ssgu(sw.sgu), ssd(sw.sd);
    const HostTensor bias = moetest::normal(rng, DType::kF32, {E}, 0.1);
    DeviceTensor db(bias);
    std::vector<DeviceTensor> dx, dl, dout;
    std::vector<FusedMoESharedExpertArgs> args(kRounds);
    for (int r = 0; r < kRounds; ++r) {
      dx.emplace_back(moetest::normal(rng, DType::kBF16, {T, H}, 1.0));
      dl.emplace_back(moetest::normal(rng, DType::kF32, {T, E}, 1.0));
      dout.emplace_back(DType::kBF16, std::vector<int64_t>{T, H}, kPoison);
    }
    for (int r = 0; r < kRounds; ++r) {
      FusedMoESharedExpertArgs& a = args[r];
      a.moe.hidden_states = dx[r].view();
      a.moe.gating_output = dl[r].view();
      a.moe.correction_bias = db.view();
      a.moe.params.top_k = 4;
      a.moe.params.renormalize = true;
      a.moe.params.scoring_func = ScoringFunc::kSigmoid;
      a.moe.params.num_expert_group = 4;
      a.moe.params.topk_group = 2;
      a.moe.w_gate_up = wgu.view();
      a.moe.w_down = wd.view();
      a.moe.quant = quant_of(QuantScheme::kFp8Block128, sgu, sd);
      a.moe.output = dout[r].view();
      a.shared_w_gate_up = swgu.view();
      a.shared_w_down = swd.view();
      a.shared_quant = quant_of(QuantScheme::kFp8PerChannel, ssgu, ssd);
    }
    ASSERT_EQ(plan_fused_moe_shared_expert(args[0]).routed, RoutedPath::kDirect);
    DeviceWorkspace ws(fused_moe_shared_expert_workspace_size(args[0]));
    for (FusedMoESharedExpertArgs& a : args) a.moe.workspace = ws.get();
    cudaStream_t stream;
    MOEKIT_CUDA_OK(cudaStreamCreate(&stream));
    const auto enqueue = [&] {
      for (const FusedMoESharedExpertArgs& a : args) fused_moe_shared_expert(a, stream);
    };
    std::vector<HostTensor> want;
    {
      ScopedPdl off(2);
      for (const FusedMoESharedExpertArgs& a : args) {  // each round alone
        fused_moe_shared_expert(a, stream);
        MOEKIT_CUDA_OK(cudaStreamSynchronize(stream));
      }
    }
    for (int r = 0; r < kRounds; ++r) {
      want.push_back(dout[r].download());
      const auto* bits = static_cast<const uint16_t*>(want[r].data());
      int64_t poisoned = 0;
      for (int64_t i = 0; i < T * H; ++i) poisoned += bits[i] == 0xFFFF;
      EXPECT_EQ(poisoned, 0) << "round " << r << " left poisoned outputs";
    }
    const auto capture = [&](int pdl, cudaGraph_t& g, cudaGraphExec_t& exec) {
      ScopedPdl knob(pdl);
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      enqueue();
      ASSERT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    };
    for (int pdl : {2, 1}) {
      SCOPED_TRACE(pdl == 1 ? "PDL on" : "PDL off");
      cudaGraph_t g = nullptr;
      cudaGraphExec_t exec = nullptr;
      capture(pdl, g, exec);
      for (int r = 0; r < kRounds; ++r)
        MOEKIT_CUDA_OK(cudaMemset(dout[r].data(), kPoison, want[r].nbytes()));
      for (int rep = 0; rep < 3; ++rep) MOEKIT_CUDA_OK(cudaGraphLaunch(exec, stream));
      MOEKIT_CUDA_OK(cudaStreamSynchronize(stream));
      for (int r = 0; r < kRounds; ++r)
        EXPECT_TRUE(same_bytes(dout[r].download(), want[r])) << "round " << r;
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
    }
    MOEKIT_CUDA_OK(cudaStreamDestroy(stream));
  }
}

// ---- FP8 weights with the engine inputs (docs/moe.md "With activations, biases and the
// engine inputs") ----

using enginetest::Map;

// An expert map with i64 (or i32) global ids, and the router weight on the input (top-1):
// against the reference, and bit for bit against the op on the inputs an engine would
// prepare by hand (gathered local i32 ids; scaled rows and unit weights).
TEST(MoEFp8Gpu, EngineInputsOnTheDecodePath) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 9100;
  struct EngineCase {
    DType dt;
    int64_t T, K, E_global;
    Map map;
    Ids ids;
    bool i64, apply;
  };
  const EngineCase cases[] = {
      {DType::kBF16, 1, 4, 24, Map::kShuffled, Ids::kDistinct, true, false},
      {DType::kBF16, 37, 4, 24, Map::kBlocked, Ids::kMinusOne, true, false},
      {DType::kF16, 64, 8, 40, Map::kBadLocal, Ids::kMixed, false, false},
      {DType::kBF16, 20, 2, 24, Map::kAllRemote, Ids::kMixed, true, false},
      {DType::kBF16, 45, 1, 8, Map::kAllLocal, Ids::kMinusOne, false, true},
      {DType::kF16, 64, 1, 24, Map::kShuffled, Ids::kMixed, true, true},
  };
  for (QuantScheme s : kSchemes) {
    const bool block = s == QuantScheme::kFp8Block128;
    const int64_t H = block ? 256 : 48, F = block ? 128 : 80, E = 8;
    for (const EngineCase& c : cases) {
      const std::string what =
          std::string(quant_scheme_name(s)) + " " + dtype_name(c.dt) + " T=" + std::to_string(c.T) +
          " K=" + std::to_string(c.K) + " E_global=" + std::to_string(c.E_global) +
          " ids=" + moetest::ids_name(c.ids) + (c.i64 ? " i64" : "") + (c.apply ? " apply" : "");
      SCOPED_TRACE(what);
      std::mt19937_64 rng(++seed);
      const HostTensor x = moetest::normal(rng, c.dt, {c.T, H}, 1.0);
      const Fp8Weights w(rng, s, E, H, F);
      const HostTensor tw = moetest::make_topk_weights(rng, c.T, c.K);
      const HostTensor ids = moetest::make_ids(rng, c.T, c.K, c.E_global, c.ids);
      const HostTensor map = enginetest::make_map(rng, c.E_global, E, 1, c.map);
      const HostTensor engine_ids = c.i64 ? enginetest::widen(ids) : ids;
      const HostTensor got = run_fp8_indexed(s, x, w, tw, engine_ids, &map, c.apply);
      expect_close(got, reference_indexed(s, x, w, tw, engine_ids, &map, c.apply), c.dt, what);
      HostTensor xs = x, ws = tw;
      if (c.apply) enginetest::scale_by_hand(x, tw, &xs, &ws);
      const HostTensor by_hand =
          run_fp8_indexed(s, xs, w, ws, enginetest::gather_local(ids, map, E), nullptr, false);
      EXPECT_TRUE(same_bytes(got, by_hand)) << "differs from the op on hand-prepared inputs";
    }
  }
}

// The FP8 layer with an expert map (global routing) and the router weight on the input,
// a FP8 shared expert reading the unscaled x.
TEST(MoEFp8Gpu, LayerWithAMapAndRouterWeightOnInput) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 9300;
  const int64_t H = 256, E = 16, E_global = 48, F = 128, S = 128;
  for (QuantScheme routed : kSchemes) {
    for (const auto& [T, K, apply] : {std::tuple<int64_t, int, bool>{1, 4, false},
                                      {33, 4, false},
                                      {64, 1, true},
                                      {9, 1, true}}) {
      SCOPED_TRACE(std::string(quant_scheme_name(routed)) + " T=" + std::to_string(T) +
                   " K=" + std::to_string(K) + (apply ? " apply" : ""));
      const QuantScheme shared = routed == QuantScheme::kFp8PerTensor ? QuantScheme::kFp8Block128
                                                                      : QuantScheme::kFp8PerTensor;
      std::mt19937_64 rng(++seed);
      LayerInputs in;
      in.x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
      in.logits = moetest::normal(rng, DType::kF32, {T, E_global}, 1.0);
      const HostTensor map = enginetest::make_map(rng, E_global, E, 2, Map::kShuffled);
      in.map = &map;
      in.params.top_k = K;
      in.params.renormalize = K > 1;
      in.apply = apply;
      const Fp8Weights rw(rng, routed, E, H, F), sw(rng, shared, 0, H, S);
      check_fp8_layer(routed, shared, in, rw, &sw);
    }
  }
}

// The weight-only FP8 sorted plan (bf16 rows, e4m3 weights unpacked in decode_persistent's
// tiles): per-channel and per-tensor weights, T = 0, 1, odd counts and past the direct path,
// odd H and F (multiples of 16), skewed routing (all tokens on a few experts, most experts
// empty), an expert map (-1 ids of non-local experts), gate/up scales of 2^+-30 (down scales of
// 2^-+60: outputs ~1), static per-tensor activation scales (not read), beside a FP8 shared
// expert; against the reference, NaN-free, bit-identical reruns. The plan is one of the layer's
// candidates.
TEST(MoEFp8Gpu, FusedMoeWeightOnlySortedPlan) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 9500;
  // The narrow tiles (32 x 128) and the planner's (32 x 256), both GEMMs.
  LayerPlan plans[2];
  ASSERT_TRUE(parse_plan(
      "sorted two_gemms{gate_up: decode_persistent 32x128, down: decode_persistent 32x128}",
      &plans[0]));
  ASSERT_TRUE(parse_plan(
      "sorted two_gemms{gate_up: decode_persistent 32x256, down: decode_persistent 32x256}",
      &plans[1]));
  struct WeightOnlyCase {
    int64_t T, H, E, F;
    int K;
    double scale_base;
    bool skewed, map;
    bool stat = false;  // static per-tensor activation scales (not read), per tensor only
  };
  const WeightOnlyCase cases[] = {
      {0, 256, 16, 128, 4, 1.0, false, false},       {1, 256, 16, 128, 4, 1.0, false, false},
      {17, 272, 16, 80, 4, 1.0, false, false},       {200, 256, 32, 128, 8, 1.0, false, false},
      {77, 256, 16, 128, 4, 1.0, true, false},       {45, 256, 16, 128, 2, 1.0, false, true},
      {33, 256, 16, 128, 4, 0x1p-30, false, false},  {33, 256, 16, 128, 4, 0x1p30, false, false},
      {77, 256, 16, 128, 4, 1.0, true, false, true},
  };
  // The down scale that brings the output back to ~1 (where the bf16 tolerance's absolute
  // part is meant to apply): act ~ gate_up^2 for huge scales (silu(g) ~ g), ~ gate_up^2 / 2
  // for tiny ones.
  const auto down_base = [](double gate_up) { return 1.0 / (gate_up * gate_up); };
  for (QuantScheme routed : {QuantScheme::kFp8PerChannel, QuantScheme::kFp8PerTensor}) {
    for (const WeightOnlyCase& c : cases) {
      if (c.stat && routed != QuantScheme::kFp8PerTensor) continue;
      SCOPED_TRACE(std::string(quant_scheme_name(routed)) + " T=" + std::to_string(c.T) + " H=" +
                   std::to_string(c.H) + " E=" + std::to_string(c.E) + " F=" + std::to_string(c.F) +
                   (c.skewed ? " skewed" : "") + (c.map ? " map" : "") + " scale " +
                   std::to_string(c.scale_base) + (c.stat ? " static scales" : ""));
      std::mt19937_64 rng(++seed);
      LayerInputs in;
      const int64_t E_logits = c.map ? 3 * c.E : c.E;
      in.x = moetest::normal(rng, DType::kBF16, {c.T, c.H}, 1.0);
      in.logits = moetest::normal(rng, DType::kF32, {c.T, E_logits}, 1.0);
      if (c.skewed) {  // experts 0..3 far ahead: every route on 4 of the 16 experts
        for (int64_t t = 0; t < c.T; ++t)
          for (int64_t e = 0; e < 4; ++e) in.logits.set(t * E_logits + e, 20.0 + e);
      }
      HostTensor map;
      if (c.map) {
        map = enginetest::make_map(rng, E_logits, c.E, 2, Map::kShuffled);
        in.map = &map;
      }
      in.params.top_k = c.K;
      in.params.renormalize = true;
      Fp8Weights rw(rng, routed, c.E, c.H, c.F, c.scale_base, down_base(c.scale_base));
      if (c.stat) rw.set_static_scales(std::ldexp(1.0, -20), std::ldexp(1.0, 20));
      if (c.T > 0) {
        DeviceTensor dx(in.x), dl(in.logits), dwgu(rw.wgu), dwd(rw.wd), dsgu(rw.sgu), dsd(rw.sd),
            dagu, dadn;
        FusedMoEArgs a;
        a.hidden_states = dx.view();
        a.gating_output = dl.view();
        a.params = in.params;
        a.w_gate_up = dwgu.view();
        a.w_down = dwd.view();
        a.quant = quant_of(routed, dsgu, dsd);
        add_static_scales(a.quant, rw, &dagu, &dadn);
        DeviceTensor dmap;
        if (c.map) {
          dmap = DeviceTensor(map);
          a.expert_map = dmap.view();
        }
        for (const LayerPlan& plan : plans) {
          bool listed = false;
          for (const LayerPlan& p : fused_moe_plan_candidates(a)) listed = listed || p == plan;
          EXPECT_TRUE(listed) << to_string(plan) << " is not a candidate";
        }
      }
      for (const LayerPlan& plan : plans) {
        SCOPED_TRACE(to_string(plan));
        check_fp8_layer(routed, QuantScheme::kNone, in, rw, nullptr, &plan);
      }
      // fused_moe_shared_expert: a block-scaled shared expert's output (T <= 64: its direct
      // kernel, no activation quantized) added in the combine.
      if (c.H % 128 == 0 && (c.T == 1 || c.T == 45)) {
        const Fp8Weights sw(rng, QuantScheme::kFp8Block128, 0, c.H, 256);
        check_fp8_layer(routed, QuantScheme::kFp8Block128, in, rw, &sw, &plans[0]);
      }
    }
  }
}

}  // namespace
}  // namespace moekit
