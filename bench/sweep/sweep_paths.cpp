#include "sweep_paths.h"

#include <string>

#include "core/pdl.h"
#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"
#include "mlp/direct_mlp.h"
#include "mlp/gemv_mlp.h"
#include "mlp/streamk_mlp.h"
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
    {&Knobs::dense_path, 0, detail::dense_mlp_path_override},
    {&Knobs::streamk_grid, 0, detail::streamk_mlp_grid_override},
    {&Knobs::direct_load, 0, detail::direct_mlp_load_mode_override},
    {&Knobs::direct_reduce, -1, detail::direct_mlp_reduce_override},
    {&Knobs::direct_split, 0, detail::direct_mlp_split_override},
    {&Knobs::routed_path, 0, detail::routed_path_override},
    {&Knobs::pdl, 0, detail::pdl_override},
};
constexpr int kIntKnobCount = sizeof(kIntKnobs) / sizeof(kIntKnobs[0]);

// The expert-MLP GEMMs over P rows (src/moe/expert_mlp.cpp), with stand-in pointers: the
// planner compares them, never reads them.
detail::ExpertMlpGemms expert_gemms(const SweepCase& c, int64_t P, int alignment, bool routed) {
  static char in, meta, act, counters;
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

// src/moe/expert_mlp.cpp run_dense_mlp's choice.
std::string dense_path(DType dt, int64_t T, int64_t H, int64_t S, DType out) {
  if (T == 0) return "none";
  if (detail::gemv_mlp_preferred(T, H, S) && detail::gemv_mlp_supported(dt, T, H, S)) {
    return "gemv";
  }
  if (detail::direct_mlp_preferred(T, H, S) && detail::direct_mlp_supported(dt, T, H, S)) {
    return "direct";
  }
  if (detail::streamk_mlp_scratch_bytes(dt, T, H, S) > 0 && detail::streamk_mlp_preferred(H, S)) {
    return "streamk";
  }
  static char x, act, y;
  detail::GroupedGemmProblem up;
  up.in_dtype = up.out_dtype = dt;
  up.a = &x;
  up.c = &act;
  up.n = S;
  up.k = H;
  up.activation = Activation::kSiluAndMul;
  up.rows = detail::GemmRows::kDense;
  up.m = T;
  detail::GroupedGemmProblem down = up;
  down.out_dtype = out;
  down.a = &act;
  down.c = &y;
  down.n = H;
  down.k = S;
  down.activation = Activation::kNone;
  return "gemm " + to_string(detail::plan_mlp_gemms(up, down, detail::current_gemm_device()));
}

detail::MoEShapes shapes(const SweepCase& c) {
  detail::MoEShapes s;
  s.dtype = c.dtype;
  s.T = c.T;
  s.H = c.H;
  s.E = c.E;
  s.F = c.N;
  s.K = c.K;
  return s;
}

std::string routed_path(const SweepCase& c, bool direct) {
  if (direct) return "direct";
  return "sorted " + expert_plan(expert_gemms(c, c.T * c.K, 1, true), -1);
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
      p.max_m = c.max_m;
      p.n = c.N;
      p.k = c.H;
      if (p.max_m <= 0) return "no launch";
      const detail::GemmDevice device = detail::current_gemm_device();
      GemmPlan storage;
      const GemmPlan* forced =
          forced_plan(c.knobs.fp8_plan, detail::gemm_fp8_plan_candidates(p, device), &storage);
      return to_string(forced ? *forced : detail::plan_gemm_fp8(p, device));
    }
    case Op::kExpertMlp: {
      if (c.T == 0 && c.tail == 0 && c.alignment == 1) return "no launch";
      const int64_t P = c.T + c.E * (c.alignment - 1) + c.tail;
      return expert_plan(expert_gemms(c, P, c.alignment, false), c.knobs.mlp_plan);
    }
    case Op::kFusedMoeExperts:
      return c.T == 0 ? "none" : routed_path(c, false);
    case Op::kIndexedExpertMlp:
      return c.T == 0 ? "none" : routed_path(c, detail::indexed_takes_direct(shapes(c)));
    case Op::kFusedMoe:
    case Op::kFusedMoeSharedExpert: {
      if (c.T == 0) return "none";
      std::string s = routed_path(c, detail::layer_takes_direct(shapes(c)));
      if (c.S > 0) s += " + shared " + dense_path(c.dtype, c.T, c.H, c.S, DType::kF32);
      return s;
    }
    case Op::kSharedExpertMlp:
      return dense_path(c.dtype, c.T, c.H, c.N, c.dtype);
    default:
      return "";
  }
}

int64_t chain_launches() {
  return detail::sm90_mlp_chain_launches();
}

}  // namespace moekit::sweep
