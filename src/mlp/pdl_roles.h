// A two-kernel dense MLP's PDL roles (the GEMV and direct kernels' Params::pdl): launched
// without PDL, gate_up (the first kernel, which triggers) or down (the second, which waits).
#pragma once

namespace moekit::detail::gemm::pdl_roles {

constexpr int kPdlNone = 0, kPdlFirst = 1, kPdlSecond = 2;

}  // namespace moekit::detail::gemm::pdl_roles
