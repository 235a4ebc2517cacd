// The direct dense MLP (docs/dense-mlp.md "Direct dense MLP"): the two GEMMs of a gated MLP
// over T <= 32 tokens as two small-batch kernels that stream the weights straight into
// mma.sync registers (direct_mlp_kernel.cuh), chained with PDL. SharedExpertMLPFwd and
// the fused layer's shared expert take it where direct_mlp_supported() holds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "moekit/tensor.h"

namespace moekit::detail {

constexpr int64_t kDirectMlpMaxTokens = 32;

// bf16/f16, 1 <= T <= 32, H and S multiples of 8 in 1..2^30, the x slice of a cluster
// rank fits the shared memory, and the current device is an sm_90 part.
bool direct_mlp_supported(DType dtype, int64_t T, int64_t H, int64_t S);

// run_dense_mlp's choice: forced (dense_mlp_forced_path() == 3, src/gemm/streamk_mlp.h),
// or by default T <= kDirectMlpDefaultMaxTokens with < kStreamkMlpMinWeightBytes of
// weights. H200 (docs/dense-mlp.md "Direct dense MLP"): it won at one token on 47-88 MB
// MLPs (FusedMoESharedExpert glm45-t1 0.1442 -> 0.1351 ms, ds-v3-grouped-t1 0.2400 ->
// 0.2313) and, since its clusters fit one wave and its x reads are conflict-free, at 32
// tokens (SharedExpertMLP glm45-t32 0.02715 -> 0.02542 ms, ds-v3-t32 0.03767 ->
// 0.03730); it lost on kimi-k2's 793 MB (stream-K's).
constexpr int64_t kDirectMlpDefaultMaxTokens = kDirectMlpMaxTokens;
bool direct_mlp_preferred(int64_t T, int64_t H, int64_t S);

// act [T, S] (dtype) = silu(x w_gate_up[:S]^T) * (x w_gate_up[S:]^T); out [T, H] (dtype or
// f32) = act w_down^T. No workspace beyond act; x, weights, act and out 16-byte aligned.
void run_direct_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                    const void* w_gate_up, const void* w_down, void* act, void* out,
                    DType out_dtype, cudaStream_t stream);

// Test knob (not thread-safe): how both direct kernels load weights. 0 = the rule
// (paired lanes where the k slice is >= 1024, else single lanes with a 128-byte L2
// fetch; MOEKIT_DIRECT_PAIR / MOEKIT_DIRECT_L2FETCH override it), 1 = single lanes,
// 2 = paired lanes.
int& direct_mlp_load_mode_override();

// Test knob (not thread-safe): the form of the direct kernels' cluster sum (-1 = the
// default, push, or MOEKIT_DIRECT_REDUCE; 0 pull, 1 batched pull, 2 push:
// direct_mlp_kernel.cuh).
int& direct_mlp_reduce_override();

// Test knob (not thread-safe): the k split (1-8, portable clusters) forced on both direct
// GEMMs where its x slice fits (0 = MOEKIT_DIRECT_SPLIT_UP / _DOWN, else the plan).
int& direct_mlp_split_override();

// The k split (cluster size) and k slice one direct GEMM of n_out output columns over
// k uses (host plan; exposed for the tests). capacity(split, smem), when given, is the
// number of such clusters the device holds at once: the split shrinks until every row
// group's cluster fits in one wave (a second wave doubled the time: H200, ds-v3's
// 32-token gate_up at 8 ranks, 30 of 32 clusters resident, 34.9 us; at 7 ranks, 32 of
// 32, 24.7 us).
using ClusterCapacity = std::function<int(int split, int smem)>;
struct DirectGemmPlan {
  int split = 0, k_slice = 0, row_groups = 0, tn = 0, smem = 0;
};
// force_split > 0 (the MOEKIT_DIRECT_SPLIT_UP / _DOWN experiment knobs) takes that split
// as it is, whether its clusters fit one wave or not, unless its x slice would not fit
// the shared memory (then the plan is the unforced one).
DirectGemmPlan direct_gemm_plan(int64_t T, int64_t n_out, int64_t k, bool silu, int sms,
                                const ClusterCapacity& capacity = {}, int force_split = 0);

}  // namespace moekit::detail
