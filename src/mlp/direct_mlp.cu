// Host side of the direct dense MLP: per-GEMM plan (k split over a cluster, k slice,
// tokens per tile) and the two launches. Kernel: direct_mlp_kernel.cuh.
#include <algorithm>
#include <type_traits>

#include "core/dtype_dispatch.h"
#include "core/kernel_launch.h"
#include "core/pdl.h"
#include "mlp/direct_mlp.h"
#include "mlp/direct_mlp_kernel.cuh"
#include "moekit/error.h"

namespace moekit::detail {
namespace {

namespace dg = gemm::direct;

constexpr int kSliceAlign = dg::kBatch * dg::kChunkK;  // whole load batches per slice
static_assert(dg::kMaxSplit == kDirectMlpMaxSplit, "one cluster limit");

// The mma.sync instruction of an element type.
template <typename E>
using MmaOf = std::conditional_t<std::is_same_v<E, __half>, gemm::MmaF16, gemm::MmaBF16>;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Kernel, its shared-memory limit raised (once per device).
template <auto Kernel>
const void* with_smem_limit() {
  if (raise_smem_limit<Kernel>(kDirectMlpMaxSmem) != cudaSuccess)
    throw Error("moekit: direct MLP: cannot reserve its shared memory on this device");
  return reinterpret_cast<const void*>(Kernel);
}

// The kernel of a plan's tile width, its shared-memory limit raised.
template <typename T, typename Mma, typename Out, bool kSilu>
const void* prepared_kernel(int tn) {
  return tn == 8 ? with_smem_limit<dg::direct_gemm_kernel<T, Mma, Out, 8, kSilu>>()
                 : with_smem_limit<dg::direct_gemm_kernel<T, Mma, Out, 32, kSilu>>();
}

// How the direct kernels load weight lines: paired lanes (a warp instruction reads 4 whole
// 128-byte lines, not 16 halves) where a CTA's k slice is >= 1024, else single lanes with a
// 128-byte L2 fetch (docs/dense-mlp.md "Direct dense MLP").
constexpr int kPairMinSlice = 1024;

template <typename E, typename Mma, typename Out, bool kSilu>
ClusterCapacity typed_capacity(int64_t T) {
  const int tn = T <= 8 ? 8 : 32;
  return [tn](int split, int smem) {
    return co_resident_clusters(prepared_kernel<E, Mma, Out, kSilu>(tn), split, dg::kThreads,
                                static_cast<size_t>(smem));
  };
}

void launch(const void* kernel, const DirectGemmPlan& pl, const dg::Params& p,
            cudaStream_t stream) {
  LaunchConfig config(dim3(static_cast<unsigned>(pl.split), static_cast<unsigned>(pl.row_groups)),
                      dim3(dg::kThreads), static_cast<size_t>(pl.smem), stream);
  if (pl.split > 1) config.cluster(pl.split);
  if (p.pdl != dg::kPdlNone) config.pdl();
  const cudaLaunchConfig_t cfg = config.config();
  void* args[] = {const_cast<dg::Params*>(&p)};
  cudaLaunchKernelExC(&cfg, kernel, args);
}

bool dims_fit(int64_t T, int64_t H, int64_t S) {
  constexpr int64_t kMaxDim = int64_t{1} << 30;
  return T >= 1 && T <= kDirectMlpMaxTokens && H >= 8 && S >= 8 && H <= kMaxDim && S <= kMaxDim &&
         H % 8 == 0 && S % 8 == 0;
}

}  // namespace

DirectGemmPlan direct_gemm_plan_for_split(int64_t T, int64_t n_out, int64_t k, bool silu,
                                          int split) {
  DirectGemmPlan pl;
  pl.tn = T <= 8 ? 8 : 32;
  pl.row_groups = static_cast<int>(
      ceil_div(n_out, silu ? dg::cols_per_cta<true>() : dg::cols_per_cta<false>()));
  const int64_t want = std::clamp<int64_t>(split, 1, dg::kMaxSplit);
  const int64_t slice = ceil_div(ceil_div(k, want), kSliceAlign) * kSliceAlign;
  pl.split = static_cast<int>(ceil_div(k, slice));
  pl.k_slice = static_cast<int>(slice);
  pl.smem =
      pl.tn * (pl.k_slice + dg::kXPad) * 2 + dg::reduce_slots(pl.split) * (pl.tn / 8) * 32 * 16;
  return pl;
}

DirectGemmPlan direct_gemm_plan(int64_t T, int64_t n_out, int64_t k, bool silu, int sms,
                                const ClusterCapacity& capacity) {
  // Enough CTAs for ~2 per SM (the loads in flight that the memory's rate needs), a k
  // slice whose x fits the shared memory at 2-3 CTAs per SM, at most 8 ranks.
  const int tn = T <= 8 ? 8 : 32;
  const int64_t k_max = tn == 8 ? 4096 : 1024;
  const int64_t row_groups =
      ceil_div(n_out, silu ? dg::cols_per_cta<true>() : dg::cols_per_cta<false>());
  const int64_t want =
      std::max<int64_t>(ceil_div(k, k_max), ceil_div(2 * int64_t{sms}, row_groups));
  const DirectGemmPlan first =
      direct_gemm_plan_for_split(T, n_out, k, silu, static_cast<int>(std::min<int64_t>(want, 64)));
  if (!capacity) return first;
  // Then the largest split at or below it whose clusters all fit at once, if any does (one
  // CTA is no cluster: any number of them queue behind each other).
  for (int s = first.split; s >= 1; --s) {
    const DirectGemmPlan pl = direct_gemm_plan_for_split(T, n_out, k, silu, s);
    if (pl.split == s && pl.smem <= kDirectMlpMaxSmem &&
        (s == 1 || capacity(s, pl.smem) >= pl.row_groups))
      return pl;
  }
  return first;
}

bool direct_mlp_supported(DType dtype, int64_t T, int64_t H, int64_t S, const DeviceProps& device) {
  if ((dtype != DType::kBF16 && dtype != DType::kF16) || !dims_fit(T, H, S) || !device.sm90())
    return false;
  return direct_gemm_plan(T, S, H, true, device.sms).smem <= kDirectMlpMaxSmem &&
         direct_gemm_plan(T, H, S, false, device.sms).smem <= kDirectMlpMaxSmem;
}

ClusterCapacity direct_cluster_capacity(DType dtype, DType out_dtype, int64_t T, bool silu) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return {};  // no direct MLP: unknown
  return dispatch_in_out(dtype, out_dtype, "direct_mlp", [&](auto in_type, auto out_type) {
    using E = typename decltype(in_type)::type;
    if (silu) return typed_capacity<E, MmaOf<E>, E, true>(T);
    return typed_capacity<E, MmaOf<E>, typename decltype(out_type)::type, false>(T);
  });
}

namespace {

// out [T, n_out] = x [T, K] w [rows, K]^T under plan pl.
dg::Params gemm_params(const void* x, const void* w, void* out, int64_t T, int64_t K, int64_t n_out,
                       const DirectGemmPlan& pl, int pdl) {
  return {x,
          w,
          out,
          static_cast<int>(T),
          static_cast<int>(K),
          static_cast<int>(n_out),
          pl.k_slice,
          pl.k_slice + dg::kXPad,
          pdl,
          pl.k_slice >= kPairMinSlice};
}

template <typename E, typename Mma, typename Out>
void run_typed(const void* x, int64_t T, int64_t H, int64_t S, const void* w_gate_up,
               const void* w_down, void* act, void* out, int split_gate_up, int split_down,
               cudaStream_t stream) {
  const bool pdl = pdl_enabled();
  const DirectGemmPlan up = direct_gemm_plan_for_split(T, S, H, true, split_gate_up);
  const DirectGemmPlan down = direct_gemm_plan_for_split(T, H, S, false, split_down);
  const dg::Params pu =
      gemm_params(x, w_gate_up, act, T, H, S, up, pdl ? dg::kPdlFirst : dg::kPdlNone);
  const dg::Params pd =
      gemm_params(act, w_down, out, T, S, H, down, pdl ? dg::kPdlSecond : dg::kPdlNone);
  launch(prepared_kernel<E, Mma, E, true>(up.tn), up, pu, stream);
  launch(prepared_kernel<E, Mma, Out, false>(down.tn), down, pd, stream);
}

}  // namespace

void run_direct_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                    const void* w_gate_up, const void* w_down, void* act, void* out,
                    DType out_dtype, int split_gate_up, int split_down, cudaStream_t stream) {
  if (!direct_mlp_supported(dtype, T, H, S, device_props()))
    throw Error("moekit: direct MLP called for a shape or device it does not support");
  dispatch_in_out(dtype, out_dtype, "direct_mlp", [&](auto in_type, auto out_type) {
    using E = typename decltype(in_type)::type;
    run_typed<E, MmaOf<E>, typename decltype(out_type)::type>(
        x, T, H, S, w_gate_up, w_down, act, out, split_gate_up, split_down, stream);
  });
}

}  // namespace moekit::detail
