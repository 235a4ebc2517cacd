// The MLP activations (moekit::Activation) beyond the GEMM epilogues: what each needs of
// the weights, and the elementwise kernel of the general MLP path (activation_kernel.cu):
// plain GEMMs write the f32 pre-activations, the kernel adds the bias, applies the
// activation and rounds once (docs/moe.md "Activations").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/workspace.h"
#include "gemm/grouped_gemm.h"
#include "moekit/gemm.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// "silu_and_mul", "gelu_tanh_and_mul", "gelu_and_mul", "relu2", "swiglu_oai" ("none";
// "unknown" out of range).
const char* activation_name(Activation act);
// An activation the MLP ops run (every enumerator but kNone).
bool is_mlp_activation(Activation act);
// Gated activations read a gate and an up value per output column; kRelu2 one value.
inline bool is_gated(Activation act) {
  return act != Activation::kRelu2 && act != Activation::kNone;
}
// Rows of w_gate_up (columns of the pre-activations) for intermediate size F.
inline int64_t gate_up_rows(Activation act, int64_t F) {
  return is_gated(act) ? 2 * F : F;
}

// An MLP's activation and which biases it adds. silu_and_mul without biases runs the fused
// epilogues; anything else the general path.
struct MlpActivation {
  Activation act = Activation::kSiluAndMul;
  bool gate_up_bias = false;
  bool down_bias = false;
  bool general() const { return act != Activation::kSiluAndMul || gate_up_bias || down_bias; }
};

// The biases of an MLP's GEMMs (device pointers, f32 or the op's dtype; null: none).
struct MlpBiases {
  const void* gate_up = nullptr;
  DType gate_up_dtype = DType::kF32;
  const void* down = nullptr;
  DType down_dtype = DType::kF32;
};

// The general path's f32 pre-activation buffer [rows, cols]: the gate/up GEMM's output
// (gate_up_rows(act, F) columns) and, when a down bias is added to an output that is not f32,
// the down GEMM's f32 output (H columns) before the bias pass. 0 on the fused path.
inline int64_t general_pre_cols(const MlpActivation& m, int64_t F, int64_t H, bool out_f32) {
  if (!m.general()) return 0;
  const int64_t up = gate_up_rows(m.act, F);
  return m.down_bias && !out_f32 && H > up ? H : up;
}
// Carves that buffer for `rows` rows (nullptr on the fused path).
inline float* take_general_pre(WorkspaceCarver& ws, const MlpActivation& m, int64_t rows, int64_t F,
                               int64_t H, bool out_f32) {
  const int64_t cols = general_pre_cols(m, F, H, out_f32);
  if (cols == 0) return nullptr;
  return static_cast<float*>(ws.take(static_cast<size_t>(rows * cols) * sizeof(float)));
}

// out[r, c] = round(act(in[r, cols of c] + bias[e(r), cols of c])) for c < cols, over the
// rows of `rows`: with `ends`, a contiguous(alignment) permuted buffer (e(r) from the ends;
// padding rows untouched), else dense rows (bias of one expert). kNone: out = in + bias (the
// down bias pass; out may then be `in` itself when out_dtype is f32).
struct ActivationLaunch {
  DType dtype = DType::kBF16;  // the op's dtype
  Activation act = Activation::kSiluAndMul;
  const float* in = nullptr;  // [rows, gate_up_rows(act, cols)] (kNone: [rows, cols])
  int64_t rows = 0, cols = 0;
  const void* bias = nullptr;  // optional [E or 1, in columns]
  DType bias_dtype = DType::kF32;
  const int32_t* ends = nullptr;  // [E] contiguous ends, or nullptr (dense)
  int E = 1;
  int alignment = 1;
  void* out = nullptr;             // [rows, cols]
  DType out_dtype = DType::kBF16;  // dtype or f32
};
void launch_activation(const ActivationLaunch& p, cudaStream_t stream, const char* op);

// The general path of an MLP whose plans `up` and `down` carry (validated by the caller):
// up (kNone, f32 into act.in), the activation kernel with the gate/up bias (act: its rows,
// layout and output), down, and with a down bias the bias pass from down.c (f32, H
// columns) into `out` (out_dtype; may be down.c itself when f32).
void run_general_mlp(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                     ActivationLaunch act, const MlpBiases& biases, int64_t H, void* out,
                     DType out_dtype, cudaStream_t stream, const char* op);

}  // namespace moekit::detail
