// Internal entry to the grouped-GEMM engine, shared by the public GEMM ops and
// the MLP / MoE compositions (which need row structures the public op lacks,
// e.g. one dense group whose row count is only known on the host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/gemm.h"
#include "moekit/plan.h"
#include "moekit/tensor.h"

namespace moekit::detail {

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
  // The per-group counts come from top-k routing (the fused MoE layers): ragged and
  // skewed, so many groups run past the decode tile's 32 rows (each extra m-tile streams
  // the group's weights again) even at a low average. The planner then leaves the
  // decode tiles at a lower average (plan_gemm). The standalone ops cannot know.
  bool routed_counts = false;
  // Device scratch of kTileCounterBytes for the SM90 kernels' dynamic schedule (zeroed
  // on the stream by the launch that uses it); nullptr: static schedules only.
  unsigned* tile_counter = nullptr;
  // Weight-only FP8 (non-null b_scale): b is e4m3, row j of group g scaled by b_scale as
  // fp8_scale_index(b_scales, b rows, k) places it (per channel or per tensor); a and c bf16,
  // k % 16 == 0; decode_persistent only (docs/gemm.md "Weight-only FP8 decode tiles").
  const float* b_scale = nullptr;
  Fp8Scales b_scales = Fp8Scales::kPerChannel;
  // What runs (gemm_planner.h: plan_gemm, or a forced plan that gemm_plan_rejection
  // accepts): run_grouped_gemm launches exactly this.
  GemmPlan plan;
};

// Bytes of GroupedGemmProblem::tile_counter (one 32-bit counter, padded).
constexpr size_t kTileCounterBytes = 256;

// Groups kDecodePersistent's shared-memory group table holds.
constexpr int kGemmPersistentMaxGroups = 1024;

// Validates nothing but the plan (callers have): launches problem.plan on `stream`, or
// throws moekit::Error naming `op` when the plan cannot run the problem. m == 0 or n == 0
// is a no-op.
void run_grouped_gemm(const GroupedGemmProblem& problem, cudaStream_t stream,
                      const char* op = "moe_grouped_gemm");

// False when run_grouped_gemm(problem) launches nothing (no rows, n == 0, no groups).
bool grouped_gemm_launches(const GroupedGemmProblem& problem);

// Whether the mma.sync kernels' weight (b) loads of a problem whose b holds `b_bytes`
// carry an L2 evict-first policy: small decode GEMMs gain, multi-GB ones lose (docs/gemm.md,
// "L2 hints of b").
constexpr int64_t kEvictFirstMaxBBytes = int64_t{1} << 30;
inline bool gemm_b_evict_first(int64_t b_bytes) {
  return b_bytes <= kEvictFirstMaxBBytes;
}

// The SM90 expert-MLP chain (docs/gemm.md "The SM90 expert-MLP chain"): both GEMMs of an
// expert MLP (contiguous rows, gate_up with silu_and_mul into act, then down from act) in
// one persistent launch of sm90 or sm90_pairs tiles, where each down tile starts once its
// group's gate_up tiles are stored (MlpPath::kChain, gemm_planner.h run_mlp_gemms).
// Scratch: kSm90MlpChainScratchBytes of device memory (zeroed by the launch).
constexpr size_t kSm90MlpChainScratchBytes = 256 + 4 * 1024;

// Chain launches so far in this process (tests check that a case reached the chain).
int64_t sm90_mlp_chain_launches();

}  // namespace moekit::detail
