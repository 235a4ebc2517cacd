#include "sweep_paths.h"

#include <string>

#include "core/pdl.h"
#include "gemm/gemm_force.h"
#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/sm90/device.h"
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
    {&Knobs::chain, 0, detail::sm90_mlp_chain_override},
    {&Knobs::chain_pairs, 0, detail::sm90_mlp_chain_pairs_override},
    {&Knobs::gemm_pdl, 0, detail::gemm_pdl_override},
    {&Knobs::dynamic, 0, detail::sm90_dynamic_override},
    {&Knobs::tile_n, 0, detail::sm90_tile_n_override},
    {&Knobs::pdl, 0, detail::pdl_override},
};
constexpr int kIntKnobCount = sizeof(kIntKnobs) / sizeof(kIntKnobs[0]);

std::string config_str(int config, int split) {
  std::string s = std::to_string(config);
  if (split > 0) s += "s" + std::to_string(split);
  return s;
}

// The two GEMM problems of an expert MLP over P rows (src/moe/expert_mlp.cpp
// run_expert_mlp_gemms), with stand-in pointers: the rules compare them, never read them.
void mlp_problems(const SweepCase& c, int64_t P, int alignment, bool routed,
                  detail::GroupedGemmProblem* up, detail::GroupedGemmProblem* down) {
  static char act, meta, in, out;
  up->in_dtype = up->out_dtype = c.dtype;
  up->a = &in;
  up->b = &in;
  up->c = &act;
  up->num_groups = static_cast<int>(c.E);
  up->n = c.N;
  up->k = c.H;
  up->activation = Activation::kSiluAndMul;
  up->rows = detail::GemmRows::kContiguous;
  up->layout_metadata = reinterpret_cast<const int32_t*>(&meta);
  up->alignment = alignment;
  up->m = P;
  up->routed_counts = routed;
  *down = *up;
  down->a = &act;
  down->c = &out;
  down->n = c.H;
  down->k = c.N;
  down->activation = Activation::kNone;
}

// "chain", "chain pairs", or "UP/DOWN" configs (+ " pdl" for a PDL chain).
std::string mlp_gemms(detail::GroupedGemmProblem up, detail::GroupedGemmProblem down) {
  if (!detail::grouped_gemm_launches(up)) return "no launch";
  if (detail::sm90_mlp_chain_applies(up, down)) {
    return detail::sm90_mlp_chain_pairs(up, down) ? "chain pairs" : "chain";
  }
  const detail::MlpGemmForce& f = detail::mlp_gemm_force_override();
  if (f.first_config >= 0) {
    up.config = f.first_config;
    up.split_k = f.first_split;
  }
  if (f.second_config >= 0) {
    down.config = f.second_config;
    down.split_k = f.second_split;
  }
  std::string s = config_str(detail::select_grouped_gemm_config(up), up.split_k) + "/" +
                  config_str(detail::select_grouped_gemm_config(down), down.split_k);
  if (detail::gemm_pdl_chain(up, down)) s += " pdl";
  return s;
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
  detail::PublicGemmForce gemm;
  detail::MlpGemmForce mlp;
};

ForcedPaths::ForcedPaths(const Knobs& k) : saved_(new Saved) {
  for (int i = 0; i < kIntKnobCount; ++i) {
    const IntKnob& knob = kIntKnobs[i];
    saved_->ints[i] = knob.ref();
    if (k.*knob.field != knob.fallback) knob.ref() = k.*knob.field;
  }
  saved_->gemm = detail::public_gemm_force_override();
  saved_->mlp = detail::mlp_gemm_force_override();
  detail::PublicGemmForce& g = detail::public_gemm_force_override();
  if (k.gemm_config >= 0) {
    g.config = k.gemm_config;
    g.split_k = k.gemm_split;
  }
  if (k.fp8_config >= 0) g.fp8_config = k.fp8_config;
  detail::MlpGemmForce& m = detail::mlp_gemm_force_override();
  if (k.up_config >= 0) {
    m.first_config = k.up_config;
    m.first_split = k.up_split;
  }
  if (k.down_config >= 0) {
    m.second_config = k.down_config;
    m.second_split = k.down_split;
  }
}

ForcedPaths::~ForcedPaths() {
  for (int i = 0; i < kIntKnobCount; ++i) kIntKnobs[i].ref() = saved_->ints[i];
  detail::public_gemm_force_override() = saved_->gemm;
  detail::mlp_gemm_force_override() = saved_->mlp;
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
      const detail::PublicGemmForce& f = detail::public_gemm_force_override();
      p.config = f.config;
      p.split_k = f.split_k;
      if (!detail::grouped_gemm_launches(p)) return "no launch";
      return "config " + config_str(detail::select_grouped_gemm_config(p), p.split_k);
    }
    case Op::kGroupedGemmFp8: {
      detail::GroupedGemmFP8Problem p;
      p.num_groups = static_cast<int>(c.E);
      p.max_m = c.max_m;
      p.n = c.N;
      p.k = c.H;
      p.config = detail::public_gemm_force_override().fp8_config;
      if (p.max_m <= 0) return "no launch";
      return "config " + std::to_string(detail::select_grouped_gemm_fp8_config(p));
    }
    case Op::kExpertMlp: {
      if (c.T == 0 && c.tail == 0 && c.alignment == 1) return "no launch";
      detail::GroupedGemmProblem up, down;
      mlp_problems(c, c.T + c.E * (c.alignment - 1) + c.tail, c.alignment, false, &up, &down);
      return mlp_gemms(up, down);
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
