// The FP8-weight MLP on the contiguous FP8 grouped GEMMs (fp8_mlp.h): plans, workspace and
// the launch sequence.
#include "moe/fp8_mlp.h"

#include <utility>

#include "core/check.h"
#include "gemm/grouped_gemm.h"  // kTileCounterBytes
#include "gemm/grouped_gemm_fp8.h"
#include "moe/moe_internal.h"  // ExpertMlpGemms, expert_mlp_problems

namespace moekit::detail {
namespace {

int64_t blocks128(int64_t n) {
  return (n + kQuantBlock - 1) / kQuantBlock;
}

size_t f32_bytes(int64_t n) {
  return static_cast<size_t>(n) * sizeof(float);
}

// A stand-in for pointers the planners only test for null.
const float* stand_in() {
  static const float v = 1.f;
  return &v;
}

// The same for the tile counter, which the MLP's workspace always holds (carve_fp8_mlp).
unsigned* counter_stand_in() {
  static unsigned v = 0;
  return &v;
}

GroupedGemmFP8Problem problem(const Fp8MlpShapes& s, int64_t n, int64_t k) {
  GroupedGemmFP8Problem p;
  p.tile_counter = counter_stand_in();
  p.contiguous = true;
  p.alignment = s.alignment;
  p.num_groups = static_cast<int>(s.E);
  p.m = s.P;
  p.n = n;
  p.k = k;
  p.scales = fp8_gemm_scales(s.scheme);
  return p;
}

}  // namespace

Fp8ActScales fp8_act_scales(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::kFp8PerChannel:
      return Fp8ActScales::kPerToken;
    case QuantScheme::kFp8PerTensor:
      return Fp8ActScales::kPerTensor;
    default:
      return Fp8ActScales::kGroup128;
  }
}

Fp8Scales fp8_gemm_scales(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::kFp8PerChannel:
      return Fp8Scales::kPerChannel;
    case QuantScheme::kFp8PerTensor:
      return Fp8Scales::kPerTensor;
    default:
      return Fp8Scales::kBlock;
  }
}

int64_t fp8_act_scale_count(QuantScheme scheme, int64_t rows, int64_t cols, bool given) {
  switch (scheme) {
    case QuantScheme::kFp8PerChannel:
      return rows;
    case QuantScheme::kFp8PerTensor:
      return given ? 0 : 1;
    default:
      return rows * blocks128(cols);
  }
}

GroupedGemmFP8Problem fp8_gate_up_problem(const Fp8MlpShapes& s) {
  GroupedGemmFP8Problem p = problem(s, s.F, s.H);
  p.activation = Activation::kSiluAndMul;
  if (s.static_act) p.c_scale = stand_in();  // e4m3 act straight from the epilogue
  return p;
}

GroupedGemmFP8Problem fp8_down_problem(const Fp8MlpShapes& s) {
  return problem(s, s.H, s.F);
}

namespace {

// The expert MLP's two GEMM problems (expert_mlp_problems: bf16 rows in, act, out) over e4m3
// weights with their scales; g's pointers may be planning stand-ins. No tile counter: the
// weight-only tiles run a static schedule.
std::pair<GroupedGemmProblem, GroupedGemmProblem> weight_only_problems(const Fp8MlpShapes& s,
                                                                       ExpertMlpGemms g,
                                                                       const float* up_scale,
                                                                       const float* down_scale) {
  g.dtype = s.dtype;
  g.P = s.P;
  g.E = s.E;
  g.H = s.H;
  g.F = s.F;
  g.alignment = s.alignment;
  g.routed_counts = true;
  auto [up, down] = expert_mlp_problems(g);
  up.tile_counter = down.tile_counter = nullptr;
  up.b_scale = up_scale;
  down.b_scale = down_scale;
  up.b_scales = down.b_scales = fp8_gemm_scales(s.scheme);
  return {up, down};
}

}  // namespace

std::pair<GroupedGemmProblem, GroupedGemmProblem> fp8_weight_only_problems(const Fp8MlpShapes& s) {
  return weight_only_problems(s, ExpertMlpGemms{}, stand_in(), stand_in());
}

MlpPlan fp8_weight_only_plan() {
  MlpPlan m;
  m.path = MlpPath::kTwoGemms;
  m.gate_up.kernel = GemmKernel::kDecodePersistent;
  m.gate_up.tile_m = 32;
  m.gate_up.tile_n = 256;  // 0.75x-0.81x of 32 x 128 (layer_planner.cpp)
  m.down = m.gate_up;
  return m;
}

bool fp8_weight_only(const MlpPlan& plan) {
  return plan.path == MlpPath::kTwoGemms && plan.gate_up.kernel == GemmKernel::kDecodePersistent &&
         plan.down.kernel == GemmKernel::kDecodePersistent;
}

MlpPlan plan_fp8_mlp(const Fp8MlpShapes& s, const GemmDevice& device) {
  MlpPlan m;
  m.path = MlpPath::kTwoGemms;
  m.gate_up = plan_gemm_fp8(fp8_gate_up_problem(s), device);
  m.down = plan_gemm_fp8(fp8_down_problem(s), device);
  return m;
}

std::vector<MlpPlan> fp8_mlp_plan_candidates(const Fp8MlpShapes& s, const GemmDevice& device) {
  // Every pair of the two GEMMs' candidates, not each varied beside the other's plan as the
  // bf16 MLPs: 1-4 each (tile shapes and schedules), few enough to time every pair.
  std::vector<MlpPlan> out;
  for (const GemmPlan& up : gemm_fp8_plan_candidates(fp8_gate_up_problem(s), device)) {
    for (const GemmPlan& down : gemm_fp8_plan_candidates(fp8_down_problem(s), device)) {
      MlpPlan m;
      m.path = MlpPath::kTwoGemms;
      m.gate_up = up;
      m.down = down;
      out.push_back(m);
    }
  }
  // Last (the others keep their indices): the weight-only FP8 GEMMs on the bf16 rows, each
  // GEMM on 32 x 128 or 32 x 256 tiles (the planner's: 32 x 256 for both).
  for (int up_n : {128, 256}) {
    for (int down_n : {128, 256}) {
      MlpPlan m = fp8_weight_only_plan();
      m.gate_up.tile_n = up_n;
      m.down.tile_n = down_n;
      if (fp8_mlp_plan_rejection(m, s, device).empty()) out.push_back(m);
    }
  }
  return out;
}

std::string fp8_mlp_plan_rejection(const MlpPlan& plan, const Fp8MlpShapes& s,
                                   const GemmDevice& device) {
  if (plan.path != MlpPath::kTwoGemms)
    return "FP8 weights run two FP8 GEMMs (two_gemms), not " + to_string(plan);
  if (fp8_weight_only(plan)) {
    if (!s.weight_only_ok)
      return "weight-only FP8 GEMMs (" + to_string(plan) +
             ") run in the fused layers' sorted path only";
    const auto [up, down] = fp8_weight_only_problems(s);
    std::string why = gemm_plan_rejection(plan.gate_up, up, device);
    if (!why.empty()) return "the weight-only FP8 gate_up GEMM: " + why;
    why = gemm_plan_rejection(plan.down, down, device);
    return why.empty() ? why : "the weight-only FP8 down GEMM: " + why;
  }
  std::string why = gemm_fp8_plan_rejection(plan.gate_up, fp8_gate_up_problem(s), device);
  if (!why.empty()) return "the FP8 gate_up GEMM: " + why;
  why = gemm_fp8_plan_rejection(plan.down, fp8_down_problem(s), device);
  return why.empty() ? why : "the FP8 down GEMM: " + why;
}

Fp8MlpBuffers carve_fp8_mlp(const Fp8MlpShapes& s, bool dense, WorkspaceCarver& ws) {
  // The same bytes with static per-tensor scales or without (the workspace-size queries do
  // not see them): their buffers go unused.
  Fp8MlpBuffers b;
  b.in_scales = static_cast<float*>(
      ws.take(f32_bytes(fp8_act_scale_count(s.scheme, s.P, s.H, /*given=*/false))));
  b.act = ws.take(static_cast<size_t>(s.P * s.F) * 2);  // bf16
  b.q_act = ws.take(static_cast<size_t>(s.P * s.F));
  b.act_scales = static_cast<float*>(
      ws.take(f32_bytes(fp8_act_scale_count(s.scheme, s.P, s.F, /*given=*/false))));
  if (s.scheme == QuantScheme::kFp8PerTensor)
    b.amax = static_cast<uint32_t*>(ws.take(sizeof(uint32_t)));
  if (dense) b.ends = static_cast<int32_t*>(ws.take(sizeof(int32_t)));
  // Both GEMMs' (one stream, one after the other; each launch zeroes it).
  b.tile_counter = static_cast<unsigned*>(ws.take(kTileCounterBytes));
  return b;
}

void quantize_fp8_input(const Fp8MlpShapes& s, const void* x, const float* static_scale,
                        const Fp8RowGroups& groups, const Fp8MlpBuffers& b, void* q,
                        cudaStream_t stream) {
  QuantizeFp8Launch l;
  l.x = x;
  l.dtype = s.dtype;
  l.src_rows = s.P;
  l.k = s.H;
  l.group_ends = groups.ends;  // moe_expert_mlp: its padding rows are left alone
  l.groups = groups.E;
  l.alignment = groups.alignment;
  l.mode = fp8_act_scales(s.scheme);
  if (l.mode == Fp8ActScales::kPerTensor) {
    l.tensor_scale = static_scale;
    if (l.tensor_scale == nullptr) {
      launch_fp8_tensor_scale(x, s.dtype, s.P, s.H, groups, b.amax, b.in_scales, stream);
      l.tensor_scale = b.in_scales;
    }
  } else {
    l.scales = b.in_scales;
  }
  l.q = q;
  launch_quantize_fp8(l, stream);
}

void run_fp8_mlp(const Fp8MlpRun& run, cudaStream_t stream) {
  Fp8MlpRun r = run;
  r.s.static_act = r.scales.a_down != nullptr;
  const Fp8MlpShapes& s = r.s;
  const bool per_tensor = s.scheme == QuantScheme::kFp8PerTensor;
  const int32_t* ends = r.layout_metadata;
  if (ends == nullptr) {  // dense: one group of all P rows
    launch_fill_i32(r.b.ends, static_cast<int32_t>(s.P), stream);
    ends = r.b.ends;
  }
  // gate/up: silu_and_mul into bf16 act, or (static a_down_scale) e4m3 act directly. A dynamic
  // per-tensor scale of act: its max |act| gathered by the GEMM's epilogue (c_amax), not by a
  // pass over act.
  const bool act_amax = per_tensor && !s.static_act;
  if (act_amax) launch_fill_i32(reinterpret_cast<int32_t*>(r.b.amax), 0, stream);
  // Block scales on the 128 x 256 gate/up tiles: each tile's output columns are one group of
  // 128, so its epilogue quantizes act for the down GEMM itself (no bf16 act, no pass).
  const bool group_out = s.scheme == QuantScheme::kFp8Block128 && !s.static_act && s.H > 0 &&
                         r.plan.gate_up.kernel == GemmKernel::kFp8Sm90 &&
                         r.plan.gate_up.tile_m == 128 && r.plan.gate_up.tile_n == 256;
  GroupedGemmFP8Problem up = fp8_gate_up_problem(s);
  up.a = r.q_in;
  up.a_scale = r.scales.a_gate_up != nullptr ? r.scales.a_gate_up : r.b.in_scales;
  up.b = r.w_gate_up;
  up.b_scale = r.scales.gate_up;
  up.layout_metadata = ends;
  up.c = s.static_act || group_out ? r.b.q_act : r.b.act;
  up.c_scale = s.static_act ? r.scales.a_down : nullptr;
  up.c_group_scales = group_out ? r.b.act_scales : nullptr;
  up.c_amax = act_amax ? r.b.amax : nullptr;
  up.tile_counter = r.b.tile_counter;
  up.plan = r.plan.gate_up;
  run_grouped_gemm_fp8(up, stream);
  const float* act_scale = group_out ? r.b.act_scales : r.scales.a_down;
  if (!s.static_act && !group_out) {
    QuantizeFp8Launch q;
    q.x = r.b.act;
    q.dtype = DType::kBF16;
    q.src_rows = s.P;
    q.k = s.F;
    // Only the groups' rows: the gate/up GEMM wrote no others (dense: one group of all P).
    q.group_ends = r.layout_metadata;
    q.groups = s.E;
    q.alignment = s.alignment;
    q.mode = fp8_act_scales(s.scheme);
    if (per_tensor) {
      // max |act| over the rows the GEMM wrote (the groups' rows), from its epilogue.
      launch_fp8_scale_from_amax(r.b.amax, r.b.act_scales, stream);
      q.tensor_scale = r.b.act_scales;
    } else {
      q.scales = r.b.act_scales;
    }
    q.q = r.b.q_act;
    launch_quantize_fp8(q, stream);
    act_scale = r.b.act_scales;
  }
  GroupedGemmFP8Problem down = fp8_down_problem(s);
  down.a = r.b.q_act;
  down.a_scale = act_scale;
  down.b = r.w_down;
  down.b_scale = r.scales.down;
  down.layout_metadata = ends;
  down.c = r.out;
  down.tile_counter = r.b.tile_counter;
  down.plan = r.plan.down;
  run_grouped_gemm_fp8(down, stream);
}

void run_fp8_weight_only_mlp(const Fp8MlpRun& r, const void* in, cudaStream_t stream) {
  ExpertMlpGemms g;
  g.in = in;
  g.layout_metadata = r.layout_metadata;
  g.w_gate_up = r.w_gate_up;
  g.w_down = r.w_down;
  g.act = r.b.act;
  g.out = r.out;
  auto [up, down] = weight_only_problems(r.s, g, r.scales.gate_up, r.scales.down);
  up.plan = r.plan.gate_up;
  down.plan = r.plan.down;
  run_grouped_gemm(up, stream, "fused_moe");
  run_grouped_gemm(down, stream, "fused_moe");
}

}  // namespace moekit::detail
