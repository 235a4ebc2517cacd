// The direct dense MLP (docs/dense-mlp.md "Direct dense MLP"): the two GEMMs of a gated MLP
// over T <= 32 tokens as two small-batch kernels that stream the weights straight into
// mma.sync registers (direct_mlp_kernel.cuh), chained with PDL. The dense-MLP planner
// (mlp_planner.h) picks it and its k splits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "core/device.h"
#include "moekit/tensor.h"

namespace moekit::detail {

constexpr int64_t kDirectMlpMaxTokens = 32;
constexpr int kDirectMlpMaxSplit = 8;  // ranks per cluster (portable clusters)

// bf16/f16, 1 <= T <= 32, H and S multiples of 8 in 1..2^30, the x slice of the planned
// cluster ranks fits the shared memory, and `device` is an sm_90 part.
bool direct_mlp_supported(DType dtype, int64_t T, int64_t H, int64_t S, const DeviceProps& device);

// One direct GEMM's launch shape: k split (cluster size), k slice, row groups (clusters),
// tokens per tile and shared memory per CTA.
struct DirectGemmPlan {
  int split = 0, k_slice = 0, row_groups = 0, tn = 0, smem = 0;
};
// The shared memory a direct kernel may take per CTA.
constexpr int kDirectMlpMaxSmem = 200 * 1024;

// Co-resident clusters of `split` CTAs with `smem` bytes each that the device holds at
// once (cudaOccupancyMaxActiveClusters of the kernel); empty: unknown.
using ClusterCapacity = std::function<int(int split, int smem)>;

// The k split one direct GEMM of n_out output columns over k picks: enough CTAs for ~2
// per SM, then the largest split at or below it whose clusters all fit the device at once
// (capacity; a cluster that waits for a second wave doubles the kernel's time:
// docs/dense-mlp.md "Direct dense MLP").
DirectGemmPlan direct_gemm_plan(int64_t T, int64_t n_out, int64_t k, bool silu, int sms,
                                const ClusterCapacity& capacity = {});
// The launch shape of a given split (1..8); its .split differs from `split` when some
// rank would get no k.
DirectGemmPlan direct_gemm_plan_for_split(int64_t T, int64_t n_out, int64_t k, bool silu,
                                          int split);

// The current device's cluster capacity of the direct kernel of (dtype, out_dtype, silu)
// at T tokens (queried once per device, split and shared size).
ClusterCapacity direct_cluster_capacity(DType dtype, DType out_dtype, int64_t T, bool silu);

// act [T, S] (dtype) = silu(x w_gate_up[:S]^T) * (x w_gate_up[S:]^T) with a k split of
// split_gate_up; out [T, H] (dtype or f32) = act w_down^T with split_down. No workspace
// beyond act; x, weights, act and out 16-byte aligned. The splits come from a plan the
// planner accepted (direct_gemm_plan_for_split(...).split == split, smem fits).
void run_direct_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                    const void* w_gate_up, const void* w_down, void* act, void* out,
                    DType out_dtype, int split_gate_up, int split_down, cudaStream_t stream);

}  // namespace moekit::detail
