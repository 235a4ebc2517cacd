#include "sweep_paths.h"

#include <string>

#include "core/pdl.h"
#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"
#include "moe/moe_internal.h"
#include "moekit/tensor.h"

namespace moekit::sweep {
namespace {

// The plain int knobs: a Knobs field and the library's override it sets.
struct IntKnob {
  int Knobs::*field;
  int fallback;
  int& (*ref)();
};

const IntKnob kIntKnobs[] = {
    {&Knobs::pdl, 0, detail::pdl_override},
};
constexpr int kIntKnobCount = sizeof(kIntKnobs) / sizeof(kIntKnobs[0]);

// The expert-MLP GEMMs over P rows (src/moe/expert_mlp.cpp), with stand-in pointers: the
// planner compares them, never reads them.
detail::ExpertMlpGemms expert_gemms(const SweepCase& c, int64_t P, int alignment, bool routed) {
  static char in, meta, act, counters;
  static float pre;
  detail::ExpertMlpGemms g;
  g.dtype = c.dtype;
  g.in = &in;
  g.P = P;
  g.E = c.E;
  g.H = c.H;
  g.F = c.N;
  g.layout_metadata = reinterpret_cast<const int32_t*>(&meta);
  g.alignment = alignment;
  g.w_gate_up = g.w_down = &in;
  g.act = &act;
  g.out = &in;
  g.routed_counts = routed;
  g.counters = &counters;
  g.mlp.act = c.act;  // the general path's GEMMs: no chain, f32 pre-activations
  g.mlp.gate_up_bias = c.gate_up_bias != DType::kUndefined;
  g.mlp.down_bias = c.down_bias != DType::kUndefined;
  if (g.mlp.general()) g.pre = &pre;
  return g;
}

// The expert MLP's plan (a forced knob: the candidate it names), or "no launch".
std::string expert_plan(const detail::ExpertMlpGemms& g, int knob) {
  if (g.P <= 0) return "no launch";
  const detail::GemmDevice device = detail::current_gemm_device();
  MlpPlan storage;
  const MlpPlan* forced =
      forced_plan(knob, detail::expert_mlp_gemms_plan_candidates(g, device), &storage);
  return to_string(forced ? *forced : detail::plan_expert_mlp_gemms(g, device));
}

// The first of `candidates` on `path`, or null.
const MlpPlan* first_on(MlpPath path, const std::vector<MlpPlan>& candidates) {
  for (const MlpPlan& m : candidates)
    if (m.path == path) return &m;
  return nullptr;
}

}  // namespace

struct ForcedPaths::Saved {
  int ints[kIntKnobCount];
};

ForcedPaths::ForcedPaths(const Knobs& k) : saved_(new Saved) {
  for (int i = 0; i < kIntKnobCount; ++i) {
    const IntKnob& knob = kIntKnobs[i];
    saved_->ints[i] = knob.ref();
    if (k.*knob.field != knob.fallback) knob.ref() = k.*knob.field;
  }
}

ForcedPaths::~ForcedPaths() {
  for (int i = 0; i < kIntKnobCount; ++i) kIntKnobs[i].ref() = saved_->ints[i];
  delete saved_;
}

std::string path_taken(const SweepCase& c) {
  switch (c.op) {
    case Op::kGroupedGemm: {
      detail::GroupedGemmProblem p;
      p.in_dtype = c.dtype;
      p.out_dtype = c.out;
      p.num_groups = static_cast<int>(c.E);
      p.n = c.N;
      p.k = c.H;
      p.activation = c.silu ? Activation::kSiluAndMul : Activation::kNone;
      p.rows = c.masked ? detail::GemmRows::kMasked : detail::GemmRows::kContiguous;
      p.alignment = c.alignment;
      p.max_m = c.max_m;
      p.m = c.T + c.E * (c.alignment - 1) + c.tail;
      static unsigned counter;  // the workspace's counter (stand-in)
      p.tile_counter = c.workspace ? &counter : nullptr;
      if (!detail::grouped_gemm_launches(p)) return "no launch";
      const detail::GemmDevice device = detail::current_gemm_device();
      GemmPlan storage;
      const GemmPlan* forced =
          forced_plan(c.knobs.gemm_plan, detail::gemm_plan_candidates(p, device), &storage);
      return to_string(forced ? *forced : detail::plan_gemm(p, device));
    }
    case Op::kGroupedGemmFp8: {
      detail::GroupedGemmFP8Problem p;
      p.num_groups = static_cast<int>(c.E);
      p.contiguous = !c.masked;
      p.alignment = c.masked ? 1 : c.alignment;
      p.max_m = c.masked ? c.max_m : 0;
      p.m = c.masked ? 0 : c.T + c.E * (c.alignment - 1) + c.tail;
      p.n = c.N;
      p.k = c.H;
      p.scales = c.fp8_scales;
      p.activation = c.silu ? Activation::kSiluAndMul : Activation::kNone;
      static float c_scale;  // an e4m3 c's scale (stand-in)
      p.c_scale = c.out == DType::kFP8E4M3 ? &c_scale : nullptr;
      static unsigned counter;  // the workspace's tile counter (stand-in)
      p.tile_counter = c.workspace ? &counter : nullptr;
      if ((c.masked ? p.max_m : p.m) <= 0 || p.n == 0 || p.num_groups == 0) return "no launch";
      const detail::GemmDevice device = detail::current_gemm_device();
      GemmPlan storage;
      const GemmPlan* forced =
          forced_plan(c.knobs.fp8_plan, detail::gemm_fp8_plan_candidates(p, device), &storage);
      return to_string(forced ? *forced : detail::plan_gemm_fp8(p, device));
    }
    case Op::kExpertMlp: {
      if (c.T == 0 && c.tail == 0 && c.alignment == 1) return "no launch";
      if (c.quant != QuantScheme::kNone) return "";  // the runner asks the FP8 planner
      const int64_t P = c.T + c.E * (c.alignment - 1) + c.tail;
      return expert_plan(expert_gemms(c, P, c.alignment, false), c.knobs.mlp_plan);
    }
    default:
      return "";
  }
}

bool forced_dense_plan(const Knobs& k, const MlpPlan& planned,
                       const std::vector<MlpPlan>& candidates, MlpPlan* plan) {
  if (k.dense_path == 0 && k.streamk_grid == 0 && k.direct_split == 0) return false;
  static const MlpPath kPaths[] = {MlpPath::kStreamK, MlpPath::kTwoGemms, MlpPath::kDirect,
                                   MlpPath::kGemv};
  const MlpPath want =
      k.dense_path >= 1 && k.dense_path <= 4 ? kPaths[k.dense_path - 1] : planned.path;
  const MlpPlan* pick = planned.path == want ? &planned : first_on(want, candidates);
  if (pick == nullptr) pick = first_on(MlpPath::kTwoGemms, candidates);
  if (pick == nullptr) return false;
  *plan = *pick;
  if (plan->path == MlpPath::kStreamK && k.streamk_grid > 0 && k.streamk_grid < plan->split_gate_up)
    plan->split_gate_up = plan->split_down = k.streamk_grid;
  if (plan->path == MlpPath::kDirect && k.direct_split > 0) {
    // The candidate whose splits match the knob on most GEMMs (a split a GEMM cannot take
    // leaves that GEMM to another candidate's).
    int best = 0;
    for (const MlpPlan& m : candidates) {
      if (m.path != MlpPath::kDirect) continue;
      const int hits = (m.split_gate_up == k.direct_split) + (m.split_down == k.direct_split);
      if (hits > best) {
        best = hits;
        *plan = m;
      }
    }
  }
  return true;
}

bool forced_layer_plan(const Knobs& k, const LayerPlan& planned,
                       const std::vector<LayerPlan>& candidates, LayerPlan* plan) {
  *plan = planned;
  bool forced = false;
  if (k.routed_path == 1 || k.routed_path == 2) {
    const RoutedPath want = k.routed_path == 1 ? RoutedPath::kDirect : RoutedPath::kSorted;
    for (const LayerPlan& l : candidates) {
      if (l.routed != want) continue;
      if (want != planned.routed) plan->experts = l.experts;
      plan->routed = want;
      forced = true;
      break;
    }
  }
  if (planned.has_shared) {
    std::vector<MlpPlan> shared;
    for (const LayerPlan& l : candidates)
      if (l.routed == plan->routed && l.experts == plan->experts) shared.push_back(l.shared);
    forced = forced_dense_plan(k, planned.shared, shared, &plan->shared) || forced;
  }
  return forced;
}

int64_t chain_launches() {
  return detail::sm90_mlp_chain_launches();
}

}  // namespace moekit::sweep
