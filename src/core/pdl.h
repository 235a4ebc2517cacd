// Programmatic Dependent Launch (PDL): the host-side switch. Device helpers and the
// launch helper are in core/pdl.cuh.
#pragma once

namespace moekit::detail {

// True when kernels launched through launch_pdl() carry the PDL attribute: on by
// default, off with MOEKIT_PDL=0 in the environment (read once), or as the override says.
bool pdl_enabled();

// Test knob (not thread-safe): 0 = default (the environment), 1 = on, 2 = off.
int& pdl_override();

}  // namespace moekit::detail
