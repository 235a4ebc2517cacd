// Input builders shared by the sweep's op files (sweep_ops_*.cpp).
#pragma once

#include <cstdint>
#include <vector>

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
