// The current device's SM count when it is an sm_90 part (the hand-written Hopper
// kernels are built for sm_90a only), else 0; cached per device.
#pragma once

#include <cuda_runtime_api.h>

namespace moekit::detail {

int sm90_sm_count();

// Test knob (not thread-safe): 0 = the rule / the environment, 1 = fully dynamic wherever a
// counter is given (configs 2 and 6, any rows), 2 = static, 3 = the last wave dynamic.
int& sm90_dynamic_override();

// Trailing waves an unpaired SM90 launch hands out dynamically, given a counter (docs/gemm.md
// "Dynamic schedule"): -1 = none (the static walk), kSm90DynamicAll = every tile after each
// block's first. The rule: config 2 (128-row tiles) on grouped rows all, where the tiles that
// share an operand need no lockstep to find it in the L2 (H200: ds-v3-prefill-mlp-up
// -2.5-3.5%); dense rows static; config 6 (64-row tiles: fully dynamic lost 20-35%, its
// neighbouring blocks find the b tiles they share in the L2 only in lockstep) static, or
// its last MOEKIT_SM90_DYNAMIC_TAIL waves (a measurement knob: the imbalance sits at the
// end). MOEKIT_SM90_DYNAMIC = 0 (static) | 1 (all, everywhere) overrides the rule; the test
// knob overrides both.
constexpr int kSm90DynamicAll = 1 << 20;
int sm90_dynamic_waves(bool pingpong, bool dense_rows);

// Whether the expert-MLP paths (MoEExpertMLPFwd, the fused layers' permuted path) hand
// their GEMMs the tile counters they carve (then the rule above decides): yes unless
// MOEKIT_SM90_DYNAMIC_MLP=0. Their routed decode / t512 GEMMs pick config 2, which the rule
// makes dynamic: H200 (session 9) FusedMoE qwen3-235b-decode -3%, ds-v3-grouped-decode and
// the t512 shared-expert rows -2 to -3%, the other rows within the spread.
bool sm90_dynamic_mlp();

// The counter for one launch: `counter` zeroed on `stream` when sm90_dynamic_waves says so
// (*waves = its answer), else nullptr (*waves = -1). Throws moekit::Error naming `op` when
// the zeroing fails.
unsigned* sm90_tile_counter(unsigned* counter, bool pingpong, bool dense_rows, cudaStream_t stream,
                            const char* op, int* waves);

}  // namespace moekit::detail
