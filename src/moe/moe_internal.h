// Internal pieces of the MoE compositions: workspace carving, shapes, the
// direct ("indexed") small-batch kernels and the weighted combine.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "core/workspace.h"
#include "gemm/gemm_planner.h"  // GemmDevice, MlpPlan, kSm90MlpChainScratchBytes
#include "mlp/activation.h"
#include "mlp/dense_mlp.h"
#include "moe/weight_quant.h"
#include "moekit/plan.h"
#include "moekit/quant.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// Shapes of a routed MoE problem (validated by the caller).
struct MoEShapes {
  DType dtype = DType::kBF16;  // hidden states, output (and weights when not quantized)
  int64_t T = 0, H = 0, E = 0, F = 0, K = 0;
  MlpActivation mlp;  // the experts' activation and biases (general(): the general path)
  QuantScheme quant = QuantScheme::kNone;  // the weights' (e4m3 when quantized)
  // fp8_per_tensor with a given a_down_scale: the FP8 gate/up GEMM writes the down GEMM's
  // e4m3 input itself (a c_scale), which not every FP8 kernel can (the planners must know).
  bool static_act = false;
};

// The workspace bytes of shapes s: what carve(ws) takes from a counting carver (none when
// s.T = 0), so that a size query and the op share one layout.
template <class Carve>
size_t carved_bytes(const MoEShapes& s, Carve&& carve) {
  if (s.T == 0) return 0;
  WorkspaceCarver ws(nullptr);
  carve(ws);
  return ws.bytes();
}

// Limits of the direct path: routes are decoded per block from topk_ids in shared
// memory (T*K ids, an E-bit presence bitmap); an expert's weight offsets are 32-bit.
constexpr int64_t kDirectMaxTokens = 64;
constexpr int64_t kDirectMaxRoutes = 1024;
constexpr int64_t kDirectMaxExperts = 4096;
// FP8 weights' routed direct path runs to the routes' limit at top-8 (T*K <= 1024): past 64
// tokens the sorted path's FP8 GEMMs, built for many rows an expert, took 1.4x-1.9x the
// direct kernels' time per active expert on the decoding PR's layers (docs/PERF.md "FP8
// layers of small F past the direct kernels"). The kernels have no limit of their own on T.
constexpr int64_t kFp8DirectMaxTokens = 128;

// The routed direct path's token limit for s's weights.
inline int64_t direct_max_tokens(const MoEShapes& s) {
  return quantized(s.quant) ? kFp8DirectMaxTokens : kDirectMaxTokens;
}

// The direct kernels address an expert's weight rows by 32-bit element offsets from a
// tile's first row (direct::tile_rows): the largest, (F + 8) * H into the gate/up block,
// stays below 2^31 when 2*F*H does (F >= 8).
inline bool direct_weight_offsets_fit(int64_t F, int64_t H) {
  return 2 * F * H < (int64_t{1} << 31);
}

inline bool direct_path_eligible(const MoEShapes& s) {
  return !s.mlp.general() && s.T <= direct_max_tokens(s) && s.T * s.K <= kDirectMaxRoutes &&
         s.E <= kDirectMaxExperts && direct_weight_offsets_fit(s.F, s.H);
}

// Empty when the direct path can run s, else the limit s is past ("T = 65 > 64").
std::string direct_path_rejection(const MoEShapes& s);

// Routed experts on device pointers: output[t] = sum_k w[t,k] * MLP_id(x_t)
// (+ addend[t] when addend != nullptr, an f32 [T, H] term added before the single
// rounding), by the routed part of a LayerPlan: the sort-free small-batch path (kDirect,
// requires direct_path_eligible) or pre-permute -> the expert MLP plan's GEMMs -> combine.
struct RoutedExperts {
  MoEShapes s;
  RoutedPath routed = RoutedPath::kSorted;
  MlpPlan experts;                  // kSorted
  const void* hidden = nullptr;     // [T, H]
  const void* w_gate_up = nullptr;  // [E, 2F, H]
  const void* w_down = nullptr;     // [E, H, F]
  WeightScales scales;              // s.quant's scales (e4m3 weights)
  const float* topk_weights = nullptr;
  const int32_t* topk_ids = nullptr;
  const float* addend = nullptr;  // optional [T, H] f32
  MlpBiases biases;               // s.mlp says which are given
  void* output = nullptr;         // [T, H]
};
size_t routed_experts_workspace_size(const MoEShapes& s, RoutedPath routed);
// Carves its buffers (routed_experts_workspace_size bytes) from ws's current position.
void run_routed_experts(const RoutedExperts& p, WorkspaceCarver& ws, cudaStream_t stream);

// Expert MLP on a contiguous permuted buffer: gate/up grouped GEMM with silu_and_mul into
// act [P, F], then the down grouped GEMM into out [P, H]. The general path (mlp.general()):
// gate/up GEMM (kNone) into pre [P, gate_up_rows] f32, the activation kernel (gate/up bias)
// into act, the down GEMM (kNone) into out, or into pre (f32) then the down-bias pass.
constexpr size_t kExpertMlpCounterBytes = 512 + kSm90MlpChainScratchBytes;
struct ExpertMlpGemms {
  DType dtype = DType::kBF16;
  const void* in = nullptr;  // [P, H]
  int64_t P = 0, E = 0, H = 0, F = 0;
  const int32_t* layout_metadata = nullptr;  // [E] contiguous ends
  int alignment = 1;
  const void* w_gate_up = nullptr;  // [E, 2F, H]
  const void* w_down = nullptr;     // [E, H, F]
  void* act = nullptr;              // [P, F]
  void* out = nullptr;              // [P, H]; may alias `in` (dead once the first GEMM has run)
  MlpActivation mlp;                // general(): the general path, with:
  MlpBiases biases;
  float* pre = nullptr;  // [P, general_pre_cols(mlp, F, H, false)] f32
  // The counts come from top-k routing (the fused layers), GroupedGemmProblem::routed_counts.
  bool routed_counts = false;
  // kExpertMlpCounterBytes of workspace: the GEMMs' tile counters, then the chain's scratch.
  // Planning needs none (the plan is the one run with them).
  void* counters = nullptr;
};
// The two GEMM problems of g (without counters, stand-ins mark them given: planning).
std::pair<GroupedGemmProblem, GroupedGemmProblem> expert_mlp_problems(const ExpertMlpGemms& g);
// The planner's plan of the two GEMMs, and every plan that can run them (gemm_planner.h).
MlpPlan plan_expert_mlp_gemms(const ExpertMlpGemms& g, const GemmDevice& device);
std::vector<MlpPlan> expert_mlp_gemms_plan_candidates(const ExpertMlpGemms& g,
                                                      const GemmDevice& device);
// Why `plan` cannot run the general path of `mlp` beyond its GEMMs' own limits (empty: it
// can, or mlp is not general).
std::string expert_mlp_general_rejection(const MlpPlan& plan, const MlpActivation& mlp);
// Runs `plan` (throws moekit::Error naming `op` when it cannot run g).
void run_expert_mlp_gemms(const ExpertMlpGemms& g, const MlpPlan& plan, cudaStream_t stream,
                          const char* op = "moe_expert_mlp");

// ---- kernels (moe_kernels.cu) ----

// Stage 1 of the direct path: act[r, :] = round(silu(x_t . w_gate[e]^T) * (x_t . w_up[e]^T))
// for every route r = t*K + k with e = topk_ids[r] in [0, E). act is [T*K, F].
void launch_direct_gate_up(const MoEShapes& s, const void* hidden, const void* w_gate_up,
                           const int32_t* topk_ids, void* act, cudaStream_t stream);
// Stage 2: down[r, :] = act[r, :] . w_down[e]^T in f32 for every valid route. down is [T*K, H].
void launch_direct_down(const MoEShapes& s, const void* act, const void* w_down,
                        const int32_t* topk_ids, float* down, cudaStream_t stream);

// The FP8-weight decode kernels (moe_kernels_fp8.cu): the two stages above with e4m3 weights
// dequantized in registers by `scales` (per tensor, per channel or 128 x 128 blocks), bf16 /
// f16 activations (not quantized), f32 sums. topk_ids == nullptr: the dense form (a shared
// expert's MLP): route r is token r of the one expert (s.E = 1, no E axis in the scales).
// down_dtype: f32 (the routed combine's rows) or s.dtype (a dense MLP's output).
void launch_direct_fp8_gate_up(const MoEShapes& s, const void* hidden, const void* w_gate_up,
                               const WeightScales& scales, const int32_t* topk_ids, void* act,
                               cudaStream_t stream, const char* op);
void launch_direct_fp8_down(const MoEShapes& s, const void* act, const void* w_down,
                            const WeightScales& scales, const int32_t* topk_ids, void* down,
                            DType down_dtype, cudaStream_t stream, const char* op);

// out[t, :] = round(sum_k in k order over valid routes of w[t,k] * rows[row(t,k), :]
//                   (+ addend[t, :])), f32 accumulation; tokens without routes get
// zeros (or the addend). Row of route r: inverse[r] when `inverse` (valid when in
// [0, num_rows)), else r itself (valid when topk_ids[r] is in [0, E)).
struct CombineProblem {
  DType out_dtype = DType::kBF16;
  DType rows_dtype = DType::kBF16;  // out_dtype, f32, or bf16 (the FP8 GEMMs' rows)
  const void* rows = nullptr;
  int64_t num_rows = 0;
  const int32_t* inverse = nullptr;
  const int32_t* topk_ids = nullptr;
  int64_t E = 0;
  const float* topk_weights = nullptr;
  const float* addend = nullptr;
  void* out = nullptr;
  int64_t T = 0, K = 0, H = 0;
};
void launch_combine(const CombineProblem& p, cudaStream_t stream);

}  // namespace moekit::detail
