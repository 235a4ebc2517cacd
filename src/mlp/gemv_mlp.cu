// Host side of the one-token dense MLP: grid size and the two PDL-chained launches.
// Kernel: gemv_mlp_kernel.cuh.
#include <algorithm>

#include "core/check.h"
#include "core/dtype_dispatch.h"
#include "core/kernel_launch.h"
#include "core/pdl.cuh"
#include "mlp/gemv_mlp.h"
#include "mlp/gemv_mlp_kernel.cuh"
#include "moekit/error.h"

namespace moekit::detail {
namespace {

namespace gv = gemm::gemv;

constexpr int64_t kMaxSmem = 200 * 1024;  // the staged x / h row

bool dims_fit(int64_t T, int64_t H, int64_t S) {
  return T == 1 && H >= 8 && S >= 8 && H % 8 == 0 && S % 8 == 0 && 2 * H <= kMaxSmem &&
         2 * S <= kMaxSmem;
}

// out [n_out] = x [K] . w^T: one CTA per column at a time, as many CTAs as fit at once.
template <typename E, typename Out, bool kSilu>
void launch_gemv(const void* x, const void* w, void* out, int64_t K, int64_t n_out, int pdl,
                 cudaStream_t stream) {
  constexpr auto kernel = gv::gemv_kernel<E, Out, kSilu>;
  if (raise_smem_limit<kernel>(static_cast<int>(kMaxSmem)) != cudaSuccess)
    throw Error("moekit: GEMV MLP: cannot reserve its shared memory on this device");
  const int smem = static_cast<int>(2 * K);
  const int64_t resident =
      int64_t{device_props().sms} *
      blocks_per_sm(reinterpret_cast<const void*>(kernel), gv::kThreads, static_cast<size_t>(smem));
  const int grid = static_cast<int>(std::min(n_out, std::max<int64_t>(resident, 1)));
  const gv::Params p{x, w, out, static_cast<int>(K), static_cast<int>(n_out), pdl};
  launch_pdl(kernel, dim3(grid), dim3(gv::kThreads), static_cast<size_t>(smem), stream, p);
  check_launch("shared_expert_mlp (GEMV)");
}

template <typename E, typename Out>
void run_typed(const void* x, int64_t H, int64_t S, const void* w_gate_up, const void* w_down,
               void* act, void* out, cudaStream_t stream) {
  const bool pdl = pdl_enabled();
  launch_gemv<E, E, true>(x, w_gate_up, act, H, S, pdl ? gv::kPdlFirst : gv::kPdlNone, stream);
  launch_gemv<E, Out, false>(act, w_down, out, S, H, pdl ? gv::kPdlSecond : gv::kPdlNone, stream);
}

}  // namespace

bool gemv_mlp_supported(DType dtype, int64_t T, int64_t H, int64_t S, const DeviceProps& device) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) && dims_fit(T, H, S) && device.sm90();
}

void run_gemv_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                  const void* w_gate_up, const void* w_down, void* act, void* out, DType out_dtype,
                  cudaStream_t stream) {
  if (!gemv_mlp_supported(dtype, T, H, S, device_props()))
    throw Error("moekit: GEMV MLP called for a shape or device it does not support");
  dispatch_in_out(dtype, out_dtype, "gemv_mlp", [&](auto in_type, auto out_type) {
    run_typed<typename decltype(in_type)::type, typename decltype(out_type)::type>(
        x, H, S, w_gate_up, w_down, act, out, stream);
  });
}

}  // namespace moekit::detail
