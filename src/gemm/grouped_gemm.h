// Internal entry to the grouped-GEMM engine, shared by the public GEMM ops and
// the MLP / MoE compositions (which need row structures the public op lacks,
// e.g. one dense group whose row count is only known on the host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/gemm.h"
#include "moekit/tensor.h"

namespace moekit::detail {

// Programmatic dependent launch (PDL) between the two GEMMs of an MLP (docs/gemm.md
// "PDL chain of an MLP's GEMMs"). Set only by run_grouped_gemm_pair.
enum class GemmPdl : int {
  kNone = 0,  // a plain launch: no attribute, no griddepcontrol (today's kernels)
  // The chain's first GEMM: launched with the PDL attribute, griddepcontrol.wait before
  // any global access, launch_dependents once its mainloop's last loads are issued.
  kFirst = 1,
  // The chain's second GEMM, launched with the PDL attribute right after a kFirst GEMM
  // on the same stream: issues its first b (weight) stages, then waits for the first
  // GEMM, then loads a. The first GEMM must not write this one's b or metadata.
  kSecond = 2,
};

enum class GemmRows {
  kContiguous,  // a [P, k]: group g owns rows [align_up(end[g-1], alignment), end[g])
  kMasked,      // a [G, max_m, k]: group g owns rows [0, count[g]) of its slab
  kDense,       // a [m, k] with one group (num_groups == 1): all m rows
};

// c[row, :] = act(a[row, :] . b[g]^T) for every row of every group g.
// b is [G, n, k] ([G, 2n, k] gate rows then up rows for kSiluAndMul).
// Accumulates in f32; c is in out_dtype (== in_dtype, or f32). Rows outside
// every group are never written. All pointers are device pointers.
struct GroupedGemmProblem {
  DType in_dtype = DType::kBF16;  // bf16 or f16 (a and b)
  DType out_dtype = DType::kBF16;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int num_groups = 1;
  int64_t n = 0;  // output columns
  int64_t k = 0;  // reduction length
  Activation activation = Activation::kNone;
  GemmRows rows = GemmRows::kDense;
  const int32_t* layout_metadata = nullptr;  // device [G]: contiguous ends or masked counts
  int alignment = 1;                         // kContiguous
  int64_t max_m = 0;                         // kMasked
  int64_t m = 0;                             // kContiguous: P (rows allocated); kDense: rows
  // Kernel configuration: -1 = heuristic (docs/gemm.md), else a GemmConfig value
  // (forces one; tests use this to cover every config the heuristic can pick).
  int config = -1;
  // kGemmConfigDecodeSplitK: CTAs (one thread-block cluster) per output tile, clamped
  // to 1..8 (any cluster size); 0 = the heuristic's split (src/gemm/split_k.h).
  // kGemmConfigDecodeStream / kGemmConfigDecodeStreamDeep: >= 2 runs those tiles split
  // the same way (a measured variant, not picked by the heuristic); 0 or 1: unsplit.
  int split_k = 0;
  // The per-group counts come from top-k routing (the fused MoE layers): ragged and
  // skewed, so many groups run past the decode tile's 32 rows (each extra m-tile streams
  // the group's weights again) even at a low average. The heuristic then leaves the
  // decode tiles at a lower average (docs/gemm.md). The standalone ops cannot know.
  bool routed_counts = false;
  // PDL role (run_grouped_gemm_pair sets it); kNone everywhere else. Configs without a
  // PDL variant (1, 2, 6; 5 split) launch plainly whatever it says.
  GemmPdl pdl = GemmPdl::kNone;
  // Device scratch of kTileCounterBytes for the SM90 kernels' dynamic schedule (zeroed
  // on the stream by the launch that uses it); nullptr: static schedules only.
  unsigned* tile_counter = nullptr;
};

// Bytes of GroupedGemmProblem::tile_counter (one 32-bit counter, padded).
constexpr size_t kTileCounterBytes = 256;

// The tile configurations of the bf16/f16 engine (docs/gemm.md).
enum GemmConfig : int {
  kGemmConfigDecode = 0,   // 32x128 tiles, 4 warps: few rows per group, streams b
  kGemmConfigPrefill = 1,  // 128x128 tiles, 4 warps, 2 blocks per SM: many rows per group
  // Hopper TMA + wgmma, warp-specialized, persistent; 128x256 tiles (docs/gemm.md
  // "SM90 engine"). The heuristic's choice for many rows per group (in place of 1).
  kGemmConfigSm90 = 2,
  // Decode tiles with split-K over a thread-block cluster, reduced in a fixed order
  // through distributed shared memory: the heuristic's choice when the decode tiles
  // cannot fill the SMs (dense MLP at few tokens, few experts). docs/gemm.md.
  kGemmConfigDecodeSplitK = 3,
  // Decode tiles streaming 256 bytes of each weight row per stage (fewer DRAM page
  // switches): 2 stages, 2 blocks per SM; the heuristic's choice for big decode GEMMs.
  kGemmConfigDecodeStream = 4,
  // The same with 5 stages, 1 block per SM: big decode GEMMs with k >= 4096.
  kGemmConfigDecodeStreamDeep = 5,
  // Config 2's ping-pong variant: two consumer warpgroups, each a whole 64x256 tile, one's
  // epilogue overlapping the other's mainloop (docs/gemm.md "SM90 ping-pong"): the
  // heuristic's pick for grouped many-row GEMMs with silu_and_mul or k <= 2048.
  kGemmConfigSm90Pingpong = 6,
  // Paired SM90 configs: 2-CTA clusters whose CTAs take two tiles that share an operand
  // and load it once, multicast to both (less L2 -> SM traffic, the limit of the
  // many-row GEMMs on the H200: docs/gemm.md "Paired SM90 configs"). 7: config 2's
  // 128x256 tiles on n-tile pairs (a multicast); 8: config 6's 64x256 ping-pong tiles on
  // m-tile pairs (b multicast).
  kGemmConfigSm90PairN = 7,
  kGemmConfigSm90PingpongPairM = 8,
  // Config 4's stream tiles on a persistent grid (2 CTAs per SM walking the tiles, the
  // group table built once per CTA, one cp.async stream over all of a CTA's tiles):
  // docs/gemm.md "Persistent decode tiles". The heuristic's pick for short-k grouped
  // decode GEMMs; k == 0 or more than kGemmPersistentMaxGroups groups run config 4.
  kGemmConfigDecodePersistent = 9,
  // Config 2's 128x256 tiles on m-tile pairs of a 2-CTA cluster (b multicast: a third
  // less L2 -> SM traffic than config 2 where a group has >= 256 rows): docs/gemm.md
  // "Paired SM90 configs". Not picked by the heuristic.
  kGemmConfigSm90PairM = 10,
  // Adaptive pairs: config 10's m-tile pairs (b multicast) for each group's m-tiles two by
  // two, config 7's n-tile pairs (a multicast) for an odd last m-tile, so ragged groups
  // waste no half pair: docs/gemm.md "Paired SM90 configs and adaptive pairs".
  kGemmConfigSm90PairAuto = 11,
  // Config 4's 256-byte stages on 32 x 64 tiles, 3 stages, 3 blocks per SM: twice the
  // tiles and twice the weight bytes in flight per tile of config 4; the heuristic's pick
  // for standalone contiguous GEMMs under 4 waves at k <= 2048 (docs/gemm.md "Narrow
  // stream tiles").
  kGemmConfigDecodeStreamNarrow = 12,
  kGemmConfigCount = 13,
};

// Groups config 9's shared-memory group table holds.
constexpr int kGemmPersistentMaxGroups = 1024;

// The config run_grouped_gemm would pick for `problem` (problem.config, else the
// MOEKIT_GEMM_CONFIG environment variable, else the heuristic).
int select_grouped_gemm_config(const GroupedGemmProblem& problem);

// Validates nothing (callers have); launches on `stream`. m == 0 or n == 0 is a no-op.
void run_grouped_gemm(const GroupedGemmProblem& problem, cudaStream_t stream);

// False when run_grouped_gemm(problem) launches nothing (no rows, n == 0, no groups).
bool grouped_gemm_launches(const GroupedGemmProblem& problem);

// Whether the mma.sync configs' weight (b) loads of a problem whose b holds `b_bytes`
// carry an L2 evict-first policy: by default when b_bytes <= kEvictFirstMaxBBytes (small
// decode GEMMs gained 1-11% on the H200, the multi-GB ones lost 1-2%: docs/gemm.md "L2
// policy of streamed weights"); MOEKIT_GEMM_B_HINT=0 / 1 (read once) forces it off / on.
constexpr int64_t kEvictFirstMaxBBytes = int64_t{1} << 30;
bool gemm_b_evict_first(int64_t b_bytes);

// The MLP GEMMs' PDL chain: on only where gemm_pdl_override() says 1 (tests and timing
// runs; it gained nothing on the H200). Off by default; no environment switch.
bool gemm_pdl_enabled();
// Test knob (not thread-safe): 0 = default (off), 1 = on, 2 = off.
int& gemm_pdl_override();

// True when run_grouped_gemm_pair runs (first, second) as a PDL chain: gemm_pdl_enabled(),
// both launch, bf16/f16 in, first's out in its in dtype, second's in it or f32, both
// take a decode-regime mma.sync config (0, 3, 4, or 5 unsplit), and the pair does not run
// as the SM90 expert-MLP chain (sm90_mlp_chain_applies).
bool gemm_pdl_chain(const GroupedGemmProblem& first, const GroupedGemmProblem& second);

// Config 2's tile width (b rows per tile: 256, 224 (no silu) or 192) for `problem`: the
// test override (0 = none), else MOEKIT_SM90_BN, else sm90::dense_tile_n for dense rows
// (wave quantization; sm90_tile_math.h) and 256 for grouped rows. A width the problem
// cannot take (224 with silu, anything else) is ignored.
int& sm90_tile_n_override();
int sm90_tile_n(const GroupedGemmProblem& problem);

// Test knob of the MLP paths (not thread-safe): configs and splits forced on the GEMMs
// that run_grouped_gemm_pair runs (where the problem leaves them to the heuristic);
// config -1 = the heuristic. Lets GPU tests run every config through the MLP ops; seeded
// from MOEKIT_MLP_GEMM_CONFIGS=FIRST,SECOND (a measurement knob, docs/bench.md).
struct MlpGemmForce {
  int first_config = -1, first_split = 0;
  int second_config = -1, second_split = 0;
};
MlpGemmForce& mlp_gemm_force_override();

// first, then second, on `stream` (the two GEMMs of an MLP: second reads what first
// writes). As a PDL chain (first kFirst, second kSecond) when gemm_pdl_chain(), else
// two plain launches, exactly as two run_grouped_gemm calls. `first` must not write
// second's b or layout metadata (weights and routing metadata never are).
void run_grouped_gemm_pair(GroupedGemmProblem first, GroupedGemmProblem second,
                           cudaStream_t stream);

// The SM90 expert-MLP chain (docs/gemm.md "SM90 expert-MLP chain"): both GEMMs of an
// expert MLP (contiguous rows, gate_up with silu_and_mul into act, then down from act) in
// one persistent launch of config 2's tiles, where each down tile starts once its group's
// gate_up tiles are stored. Scratch: kSm90MlpChainScratchBytes of device memory (zeroed
// by the launch).
constexpr size_t kSm90MlpChainScratchBytes = 256 + 4 * 1024;

// Test knob (not thread-safe): 0 = the rule below, 1 = wherever the chain can run (any
// config the GEMMs would pick), 2 = never.
int& sm90_mlp_chain_override();

// Whether run_sm90_mlp_chain would run (up, down) as one launch: the GPU is an sm_90 part,
// MOEKIT_SM90_CHAIN is not 0, bf16/f16 in and out in the same dtype, contiguous rows of
// the same groups (<= 1024), both launch with k > 0, both would run config 2 with 256-wide
// tiles (the heuristic's pick or forced by mlp_gemm_force_override) or the heuristic gives
// both config 11 (a forced 11 runs as two launches; the override's 1 skips all this), and
// the counts and bounds fit its 32-bit tile ids.
bool sm90_mlp_chain_applies(const GroupedGemmProblem& up, const GroupedGemmProblem& down);
// The same without the device check (CPU-testable).
bool sm90_mlp_chain_rule(const GroupedGemmProblem& up, const GroupedGemmProblem& down);
// Whether the chain runs config 11's pair tiles (the knob below on, and both GEMMs would run
// config 11), else config 2's.
bool sm90_mlp_chain_pairs(const GroupedGemmProblem& up, const GroupedGemmProblem& down);
// Tests' knob for the chain on config 11's pair tiles (on by default; MOEKIT_SM90_CHAIN_PAIRS=0
// turns it off): 0 = the environment, 1 = on, 2 = off.
int& sm90_mlp_chain_pairs_override();

// Runs (up, down) as the chain when sm90_mlp_chain_applies and scratch is given; returns
// whether it did (else the caller runs run_grouped_gemm_pair).
bool run_sm90_mlp_chain(const GroupedGemmProblem& up, const GroupedGemmProblem& down, void* scratch,
                        cudaStream_t stream);

// Chain launches so far in this process (tests check that a case reached the chain).
int64_t sm90_mlp_chain_launches();

}  // namespace moekit::detail
