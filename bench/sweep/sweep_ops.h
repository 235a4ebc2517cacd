// Input builders shared by the sweep's op files (sweep_ops_*.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/quant.h"
#include "moekit/reference.h"
#include "moekit/routing.h"
#include "sweep_case.h"
#include "sweep_run.h"

namespace moekit::sweep {

// Gating logits [T, E]: N(0, 1), or integer levels (exact ties), plus the case's skew.
void fill_logits(Context& ctx, const SweepCase& c, const DevTensor& g);
// correction_bias [E] ~ N(0, 0.1^2) (BENCH.md); undefined unless c.bias.
DevTensor correction_bias(Context& ctx, const SweepCase& c);
TopKParams topk_params(const SweepCase& c);
// Weights ~ N(0, 1/fan_in) in dt.
DevTensor weights(Context& ctx, DType dt, std::vector<int64_t> shape, int64_t fan_in,
                  uint64_t seed);

// One MLP's optional biases (docs/moe.md, "Activations"): gate_up [E, gate_up_rows(F)] and
// down [E, H], or [gate_up_rows(F)] and [H] for a dense MLP (E = 0), each in its dtype
// (kUndefined: none). gate_up ~ N(0, 1), N(0, 3^2) for swiglu_oai (its clamps at +-7 then
// bite); down ~ N(0, 0.5^2). `tag`, `tag + 1`: the input seeds.
struct MlpBiases {
  DevTensor gate_up, down;
};
MlpBiases mlp_biases(Context& ctx, const SweepCase& c, int64_t E, int64_t F, DType gate_up,
                     DType down, int tag);

// One MLP's weights: w_gate_up [E, gate_up_rows(F), H] and w_down [E, H, F] ([..] without the
// E axis for a dense MLP, E = 0). Without a FP8 scheme: the case's dtype, N(0, 1/fan_in)
// (seeds `tag`, `tag + 1`: those the sweep always used). With one (docs/moe.md, "Quantized
// weights"): e4m3 codes ~ N(0, 1) with f32 scales in the scheme's layout, uniform in
// [0.5, 1.5] / sqrt(fan_in) (the bench's), and the static activation scales c.static_act
// asks for with fp8_per_tensor: a_gate_up_scale near max|x| / 448 for N(0, 1) inputs,
// a_down_scale near that of the F-wide activation (the tails saturate, in the reference too).
struct MlpWeights {
  DevTensor gate_up, down;
  WeightQuant quant;  // views of the scale tensors below
  DevTensor gate_up_scale, down_scale, a_gate_up_scale, a_down_scale;
};
MlpWeights mlp_weights(Context& ctx, const SweepCase& c, QuantScheme q, int64_t E, int64_t F,
                       int tag);
// Host copies of a WeightQuant's scales (the CPU references).
WeightQuant mirror_quant(HostMirror& m, const WeightQuant& q);

// Which activations a reference quantizes: those of the FP8 GEMM paths (`gemm_path`) of
// FP8 weights (docs/moe.md, "Activations"); the FP8 direct kernels' are as given.
reference::Fp8Activations reference_acts(QuantScheme q, bool gemm_path);
// Whether the reference must compute every row for the sampled ones to be right: a dynamic
// fp8_per_tensor scale spans every row (its amax) on a path that quantizes.
bool reference_needs_all_rows(const SweepCase& c, QuantScheme q, reference::Fp8Activations acts);
// Whether the F-wide activation's scale is a dynamic fp8_per_tensor one on a path that
// quantizes: its amax may sit one bf16 step from the library's (gpu_reference::Fp8Acts),
// and a failing GPU-reference comparison is retried there (compare_amax_ties).
bool reference_amax_tie(const SweepCase& c, QuantScheme q, reference::Fp8Activations acts);

// The rows of a permuted buffer (contiguous(alignment) or masked(max_m)) holding the
// case's expert_counts: the metadata (ends or counts), the buffer's rows, and which of
// them belong to an expert.
struct PermutedRows {
  std::vector<int32_t> metadata;
  int64_t rows = 0;
  std::vector<uint8_t> valid;    // one byte per buffer row
  std::vector<int64_t> members;  // the valid rows, ascending
};
PermutedRows permuted_rows_of(const SweepCase& c);

}  // namespace moekit::sweep
