// The current device's SM count when it is an sm_90 part (the hand-written Hopper
// kernels are built for sm_90a only), else 0; cached per device.
#pragma once

#include <cuda_runtime_api.h>

namespace moekit::detail {

int sm90_sm_count();

// Test knob (not thread-safe): 0 = MOEKIT_SM90_DYNAMIC decides, 1 = dynamic, 2 = static.
int& sm90_dynamic_override();

// Experiment (MOEKIT_SM90_DYNAMIC=1, read once): a tile counter for the SM90 kernels'
// dynamic schedule, zeroed on `stream` (cudaMemsetAsync) and ready for one launch; taken
// round-robin from a per-device pool of 1024 (allocated on first use). nullptr when the
// knob is off or on failure (the static schedule).
unsigned* sm90_dynamic_tile_counter(cudaStream_t stream);

}  // namespace moekit::detail
