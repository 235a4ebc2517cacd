// The current device's SM count when it is an sm_90 part (the hand-written Hopper
// kernels are built for sm_90a only), else 0; cached per device.
#pragma once

#include <cuda_runtime_api.h>

namespace moekit::detail {

int sm90_sm_count();

// Test knob (not thread-safe): 0 = the rule / MOEKIT_SM90_DYNAMIC, 1 = dynamic wherever a
// counter is given (configs 2 and 6, any rows), 2 = static.
int& sm90_dynamic_override();

// Whether an unpaired SM90 launch takes the dynamic schedule (docs/gemm.md "Dynamic
// schedule"), given a counter: the rule is config 2 (128-row tiles) on grouped rows,
// where the tiles that share an operand need no lockstep to find it in the L2 (H200:
// ds-v3-prefill-mlp-up -2.5%); config 6's 64-row tiles and dense rows stay static (their
// neighbouring blocks read the same b / a rows at the same time only in lockstep:
// dynamic ping-pong was 25-30% slower). MOEKIT_SM90_DYNAMIC = 0 (never) | 1 (wherever a
// counter is given) overrides the rule; the test knob overrides both.
bool sm90_use_dynamic(bool pingpong, bool dense_rows);

// The counter for one launch: `counter` zeroed on `stream` when sm90_use_dynamic says so,
// else nullptr. Throws moekit::Error naming `op` when the zeroing fails.
unsigned* sm90_tile_counter(unsigned* counter, bool pingpong, bool dense_rows, cudaStream_t stream,
                            const char* op);

}  // namespace moekit::detail
