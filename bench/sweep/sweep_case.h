// The random sweep's cases (docs/sweep.md): what one case is, how the seeded generator
// draws it, the limits every drawn case respects, and the one-line spec that reproduces
// it. Host code only (the CPU test checks the generator without a GPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/gemm.h"
#include "moekit/quant.h"
#include "moekit/tensor.h"

namespace moekit::sweep {

enum class Op : int {
  kFusedTopK,
  kPermuteAlign,
  kPrePermute,
  kPostPermute,
  kGroupedGemm,
  kGroupedGemmFp8,
  kExpertMlp,
  kFusedMoeExperts,
  kIndexedExpertMlp,
  kFusedMoe,
  kFusedMoeSharedExpert,
  kSharedExpertMlp,
};
constexpr int kOpCount = 12;
const char* op_name(Op op);  // the public function's name, e.g. "moe_grouped_gemm"
bool parse_op(const std::string& name, Op* op);

// How routes are drawn: the topk ids of the ops that take them, the per-expert row counts
// of a permuted buffer, or a skew added to the gating logits.
enum class Route : int {
  kUniform,     // K distinct experts per token, uniformly
  kSkewed,      // expert e drawn with weight (1 + rank_e)^-alpha (the bench's skew)
  kOneExpert,   // every route to one expert (a row repeats it when K > 1)
  kFewExperts,  // routes to 1-3 experts: most experts empty
  kEqual,       // row counts only: the rows split evenly (the bench's default)
};
const char* route_name(Route r);

// Every internal switch the sweep can force (bench/sweep/sweep_paths.cpp applies them);
// the defaults leave each choice to the library's heuristics.
struct Knobs {
  // Forced plans: an index into the op's *_plan_candidates (taken modulo their count);
  // -1 = the planner's plan. gemm: moe_grouped_gemm; fp8: moe_grouped_gemm_fp8; mlp:
  // moe_expert_mlp.
  int gemm_plan = -1, fp8_plan = -1, mlp_plan = -1;
  // Plan knobs (bench/sweep/sweep_paths.h forced_dense_plan / forced_layer_plan: args.plan).
  int dense_path = 0, streamk_grid = 0, direct_split = 0, routed_path = 0;
  int pdl = 0;
};

// One knob: its key in a spec and its default.
struct KnobField {
  const char* key;
  int Knobs::*field;
  int fallback;
};
const std::vector<KnobField>& knob_fields();

struct SweepCase {
  int64_t index = -1;      // position in the seed's sequence (-1: from a spec)
  uint64_t data_seed = 0;  // the inputs' seed
  Op op = Op::kFusedTopK;
  std::string family = "heuristic";  // the path family drawn (op_families)
  DType dtype = DType::kBF16;        // input dtype (fp8e4m3 for the FP8 GEMM)
  DType out = DType::kBF16;          // output dtype where the op lets it differ
  DType gating = DType::kF32;        // gating logits (fused_topk: = dtype; the layers)
  int64_t T = 0;                     // tokens; the routed rows of the GEMMs and MoEExpertMLPFwd
  int64_t H = 8;                     // hidden size; the GEMMs' Kd
  int64_t N = 8;                     // intermediate F; the GEMMs' N; SharedExpertMLPFwd's S
  int64_t S = 0;  // FusedMoESharedExpertFwd's shared intermediate size (0: no shared expert)
  int64_t E = 1;
  int64_t K = 1;  // top_k
  // Permuted-buffer layout.
  bool masked = false;
  int alignment = 1;
  int64_t max_m = 0;
  int64_t tail = 0;  // buffer rows past the last expert block / past the routes
  int block_size = 64;
  // Routes.
  Route route = Route::kUniform;
  int skew_milli = 0;  // alpha * 1000 (kSkewed)
  int drop_pm = 0;     // per mille of ids set to -1
  int dup_pm = 0;      // per mille of ids repeating an earlier id of their row
  int oor_pm = 0;      // per mille of ids out of range (skipped like -1)
  // FusedTopK parameters.
  bool bias = false, sigmoid = false, renormalize = false;
  int groups = 0, topk_group = 0;
  int scale_milli = 1000;  // routed_scaling_factor * 1000
  int levels = 0;          // > 0: integer logits from [0, levels): exact ties
  // GEMMs.
  bool silu = false;
  bool workspace = true;  // moe_grouped_gemm(_fp8): pass the optional workspace
  // Engine inputs (docs/moe.md, "Engine inputs"). ep_ranks >= 2 (fused_moe_experts,
  // indexed_expert_mlp; the layers without grouped routing): ids (the layers: gating
  // logits) over E * ep_ranks global experts and an expert_map holding this rank's E; ids64:
  // the ids as i64; on_input (top_k 1, the routed ops): apply_router_weight_on_input.
  int ep_ranks = 0;
  bool ids64 = false, on_input = false;
  // The MLP ops' activation and optional biases (docs/moe.md, "Activations"); a bias is
  // kUndefined (none), f32 or the case's dtype. The shared biases: fused_moe_shared_expert
  // with S > 0 (its shared expert runs `act` too).
  Activation act = Activation::kSiluAndMul;
  DType gate_up_bias = DType::kUndefined, down_bias = DType::kUndefined;
  DType shared_gate_up_bias = DType::kUndefined, shared_down_bias = DType::kUndefined;
  // FP8 weights (docs/moe.md, "Quantized weights"): the routed experts' / the dense MLP's
  // scheme, and fused_moe_shared_expert's shared expert's (S > 0). static_act: the static
  // activation scales of the fp8_per_tensor sets (bit 0 a_gate_up_scale, bit 1 a_down_scale).
  QuantScheme quant = QuantScheme::kNone, shared_quant = QuantScheme::kNone;
  int static_act = 0;
  // moe_grouped_gemm_fp8's scale mode (its layout: masked / alignment / tail; its activation:
  // silu; an e4m3 c with a c_scale: out = fp8e4m3).
  Fp8Scales fp8_scales = Fp8Scales::kBlock;
  Knobs knobs;
};

// The ops with an MLP (moe_expert_mlp, the token-indexed MoE ops, shared_expert_mlp).
bool mlp_op(Op op);
// Whether the case's MLP takes the library's general path (an activation other than
// silu_and_mul, or a bias): the routed ops then run the sorted path at every T.
bool general_mlp(const SweepCase& c);
// Rows of w_gate_up per expert for intermediate size F: F for relu2, else 2F (swiglu_oai's
// interleaved, the others gate then up).
int64_t gate_up_rows(const SweepCase& c, int64_t F);
// "silu_and_mul", "gelu_tanh_and_mul", "gelu_and_mul", "relu2", "swiglu_oai" (the spec's
// act= values; the library's names); "none" for kNone.
const char* activation_key(Activation act);
// The case's activation, biases and FP8 weights in a few characters, e.g. "relu2+bias" or
// "silu_and_mul+fp8_block128" (summaries).
std::string activation_label(const SweepCase& c);

// moe_grouped_gemm_fp8's modes in a few characters, e.g. "contiguous+per_tensor+silu+e4m3"
// (summaries).
std::string fp8_gemm_label(const SweepCase& c);
// "block", "per_channel", "per_tensor" (the spec's fp8_scales= values).
const char* fp8_scales_key(Fp8Scales s);
// Whether the case's MLP weights (routed or shared) are FP8.
bool fp8_weights(const SweepCase& c);

bool operator==(const SweepCase& a, const SweepCase& b);
inline bool operator!=(const SweepCase& a, const SweepCase& b) {
  return !(a == b);
}

// "op=moe_grouped_gemm family=gemm_plan seed=... T=..." (every field; knobs that differ
// from their default), and back.
std::string format_spec(const SweepCase& c);
bool parse_spec(const std::string& spec, SweepCase* c, std::string* error);

// Per-case cost caps: the generator shrinks H, F, S, E and K (never T) until a case fits.
struct Limits {
  double max_flops;  // the op's useful FLOPs
  double max_bytes;  // device bytes of inputs, outputs and workspaces
};
Limits default_limits();
Limits large_limits();
double case_flops(const SweepCase& c);
double case_bytes(const SweepCase& c);

// Case `index` of seed `seed`: a pure function of both (op = index % kOpCount).
SweepCase draw_case(uint64_t seed, int64_t index, const Limits& limits);

// Why the case is not a valid input of its op (the library's validation limits), or "".
std::string invalid_reason(const SweepCase& c);

// The path families of an op; the first is "heuristic" (no knob set).
const std::vector<std::string>& op_families(Op op);

// ---- inputs derived from a case (host, deterministic) -------------------------------------

// Per-expert row counts of a permuted buffer (the GEMMs, MoEExpertMLPFwd): T rows over E
// experts as `route` says, each at most max_m when masked.
std::vector<int64_t> expert_counts(const SweepCase& c);
// topk ids [T, K] of the ops that take them (global ids in [0, E * ep_ranks) with ep_ranks).
std::vector<int32_t> draw_topk_ids(const SweepCase& c);
// The expert map [E * ep_ranks] of an ep_ranks case (empty otherwise): this rank's E experts
// as a block (rank data_seed % ep_ranks) or scattered, some entries past E (skipped).
std::vector<int32_t> draw_expert_map(const SweepCase& c);
// The case whose routing a layer runs: E * ep_ranks experts with an expert map (the
// gating logits, the correction bias, the skew and the ambiguity test span them), else c.
SweepCase routing_case(const SweepCase& c);
// inverse indices [T*K] of MoEPostPermuteFwd over P = T*K + tail rows: distinct rows, with
// -1, repeats and out-of-range values at the case's rates.
std::vector<int32_t> draw_inverse(const SweepCase& c);
// The skew bias -alpha*log(1 + rank) over a random ranking (empty unless kSkewed).
std::vector<float> skew_bias(const SweepCase& c);

// Whether FusedTopKFwd's choice for one token (logits[E], bias[E] or null) is decided by
// margins f32 arithmetic cannot blur: the group scores at the kept / dropped boundary and
// each adjacent pair of the K+1 best sel values of the kept experts are equal (the tie
// rule decides both sides alike) or apart by more than eps relative. Rows that are not
// are left out of the comparisons (a kernel in f32 may break a near-tie either way).
bool topk_row_unambiguous(const double* logits, const float* bias, const SweepCase& c,
                          double eps = 1e-5);

// Rows of a contiguous(alignment) buffer holding `counts` (+ tail) and the block ends.
int64_t contiguous_rows(const SweepCase& c, const std::vector<int64_t>& counts,
                        std::vector<int32_t>* ends);

}  // namespace moekit::sweep
