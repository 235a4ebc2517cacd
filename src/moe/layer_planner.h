// The layer planner (docs/moe.md): a routed MoE layer's plan, the direct or the sorted
// path for the routed experts, the sorted path's expert MLP (the GEMM planner's, on the
// permuted problems) and the shared expert's dense MLP (the dense-MLP planner's). Pure
// functions of the shapes and the device's properties; unit-tested on the CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/device.h"
#include "core/plan_log.h"
#include "gemm/grouped_gemm.h"
#include "mlp/mlp_planner.h"
#include "moe/fp8_mlp.h"
#include "moe/moe_internal.h"
#include "moekit/plan.h"

namespace moekit::detail {

// Which routed paths an op takes.
enum class RoutedOp {
  kSortedOnly,  // fused_moe_experts: always the sorted path
  kIndexed,     // indexed_expert_mlp: the direct path wherever it can run (its contract)
  kLayer,       // fused_moe, fused_moe_shared_expert: direct also needs few routes per expert
};

struct LayerProblem {
  MoEShapes s;
  RoutedOp op = RoutedOp::kLayer;
  int64_t S = 0;                                  // the shared expert's width, 0 = none
  MlpActivation shared_mlp;                       // the shared expert's: s.mlp.act, its own biases
  QuantScheme shared_quant = QuantScheme::kNone;  // the shared expert's weights
  bool shared_static_act = false;                 // MoEShapes::static_act of those
};

// The layer's shapes s as the shared expert's FP8 MLP plans them: its own static_act.
inline MoEShapes shared_shapes(MoEShapes s, bool static_act) {
  s.static_act = static_act;
  return s;
}

// The routed path (direct when the op's rule allows), the sorted path's expert MLP
// (plan_mlp_gemms, routed counts) and the shared expert's dense plan (f32 output).
LayerPlan plan_layer(const LayerProblem& p, const GemmDevice& device,
                     const DirectCapacity& shared_capacity = {});
// Every plan this build can run p with: each routed path the op can take (the sorted one
// with each expert-MLP candidate) with each of the shared expert's candidates.
std::vector<LayerPlan> layer_plan_candidates(const LayerProblem& p, const GemmDevice& device);
// Empty when `plan` can run p on `device`, else why not.
std::string layer_plan_rejection(const LayerPlan& plan, const LayerProblem& p,
                                 const GemmDevice& device);

// The shared expert's dense problem (stream-K scratch: carved wherever it can run).
DenseMlpProblem shared_mlp_problem(const MoEShapes& s, int64_t S, DType out_dtype,
                                   const GemmDevice& device, const MlpActivation& mlp);

// ---- a dense MLP (the shared expert) with FP8 weights ----
// Up to kDirectMaxTokens tokens with 2*S*H < 2^31 (its 32-bit weight offsets, as the routed
// form's 2*F*H) the FP8 direct kernels (moe_kernels_fp8.cu) in their dense form
// (launch_direct_fp8_*, topk_ids == nullptr): plan "direct" with no k split (split 1 / 1); past
// that the FP8 GEMMs on one group of T rows (fp8_mlp.h; plan two_gemms).
MlpPlan fp8_dense_mlp_plan();
// Empty when the dense FP8 direct kernels can run T tokens of width S, else the limit past
// ("T = 65 > 64", "2*S*H = ... >= 2^31: ...").
std::string fp8_dense_direct_rejection(int64_t T, int64_t H, int64_t S);
bool fp8_dense_uses_gemm(int64_t T, int64_t H, int64_t S);
Fp8MlpShapes dense_fp8_shapes(const MoEShapes& s, int64_t S, QuantScheme quant);
MlpPlan plan_fp8_dense_mlp(const MoEShapes& s, int64_t S, QuantScheme quant,
                           const GemmDevice& device);
std::vector<MlpPlan> fp8_dense_mlp_plan_candidates(const MoEShapes& s, int64_t S, QuantScheme quant,
                                                   const GemmDevice& device);
std::string fp8_dense_mlp_plan_rejection(const MlpPlan& plan, const MoEShapes& s, int64_t S,
                                         QuantScheme quant, const GemmDevice& device);
// The sorted path's FP8 expert MLP (s.quant a FP8 scheme): the permuted rows of s.
Fp8MlpShapes sorted_fp8_shapes(const MoEShapes& s);
// A FP8 MLP of P rows (dtype s.dtype) in E groups, contiguous(alignment), of hidden size s.H
// and width F, weights `scheme` (no static activation scale).
Fp8MlpShapes fp8_mlp_shapes(const MoEShapes& s, int64_t P, int64_t E, int64_t F, QuantScheme scheme,
                            int alignment);
// The planner's plan of a shared expert of width S, weights `quant` and activation `mlp`
// (out_dtype: f32 in a layer, the dtype alone): the dense-MLP planner's, or the FP8 one above.
MlpPlan plan_shared_mlp(const MoEShapes& s, int64_t S, QuantScheme quant, const MlpActivation& mlp,
                        DType out_dtype, const GemmDevice& device, const DirectCapacity& capacity);
// Its candidates, why `plan` cannot run it (empty: it can) and, for plan_shared_mlp, the
// current device's direct-MLP capacity (none at S = 0 or with FP8 weights: unused there).
std::vector<MlpPlan> shared_mlp_plan_candidates(const MoEShapes& s, int64_t S, QuantScheme quant,
                                                const MlpActivation& mlp, DType out_dtype,
                                                const GemmDevice& device);
std::string shared_mlp_plan_rejection(const MlpPlan& plan, const MoEShapes& s, int64_t S,
                                      QuantScheme quant, const MlpActivation& mlp, DType out_dtype,
                                      const GemmDevice& device);
DirectCapacity shared_mlp_capacity(const MoEShapes& s, int64_t S, QuantScheme quant,
                                   const MlpActivation& mlp, DType out_dtype,
                                   const GemmDevice& device);
// A shared expert's weights as run_shared_mlp reads them (validated; FP8 weights come with
// silu_and_mul and no biases).
struct SharedMlpWeights {
  const void* w_gate_up = nullptr;  // [gate_up_rows(mlp.act, S), H]
  const void* w_down = nullptr;     // [H, S]
  QuantScheme quant = QuantScheme::kNone;
  WeightScales scales;  // FP8: without the E axis
  MlpActivation mlp;    // the activation and which biases
  MlpBiases biases;
};
// Its workspace buffers: act [T, S] in the dtype, the dense MLP's stream-K scratch and (the
// general path) the f32 pre-activations; FP8 weights past the direct kernels (carve_shared_fp8):
// the e4m3 input rows, the FP8 MLP's buffers and (an output not bf16) its bf16 output.
struct SharedMlpBuffers {
  void* act = nullptr;
  void* scratch = nullptr;
  float* pre = nullptr;
  void* q_in = nullptr;
  Fp8MlpBuffers fp8;
  void* out_bf16 = nullptr;
};
void carve_shared_fp8(const MoEShapes& s, int64_t S, QuantScheme quant, DType out_dtype,
                      SharedMlpBuffers& b, WorkspaceCarver& ws);
// out [T, H] = the shared MLP of x (out_dtype: f32 or the dtype), by `plan` (bf16 / f16
// weights: run_dense_mlp; FP8 weights: the dense FP8 direct kernels or the FP8 GEMMs).
void run_shared_mlp(const MlpPlan& plan, const MoEShapes& s, int64_t S, DType out_dtype,
                    const void* x, const SharedMlpWeights& w, const SharedMlpBuffers& b, void* out,
                    cudaStream_t stream, const char* op);

// The sorted path's expert MLP GEMMs over the permuted rows [P, H] (P = T*K, alignment 1):
// gate_up from `permuted` into `act`, down from `act` over `permuted` (dead by then).
// tile_counters: kExpertMlpCounterBytes of workspace; the chain's scratch follows the two
// GEMMs' counters.
ExpertMlpGemms sorted_expert_gemms(const MoEShapes& s, void* permuted,
                                   const int32_t* layout_metadata, void* act, const void* w_gate_up,
                                   const void* w_down, void* tile_counters);
// The permuted rows of the sorted path (alignment 1: the grouped GEMM tiles every expert's
// rows on its own, so padding would only cost workspace).
constexpr int kSortedAlignment = 1;
int64_t sorted_rows(const MoEShapes& s);

// The plan log's key of a layer / dense MLP shape ("bf16 T=32 H=7168 E=256 F=2048 K=8 S=2048";
// E, F and K left out when 0), and the log line of an op's plan (core/plan_log.h).
std::string shape_key(const MoEShapes& s, int64_t S);
template <class Plan>
void log_op_plan(const char* op, const MoEShapes& s, int64_t S, const Plan& plan) {
  if (plan_log_enabled()) log_plan(op, shape_key(s, S), to_string(plan));
}

// Throws moekit::Error naming the op, argument 'plan', the plan and `reason` when `reason`
// (a *_plan_rejection) is not empty.
template <class Plan>
void check_plan(const ArgCheck& c, const Plan& plan, const std::string& reason) {
  if (!reason.empty())
    c.fail("plan", "a plan that can run these arguments", to_string(plan) + " (" + reason + ")");
}

// The plan an op runs: `given` (args.plan) when set, refused by check_plan unless
// rejection(*given) is empty; else planned(). With FP8 weights (`fp8_weights` names them)
// the planner's plan must pass too (its path may not run on this device: the FP8 GEMMs need
// sm_90), else the op fails on fp8_weights, which expect `fp8_paths`.
template <class Plan, class Rejection, class Planned>
Plan resolve_plan(const ArgCheck& c, const Plan* given, const Rejection& rejection,
                  const Planned& planned, const char* fp8_weights = nullptr,
                  const char* fp8_paths = nullptr) {
  if (given != nullptr) {
    check_plan(c, *given, rejection(*given));
    return *given;
  }
  const Plan plan = planned();
  if (fp8_weights != nullptr) {
    const std::string why = rejection(plan);
    if (!why.empty()) c.fail(fp8_weights, fp8_paths, why);
  }
  return plan;
}

}  // namespace moekit::detail
