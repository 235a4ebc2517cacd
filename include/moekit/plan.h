// Plans: what an op runs, decided by one planner per level (docs/architecture.md).
//   GemmPlan   one grouped GEMM: which kernel, its tile, split, schedule and swap_tails.
//   MlpPlan    a gated MLP's two GEMMs (two launches, or one chained launch), or one of
//              the dense small-batch MLP kernels.
//   LayerPlan  a routed MoE layer: the direct (sort-free) or the sorted path for the
//              routed experts, the expert MLP's plan, and the shared expert's.
// Planners are pure functions of the arguments' shapes and dtypes and of the device's
// properties. plan_*(args) returns the plan an op would run, without running it;
// *_plan_candidates(args) lists the candidate plans (the planner's pick among them): every
// GEMM plan that runs; for MLP and layer plans, each part's alternatives with the other
// parts as planned (not their product; an FP8 MLP's two GEMMs, with 1-4 candidates each, as
// every pair); stream-K at one CTA per SM only. An op runs the
// plan its args name (args.plan), else the planner's; a named plan that cannot run the
// arguments throws moekit::Error saying why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moekit {

// The grouped-GEMM kernels (docs/gemm.md has one section per kernel).
enum class GemmKernel : uint8_t {
  kDecode,              // mma.sync, 32 x 128 tiles, 128-byte k stages: few rows per group
  kDecodeSplitK,        // kDecode with k split over a thread-block cluster (few tiles)
  kDecodeStream,        // 32 x 128 tiles, 256-byte k stages, 2 blocks per SM
  kDecodeStreamDeep,    // the same, 5 stages, 1 block per SM (long k)
  kDecodeStreamNarrow,  // 32 x 64 tiles, 256-byte stages, 3 blocks per SM (small GEMMs)
  kDecodePersistent,    // kDecodeStream's tiles on a persistent grid (short k, grouped)
  kSm90,                // TMA + wgmma, 128 x tile_n tiles, warp-specialized, persistent
  kSm90Pairs,           // kSm90 on 2-CTA clusters sharing an operand tile (multicast)
  kFp8Sm90,             // FP8 e4m3, TMA + wgmma: every layout, scale mode and activation
};

// How a kernel's CTAs find their tiles.
enum class GemmSchedule : uint8_t {
  kStatic,   // a fixed walk (grid-stride, or one tile per CTA)
  kDynamic,  // claimed from a counter in the workspace (SMs that run ahead take more)
};

struct GemmPlan {
  GemmKernel kernel = GemmKernel::kDecode;
  int tile_m = 0;  // rows per tile
  int tile_n = 0;  // b rows per tile (with kSiluAndMul a tile makes tile_n / 2 output columns)
  int split = 1;   // CTAs per output tile along k (kDecodeSplitK: a cluster), else 1
  GemmSchedule schedule = GemmSchedule::kStatic;
  // kSm90 / kSm90Pairs at tile_n 256: tiles with at most 32 valid rows run transposed
  // (weight rows as wgmma's M, rows as N of 16 or 32; docs/gemm.md "Swapped tail tiles").
  bool swap_tails = false;
};

// The MLP paths (docs/dense-mlp.md, docs/gemm.md).
enum class MlpPath : uint8_t {
  kTwoGemms,  // gate_up (silu_and_mul) into a buffer, then down: two GEMM launches
  kChain,     // both GEMMs in one persistent SM90 launch (expert MLPs)
  kGemv,      // dense, one token: a GEMV kernel per GEMM
  kDirect,    // dense, few tokens: weights streamed into registers, k split over clusters
  kStreamK,   // dense, few tokens, large weights: stream-K over the k dimension
};

struct MlpPlan {
  MlpPath path = MlpPath::kTwoGemms;
  GemmPlan gate_up;  // kTwoGemms / kChain
  GemmPlan down;     // kTwoGemms / kChain
  // kDirect: each GEMM's cluster ranks over k; kStreamK: the grid (CTAs), equal for both;
  // 0 = n/a.
  int split_gate_up = 0;
  int split_down = 0;
};

// The routed experts' paths (docs/moe.md).
enum class RoutedPath : uint8_t {
  kSorted,  // permute -> expert MLP on the permuted rows -> combine
  kDirect,  // routes read from topk_ids, no sort: small batches
};

struct LayerPlan {
  RoutedPath routed = RoutedPath::kSorted;
  MlpPlan experts;          // kSorted: the expert MLP over the permuted rows
  bool has_shared = false;  // the layer has a shared expert
  MlpPlan shared;           // its dense MLP (has_shared)
};

// One line each, e.g. "sm90_pairs 128x256 dynamic swap_tails", "chain{gate_up: sm90_pairs
// 128x256 dynamic swap_tails, down: sm90_pairs 128x256 dynamic swap_tails}".
std::string to_string(GemmKernel kernel);
std::string to_string(const GemmPlan& plan);
std::string to_string(const MlpPlan& plan);
std::string to_string(const LayerPlan& plan);

// The inverse of to_string: parses a plan's one-line form into *out. Returns false (and,
// given error, says what was expected at which character) when `text` is not exactly a
// plan's form; *out is then unchanged. A parsed plan may still not run a given problem:
// the ops check it (a *_plan_rejection) as they check any args.plan.
bool parse_plan(const std::string& text, GemmPlan* out, std::string* error = nullptr);
bool parse_plan(const std::string& text, MlpPlan* out, std::string* error = nullptr);
bool parse_plan(const std::string& text, LayerPlan* out, std::string* error = nullptr);

bool operator==(const GemmPlan& a, const GemmPlan& b);
bool operator==(const MlpPlan& a, const MlpPlan& b);
bool operator==(const LayerPlan& a, const LayerPlan& b);
inline bool operator!=(const GemmPlan& a, const GemmPlan& b) {
  return !(a == b);
}
inline bool operator!=(const MlpPlan& a, const MlpPlan& b) {
  return !(a == b);
}
inline bool operator!=(const LayerPlan& a, const LayerPlan& b) {
  return !(a == b);
}

}  // namespace moekit
