// Argument validation shared by the MoE ops.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "mlp/activation.h"
#include "moe/moe_internal.h"
#include "moe/weight_quant.h"
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

// A weight set's scheme (`name`: its WeightQuant field): a named QuantScheme, not a value cast
// from another integer, which every FP8 check would take for a scheme with scales of [E].
inline void check_quant_scheme(const ArgCheck& c, const char* name, QuantScheme scheme) {
  MOEKIT_REQUIRE(c, is_quant_scheme(scheme), name,
                 "a QuantScheme: kNone, kFp8PerTensor, kFp8PerChannel or kFp8Block128",
                 "value " + std::to_string(static_cast<int>(scheme)));
}

// A weight's dtype under the scheme s.quant (set by the caller from its WeightQuant): that of
// `dtype_ref` (the hidden states) without one, e4m3 with one; each mismatch named.
inline void check_weight_dtype(const ArgCheck& c, const MoEShapes& s, const char* name,
                               const TensorView& w, const char* dtype_ref_name,
                               const TensorView& dtype_ref) {
  const bool fp8 = quantized(s.quant);
  if (!w.defined()) return;  // the shape check names it
  if (!fp8) {
    MOEKIT_REQUIRE(c, w.dtype != DType::kFP8E4M3, name,
                   "bf16 / f16 weights (e4m3 weights need a FP8 scheme in quant.scheme)",
                   w.describe() + " with quant.scheme none");
    MOEKIT_REQUIRE(c, w.dtype == DType::kBF16 || w.dtype == DType::kF16, name, "dtype bf16 or f16",
                   w.describe());
    c.same_dtype(name, w, dtype_ref_name, dtype_ref);
    return;
  }
  MOEKIT_REQUIRE(c, w.dtype == DType::kFP8E4M3, name,
                 std::string("fp8e4m3 weights (quant.scheme ") + quant_scheme_name(s.quant) + ")",
                 w.describe());
}

// A weight tensor of `shape`, 16-byte aligned, in the dtypes s.quant allows.
inline void check_weight_tensor(const ArgCheck& c, const MoEShapes& s, const char* name,
                                const TensorView& w, std::initializer_list<int64_t> shape) {
  if (quantized(s.quant)) {
    c.tensor(name, w, {DType::kFP8E4M3}, shape, 16);
  } else {
    c.tensor(name, w, {DType::kBF16, DType::kF16}, shape, 16);
  }
}

// The shape rules of a FP8 scheme on a gated MLP of hidden size s.H and width s.F: rows of
// whole 16-byte e4m3 chunks (H and F multiples of 16), and for 128 x 128 blocks H and F
// multiples of 128 (no block straddles the gate and up halves, and every GEMM's k is a
// whole number of blocks and of 128-wide activation groups).
inline void check_quant_shapes(const ArgCheck& c, const MoEShapes& s, const char* name,
                               const TensorView& w_gate_up, const char* inner) {
  if (!quantized(s.quant)) return;
  const int64_t m = s.quant == QuantScheme::kFp8Block128 ? kQuantBlock : 16;
  const std::string why = s.quant == QuantScheme::kFp8Block128
                              ? " (fp8_block128: whole 128 x 128 scale blocks)"
                              : " (e4m3 rows of whole 16-byte chunks)";
  MOEKIT_REQUIRE(c, s.H % m == 0, name, "H (the last dim) a multiple of " + str(m) + why,
                 w_gate_up.describe());
  MOEKIT_REQUIRE(c, s.F % m == 0, name,
                 std::string(inner) + " (half the gate+up rows) a multiple of " + str(m) + why,
                 w_gate_up.describe());
}

// An MLP's w_gate_up [(E,) 2F, H] ([(E,) F, H] for relu2, s.mlp.act): fills s.E (1 for
// dense) and s.F. `experts` selects the 3-d (per-expert) form.
inline void check_gate_up(const ArgCheck& c, MoEShapes& s, const char* name,
                          const TensorView& w_gate_up, const char* dtype_ref_name,
                          const TensorView& dtype_ref, bool experts) {
  const char* inner = experts ? "F" : "S";
  check_weight_dtype(c, s, name, w_gate_up, dtype_ref_name, dtype_ref);
  if (experts) {
    check_weight_tensor(c, s, name, w_gate_up, {kAnyDim, kAnyDim, s.H});
  } else {
    check_weight_tensor(c, s, name, w_gate_up, {kAnyDim, s.H});
  }
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
  check_quant_shapes(c, s, name, w_gate_up, inner);
}

// The FP8 weight kernels fuse silu_and_mul without biases: with a FP8 scheme (s.quant) any
// other activation or a bias is refused, naming the argument (check_biases calls it).
inline void check_quant_activation(const ArgCheck& c, const MoEShapes& s, const char* act_name,
                                   const char* gu_bias_name, const TensorView& gate_up_bias,
                                   const char* down_bias_name, const TensorView& down_bias) {
  if (!quantized(s.quant)) return;
  const std::string with = std::string(" with FP8 weights (scheme ") + quant_scheme_name(s.quant) +
                           ": the FP8 kernels run silu_and_mul without biases)";
  MOEKIT_REQUIRE(c, s.mlp.act == Activation::kSiluAndMul, act_name, "silu_and_mul" + with,
                 activation_name(s.mlp.act));
  MOEKIT_REQUIRE(c, !gate_up_bias.defined(), gu_bias_name, "no bias" + with,
                 gate_up_bias.describe());
  MOEKIT_REQUIRE(c, !down_bias.defined(), down_bias_name, "no bias" + with, down_bias.describe());
}

// An MLP's optional biases, f32 or the op's dtype: gate/up [(E,) gate_up_rows] and down
// [(E,) H]; sets s.mlp's bias flags (FP8 weights: none, and silu_and_mul).
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
  check_quant_activation(c, s, "activation", gu_name, gate_up_bias, down_name, down_bias);
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
  check_weight_dtype(c, s, name, w_down, dtype_ref_name, dtype_ref);
  if (experts) {
    check_weight_tensor(c, s, name, w_down, {s.E, s.H, s.F});
  } else {
    check_weight_tensor(c, s, name, w_down, {s.H, s.F});
  }
}

// The scales of `q` (named "<prefix>.w_gate_up_scale", ...) for shapes s (E, H, F; `experts`:
// with the E axis) under q.scheme, laid out as moekit/quant.h says.
inline void check_quant_scales(const ArgCheck& c, const MoEShapes& s, const char* prefix,
                               const WeightQuant& q, bool experts) {
  const std::string p(prefix);
  const std::string gu = p + ".w_gate_up_scale", dn = p + ".w_down_scale";
  const std::string agu = p + ".a_gate_up_scale", adn = p + ".a_down_scale";
  const auto absent = [&](const std::string& name, const TensorView& t, const char* when) {
    MOEKIT_REQUIRE(c, !t.defined(), name.c_str(), std::string("no tensor ") + when,
                   t.describe() + " with quant.scheme " + quant_scheme_name(q.scheme));
  };
  if (!quantized(q.scheme)) {
    const char* why = "without a FP8 scheme (quant.scheme none)";
    absent(gu, q.w_gate_up_scale, why);
    absent(dn, q.w_down_scale, why);
    absent(agu, q.a_gate_up_scale, why);
    absent(adn, q.a_down_scale, why);
    return;
  }
  const auto scale = [&](const std::string& name, const TensorView& t, int64_t rows, int64_t cols) {
    c.tensor(name.c_str(), t, {DType::kF32},
             weight_scale_shape(q.scheme, s.E, rows, cols, experts));
  };
  scale(gu, q.w_gate_up_scale, gate_up_rows(s.mlp.act, s.F), s.H);
  scale(dn, q.w_down_scale, s.H, s.F);
  if (q.scheme == QuantScheme::kFp8PerTensor) {
    c.optional_tensor(agu.c_str(), q.a_gate_up_scale, {DType::kF32}, {1});
    c.optional_tensor(adn.c_str(), q.a_down_scale, {DType::kF32}, {1});
  } else {
    absent(agu, q.a_gate_up_scale, "(static activation scales go with fp8_per_tensor only)");
    absent(adn, q.a_down_scale, "(static activation scales go with fp8_per_tensor only)");
  }
}

// MoEShapes::static_act of weights quantized as q: fp8_per_tensor with a given a_down_scale.
inline bool static_act_of(const WeightQuant& q) {
  return q.scheme == QuantScheme::kFp8PerTensor && q.a_down_scale.defined();
}

// An MLP op's (Args: its arguments) input rows `x` (named x_name), activation and w_gate_up
// (`experts`: with the E axis) under a.quant.scheme: the shapes they fix, before the rest.
template <class Args>
MoEShapes check_mlp_inputs(const ArgCheck& c, const Args& a, const char* x_name,
                           const TensorView& x, bool experts) {
  MoEShapes s = check_hidden(c, x_name, x);
  check_activation(c, s, a.activation);
  check_quant_scheme(c, "quant.scheme", a.quant.scheme);
  s.quant = a.quant.scheme;
  s.static_act = static_act_of(a.quant);
  check_gate_up(c, s, "w_gate_up", a.w_gate_up, x_name, x, experts);
  return s;
}
// Then its w_down and the weights' scales (a.quant).
template <class Args>
void check_mlp_down(const ArgCheck& c, const MoEShapes& s, const Args& a, const char* x_name,
                    const TensorView& x, bool experts) {
  check_down(c, s, "w_down", a.w_down, x_name, x, experts);
  check_quant_scales(c, s, "quant", a.quant, experts);
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

// The routed experts' weights and quant scales in an op's memory rule (outputs_disjoint,
// spliced in with ArgCheck::join), named as the args structs name them (ExpertMLPArgs,
// FusedMoEExpertsArgs, FusedMoEArgs): one list for the three ops.
template <class Args>
std::array<ArgCheck::Arg, 6> weight_args(const Args& a) {
  return {{{"w_gate_up", a.w_gate_up},
           {"w_down", a.w_down},
           {"quant.w_gate_up_scale", a.quant.w_gate_up_scale},
           {"quant.w_down_scale", a.quant.w_down_scale},
           {"quant.a_gate_up_scale", a.quant.a_gate_up_scale},
           {"quant.a_down_scale", a.quant.a_down_scale}}};
}
// Their biases (the experts op lists the routing inputs in between).
template <class Args>
std::array<ArgCheck::Arg, 2> bias_args(const Args& a) {
  return {{{"gate_up_bias", a.gate_up_bias}, {"down_bias", a.down_bias}}};
}

}  // namespace moekit::detail
