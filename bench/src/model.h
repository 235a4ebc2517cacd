// The FLOP / byte model of BENCH.md and the speed-of-light classification.
//   FLOPs: 2*M*N*Kd per GEMM with M the real routed rows (never padding); nothing
//          for elementwise work (routing, permutes, combines, activations).
//   Bytes: every input read once and every output written once; of expert weights
//          only the experts that receive at least one route; of permuted buffers
//          only the rows that hold routes.
// Host code only.
#pragma once

#include <cstdint>
#include <string>

#include "workload.h"

namespace moekit::bench {

// What the row's inputs turned out to hold (known once routing is generated).
struct RoutingStats {
  int64_t routed_rows = -1;     // M: routes with a valid id / valid permuted rows (-1: all)
  int64_t active_experts = -1;  // experts with >= 1 route (-1: all)
};

struct Cost {
  double flops = 0;
  double bytes = 0;
};

// The main shapes of a row, read from its tensors (0 where the op has none).
struct Dims {
  int64_t T = 0, H = 0, E = 0, K = 0, F = 0, S = 0;  // tokens, hidden, experts, top_k, ...
  int64_t P = 0;                                     // permuted rows (allocated)
  int64_t N = 0, Kd = 0;                             // GEMM output width / reduction
  int64_t max_m = 0;                                 // masked layouts
  bool masked = false, swiglu = false, bias = false;
  int64_t block_size = 0;  // MoEPermuteAlignFwd
};
Dims row_dims(const Row& row);

// Default (all rows routed, every expert active) stats of a row, i.e. the upper bound.
RoutingStats full_routing(const Row& row);

Cost op_cost(const Row& row, const RoutingStats& stats);

struct Ceilings {
  double read_tbps = 4.53;     // streaming read, TB/s
  double bf16_tflops = 760.0;  // cuBLAS bf16 8192^3
  double fp8_tflops = 1395.0;  // cuBLASLt fp8 8192^3
  std::string source = "nominal (BENCH.md figures)";
};

struct Sol {
  double comp_ms = 0, mem_ms = 0, ideal_ms = 0;
  double sol = 0;     // ideal / measured (0 when not measured)
  std::string bound;  // "comp", "mem" or "lat" (ideal < 5 us)
};

// True for ops whose F_peak is the fp8 rate.
bool uses_fp8_peak(const std::string& op);
// A row with FP8 weights (param weight_quant: fp8_per_tensor / fp8_per_channel / fp8_block128):
// its cost counts e4m3 weight bytes and their scales, its compute ceiling is the FP8 rate
// (the GEMM paths multiply FP8 operands).
bool weight_quant_fp8(const Row& row);
// The f32 scale bytes of one expert's weights [2F, H] and [H, F] under the row's weight_quant.
double weight_scale_bytes(const Row& row, int64_t H, int64_t F);
Sol classify(const Cost& cost, bool fp8, const Ceilings& ceilings, double measured_ms);
// The ideal time that picks a row's timing mode (graph under 20 us): at the nominal
// ceilings, so a row's mode does not change with what a GPU measures.
double timing_ideal_ms(const Cost& cost, bool fp8);

}  // namespace moekit::bench
