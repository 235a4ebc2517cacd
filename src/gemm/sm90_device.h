// The current device's SM count when it is an sm_90 part (the hand-written Hopper
// kernels are built for sm_90a only), else 0; cached per device.
#pragma once

namespace moekit::detail {

int sm90_sm_count();

}  // namespace moekit::detail
