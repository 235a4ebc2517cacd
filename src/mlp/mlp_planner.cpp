// The dense-MLP planner: the path rules of docs/dense-mlp.md "Which path runs".
#include "mlp/mlp_planner.h"

#include "gemm/gemm_planner.h"
#include "mlp/gemv_mlp.h"
#include "mlp/streamk_mlp.h"

namespace moekit::detail {
namespace {

int64_t weight_bytes(const DenseMlpProblem& p) {
  return 3 * p.H * p.S * 2;  // 2-byte gate, up and down weights
}

bool streamk_runs(const DenseMlpProblem& p, const GemmDevice& device) {
  return p.streamk_scratch && streamk_mlp_scratch_bytes(p.dtype, p.T, p.H, p.S, device.props) > 0;
}

MlpPlan kernel_plan(MlpPath path, int split_gate_up, int split_down) {
  MlpPlan m;
  m.path = path;
  m.split_gate_up = split_gate_up;
  m.split_down = split_down;
  return m;
}

MlpPlan gemms_plan(const DenseMlpProblem& p, const GemmDevice& device) {
  GroupedGemmProblem up, down;
  dense_mlp_gemms(p, nullptr, nullptr, nullptr, nullptr, nullptr, &up, &down);
  return plan_mlp_gemms(up, down, device);
}

// Why one direct GEMM cannot take `split` (empty: it can).
std::string direct_split_rejection(const char* gemm, int split, int64_t T, int64_t n_out, int64_t k,
                                   bool silu) {
  const std::string what = std::string(gemm) + " split " + std::to_string(split);
  if (split < 1 || split > kDirectMlpMaxSplit)
    return what + ": the direct kernels split k over 1 to " + std::to_string(kDirectMlpMaxSplit) +
           " cluster ranks";
  const DirectGemmPlan pl = direct_gemm_plan_for_split(T, n_out, k, silu, split);
  if (pl.split != split)
    return what + ": k = " + std::to_string(k) + " gives only " + std::to_string(pl.split) +
           " ranks k (slices of whole 128-element load batches)";
  if (pl.smem > kDirectMlpMaxSmem)
    return what + ": the x slice takes " + std::to_string(pl.smem) + " bytes of shared memory (> " +
           std::to_string(kDirectMlpMaxSmem) + ")";
  return {};
}

}  // namespace

DirectCapacity device_direct_capacity(const DenseMlpProblem& p) {
  return {direct_cluster_capacity(p.dtype, p.dtype, p.T, /*silu=*/true),
          direct_cluster_capacity(p.dtype, p.out_dtype, p.T, /*silu=*/false)};
}

void dense_mlp_gemms(const DenseMlpProblem& p, const void* x, const void* w_gate_up,
                     const void* w_down, void* act, void* out, GroupedGemmProblem* up,
                     GroupedGemmProblem* down, float* pre) {
  *up = GroupedGemmProblem();
  up->in_dtype = p.dtype;
  up->out_dtype = p.dtype;
  up->a = x;
  up->b = w_gate_up;
  up->c = act;
  up->num_groups = 1;
  up->n = p.S;
  up->k = p.H;
  up->activation = Activation::kSiluAndMul;
  up->rows = GemmRows::kDense;
  up->m = p.T;
  *down = *up;
  down->out_dtype = p.out_dtype;
  down->a = act;
  down->b = w_down;
  down->c = out;
  down->n = p.H;
  down->k = p.S;
  down->activation = Activation::kNone;
  if (!p.mlp.general()) return;
  up->activation = Activation::kNone;
  up->out_dtype = DType::kF32;
  up->c = pre;
  up->n = gate_up_rows(p.mlp.act, p.S);
  if (p.mlp.down_bias && p.out_dtype != DType::kF32) {
    down->out_dtype = DType::kF32;
    down->c = pre;
  }
}

namespace {

// Why the single-kernel dense paths cannot run p's activation (empty: they can).
std::string general_rejection(const DenseMlpProblem& p) {
  if (!p.mlp.general()) return {};
  return std::string("the dense MLP kernels run silu_and_mul without biases, not ") +
         activation_name(p.mlp.act) +
         (p.mlp.gate_up_bias || p.mlp.down_bias ? " with biases" : "") +
         " (two GEMMs around the activation kernel)";
}

}  // namespace

MlpPlan plan_dense_mlp(const DenseMlpProblem& p, const GemmDevice& device,
                       const DirectCapacity& capacity) {
  if (p.mlp.general()) return gemms_plan(p, device);
  const bool large = weight_bytes(p) >= kStreamkMlpMinWeightBytes;
  if (p.T == 1 && large && gemv_mlp_supported(p.dtype, p.T, p.H, p.S, device.props))
    return kernel_plan(MlpPath::kGemv, 0, 0);
  if (p.T <= kDirectMlpMaxTokens && !large &&
      direct_mlp_supported(p.dtype, p.T, p.H, p.S, device.props)) {
    const DirectGemmPlan up =
        direct_gemm_plan(p.T, p.S, p.H, true, device.props.sms, capacity.gate_up);
    const DirectGemmPlan down =
        direct_gemm_plan(p.T, p.H, p.S, false, device.props.sms, capacity.down);
    return kernel_plan(MlpPath::kDirect, up.split, down.split);
  }
  if (large && streamk_runs(p, device))
    return kernel_plan(MlpPath::kStreamK, device.props.sms, device.props.sms);
  return gemms_plan(p, device);
}

std::vector<MlpPlan> dense_mlp_plan_candidates(const DenseMlpProblem& p, const GemmDevice& device) {
  std::vector<MlpPlan> out;
  const bool kernels = !p.mlp.general();
  if (kernels && gemv_mlp_supported(p.dtype, p.T, p.H, p.S, device.props))
    out.push_back(kernel_plan(MlpPath::kGemv, 0, 0));
  if (kernels && direct_mlp_supported(p.dtype, p.T, p.H, p.S, device.props)) {
    for (int su = 1; su <= kDirectMlpMaxSplit; ++su) {
      if (!direct_split_rejection("", su, p.T, p.S, p.H, true).empty()) continue;
      for (int sd = 1; sd <= kDirectMlpMaxSplit; ++sd) {
        if (direct_split_rejection("", sd, p.T, p.H, p.S, false).empty())
          out.push_back(kernel_plan(MlpPath::kDirect, su, sd));
      }
    }
  }
  if (kernels && streamk_runs(p, device))
    out.push_back(kernel_plan(MlpPath::kStreamK, device.props.sms, device.props.sms));
  GroupedGemmProblem up, down;
  dense_mlp_gemms(p, nullptr, nullptr, nullptr, nullptr, nullptr, &up, &down);
  for (const MlpPlan& m : mlp_gemms_plan_candidates(up, down, device)) out.push_back(m);
  return out;
}

std::string dense_mlp_plan_rejection(const MlpPlan& plan, const DenseMlpProblem& p,
                                     const GemmDevice& device) {
  if (plan.path != MlpPath::kTwoGemms) {
    const std::string why = general_rejection(p);
    if (!why.empty()) return why;
  }
  switch (plan.path) {
    case MlpPath::kGemv:
      if (!gemv_mlp_supported(p.dtype, p.T, p.H, p.S, device.props))
        return "the GEMV MLP runs one token of bf16 / f16 with H and S multiples of 8 whose rows "
               "fit the shared memory, on an sm_90 device";
      return plan.split_gate_up == 0 && plan.split_down == 0 ? std::string()
                                                             : "the GEMV MLP has no k split";
    case MlpPath::kDirect: {
      if (!direct_mlp_supported(p.dtype, p.T, p.H, p.S, device.props))
        return "the direct MLP runs 1 to " + std::to_string(kDirectMlpMaxTokens) +
               " tokens of bf16 / f16 with H and S multiples of 8, on an sm_90 device";
      const std::string up =
          direct_split_rejection("gate_up", plan.split_gate_up, p.T, p.S, p.H, true);
      return up.empty() ? direct_split_rejection("down", plan.split_down, p.T, p.H, p.S, false)
                        : up;
    }
    case MlpPath::kStreamK:
      if (!streamk_runs(p, device))
        return "the stream-K MLP runs 1 to " + std::to_string(kStreamkMlpMaxTokens) +
               " tokens of bf16 / f16 on an sm_90 device, with its scratch in the workspace";
      if (plan.split_gate_up != plan.split_down || plan.split_gate_up < 1 ||
          plan.split_gate_up > device.props.sms)
        return "the stream-K MLP's split is its grid, one for both GEMMs, 1 to " +
               std::to_string(device.props.sms) + " CTAs";
      return {};
    case MlpPath::kTwoGemms:
    case MlpPath::kChain: {
      GroupedGemmProblem up, down;
      dense_mlp_gemms(p, nullptr, nullptr, nullptr, nullptr, nullptr, &up, &down);
      return mlp_gemms_plan_rejection(plan, up, down, device);
    }
  }
  return "an unknown MLP path";
}

}  // namespace moekit::detail
