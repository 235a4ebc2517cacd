// Host side of the direct dense MLP: per-GEMM plan (k split over a cluster, k slice,
// tokens per tile) and the two launches. Kernel: direct_mlp_kernel.cuh.
#include <algorithm>

#include "core/pdl.h"
#include "gemm/direct_mlp.h"
#include "gemm/direct_mlp_kernel.cuh"
#include "gemm/sm90_device.h"
#include "gemm/streamk_mlp.h"
#include "moekit/error.h"

namespace moekit::detail {
namespace {

namespace dg = gemm::direct;

constexpr int kMaxDevices = 64;
constexpr int kMaxSmem = 200 * 1024;
constexpr int kSliceAlign = dg::kBatch * dg::kChunkK;  // whole load batches per slice

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

template <typename T, typename Mma, typename Out, int TN, bool kSilu>
void launch(const DirectGemmPlan& pl, const dg::Params& p, cudaStream_t stream) {
  auto kernel = dg::direct_gemm_kernel<T, Mma, Out, TN, kSilu>;
  static bool attr_set[kMaxDevices] = {};  // per instantiation and device (kMaxSmem)
  int device = 0;
  cudaGetDevice(&device);
  if (device < 0 || device >= kMaxDevices) device = 0;
  if (!attr_set[device]) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem) !=
        cudaSuccess)
      throw Error("moekit: direct MLP: cannot reserve its shared memory on this device");
    attr_set[device] = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(pl.split), static_cast<unsigned>(pl.row_groups));
  cfg.blockDim = dim3(dg::kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(pl.smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pl.split > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(pl.split);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (p.pdl != dg::kPdlNone) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  cudaLaunchKernelEx(&cfg, kernel, p);
}

template <typename T, typename Mma, typename Out, bool kSilu>
void launch_tn(const DirectGemmPlan& pl, const dg::Params& p, cudaStream_t stream) {
  if (pl.tn == 8)
    launch<T, Mma, Out, 8, kSilu>(pl, p, stream);
  else
    launch<T, Mma, Out, 32, kSilu>(pl, p, stream);
}

bool dims_fit(int64_t T, int64_t H, int64_t S) {
  constexpr int64_t kMaxDim = int64_t{1} << 30;
  return T >= 1 && T <= kDirectMlpMaxTokens && H >= 8 && S >= 8 && H <= kMaxDim && S <= kMaxDim &&
         H % 8 == 0 && S % 8 == 0;
}

}  // namespace

DirectGemmPlan direct_gemm_plan(int64_t T, int64_t n_out, int64_t k, bool silu, int sms) {
  DirectGemmPlan pl;
  pl.tn = T <= 8 ? 8 : 32;
  pl.row_groups = static_cast<int>(
      ceil_div(n_out, silu ? dg::cols_per_cta<true>() : dg::cols_per_cta<false>()));
  // Enough CTAs for ~2 per SM (the loads in flight that the memory's rate needs), a k
  // slice whose x fits the shared memory at 2-3 CTAs per SM, at most 8 ranks.
  const int64_t k_max = pl.tn == 8 ? 4096 : 1024;
  const int64_t want = std::max<int64_t>(ceil_div(k, k_max), ceil_div(2 * sms, pl.row_groups));
  int64_t split = std::clamp<int64_t>(want, 1, dg::kMaxSplit);
  const int64_t slice = ceil_div(ceil_div(k, split), kSliceAlign) * kSliceAlign;
  pl.split = static_cast<int>(ceil_div(k, slice));
  pl.k_slice = static_cast<int>(slice);
  pl.smem = pl.tn * (pl.k_slice + 8) * 2 + dg::kWarps * (pl.tn / 8) * 32 * 16;
  return pl;
}

bool direct_mlp_preferred(int64_t T, int64_t H, int64_t S) {
  const int forced = dense_mlp_forced_path();
  if (forced != 0) return forced == 3;
  return T <= kDirectMlpDefaultMaxTokens && 3 * H * S * 2 < kStreamkMlpMinWeightBytes;
}

bool direct_mlp_supported(DType dtype, int64_t T, int64_t H, int64_t S) {
  if ((dtype != DType::kBF16 && dtype != DType::kF16) || !dims_fit(T, H, S)) return false;
  const int sms = sm90_sm_count();
  if (sms == 0) return false;
  return direct_gemm_plan(T, S, H, true, sms).smem <= kMaxSmem &&
         direct_gemm_plan(T, H, S, false, sms).smem <= kMaxSmem;
}

void run_direct_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                    const void* w_gate_up, const void* w_down, void* act, void* out,
                    DType out_dtype, cudaStream_t stream) {
  if (!direct_mlp_supported(dtype, T, H, S))
    throw Error("moekit: direct MLP called for a shape or device it does not support");
  const int sms = sm90_sm_count();
  const bool pdl = pdl_enabled();
  const DirectGemmPlan up = direct_gemm_plan(T, S, H, true, sms);
  const DirectGemmPlan down = direct_gemm_plan(T, H, S, false, sms);
  dg::Params pu{x,
                w_gate_up,
                act,
                static_cast<int>(T),
                static_cast<int>(H),
                static_cast<int>(S),
                up.k_slice,
                up.k_slice + 8,
                pdl ? dg::kPdlFirst : dg::kPdlNone};
  dg::Params pd{act,
                w_down,
                out,
                static_cast<int>(T),
                static_cast<int>(S),
                static_cast<int>(H),
                down.k_slice,
                down.k_slice + 8,
                pdl ? dg::kPdlSecond : dg::kPdlNone};
  if (dtype == DType::kBF16) {
    launch_tn<__nv_bfloat16, gemm::MmaBF16, __nv_bfloat16, true>(up, pu, stream);
    if (out_dtype == DType::kF32)
      launch_tn<__nv_bfloat16, gemm::MmaBF16, float, false>(down, pd, stream);
    else
      launch_tn<__nv_bfloat16, gemm::MmaBF16, __nv_bfloat16, false>(down, pd, stream);
  } else {
    launch_tn<__half, gemm::MmaF16, __half, true>(up, pu, stream);
    if (out_dtype == DType::kF32)
      launch_tn<__half, gemm::MmaF16, float, false>(down, pd, stream);
    else
      launch_tn<__half, gemm::MmaF16, __half, false>(down, pd, stream);
  }
}

}  // namespace moekit::detail
