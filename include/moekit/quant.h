// Quantized weights of the expert and shared-expert MLPs (docs/moe.md "Quantized weights").
// One WeightQuant per weight set: the routed experts' (E axis) or a dense MLP's (no E axis).
//
//   scheme           weights   w_gate_up_scale (f32)          w_down_scale (f32)
//   kNone            x dtype   undefined                      undefined
//   kFp8PerTensor    e4m3      [E]      ([1] dense)           [E]      ([1] dense)
//   kFp8PerChannel   e4m3      [E, 2F]  ([2S] dense)          [E, H]   ([H] dense)
//   kFp8Block128     e4m3      [E, ceil(2F/128), ceil(H/128)] [E, ceil(H/128), ceil(F/128)]
//                              ([ceil(2S/128), ceil(H/128)])  ([ceil(H/128), ceil(S/128)])
//
// The weight an op uses is dequant(w)[n, k] = float(w[n, k]) * scale(n, k): scale(n, k) is
// the matrix's one scale (per tensor), row n's (per channel) or block (n/128, k/128)'s.
// a_gate_up_scale / a_down_scale: optional [1] f32 static activation scales (kFp8PerTensor
// only; undefined = dynamic), positive normal floats (a_down_scale is the gate/up GEMM's
// c_scale: moekit/gemm.h says why). Which activations a path quantizes, and how: docs/moe.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/tensor.h"

namespace moekit {

enum class QuantScheme : uint8_t {
  kNone,           // weights in the activations' dtype (bf16 / f16), no scales
  kFp8PerTensor,   // e4m3 weights, one scale per weight matrix (per expert)
  kFp8PerChannel,  // e4m3 weights, one scale per output row
  kFp8Block128,    // e4m3 weights, one scale per 128 x 128 block (DeepSeek-V3 checkpoints)
};

// "none", "fp8_per_tensor", "fp8_per_channel", "fp8_block128".
const char* quant_scheme_name(QuantScheme scheme);
// The inverse of quant_scheme_name; false (and *out unchanged) for any other text.
bool parse_quant_scheme(const std::string& text, QuantScheme* out);

// The shape of the f32 scales of weights [E, rows, cols] under `scheme` (the table above;
// experts = false: a dense MLP's [rows, cols], no E axis); empty for kNone.
std::vector<int64_t> weight_scale_shape(QuantScheme scheme, int64_t E, int64_t rows, int64_t cols,
                                        bool experts = true);

struct WeightQuant {
  QuantScheme scheme = QuantScheme::kNone;
  TensorView w_gate_up_scale;  // see the table above
  TensorView w_down_scale;
  TensorView a_gate_up_scale;  // optional [1] f32, kFp8PerTensor only: the gate_up input's
  TensorView a_down_scale;     // optional [1] f32, kFp8PerTensor only: the down input's
};

}  // namespace moekit
