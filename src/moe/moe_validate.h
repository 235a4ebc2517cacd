// Argument validation shared by the MoE ops.
#pragma once

#include <cstdint>
#include <string>

#include "core/check.h"
#include "mlp/activation.h"
#include "moe/moe_internal.h"
#include "moekit/tensor.h"

namespace moekit::detail {

inline std::string str(int64_t v) {
  return std::to_string(v);
}

// hidden [T, H] bf16/f16 with H a positive multiple of 8; T (GEMM rows) and H within
// the kernels' 32-bit sizes. Returns dtype, T, H.
inline MoEShapes check_hidden(const ArgCheck& c, const char* name, const TensorView& hidden) {
  c.tensor(name, hidden, {DType::kBF16, DType::kF16}, {kAnyDim, kAnyDim}, 16);
  MoEShapes s;
  s.dtype = hidden.dtype;
  s.T = hidden.size(0);
  s.H = hidden.size(1);
  MOEKIT_REQUIRE(c, s.H > 0 && s.H % 8 == 0, name,
                 "a hidden size (dim 1) that is a positive multiple of 8", hidden.describe());
  c.fits_i32(s.T, name, "rows (dim 0)", hidden);
  c.fits_i32(s.H, name, "columns (dim 1)", hidden);
  return s;
}

// An MLP op's activation (sets s.mlp.act, which check_gate_up reads).
inline void check_activation(const ArgCheck& c, MoEShapes& s, Activation act) {
  MOEKIT_REQUIRE(
      c, is_mlp_activation(act), "activation",
      "an MLP activation: kSiluAndMul, kGeluTanhAndMul, kGeluAndMul, kRelu2 or "
      "kSwigluOai",
      std::string(activation_name(act)) + " (value " + std::to_string(static_cast<int>(act)) + ")");
  s.mlp.act = act;
}

// An MLP's w_gate_up [(E,) 2F, H] ([(E,) F, H] for relu2, s.mlp.act): fills s.E (1 for
// dense) and s.F. `experts` selects the 3-d (per-expert) form.
inline void check_gate_up(const ArgCheck& c, MoEShapes& s, const char* name,
                          const TensorView& w_gate_up, const char* dtype_ref_name,
                          const TensorView& dtype_ref, bool experts) {
  const char* inner = experts ? "F" : "S";
  if (experts) {
    c.tensor(name, w_gate_up, {DType::kBF16, DType::kF16}, {kAnyDim, kAnyDim, s.H}, 16);
  } else {
    c.tensor(name, w_gate_up, {DType::kBF16, DType::kF16}, {kAnyDim, s.H}, 16);
  }
  c.same_dtype(name, w_gate_up, dtype_ref_name, dtype_ref);
  s.E = experts ? w_gate_up.size(0) : 1;
  const int64_t rows = w_gate_up.size(experts ? 1 : 0);
  const bool gated = is_gated(s.mlp.act);
  MOEKIT_REQUIRE(c, s.E > 0, name, "at least one expert (dim 0)", w_gate_up.describe());
  MOEKIT_REQUIRE(c, rows > 0 && rows % (gated ? 16 : 8) == 0, name,
                 gated ? std::string("2*") + inner + " gate+up rows with " + inner +
                             " a positive multiple of 8"
                       : std::string(inner) + " rows (relu2 is not gated) with " + inner +
                             " a positive multiple of 8",
                 w_gate_up.describe());
  c.fits_i32(rows, name, experts ? "gate+up rows per expert (dim 1)" : "gate+up rows (dim 0)",
             w_gate_up);
  s.F = gated ? rows / 2 : rows;
}

// An MLP's optional biases, f32 or the op's dtype: gate/up [(E,) gate_up_rows] and down
// [(E,) H]; sets s.mlp's bias flags.
inline void check_biases(const ArgCheck& c, MoEShapes& s, const char* gu_name,
                         const TensorView& gate_up_bias, const char* down_name,
                         const TensorView& down_bias, bool experts) {
  const int64_t rows = gate_up_rows(s.mlp.act, s.F);
  if (experts) {
    c.optional_tensor(gu_name, gate_up_bias, {DType::kF32, s.dtype}, {s.E, rows}, 16);
    c.optional_tensor(down_name, down_bias, {DType::kF32, s.dtype}, {s.E, s.H}, 16);
  } else {
    c.optional_tensor(gu_name, gate_up_bias, {DType::kF32, s.dtype}, {rows}, 16);
    c.optional_tensor(down_name, down_bias, {DType::kF32, s.dtype}, {s.H}, 16);
  }
  s.mlp.gate_up_bias = gate_up_bias.defined();
  s.mlp.down_bias = down_bias.defined();
}

// The biases as device pointers (validated).
inline MlpBiases mlp_biases(const TensorView& gate_up_bias, const TensorView& down_bias) {
  MlpBiases b;
  b.gate_up = gate_up_bias.data;
  b.gate_up_dtype = gate_up_bias.defined() ? gate_up_bias.dtype : DType::kF32;
  b.down = down_bias.data;
  b.down_dtype = down_bias.defined() ? down_bias.dtype : DType::kF32;
  return b;
}

// Its w_down [(E,) H, F].
inline void check_down(const ArgCheck& c, const MoEShapes& s, const char* name,
                       const TensorView& w_down, const char* dtype_ref_name,
                       const TensorView& dtype_ref, bool experts) {
  if (experts) {
    c.tensor(name, w_down, {DType::kBF16, DType::kF16}, {s.E, s.H, s.F}, 16);
  } else {
    c.tensor(name, w_down, {DType::kBF16, DType::kF16}, {s.H, s.F}, 16);
  }
  c.same_dtype(name, w_down, dtype_ref_name, dtype_ref);
}

inline void check_mlp_weights(const ArgCheck& c, MoEShapes& s, const char* gu_name,
                              const TensorView& w_gate_up, const char* down_name,
                              const TensorView& w_down, const char* dtype_ref_name,
                              const TensorView& dtype_ref, bool experts) {
  check_gate_up(c, s, gu_name, w_gate_up, dtype_ref_name, dtype_ref, experts);
  check_down(c, s, down_name, w_down, dtype_ref_name, dtype_ref, experts);
}

// topk_ids [T, K] i32 or i64 (K >= 1, T*K routes within 32 bits); fills s.K.
inline void check_topk_ids(const ArgCheck& c, MoEShapes& s, const TensorView& topk_ids) {
  c.tensor("topk_ids", topk_ids, {DType::kI32, DType::kI64}, {s.T, kAnyDim});
  s.K = topk_ids.size(1);
  MOEKIT_REQUIRE(c, s.K > 0, "topk_ids", "top_k (dim 1) >= 1", topk_ids.describe());
  MOEKIT_REQUIRE(c, s.T * s.K <= INT32_MAX, "topk_ids", "at most 2^31-1 routes (T*K)",
                 topk_ids.describe());
}

// apply_router_weight_on_input needs top-1 routing (vLLM's definition: the one route's
// weight scales the input row).
inline void check_router_weight_on_input(const ArgCheck& c, bool apply, int64_t K) {
  MOEKIT_REQUIRE(c, !apply || K == 1, "apply_router_weight_on_input",
                 "top_k 1 (the input row is scaled by its one route's weight)",
                 "true with top_k " + str(K));
}

// A *_workspace_size query of op `op`: `bytes(c)` validates what the size depends on
// with `c` (shapes only) and returns the size, which must be at most kMaxTensorBytes.
template <class Fn>
size_t workspace_query(const char* op, Fn&& bytes) {
  const ArgCheck c(op, ArgCheck::Mode::kShapesOnly);
  const size_t n = bytes(c);
  c.workspace_size(n);
  return n;
}

inline void check_output(const ArgCheck& c, const char* name, const TensorView& out,
                         const MoEShapes& s, const char* hidden_name, const TensorView& hidden) {
  c.tensor(name, out, {DType::kBF16, DType::kF16}, {s.T, s.H}, 16);
  c.same_dtype(name, out, hidden_name, hidden);
}

}  // namespace moekit::detail
