#include "sweep_case.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>
#include <sstream>

namespace moekit::sweep {
namespace {

// ---- randomness ---------------------------------------------------------------------------

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Integer draws from mt19937_64 words only (no std distributions: their output is
// implementation-defined, and a seed must name the same case in every build).
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  uint64_t next() { return g_(); }
  double u01() { return static_cast<double>(g_() >> 11) * 0x1.0p-53; }
  bool chance(double p) { return u01() < p; }
  int64_t uniform(int64_t lo, int64_t hi) {  // inclusive; hi - lo < 2^32
    return lo + static_cast<int64_t>(g_() % static_cast<uint64_t>(hi - lo + 1));
  }
  int64_t log_uniform(int64_t lo, int64_t hi) {  // 1 <= lo <= hi
    const double x = std::exp(std::log(static_cast<double>(lo)) +
                              u01() * (std::log(hi + 1.0) - std::log(static_cast<double>(lo))));
    return std::clamp(static_cast<int64_t>(x), lo, hi);
  }
  template <class T>
  T pick(std::initializer_list<T> v) {
    return *(v.begin() + uniform(0, static_cast<int64_t>(v.size()) - 1));
  }

 private:
  std::mt19937_64 g_;
};

// Streams of one case's input draws.
enum Stream : uint64_t {
  kIdsStream = 1,
  kCountsStream,
  kInverseStream,
  kSkewStream,
  kMapStream,
  kEngineStream,
  kActivationStream,
  kQuantStream,
};
Rng stream(const SweepCase& c, Stream s) {
  return Rng(mix(c.data_seed ^ mix(s)));
}

// ---- names ---------------------------------------------------------------------------------

const char* const kOpNames[kOpCount] = {
    "fused_topk",       "moe_permute_align",       "moe_pre_permute",
    "moe_post_permute", "moe_grouped_gemm",        "moe_grouped_gemm_fp8",
    "moe_expert_mlp",   "fused_moe_experts",       "indexed_expert_mlp",
    "fused_moe",        "fused_moe_shared_expert", "shared_expert_mlp",
};
const char* const kRouteNames[] = {"uniform", "skewed", "one_expert", "few_experts", "equal"};
// By Activation's value (moekit/gemm.h): the library's names (src/mlp/activation.cpp).
const char* const kActivationKeys[] = {"none",         "silu_and_mul", "gelu_tanh_and_mul",
                                       "gelu_and_mul", "relu2",        "swiglu_oai"};
constexpr int kActivationCount = sizeof(kActivationKeys) / sizeof(kActivationKeys[0]);
// By QuantScheme's value (moekit/quant.h): the library's names (quant_scheme_name).
const char* const kQuantKeys[] = {"none", "fp8_per_tensor", "fp8_per_channel", "fp8_block128"};
// By Fp8Scales' value (moekit/gemm.h).
const char* const kFp8ScalesKeys[] = {"block", "per_channel", "per_tensor"};

// The enum value whose name (names[value]) is s, at or after `first`.
template <class Enum, size_t kCount>
bool parse_name(const std::string& s, const char* const (&names)[kCount], int first, Enum* out) {
  for (int i = first; i < static_cast<int>(kCount); ++i) {
    if (s == names[i]) {
      *out = static_cast<Enum>(i);
      return true;
    }
  }
  return false;
}

// The spec's dtype fields.
struct DtypeKey {
  const char* key;
  DType SweepCase::*field;
};
const DtypeKey kDtypeKeys[] = {
    {"dtype", &SweepCase::dtype},
    {"out", &SweepCase::out},
    {"gating", &SweepCase::gating},
    {"gate_up_bias", &SweepCase::gate_up_bias},
    {"down_bias", &SweepCase::down_bias},
    {"shared_gate_up_bias", &SweepCase::shared_gate_up_bias},
    {"shared_down_bias", &SweepCase::shared_down_bias},
};

bool parse_dtype(const std::string& s, DType* d) {
  for (DType x : {DType::kBF16, DType::kF16, DType::kF32, DType::kI32, DType::kFP8E4M3}) {
    if (s == dtype_name(x)) {
      *d = x;
      return true;
    }
  }
  return false;
}

// ---- limits of the library's validation ---------------------------------------------------

// src/routing/fused_topk_kernel.h kTopKMaxExperts / kTopKMaxK; src/permute/permute_kernels.h
// kPermuteMaxExperts (also the sorted path of the routed layers: fused_moe.cpp
// check_path_experts); src/gemm/moe_grouped_gemm.cpp kMaxExperts; src/moe/moe_internal.h
// kDirectMax* (the direct path). MoEExpertMLPFwd has no expert limit of its own: the sweep
// stays at the GEMMs' 1024.
constexpr int64_t kTopKMaxExperts = 1024, kMaxTopK = 16, kPermuteMaxExperts = 1024;
constexpr int64_t kGemmMaxExperts = 1024, kDirectMaxExperts = 4096;
constexpr int64_t kDirectMaxTokens = 64, kFp8DirectMaxTokens = 128, kDirectMaxRoutes = 1024;
constexpr int64_t kMaxTokens = 65536, kMaxWidthUnits = 1024;  // widths up to 8 * 1024
// f32 outputs are held to the f32 limit (1e-5 on rel_l2 and on the share of elements
// outside 1e-5 + 1e-5*|ref|). The f32 accumulation errors of the kernel and of the f32 GPU
// reference (~3e-8 * sqrt(Kd) each, for outputs ~N(0, 1)) put a few elements past it at
// Kd = 2048 with silu_and_mul (two such sums multiplied); at 1024 the share stays < 1e-6.
constexpr int64_t kF32OutMaxReduction = 1024;

// The direct path runs silu_and_mul without biases only (docs/moe.md, "Activations").
bool direct_eligible(const SweepCase& c) {
  const int64_t max_tokens = c.quant != QuantScheme::kNone ? kFp8DirectMaxTokens : kDirectMaxTokens;
  return !general_mlp(c) && c.T <= max_tokens && c.T * c.K <= kDirectMaxRoutes &&
         c.E <= kDirectMaxExperts && 2 * c.N * c.H < (int64_t{1} << 31);
}
// FP8 weights past 64 tokens take the direct path only with per-tensor / per-channel scales,
// F <= 768 and T*K <= 8E (src/moe/layer_planner.cpp fp8_takes_direct).
bool fp8_direct_past_64(const SweepCase& c) {
  return c.quant != QuantScheme::kFp8Block128 && c.N <= 768 && c.T * c.K <= 8 * c.E;
}
bool past_64_fp8(const SweepCase& c) {
  return c.quant != QuantScheme::kNone && c.T > kDirectMaxTokens;
}
// Whether indexed_expert_mlp / the layers take the direct path (src/moe/fused_moe.cpp).
bool indexed_direct(const SweepCase& c) {
  if (c.knobs.routed_path != 0) return c.knobs.routed_path == 1 && direct_eligible(c);
  return direct_eligible(c) && (!past_64_fp8(c) || fp8_direct_past_64(c));
}
bool layer_direct(const SweepCase& c) {
  if (c.knobs.routed_path != 0) return c.knobs.routed_path == 1 && direct_eligible(c);
  if (past_64_fp8(c)) return direct_eligible(c) && fp8_direct_past_64(c);
  return direct_eligible(c) && c.T * c.K <= 16 * c.E;
}

bool routes_from_gating(Op op) {
  return op == Op::kFusedTopK || op == Op::kFusedMoe || op == Op::kFusedMoeSharedExpert;
}
bool takes_ids(Op op) {
  return op == Op::kPermuteAlign || op == Op::kPrePermute || op == Op::kFusedMoeExperts ||
         op == Op::kIndexedExpertMlp;
}
bool row_counts(Op op) {
  return op == Op::kGroupedGemm || op == Op::kGroupedGemmFp8 || op == Op::kExpertMlp;
}

int64_t max_experts(const SweepCase& c) {
  switch (c.op) {
    case Op::kFusedTopK:
    case Op::kFusedMoe:
    case Op::kFusedMoeSharedExpert:
      return kTopKMaxExperts;
    case Op::kPermuteAlign:
    case Op::kPrePermute:
    case Op::kFusedMoeExperts:
      return kPermuteMaxExperts;
    case Op::kIndexedExpertMlp:
      return indexed_direct(c) ? kDirectMaxExperts : kPermuteMaxExperts;
    case Op::kGroupedGemm:
    case Op::kGroupedGemmFp8:
    case Op::kExpertMlp:
      return kGemmMaxExperts;
    case Op::kPostPermute:
    case Op::kSharedExpertMlp:
      return 1;
  }
  return 1;
}

size_t dsize(DType d) {
  return dtype_size(d);
}

// ---- families ------------------------------------------------------------------------------

// The knobs of the case's family. `round` counts the earlier cases of the same op and
// family: the forced values cycle with it, so every value comes up within a few rounds.
void draw_knobs(SweepCase& c, Rng& rng, int64_t round) {
  Knobs& k = c.knobs;
  const std::string& f = c.family;
  const auto cycle = [&](int n) { return static_cast<int>(round % n); };
  if (f == "pdl_off") {
    k.pdl = 2;
  } else if (f == "gemm_plan") {
    k.gemm_plan = cycle(1 << 12);  // modulo the case's candidates
  } else if (f == "no_workspace") {
    c.workspace = false;
  } else if (f == "fp8_plan") {
    k.fp8_plan = cycle(4);  // two tile shapes x two schedules (modulo the case's candidates)
  } else if (f == "mlp_plan") {
    k.mlp_plan = cycle(1 << 12);
  } else if (f == "routed_path") {
    k.routed_path = 1 + cycle(2);
  } else if (f == "dense_path") {
    k.dense_path = 1 + cycle(4);
  } else if (f == "direct_knobs") {
    k.dense_path = 3;
    k.direct_split = static_cast<int>(rng.uniform(0, 8));  // 0: the plan; 1-8 ranks
  } else if (f == "streamk_grid") {
    k.dense_path = 1;
    k.streamk_grid = static_cast<int>(rng.uniform(1, 132));
  }
}

// ---- shapes --------------------------------------------------------------------------------

// Token counts: log-uniform, with weight on the edges; the forced small-batch paths get
// the batches they take (GEMV: 1 token, direct: <= 32, stream-K and the routed direct
// path: <= 64) most of the time.
int64_t draw_tokens(const SweepCase& c, Rng& rng) {
  const Knobs& k = c.knobs;
  if (k.dense_path == 4 && rng.chance(0.7)) return 1;
  if (k.dense_path == 3) return rng.chance(0.2) ? 1 : rng.log_uniform(1, 32);
  if (k.dense_path != 0 || k.routed_path == 1) {
    return rng.chance(0.25) ? 1 : rng.log_uniform(1, 64);
  }
  const double r = rng.u01();
  if (r < 0.03) return 0;
  if (r < 0.08) return 1;
  if (r < 0.14) return rng.uniform(2, 17);
  return rng.log_uniform(1, kMaxTokens);
}

int64_t draw_experts(Rng& rng, int64_t max_e) {
  const double r = rng.u01();
  if (r < 0.08) return 1;
  if (r < 0.16) return max_e;
  if (r < 0.32) {
    // Model counts, the decoding PR's odd ones (a shared expert folded in: 129, 257, 513),
    // and the edges of the kernels' instances (512 / 513: FusedTopK's 32-slot rows and the
    // permute ops' chunked kernels start past 512).
    const int64_t e = rng.pick<int64_t>({2,   3,   7,   8,   16,  32,  60,  64,  128,  129, 160,
                                         192, 256, 257, 384, 512, 513, 640, 768, 1000, 1023});
    return std::min(e, max_e);
  }
  return rng.log_uniform(1, max_e);
}

// A multiple of `unit` up to unit * kMaxWidthUnits: tiny, model-like, or any.
int64_t draw_width(Rng& rng, int64_t unit) {
  const double r = rng.u01();
  int64_t m;
  if (r < 0.1) {
    m = rng.uniform(1, 3);
  } else if (r < 0.35) {
    m = rng.pick<int64_t>({16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 896, 1024});
  } else {
    m = rng.log_uniform(1, kMaxWidthUnits);
  }
  return unit * m;
}

int draw_alignment(Rng& rng) {
  return rng.chance(0.4) ? 1 : rng.pick({2, 3, 4, 7, 8, 16, 32, 64, 128, 256});
}

DType draw_half(Rng& rng) {
  return rng.chance(0.5) ? DType::kBF16 : DType::kF16;
}
DType draw_any_float(Rng& rng) {
  const double r = rng.u01();
  return r < 0.4 ? DType::kBF16 : r < 0.8 ? DType::kF16 : DType::kF32;
}

void draw_routes(SweepCase& c, Rng& rng) {
  const double r = rng.u01();
  c.route = r < 0.4    ? Route::kUniform
            : r < 0.65 ? Route::kSkewed
            : r < 0.78 ? Route::kOneExpert
            : r < 0.9  ? Route::kFewExperts
                       : (row_counts(c.op) ? Route::kEqual : Route::kUniform);
  if (c.route == Route::kSkewed) c.skew_milli = rng.pick({300, 500, 1000, 2000});
  if (takes_ids(c.op) || c.op == Op::kPostPermute) {
    if (rng.chance(0.3)) c.drop_pm = rng.pick({20, 100, 300, 1000});
    if (rng.chance(0.25)) c.dup_pm = std::min(rng.pick({50, 200, 500}), 1000 - c.drop_pm);
    if (rng.chance(0.1)) c.oor_pm = std::min(rng.pick({10, 50}), 1000 - c.drop_pm - c.dup_pm);
  }
}

// FusedTopK's parameters: K <= min(16, E); grouping over a divisor of E.
void fix_topk(SweepCase& c) {
  c.K = std::clamp<int64_t>(c.K, 1, std::min(kMaxTopK, c.E));
  if (c.groups > 0 && (c.E % c.groups != 0 || c.groups > c.E)) c.groups = c.topk_group = 0;
  if (c.groups > 0) {
    const int64_t per = c.E / c.groups;
    const int64_t need = (c.K + per - 1) / per;
    c.topk_group =
        static_cast<int>(std::clamp<int64_t>(std::max<int64_t>(c.topk_group, need), 1, c.groups));
  }
}

void draw_topk_params(SweepCase& c, Rng& rng) {
  c.K = rng.chance(0.15) ? 1 : rng.uniform(1, std::min(kMaxTopK, c.E));
  c.renormalize = rng.chance(0.5);
  c.sigmoid = rng.chance(0.3);
  c.scale_milli = rng.chance(0.7) ? 1000 : rng.pick({1, 500, 2500});
  if (rng.chance(0.08)) {
    c.levels = rng.pick({2, 3, 5, 16});
  } else {
    c.bias = rng.chance(0.4);
  }
  if (rng.chance(0.3) && c.E >= 2) {
    std::vector<int> divisors;
    for (int g = 2; g <= c.E; ++g)
      if (c.E % g == 0) divisors.push_back(g);
    c.groups = divisors[rng.uniform(0, static_cast<int64_t>(divisors.size()) - 1)];
    c.topk_group = static_cast<int>(rng.uniform(1, c.groups));
  }
  fix_topk(c);
}

void draw_shapes(SweepCase& c, Rng& rng) {
  c.T = draw_tokens(c, rng);
  c.dtype = draw_half(rng);
  c.out = c.dtype;
  switch (c.op) {
    case Op::kFusedTopK:
      c.dtype = c.out = c.gating = draw_any_float(rng);
      c.E = draw_experts(rng, kTopKMaxExperts);
      draw_topk_params(c, rng);
      draw_routes(c, rng);
      if (c.route != Route::kSkewed) c.route = Route::kUniform;
      break;
    case Op::kPermuteAlign:
    case Op::kPrePermute:
      c.E = draw_experts(rng, kPermuteMaxExperts);
      c.K = rng.uniform(1, kMaxTopK);
      draw_routes(c, rng);
      if (c.op == Op::kPermuteAlign) {
        c.block_size = rng.pick({16, 32, 64, 128, 256});
      } else {
        c.dtype = c.out = draw_any_float(rng);
        c.H = draw_width(rng, 8);
        c.alignment = draw_alignment(rng);
      }
      break;
    case Op::kPostPermute:
      c.dtype = draw_any_float(rng);
      c.out = c.dtype == DType::kF32 || rng.chance(0.25) ? DType::kF32 : c.dtype;
      c.K = rng.uniform(1, kMaxTopK);
      c.H = draw_width(rng, 8);
      c.tail = rng.chance(0.5) ? 0 : rng.uniform(1, 64);
      draw_routes(c, rng);
      break;
    case Op::kGroupedGemm:
    case Op::kGroupedGemmFp8:
    case Op::kExpertMlp: {
      const bool fp8 = c.op == Op::kGroupedGemmFp8;
      c.E = draw_experts(rng, kGemmMaxExperts);
      c.H = rng.chance(0.02) ? 0 : draw_width(rng, fp8 ? 16 : 8);
      c.N = draw_width(rng, 8);
      c.masked = fp8 || (c.op == Op::kGroupedGemm && rng.chance(0.3));
      if (!c.masked) {
        c.alignment = draw_alignment(rng);
        c.tail = rng.chance(0.6) ? 0 : rng.uniform(1, 300);
      }
      if (fp8) {
        c.dtype = DType::kFP8E4M3;
        c.out = DType::kBF16;
      } else if (c.op == Op::kGroupedGemm) {
        c.silu = rng.chance(0.4);
        if (rng.chance(0.25)) c.out = DType::kF32;
      } else {
        if (c.H == 0) c.H = 8;
      }
      draw_routes(c, rng);
      break;
    }
    case Op::kFusedMoeExperts:
    case Op::kIndexedExpertMlp:
      c.K = rng.uniform(1, kMaxTopK);
      c.H = draw_width(rng, 8);
      c.N = draw_width(rng, 8);
      if (c.op == Op::kIndexedExpertMlp && c.knobs.routed_path == 1 && c.T > 0) {
        c.K = std::min<int64_t>(c.K, kDirectMaxRoutes / c.T);
        if (c.K < 1) c.K = 1;
      }
      c.E = draw_experts(rng, kPermuteMaxExperts);
      if (c.op == Op::kIndexedExpertMlp && indexed_direct(c) && rng.chance(0.25)) {
        c.E = rng.log_uniform(kPermuteMaxExperts, kDirectMaxExperts);  // direct path only
      }
      draw_routes(c, rng);
      break;
    case Op::kFusedMoe:
    case Op::kFusedMoeSharedExpert:
      c.gating = rng.chance(0.5) ? DType::kF32 : draw_half(rng);
      c.H = draw_width(rng, 8);
      c.N = draw_width(rng, 8);
      if (c.op == Op::kFusedMoeSharedExpert) c.S = rng.chance(0.15) ? 0 : draw_width(rng, 8);
      c.E = draw_experts(rng, kTopKMaxExperts);
      draw_topk_params(c, rng);
      if (c.knobs.routed_path == 1 && c.T > 0) {
        c.K = std::max<int64_t>(1, std::min<int64_t>(c.K, kDirectMaxRoutes / c.T));
        fix_topk(c);
      }
      draw_routes(c, rng);
      if (c.route != Route::kSkewed) c.route = Route::kUniform;
      break;
    case Op::kSharedExpertMlp:
      c.H = draw_width(rng, 8);
      c.N = draw_width(rng, 8);
      break;
  }
}

// The engine inputs, from their own stream after everything else: the other fields of a
// seed's cases stay what they were before these existed.
void draw_engine_inputs(SweepCase& c) {
  Rng rng = stream(c, kEngineStream);
  const bool experts = c.op == Op::kFusedMoeExperts || c.op == Op::kIndexedExpertMlp;
  if (experts && rng.chance(0.25)) c.ep_ranks = static_cast<int>(rng.pick({2, 4, 8, 16}));
  if (experts && rng.chance(0.2)) c.ids64 = true;
  const bool layer = c.op == Op::kFusedMoe || c.op == Op::kFusedMoeSharedExpert;
  if ((experts || layer) && c.K == 1 && rng.chance(0.5)) c.on_input = true;
  // Drawn last, so the fields above stay what they were before layers took maps. Layers
  // route over the global experts: ungrouped routing within fused_topk's expert limit.
  if (layer && rng.chance(0.2)) {
    const int ranks = static_cast<int>(rng.pick({2, 4, 8}));
    if (c.groups == 0 && c.E * ranks <= kTopKMaxExperts) c.ep_ranks = ranks;
  }
}

// Halves a width (a multiple of `unit`, at least `unit`); false when at its minimum.
bool halve(int64_t* w, int64_t unit) {
  if (*w <= unit) return false;
  const int64_t m = *w / unit;
  *w = unit * ((m + 1) / 2);
  return true;
}

// The multiple of 8 a FP8 scheme's widths keep (docs/moe.md, "Quantized weights"): 16 (rows
// of whole 16-byte e4m3 chunks), 128 for 128 x 128 blocks; 8 without FP8 weights.
int64_t quant_unit(QuantScheme q) {
  return q == QuantScheme::kFp8Block128 ? 128 : q == QuantScheme::kNone ? 8 : 16;
}

// The units H, N and S are multiples of: the FP8 GEMM's Kd 16 (and N 64 for silu_and_mul
// with block scales), the FP8 weights' units, else 8.
struct WidthUnits {
  int64_t h = 8, n = 8, s = 8;
};
WidthUnits width_units(const SweepCase& c) {
  WidthUnits u;
  if (c.op == Op::kGroupedGemmFp8) {
    u.h = 16;
    if (c.silu && c.fp8_scales == Fp8Scales::kBlock) u.n = 64;
  }
  u.h = std::max({u.h, quant_unit(c.quant), quant_unit(c.shared_quant)});
  u.n = std::max(u.n, quant_unit(c.quant));
  u.s = quant_unit(c.shared_quant);
  return u;
}

void shrink_to(SweepCase& c, const Limits& lim) {
  const auto over = [&] { return case_flops(c) > lim.max_flops || case_bytes(c) > lim.max_bytes; };
  const WidthUnits u = width_units(c);
  for (int guard = 0; guard < 400 && over(); ++guard) {
    int64_t* widest = nullptr;
    if (c.H > u.h) widest = &c.H;
    if (c.N > u.n && (!widest || c.N > *widest)) widest = &c.N;
    if (c.S > u.s && (!widest || c.S > *widest)) widest = &c.S;
    if (widest && halve(widest, widest == &c.H ? u.h : widest == &c.N ? u.n : u.s)) continue;
    if (c.E > 1) {
      c.E = (c.E + 1) / 2;
      if (routes_from_gating(c.op)) fix_topk(c);
      continue;
    }
    if (c.K > 1) {
      c.K = (c.K + 1) / 2;
      continue;
    }
    break;
  }
}

// ---- activations ---------------------------------------------------------------------------

// The routed MLP ops (top_k routes per token).
bool routed_mlp(Op op) {
  return op == Op::kFusedMoeExperts || op == Op::kIndexedExpertMlp || op == Op::kFusedMoe ||
         op == Op::kFusedMoeSharedExpert;
}

// Families forcing a kernel that runs only silu_and_mul without biases (stream-K, the dense
// direct and GEMV kernels, the routed direct path): mostly silu there, so those kernels keep
// their share of cases; a general case checks that the knob falls back to a candidate.
bool forces_silu_kernel(const Knobs& k) {
  return k.dense_path == 1 || k.dense_path == 3 || k.dense_path == 4 || k.streamk_grid > 0 ||
         k.direct_split > 0 || k.routed_path == 1;
}

bool over_limits(const SweepCase& c, const Limits& lim) {
  return case_flops(c) > lim.max_flops || case_bytes(c) > lim.max_bytes;
}

// gpt-oss-like shapes: H a multiple of 64 but not of 128 (gpt-oss: 2880), F = 2880 and its
// tensor-parallel slices, top-4 over 32 or 128 experts (no groups); E, then F halved until
// the case fits the caps with the general path's bytes at their most (so that no activation
// drawn next halves H). False, c untouched, when it cannot (T is never shrunk).
bool take_gpt_oss_shape(SweepCase& c, Rng& rng, const Limits& lim) {
  SweepCase g = c;
  g.act = Activation::kSwigluOai;
  g.gate_up_bias = g.down_bias = DType::kF32;
  g.H = rng.pick<int64_t>({2880, 2880, 2880, 1344, 576});
  g.N = rng.pick<int64_t>({2880, 1440, 720, 360});
  if (g.op != Op::kSharedExpertMlp) g.E = rng.pick<int64_t>({32, 128});
  if (routed_mlp(g.op)) {
    g.K = 4;
    g.on_input = false;  // top-1 only
    g.groups = g.topk_group = 0;
  }
  for (;;) {
    if (g.S > 0) g.S = g.N;
    if (!over_limits(g, lim)) break;
    if (g.E > 8) {
      g.E /= 2;
    } else if (g.N > 360) {
      g.N /= 2;
    } else if (g.E > 4) {
      g.E /= 2;
    } else {
      return false;
    }
  }
  g.act = c.act;
  g.gate_up_bias = c.gate_up_bias;
  g.down_bias = c.down_bias;
  c = g;
  return true;
}

DType draw_bias_dtype(const SweepCase& c, Rng& rng) {
  return rng.chance(0.5) ? DType::kF32 : c.dtype;
}

// Sets none, one or both of a pair of biases (`at_least_one`: one or both).
void draw_biases(const SweepCase& c, Rng& rng, bool at_least_one, DType* gate_up, DType* down) {
  const int64_t which = rng.uniform(at_least_one ? 1 : 0, 3);
  if (which & 1) *gate_up = draw_bias_dtype(c, rng);
  if (which & 2) *down = draw_bias_dtype(c, rng);
}

// The MLP ops' activation and biases (and sometimes a gpt-oss-like shape), from their own
// stream after everything else: a seed's cases keep their other fields, but the shapes of
// those taking a gpt-oss shape and of those the general path's bytes push past the caps.
void draw_activation(SweepCase& c, const Limits& lim) {
  if (!mlp_op(c.op)) return;
  Rng rng = stream(c, kActivationStream);
  const bool gpt_oss = rng.chance(0.12) && take_gpt_oss_shape(c, rng, lim);
  // Beyond 1024 experts only the direct path runs (silu_and_mul without biases).
  if (c.op == Op::kIndexedExpertMlp && c.E > kPermuteMaxExperts) return;
  if (gpt_oss && rng.chance(0.6)) {  // gpt-oss itself
    c.act = Activation::kSwigluOai;
    c.gate_up_bias = draw_bias_dtype(c, rng);
    c.down_bias = draw_bias_dtype(c, rng);
  } else if (rng.chance(forces_silu_kernel(c.knobs) ? 0.2 : 0.5)) {
    c.act = rng.pick({Activation::kSiluAndMul, Activation::kGeluTanhAndMul, Activation::kGeluAndMul,
                      Activation::kRelu2, Activation::kSwigluOai});
    if (c.act == Activation::kSiluAndMul || rng.chance(0.5))
      draw_biases(c, rng, c.act == Activation::kSiluAndMul, &c.gate_up_bias, &c.down_bias);
  }
  if (c.op == Op::kFusedMoeSharedExpert && c.S > 0 && rng.chance(0.3))
    draw_biases(c, rng, true, &c.shared_gate_up_bias, &c.shared_down_bias);
  if (over_limits(c, lim)) shrink_to(c, lim);
}

// ---- FP8 weights and the FP8 GEMM's modes ------------------------------------------------

int64_t round_up(int64_t v, int64_t unit) {
  return (v + unit - 1) / unit * unit;
}

QuantScheme draw_scheme(Rng& rng) {
  return rng.pick(
      {QuantScheme::kFp8PerTensor, QuantScheme::kFp8PerChannel, QuantScheme::kFp8Block128});
}

// moe_grouped_gemm_fp8's layout (contiguous in 4 cases of 10: an alignment, rows past the
// last block), scale mode, silu_and_mul and e4m3 output (c_scale).
void draw_fp8_gemm_modes(SweepCase& c, Rng& rng, const Limits& lim) {
  if (rng.chance(0.4)) {
    c.masked = false;
    c.max_m = 0;
    c.alignment = draw_alignment(rng);
    c.tail = rng.chance(0.6) ? 0 : rng.uniform(1, 300);
  }
  const double r = rng.u01();
  c.fp8_scales = r < 0.5    ? Fp8Scales::kBlock
                 : r < 0.75 ? Fp8Scales::kPerChannel
                            : Fp8Scales::kPerTensor;
  c.silu = rng.chance(0.4);
  if (rng.chance(0.25)) c.out = DType::kFP8E4M3;
  // silu_and_mul with block scales: N a multiple of 64 (the kernel's b boxes lie in one
  // scale block); below 64 another scale mode.
  if (c.silu && c.fp8_scales == Fp8Scales::kBlock && c.N % 64 != 0) {
    if (c.N >= 64) {
      c.N = c.N / 64 * 64;
    } else {
      c.fp8_scales = Fp8Scales::kPerChannel;
    }
  }
  if (over_limits(c, lim)) shrink_to(c, lim);
}

// FP8 weights on the MLP ops whose MLP runs silu_and_mul without biases (what the FP8
// kernels run), in 35% of them: a scheme, H and F rounded up to its unit, static activation
// scales on half the fp8_per_tensor ones; fused_moe_shared_expert's shared expert its own
// scheme (S rounded up) in half of its cases with FP8 routed weights, a fifth of the others.
// moe_expert_mlp with FP8 weights runs bf16 (the FP8 GEMMs write bf16 rows).
void draw_weight_quant(SweepCase& c, Rng& rng, const Limits& lim) {
  if (general_mlp(c)) return;
  if (rng.chance(0.35)) {
    c.quant = draw_scheme(rng);
    if (c.op == Op::kExpertMlp) c.dtype = c.out = DType::kBF16;
  }
  const bool shared_biased =
      c.shared_gate_up_bias != DType::kUndefined || c.shared_down_bias != DType::kUndefined;
  if (c.op == Op::kFusedMoeSharedExpert && c.S > 0 && !shared_biased &&
      rng.chance(c.quant != QuantScheme::kNone ? 0.5 : 0.2))
    c.shared_quant = draw_scheme(rng);
  if (c.quant == QuantScheme::kFp8PerTensor || c.shared_quant == QuantScheme::kFp8PerTensor) {
    if (rng.chance(0.5)) c.static_act = static_cast<int>(rng.uniform(1, 3));
  }
  const WidthUnits u = width_units(c);
  c.H = round_up(c.H, u.h);
  c.N = round_up(c.N, u.n);
  if (c.S > 0) c.S = round_up(c.S, u.s);
  if (over_limits(c, lim)) shrink_to(c, lim);
}

// From their own stream after everything else: a seed's cases keep their other fields,
// but the FP8 cases' widths (rounded to the scheme's unit, shrunk to the caps) and
// moe_expert_mlp's dtype (bf16), and the FP8 GEMM's layout fields (contiguous cases).
void draw_quant(SweepCase& c, const Limits& lim) {
  if (c.op != Op::kGroupedGemmFp8 && !mlp_op(c.op)) return;
  Rng rng = stream(c, kQuantStream);
  if (c.op == Op::kGroupedGemmFp8) {
    draw_fp8_gemm_modes(c, rng, lim);
  } else {
    draw_weight_quant(c, rng, lim);
  }
}

std::string knobs_string(const Knobs& k) {
  std::string s;
  for (const KnobField& f : knob_fields()) {
    if (k.*f.field != f.fallback) s += std::string(" ") + f.key + "=" + std::to_string(k.*f.field);
  }
  return s;
}

}  // namespace

const char* op_name(Op op) {
  return kOpNames[static_cast<int>(op)];
}

bool parse_op(const std::string& name, Op* op) {
  for (int i = 0; i < kOpCount; ++i) {
    if (name == kOpNames[i]) {
      *op = static_cast<Op>(i);
      return true;
    }
  }
  return false;
}

const char* route_name(Route r) {
  return kRouteNames[static_cast<int>(r)];
}

bool mlp_op(Op op) {
  return op == Op::kExpertMlp || routed_mlp(op) || op == Op::kSharedExpertMlp;
}

bool general_mlp(const SweepCase& c) {
  return c.act != Activation::kSiluAndMul || c.gate_up_bias != DType::kUndefined ||
         c.down_bias != DType::kUndefined;
}

int64_t gate_up_rows(const SweepCase& c, int64_t F) {
  return c.act == Activation::kRelu2 ? F : 2 * F;
}

const char* activation_key(Activation act) {
  const int i = static_cast<int>(act);
  return i >= 0 && i < kActivationCount ? kActivationKeys[i] : "unknown";
}

std::string activation_label(const SweepCase& c) {
  const bool biased = c.gate_up_bias != DType::kUndefined || c.down_bias != DType::kUndefined ||
                      c.shared_gate_up_bias != DType::kUndefined ||
                      c.shared_down_bias != DType::kUndefined;
  std::string s = std::string(activation_key(c.act)) + (biased ? "+bias" : "");
  const QuantScheme q = c.quant != QuantScheme::kNone ? c.quant : c.shared_quant;
  if (q != QuantScheme::kNone) s += std::string("+") + kQuantKeys[static_cast<int>(q)];
  if (c.static_act != 0) s += "(static)";
  return s;
}

std::string fp8_gemm_label(const SweepCase& c) {
  return std::string(c.masked ? "masked+" : "contiguous+") + fp8_scales_key(c.fp8_scales) +
         (c.silu ? "+silu" : "") + (c.out == DType::kFP8E4M3 ? "+e4m3" : "");
}

const char* fp8_scales_key(Fp8Scales s) {
  const int i = static_cast<int>(s);
  return i >= 0 && i < 3 ? kFp8ScalesKeys[i] : "unknown";
}

bool fp8_weights(const SweepCase& c) {
  return c.quant != QuantScheme::kNone || c.shared_quant != QuantScheme::kNone;
}

const std::vector<KnobField>& knob_fields() {
  static const std::vector<KnobField> fields = {
      {"gemm_plan", &Knobs::gemm_plan, -1},      {"fp8_plan", &Knobs::fp8_plan, -1},
      {"mlp_plan", &Knobs::mlp_plan, -1},        {"dense_path", &Knobs::dense_path, 0},
      {"streamk_grid", &Knobs::streamk_grid, 0}, {"direct_split", &Knobs::direct_split, 0},
      {"routed_path", &Knobs::routed_path, 0},   {"pdl", &Knobs::pdl, 0},
  };
  return fields;
}

const std::vector<std::string>& op_families(Op op) {
  static const std::vector<std::string> families[kOpCount] = {
      {"heuristic", "pdl_off"},
      {"heuristic", "pdl_off"},
      {"heuristic", "pdl_off"},
      {"heuristic", "pdl_off"},
      {"heuristic", "gemm_plan", "no_workspace"},
      {"heuristic", "fp8_plan"},
      {"heuristic", "mlp_plan", "pdl_off"},
      {"heuristic", "pdl_off"},
      {"heuristic", "routed_path", "pdl_off"},
      {"heuristic", "routed_path", "pdl_off"},
      {"heuristic", "routed_path", "dense_path", "direct_knobs", "streamk_grid", "pdl_off"},
      {"heuristic", "dense_path", "direct_knobs", "streamk_grid", "pdl_off"},
  };
  return families[static_cast<int>(op)];
}

// The bytes cap leaves room for the shared MLPs whose weights (>= 256 MB) make the
// heuristic pick stream-K or the GEMV kernels.
Limits default_limits() {
  return {2e10, 6e8};
}

Limits large_limits() {
  return {2e11, 4e9};
}

double case_flops(const SweepCase& c) {
  const double T = static_cast<double>(c.T), H = static_cast<double>(c.H);
  const double N = static_cast<double>(c.N), S = static_cast<double>(c.S);
  const double E = static_cast<double>(c.E), K = static_cast<double>(c.K);
  switch (c.op) {
    case Op::kFusedTopK:
      return 10 * T * E;
    case Op::kPermuteAlign:
    case Op::kPrePermute:
    case Op::kPostPermute:
      return 2 * T * K * std::max(H, 1.0);
    case Op::kGroupedGemm:
    case Op::kGroupedGemmFp8:
      return 2 * T * N * (c.silu ? 2 : 1) * H;
    case Op::kExpertMlp:
      return 6 * T * N * H;
    case Op::kFusedMoeExperts:
    case Op::kIndexedExpertMlp:
      return 6 * T * K * N * H;
    case Op::kFusedMoe:
    case Op::kFusedMoeSharedExpert:
      return 6 * T * K * N * H + 6 * T * S * H + 10 * T * double(routing_case(c).E);
    case Op::kSharedExpertMlp:
      return 6 * T * N * H;
  }
  return 0;
}

namespace {

// The general path's f32 pre-activations (the library's workspace: [rows, gate/up rows], or
// H columns for a down bias when wider) and the biases; 0 for silu_and_mul without biases.
double general_path_bytes(const SweepCase& c) {
  const auto pre = [&](double rows, int64_t F, bool down_bias) {
    return rows * static_cast<double>(std::max(gate_up_rows(c, F), down_bias ? c.H : 0)) * 4;
  };
  const double T = static_cast<double>(c.T), E = static_cast<double>(c.E);
  double b = 0;
  if (general_mlp(c)) {
    const bool down = c.down_bias != DType::kUndefined;
    const double experts = c.op == Op::kSharedExpertMlp ? 1 : E;
    b += experts * static_cast<double>(gate_up_rows(c, c.N) + c.H) * 4;
    if (c.op == Op::kExpertMlp) {
      b += pre(T + E * std::max(c.alignment - 1, 0) + static_cast<double>(c.tail), c.N, down);
    } else if (c.op == Op::kSharedExpertMlp) {
      b += pre(T, c.N, down);
    } else {
      b += pre(T * static_cast<double>(c.K) + E, c.N, down);
    }
  }
  const bool shared_biased =
      c.shared_gate_up_bias != DType::kUndefined || c.shared_down_bias != DType::kUndefined;
  if (c.S > 0 && (c.act != Activation::kSiluAndMul || shared_biased))
    b += pre(T, c.S, false) + static_cast<double>(gate_up_rows(c, c.S) + c.H) * 4;
  return b;
}

}  // namespace

double case_bytes(const SweepCase& c) {
  const double T = static_cast<double>(c.T), H = static_cast<double>(c.H);
  const double N = static_cast<double>(c.N), S = static_cast<double>(c.S);
  const double E = static_cast<double>(c.E), K = static_cast<double>(c.K);
  const double ds = static_cast<double>(dsize(c.dtype)), os = static_cast<double>(dsize(c.out));
  const double pad = E * std::max(c.alignment - 1, 0) + static_cast<double>(c.tail);
  // Every output and workspace twice (the first run's copy for the rerun's comparison).
  const double general = general_path_bytes(c);
  switch (c.op) {
    case Op::kFusedTopK:
      return T * E * ds + E * 4 + 3 * T * K * 8;
    case Op::kPermuteAlign:
      return T * K * 4 + 3 * (T * K + E * c.block_size) * 4 * 2;
    case Op::kPrePermute:
      return T * H * ds + 2 * (T * K + pad) * H * ds + 4 * T * K * 4 + 8 * E * 64;
    case Op::kPostPermute:
      return (T * K + pad) * H * ds + T * K * 8 + 3 * T * H * os;
    case Op::kGroupedGemm:
    case Op::kGroupedGemmFp8:
    case Op::kExpertMlp: {
      const double rows = c.masked ? E * static_cast<double>(c.max_m) : T + pad;
      const double b_rows = c.op == Op::kExpertMlp ? 3 * N : (c.silu ? 2 * N : N);
      const double out_w = c.op == Op::kExpertMlp ? H : N;
      // a, b, c twice and the reference's output; the MLP's activation and f32 scratch.
      double b = rows * H * ds + E * b_rows * H * ds + 3 * rows * out_w * os;
      if (c.op == Op::kExpertMlp) b += rows * N * (ds + 12) + rows * H * 4;
      if (c.silu) b += rows * 2 * N * 4;
      return b + general;
    }
    case Op::kFusedMoeExperts:
    case Op::kIndexedExpertMlp:
    case Op::kFusedMoe:
    case Op::kFusedMoeSharedExpert:
      // hidden, weights, 3 outputs; the sorted path's permuted rows, activations and the
      // reference's f32 scratch.
      return T * H * ds * 4 + E * 3 * N * H * ds + T * double(routing_case(c).E) * 4 +
             S * 3 * H * ds + T * K * (H * (ds + 8) + N * (ds + 12)) + T * (S + H) * 8 + general;
    case Op::kSharedExpertMlp:
      return T * H * ds * 4 + 3 * N * H * ds + T * (N + H) * 12 + general;
  }
  return 0;
}

namespace {

// The FP8 fields' rules (src/moe/moe_validate.h; moekit/gemm.h for the FP8 GEMM's modes).
std::string invalid_quant_reason(const SweepCase& c) {
  const int fp8_scales = static_cast<int>(c.fp8_scales);
  if (fp8_scales < 0 || fp8_scales > 2) return "fp8_scales";
  if (c.op != Op::kGroupedGemmFp8) {
    if (c.fp8_scales != Fp8Scales::kBlock) return "fp8_scales on an op other than the FP8 GEMM";
    if (c.out == DType::kFP8E4M3) return "an e4m3 output on an op other than the FP8 GEMM";
  }
  if (static_cast<int>(c.quant) > 3 || static_cast<int>(c.shared_quant) > 3) return "quant scheme";
  const bool quant = c.quant != QuantScheme::kNone, shared = c.shared_quant != QuantScheme::kNone;
  if ((quant || shared) && !mlp_op(c.op)) return "FP8 weights on an op without an MLP";
  if (quant) {
    if (general_mlp(c)) return "FP8 weights need silu_and_mul without biases";
    const int64_t u = quant_unit(c.quant);
    if (c.H % u != 0 || c.N % u != 0)
      return std::string("H and F multiples of ") + std::to_string(u) + " with " +
             kQuantKeys[static_cast<int>(c.quant)];
    if (c.op == Op::kExpertMlp && c.dtype != DType::kBF16)
      return "moe_expert_mlp with FP8 weights needs bf16";
  }
  if (shared) {
    if (c.op != Op::kFusedMoeSharedExpert || c.S == 0)
      return "shared_quant without a shared expert";
    if (c.act != Activation::kSiluAndMul || c.shared_gate_up_bias != DType::kUndefined ||
        c.shared_down_bias != DType::kUndefined)
      return "FP8 shared weights need silu_and_mul without shared biases";
    const int64_t u = quant_unit(c.shared_quant);
    if (c.H % u != 0 || c.S % u != 0)
      return std::string("H and S multiples of ") + std::to_string(u) + " with shared " +
             kQuantKeys[static_cast<int>(c.shared_quant)];
  }
  if (c.static_act < 0 || c.static_act > 3) return "static_act outside 0..3";
  if (c.static_act != 0 && c.quant != QuantScheme::kFp8PerTensor &&
      c.shared_quant != QuantScheme::kFp8PerTensor)
    return "static activation scales without fp8_per_tensor weights";
  return "";
}

}  // namespace

std::string invalid_reason(const SweepCase& c) {
  const auto mult = [](int64_t v, int64_t m) { return v % m == 0; };
  if (c.T < 0 || c.T > kMaxTokens) return "T outside 0.." + std::to_string(kMaxTokens);
  if (c.E < 1 || c.E > max_experts(c)) return "E outside 1.." + std::to_string(max_experts(c));
  if (c.K < 1 || c.K > kMaxTopK) return "K outside 1..16";
  if (routes_from_gating(c.op)) {
    if (c.K > c.E) return "top_k above E";
    if (c.groups != 0) {
      if (c.E % c.groups != 0) return "num_expert_group does not divide E";
      if (c.topk_group < 1 || c.topk_group > c.groups) return "topk_group outside 1..groups";
      if (c.K > static_cast<int64_t>(c.topk_group) * (c.E / c.groups))
        return "top_k above the kept groups' experts";
    } else if (c.topk_group != 0) {
      return "topk_group without groups";
    }
  }
  const bool half = c.dtype == DType::kBF16 || c.dtype == DType::kF16;
  const bool any_float = half || c.dtype == DType::kF32;
  switch (c.op) {
    case Op::kFusedTopK:
      if (!any_float || c.gating != c.dtype) return "gating dtype";
      break;
    case Op::kPermuteAlign:
      if (c.block_size < 16 || c.block_size > 256 || (c.block_size & (c.block_size - 1)))
        return "block_size not a power of two in 16..256";
      break;
    case Op::kPrePermute:
      if (!any_float || c.alignment < 1 || c.H < 8 || !mult(c.H, 8)) return "pre_permute shape";
      break;
    case Op::kPostPermute:
      if (!any_float || c.H < 8 || !mult(c.H, 8) || c.tail < 0) return "post_permute shape";
      if (c.out != c.dtype && c.out != DType::kF32) return "post_permute out dtype";
      break;
    case Op::kGroupedGemm:
    case Op::kGroupedGemmFp8:
    case Op::kExpertMlp: {
      const bool fp8 = c.op == Op::kGroupedGemmFp8;
      if (fp8 ? (c.dtype != DType::kFP8E4M3 || (c.out != DType::kBF16 && c.out != DType::kFP8E4M3))
              : !half)
        return "GEMM dtype";
      if (fp8 && c.silu && c.fp8_scales == Fp8Scales::kBlock && !mult(c.N, 64))
        return "FP8 GEMM: silu_and_mul with block scales needs N a multiple of 64";
      if (c.op == Op::kExpertMlp && (c.masked || c.out != c.dtype)) return "expert MLP layout";
      if (c.out != c.dtype && c.out != DType::kF32 && !fp8) return "GEMM out dtype";
      if (c.H < 0 || !mult(c.H, fp8 ? 16 : 8) || c.N < 8 || !mult(c.N, 8)) return "GEMM widths";
      if (c.op == Op::kExpertMlp && c.H < 8) return "expert MLP hidden size";
      if (c.out == DType::kF32 && c.H > kF32OutMaxReduction) return "f32 out beyond 1024 products";
      if (!c.masked && c.alignment < 1) return "alignment";
      if (c.masked && c.max_m < 0) return "max_m";
      break;
    }
    case Op::kFusedMoeExperts:
    case Op::kIndexedExpertMlp:
    case Op::kFusedMoe:
    case Op::kFusedMoeSharedExpert:
    case Op::kSharedExpertMlp:
      if (!half || c.out != c.dtype) return "MLP dtype";
      if (c.H < 8 || !mult(c.H, 8) || c.N < 8 || !mult(c.N, 8) || c.S < 0 || !mult(c.S, 8))
        return "MLP widths";
      if (routes_from_gating(c.op) && c.gating != DType::kF32 && c.gating != DType::kBF16 &&
          c.gating != DType::kF16)
        return "gating dtype";
      if ((c.op == Op::kFusedMoe || c.op == Op::kFusedMoeSharedExpert) && !layer_direct(c) &&
          c.E > kPermuteMaxExperts)
        return "sorted path beyond " + std::to_string(kPermuteMaxExperts) + " experts";
      break;
  }
  if (c.scale_milli <= 0 || c.levels < 0) return "topk parameters";
  const bool experts = c.op == Op::kFusedMoeExperts || c.op == Op::kIndexedExpertMlp;
  const bool layer_map = (c.op == Op::kFusedMoe || c.op == Op::kFusedMoeSharedExpert) &&
                         c.groups == 0 && c.E * c.ep_ranks <= kTopKMaxExperts;
  if (c.ep_ranks < 0 || (c.ep_ranks > 0 && !experts && !layer_map) || c.E * c.ep_ranks > INT32_MAX)
    return "ep_ranks";
  if (c.ids64 && !experts) return "ids64";
  if (c.on_input &&
      (c.K != 1 || !(experts || c.op == Op::kFusedMoe || c.op == Op::kFusedMoeSharedExpert)))
    return "on_input without top_k 1";
  if (c.drop_pm < 0 || c.dup_pm < 0 || c.oor_pm < 0 || c.drop_pm + c.dup_pm + c.oor_pm > 1000)
    return "route rates";
  const bool shared_biased =
      c.shared_gate_up_bias != DType::kUndefined || c.shared_down_bias != DType::kUndefined;
  if (!mlp_op(c.op) && (general_mlp(c) || shared_biased))
    return "activation or bias on an op without an MLP";
  if (c.act == Activation::kNone || std::string(activation_key(c.act)) == "unknown")
    return "not an MLP activation";
  for (DType b : {c.gate_up_bias, c.down_bias, c.shared_gate_up_bias, c.shared_down_bias}) {
    if (b != DType::kUndefined && b != DType::kF32 && b != c.dtype)
      return "bias dtype neither f32 nor the case's";
  }
  if (shared_biased && !(c.op == Op::kFusedMoeSharedExpert && c.S > 0))
    return "shared-expert bias without a shared expert";
  return invalid_quant_reason(c);
}

SweepCase draw_case(uint64_t seed, int64_t index, const Limits& limits) {
  Rng rng(mix(seed ^ mix(static_cast<uint64_t>(index) + 0x51ED2701ull)));
  SweepCase c;
  c.index = index;
  c.op = static_cast<Op>(index % kOpCount);
  c.data_seed = rng.next();
  // Families in turn, the heuristic twice per cycle: (index / kOpCount) = the op's turn.
  const std::vector<std::string>& fams = op_families(c.op);
  const int64_t slots = static_cast<int64_t>(fams.size()) + 1, turn = index / kOpCount;
  const int64_t slot = turn % slots;
  c.family = fams[slot == 0 ? 0 : slot - 1];
  draw_knobs(c, rng, turn / slots);
  draw_shapes(c, rng);
  if (c.out == DType::kF32 && c.op == Op::kGroupedGemm && c.H > kF32OutMaxReduction) {
    c.H = kF32OutMaxReduction - 8 * rng.uniform(0, 4);
  }
  shrink_to(c, limits);
  if (c.masked) {  // max_m: the busiest expert's rows (unclamped), sometimes more
    SweepCase unclamped = c;
    unclamped.masked = false;
    const std::vector<int64_t> counts = expert_counts(unclamped);
    c.max_m = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
    if (rng.chance(0.5)) c.max_m += rng.uniform(1, 64);
    shrink_to(c, limits);  // E only shrinks: the counts stay within max_m
  }
  draw_engine_inputs(c);
  draw_activation(c, limits);
  draw_quant(c, limits);
  return c;
}

// ---- spec lines ----------------------------------------------------------------------------

bool operator==(const SweepCase& a, const SweepCase& b) {
  return format_spec(a) == format_spec(b) && a.index == b.index;
}

std::string format_spec(const SweepCase& c) {
  const SweepCase d;
  std::ostringstream s;
  s << "op=" << op_name(c.op) << " family=" << c.family << " seed=" << c.data_seed;
  const auto num = [&](const char* k, int64_t v, int64_t def) {
    if (v != def) s << " " << k << "=" << v;
  };
  const auto type = [&](const char* k, DType v, DType def) {
    if (v != def) s << " " << k << "=" << dtype_name(v);
  };
  type("dtype", c.dtype, d.dtype);
  type("out", c.out, d.out);
  type("gating", c.gating, d.gating);
  num("T", c.T, d.T);
  num("H", c.H, d.H);
  num("N", c.N, d.N);
  num("S", c.S, d.S);
  num("E", c.E, d.E);
  num("K", c.K, d.K);
  num("masked", c.masked, d.masked);
  num("alignment", c.alignment, d.alignment);
  num("max_m", c.max_m, d.max_m);
  num("tail", c.tail, d.tail);
  num("block_size", c.block_size, d.block_size);
  if (c.route != d.route) s << " route=" << route_name(c.route);
  num("skew_milli", c.skew_milli, d.skew_milli);
  num("drop_pm", c.drop_pm, d.drop_pm);
  num("dup_pm", c.dup_pm, d.dup_pm);
  num("oor_pm", c.oor_pm, d.oor_pm);
  num("bias", c.bias, d.bias);
  num("sigmoid", c.sigmoid, d.sigmoid);
  num("renormalize", c.renormalize, d.renormalize);
  num("groups", c.groups, d.groups);
  num("topk_group", c.topk_group, d.topk_group);
  num("scale_milli", c.scale_milli, d.scale_milli);
  num("levels", c.levels, d.levels);
  num("silu", c.silu, d.silu);
  num("workspace", c.workspace, d.workspace);
  num("ep_ranks", c.ep_ranks, d.ep_ranks);
  num("ids64", c.ids64, d.ids64);
  num("on_input", c.on_input, d.on_input);
  if (c.act != d.act) s << " act=" << activation_key(c.act);
  for (size_t i = 3; i < std::size(kDtypeKeys); ++i)  // the biases
    type(kDtypeKeys[i].key, c.*(kDtypeKeys[i].field), d.*(kDtypeKeys[i].field));
  if (c.quant != d.quant) s << " quant=" << kQuantKeys[static_cast<int>(c.quant)];
  if (c.shared_quant != d.shared_quant)
    s << " shared_quant=" << kQuantKeys[static_cast<int>(c.shared_quant)];
  num("static_act", c.static_act, d.static_act);
  if (c.fp8_scales != d.fp8_scales) s << " fp8_scales=" << fp8_scales_key(c.fp8_scales);
  s << knobs_string(c.knobs);
  return s.str();
}

bool parse_spec(const std::string& spec, SweepCase* out, std::string* error) {
  SweepCase c;
  std::istringstream in(spec);
  std::string tok;
  bool have_op = false;
  while (in >> tok) {
    const size_t eq = tok.find('=');
    if (eq == std::string::npos) {
      *error = "'" + tok + "' is not key=value";
      return false;
    }
    const std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
    int64_t n = 0;
    const bool numeric = [&] {
      char* end = nullptr;
      n = std::strtoll(v.c_str(), &end, 10);
      return !v.empty() && *end == 0;
    }();
    const auto need_num = [&](auto* field) {
      if (!numeric) return false;
      *field = static_cast<std::remove_pointer_t<decltype(field)>>(n);
      return true;
    };
    bool ok = true;
    if (k == "op") {
      ok = have_op = parse_op(v, &c.op);
    } else if (k == "family") {
      c.family = v;
    } else if (k == "seed") {
      char* end = nullptr;
      c.data_seed = std::strtoull(v.c_str(), &end, 10);
      ok = !v.empty() && *end == 0;
    } else if (const auto d = std::find_if(std::begin(kDtypeKeys), std::end(kDtypeKeys),
                                           [&](const DtypeKey& x) { return k == x.key; });
               d != std::end(kDtypeKeys)) {
      ok = parse_dtype(v, &(c.*(d->field)));
    } else if (k == "route") {
      ok = parse_name(v, kRouteNames, 0, &c.route);
    } else if (k == "T") {
      ok = need_num(&c.T);
    } else if (k == "H") {
      ok = need_num(&c.H);
    } else if (k == "N") {
      ok = need_num(&c.N);
    } else if (k == "S") {
      ok = need_num(&c.S);
    } else if (k == "E") {
      ok = need_num(&c.E);
    } else if (k == "K") {
      ok = need_num(&c.K);
    } else if (k == "masked") {
      ok = need_num(&c.masked);
    } else if (k == "alignment") {
      ok = need_num(&c.alignment);
    } else if (k == "max_m") {
      ok = need_num(&c.max_m);
    } else if (k == "tail") {
      ok = need_num(&c.tail);
    } else if (k == "block_size") {
      ok = need_num(&c.block_size);
    } else if (k == "skew_milli") {
      ok = need_num(&c.skew_milli);
    } else if (k == "drop_pm") {
      ok = need_num(&c.drop_pm);
    } else if (k == "dup_pm") {
      ok = need_num(&c.dup_pm);
    } else if (k == "oor_pm") {
      ok = need_num(&c.oor_pm);
    } else if (k == "bias") {
      ok = need_num(&c.bias);
    } else if (k == "sigmoid") {
      ok = need_num(&c.sigmoid);
    } else if (k == "renormalize") {
      ok = need_num(&c.renormalize);
    } else if (k == "groups") {
      ok = need_num(&c.groups);
    } else if (k == "topk_group") {
      ok = need_num(&c.topk_group);
    } else if (k == "scale_milli") {
      ok = need_num(&c.scale_milli);
    } else if (k == "levels") {
      ok = need_num(&c.levels);
    } else if (k == "silu") {
      ok = need_num(&c.silu);
    } else if (k == "workspace") {
      ok = need_num(&c.workspace);
    } else if (k == "ep_ranks") {
      ok = need_num(&c.ep_ranks);
    } else if (k == "ids64") {
      ok = need_num(&c.ids64);
    } else if (k == "on_input") {
      ok = need_num(&c.on_input);
    } else if (k == "act") {
      ok = parse_name(v, kActivationKeys, 1, &c.act);  // not "none"
    } else if (k == "quant") {
      ok = parse_name(v, kQuantKeys, 0, &c.quant);
    } else if (k == "shared_quant") {
      ok = parse_name(v, kQuantKeys, 0, &c.shared_quant);
    } else if (k == "static_act") {
      ok = need_num(&c.static_act);
    } else if (k == "fp8_scales") {
      ok = parse_name(v, kFp8ScalesKeys, 0, &c.fp8_scales);
    } else {
      const auto& fields = knob_fields();
      const auto f = std::find_if(fields.begin(), fields.end(),
                                  [&](const KnobField& x) { return k == x.key; });
      if (f == fields.end()) {
        *error = "unknown key '" + k + "'";
        return false;
      }
      ok = need_num(&(c.knobs.*(f->field)));
    }
    if (!ok) {
      *error = "bad value in '" + tok + "'";
      return false;
    }
  }
  if (!have_op) {
    *error = "no op=";
    return false;
  }
  *out = c;
  return true;
}

// ---- inputs --------------------------------------------------------------------------------

namespace {

// Per-expert draw weights: uniform, or the skew's (1 + rank)^-alpha over a random ranking.
std::vector<double> expert_weights(const SweepCase& c, std::vector<int64_t>* rank_out = nullptr) {
  std::vector<double> w(static_cast<size_t>(c.E), 1.0);
  std::vector<int64_t> rank(static_cast<size_t>(c.E));
  std::iota(rank.begin(), rank.end(), 0);
  Rng rng = stream(c, kSkewStream);
  for (int64_t i = c.E - 1; i > 0; --i) std::swap(rank[i], rank[rng.uniform(0, i)]);
  if (c.route == Route::kSkewed) {
    const double alpha = c.skew_milli / 1000.0;
    for (int64_t e = 0; e < c.E; ++e) w[e] = std::pow(1.0 + static_cast<double>(rank[e]), -alpha);
  }
  if (rank_out) *rank_out = rank;
  return w;
}

// Draws expert ids by weight (binary search over the cumulative weights).
class ExpertDraw {
 public:
  explicit ExpertDraw(const std::vector<double>& w) : cdf_(w.size()) {
    std::partial_sum(w.begin(), w.end(), cdf_.begin());
  }
  int32_t operator()(Rng& rng) const {
    const double x = rng.u01() * cdf_.back();
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), x);
    return static_cast<int32_t>(std::min<ptrdiff_t>(it - cdf_.begin(), cdf_.size() - 1));
  }

 private:
  std::vector<double> cdf_;
};

// The experts kOneExpert / kFewExperts route to.
std::vector<int32_t> chosen_experts(const SweepCase& c, Rng& rng) {
  const int64_t n = c.route == Route::kOneExpert ? 1 : rng.uniform(1, 3);
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(rng.uniform(0, c.E - 1)));
  return v;
}

// Applies the -1 / repeat / out-of-range rates to one row of ids (or inverse indices).
void damage_row(int32_t* row, int64_t K, const SweepCase& c, int64_t range, Rng& rng) {
  if (c.drop_pm + c.dup_pm + c.oor_pm == 0) return;
  const int32_t bad[5] = {static_cast<int32_t>(range), static_cast<int32_t>(range + 7), -2, INT_MAX,
                          INT_MIN};
  for (int64_t k = 0; k < K; ++k) {
    const int64_t r = rng.uniform(0, 999);
    if (r < c.drop_pm) {
      row[k] = -1;
    } else if (r < c.drop_pm + c.dup_pm) {
      if (k > 0) row[k] = row[rng.uniform(0, k - 1)];
    } else if (r < c.drop_pm + c.dup_pm + c.oor_pm) {
      row[k] = bad[rng.uniform(0, 4)];
    }
  }
}

}  // namespace

std::vector<int64_t> expert_counts(const SweepCase& c) {
  std::vector<int64_t> counts(static_cast<size_t>(c.E), 0);
  Rng rng = stream(c, kCountsStream);
  if (c.route == Route::kEqual) {
    for (int64_t e = 0; e < c.E; ++e) counts[e] = c.T / c.E + (e < c.T % c.E ? 1 : 0);
  } else if (c.route == Route::kOneExpert || c.route == Route::kFewExperts) {
    const std::vector<int32_t> to = chosen_experts(c, rng);
    for (int64_t r = 0; r < c.T; ++r) ++counts[to[rng.uniform(0, to.size() - 1)]];
  } else {
    const ExpertDraw draw(expert_weights(c));
    for (int64_t r = 0; r < c.T; ++r) ++counts[draw(rng)];
  }
  if (c.masked) {
    for (int64_t& n : counts) n = std::min(n, c.max_m);
  }
  return counts;
}

std::vector<int32_t> draw_topk_ids(const SweepCase& c) {
  if (c.ep_ranks > 1) {  // global ids: the same draw over every rank's experts
    SweepCase global = c;
    global.E = c.E * c.ep_ranks;
    global.ep_ranks = 0;
    return draw_topk_ids(global);
  }
  std::vector<int32_t> ids(static_cast<size_t>(c.T * c.K));
  Rng rng = stream(c, kIdsStream);
  const std::vector<int32_t> few = c.route == Route::kOneExpert || c.route == Route::kFewExperts
                                       ? chosen_experts(c, rng)
                                       : std::vector<int32_t>{};
  const ExpertDraw draw(expert_weights(c));
  std::vector<int32_t> perm(static_cast<size_t>(c.E));
  std::iota(perm.begin(), perm.end(), 0);
  const bool distinct = c.K <= c.E;
  for (int64_t t = 0; t < c.T; ++t) {
    int32_t* row = ids.data() + t * c.K;
    for (int64_t k = 0; k < c.K; ++k) {
      if (!few.empty()) {
        row[k] = few[rng.uniform(0, few.size() - 1)];
      } else if (!distinct) {
        row[k] = draw(rng);
      } else if (c.route == Route::kSkewed) {
        int32_t e = draw(rng);
        for (int tries = 0; tries < 64 && std::find(row, row + k, e) != row + k; ++tries) {
          e = draw(rng);
        }
        while (std::find(row, row + k, e) != row + k) e = (e + 1) % c.E;
        row[k] = e;
      } else {  // a partial Fisher-Yates step on a running permutation: K distinct, uniform
        std::swap(perm[k], perm[rng.uniform(k, c.E - 1)]);
        row[k] = perm[k];
      }
    }
    damage_row(row, c.K, c, c.E, rng);
  }
  return ids;
}

std::vector<int32_t> draw_expert_map(const SweepCase& c) {
  if (c.ep_ranks < 2) return {};
  const int64_t G = c.E * c.ep_ranks;
  std::vector<int32_t> map(static_cast<size_t>(G), -1);
  Rng rng = stream(c, kMapStream);
  if (rng.chance(0.5)) {  // a block: rank r holds [r*E, (r+1)*E)
    const int64_t r = static_cast<int64_t>(c.data_seed % static_cast<uint64_t>(c.ep_ranks));
    for (int64_t l = 0; l < c.E; ++l) map[r * c.E + l] = static_cast<int32_t>(l);
  } else {  // scattered: E random globals, in random local order
    std::vector<int32_t> perm(static_cast<size_t>(G));
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = G - 1; i > 0; --i) std::swap(perm[i], perm[rng.uniform(0, i)]);
    for (int64_t l = 0; l < c.E; ++l) map[perm[l]] = static_cast<int32_t>(l);
  }
  if (rng.chance(0.2)) map[rng.uniform(0, G - 1)] = static_cast<int32_t>(c.E);  // skipped
  return map;
}

SweepCase routing_case(const SweepCase& c) {
  SweepCase r = c;
  if (c.ep_ranks > 1 && (c.op == Op::kFusedMoe || c.op == Op::kFusedMoeSharedExpert)) {
    r.E = c.E * c.ep_ranks;
    r.ep_ranks = 0;
  }
  return r;
}

std::vector<int32_t> draw_inverse(const SweepCase& c) {
  const int64_t R = c.T * c.K, P = R + c.tail;
  std::vector<int32_t> rows(static_cast<size_t>(P));
  std::iota(rows.begin(), rows.end(), 0);
  Rng rng = stream(c, kInverseStream);
  for (int64_t i = P - 1; i > 0; --i) std::swap(rows[i], rows[rng.uniform(0, i)]);
  rows.resize(static_cast<size_t>(R));
  for (int64_t t = 0; t < c.T; ++t) damage_row(rows.data() + t * c.K, c.K, c, P, rng);
  return rows;
}

std::vector<float> skew_bias(const SweepCase& c) {
  if (c.route != Route::kSkewed) return {};
  std::vector<int64_t> rank;
  expert_weights(c, &rank);
  std::vector<float> b(static_cast<size_t>(c.E));
  const double alpha = c.skew_milli / 1000.0;
  for (int64_t e = 0; e < c.E; ++e)
    b[e] = static_cast<float>(-alpha * std::log1p(static_cast<double>(rank[e])));
  return b;
}

bool topk_row_unambiguous(const double* logits, const float* bias, const SweepCase& c, double eps) {
  const int64_t E = c.E;
  std::vector<double> score(logits, logits + E), sel(static_cast<size_t>(E));
  if (c.sigmoid) {
    for (double& v : score) v = 1.0 / (1.0 + std::exp(-v));
  } else {
    const double top = *std::max_element(score.begin(), score.end());
    double sum = 0;
    for (double& v : score) sum += (v = std::exp(v - top));
    for (double& v : score) v /= sum;
  }
  for (int64_t e = 0; e < E; ++e) sel[e] = score[e] + (bias ? bias[e] : 0.0);
  const auto blurred = [eps](double a, double b) {
    return a != b && std::fabs(a - b) <= eps * std::max(std::fabs(a), std::fabs(b));
  };
  std::vector<char> kept(static_cast<size_t>(E), 1);
  if (c.groups > 0 && c.topk_group < c.groups) {
    const int64_t per = E / c.groups;
    std::vector<std::pair<double, int64_t>> group(static_cast<size_t>(c.groups));
    for (int64_t g = 0; g < c.groups; ++g) {  // its best sel, or its best two with a bias
      double first = -INFINITY, second = -INFINITY;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        if (sel[e] > first) {
          second = first;
          first = sel[e];
        } else if (sel[e] > second) {
          second = sel[e];
        }
      }
      group[g] = {bias && per >= 2 ? first + second : first, g};
    }
    std::stable_sort(group.begin(), group.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    if (blurred(group[c.topk_group - 1].first, group[c.topk_group].first)) return false;
    for (int64_t r = c.topk_group; r < c.groups; ++r) {
      std::fill(kept.begin() + group[r].second * per, kept.begin() + (group[r].second + 1) * per,
                0);
    }
  }
  std::vector<double> v;
  for (int64_t e = 0; e < E; ++e)
    if (kept[e]) v.push_back(sel[e]);
  const int64_t top = std::min<int64_t>(c.K + 1, static_cast<int64_t>(v.size()));
  std::partial_sort(v.begin(), v.begin() + top, v.end(), std::greater<double>());
  for (int64_t r = 0; r + 1 < top; ++r) {
    if (blurred(v[r], v[r + 1])) return false;
  }
  return true;
}

int64_t contiguous_rows(const SweepCase& c, const std::vector<int64_t>& counts,
                        std::vector<int32_t>* ends) {
  const int64_t A = std::max(c.alignment, 1);
  int64_t end = 0, routed = 0;
  ends->assign(counts.size(), 0);
  for (size_t e = 0; e < counts.size(); ++e) {
    end = (end + A - 1) / A * A + counts[e];
    (*ends)[e] = static_cast<int32_t>(end);
    routed += counts[e];
  }
  // permuted_rows(): the routed rows plus E*(A-1) of alignment room, then the tail.
  return routed + static_cast<int64_t>(counts.size()) * (A - 1) + c.tail;
}

}  // namespace moekit::sweep
