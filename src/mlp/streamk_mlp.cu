// Host side of the stream-K dense MLP: plan (tiles, grid, scratch), TMA descriptors,
// cooperative launch. Kernel: streamk_mlp_kernel.cuh.
#include <string>
#include <type_traits>

#include "core/dtype_dispatch.h"
#include "core/kernel_launch.h"
#include "gemm/common/tma_desc.h"
#include "mlp/streamk_mlp.h"
#include "mlp/streamk_mlp_kernel.cuh"
#include "moekit/error.h"

namespace moekit::detail {
namespace {

namespace sk = gemm::streamk;

int tokens_per_tile(int64_t T) {
  return T <= 16 ? 16 : (T <= 32 ? 32 : 64);
}

struct Plan {
  int grid = 0, tn = 0;
  sk::Params p{};
  size_t counter_bytes = 0, partial_bytes = 0;
};

// The scratch is sized for one CTA per SM (`sms`); a launch may use fewer (`grid`).
Plan make_plan(int64_t T, int64_t H, int64_t S, int sms, int grid) {
  Plan pl;
  pl.grid = grid;
  pl.tn = tokens_per_tile(T);
  pl.p.T = static_cast<int>(T);
  pl.p.H = static_cast<int>(H);
  pl.p.S = static_cast<int>(S);
  pl.p.tiles1 = static_cast<int>((S + sk::kGateCols - 1) / sk::kGateCols);
  pl.p.iters1 = static_cast<int>((H + sk::kStageK - 1) / sk::kStageK);
  pl.p.tiles2 = static_cast<int>((H + sk::kTileRows - 1) / sk::kTileRows);
  pl.p.iters2 = static_cast<int>((S + sk::kStageK - 1) / sk::kStageK);
  pl.counter_bytes = (static_cast<size_t>(pl.p.tiles1 + pl.p.tiles2 + 1) * 4 + 255) / 256 * 256;
  pl.partial_bytes = static_cast<size_t>(2) * sms * 2 * sk::kTileRows * pl.tn * 4;
  return pl;
}

bool shape_fits(DType dtype, int64_t T, int64_t H, int64_t S) {
  constexpr int64_t kMaxDim = int64_t{1} << 30;  // iteration counts stay in int
  return (dtype == DType::kBF16 || dtype == DType::kF16) && T >= 1 && T <= kStreamkMlpMaxTokens &&
         H >= 1 && S >= 1 && H <= kMaxDim && S <= kMaxDim &&
         ((H + sk::kStageK - 1) / sk::kStageK) * ((S + sk::kGateCols - 1) / sk::kGateCols) <=
             kMaxDim &&
         ((S + sk::kStageK - 1) / sk::kStageK) * ((H + sk::kTileRows - 1) / sk::kTileRows) <=
             kMaxDim;
}

template <typename T, typename Mma, int TN>
void launch(const Plan& pl, const void* x, const void* w_gate_up, const void* w_down,
            cudaStream_t stream) {
  using L = sk::Layout<TN>;
  constexpr auto kernel = sk::streamk_mlp_kernel<T, Mma, TN>;
  const cudaError_t smem_err = raise_smem_limit<kernel>(L::kSmemBytes);
  if (smem_err != cudaSuccess) {
    throw Error("moekit: stream-K MLP: cannot reserve " + std::to_string(L::kSmemBytes) +
                " bytes of shared memory: " + cudaGetErrorString(smem_err));
  }
  const sk::Params& p = pl.p;
  const char* w = static_cast<const char*>(w_gate_up);
  const CUtensorMap x_map = make_tma_2d_b16(x, p.T, p.H, TN);
  const CUtensorMap gate_map = make_tma_2d_b16(w, p.S, p.H, sk::kGateCols);
  const CUtensorMap up_map =
      make_tma_2d_b16(w + static_cast<size_t>(p.S) * p.H * 2, p.S, p.H, sk::kGateCols);
  const CUtensorMap act_map = make_tma_2d_b16(p.act, p.T, p.S, TN);
  const CUtensorMap down_map = make_tma_2d_b16(w_down, p.H, p.S, sk::kTileRows);

  LaunchConfig config(dim3(pl.grid), dim3(sk::kThreads), L::kSmemBytes, stream);
  const cudaLaunchConfig_t cfg = config.cooperative().config();
  const cudaError_t err =
      cudaLaunchKernelEx(&cfg, kernel, x_map, gate_map, up_map, act_map, down_map, p);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("moekit: stream-K MLP launch failed: ") + cudaGetErrorString(err));
  }
}

template <typename T, typename Mma>
void launch_tn(const Plan& pl, const void* x, const void* w_gate_up, const void* w_down,
               cudaStream_t stream) {
  if (pl.tn == 16) return launch<T, Mma, 16>(pl, x, w_gate_up, w_down, stream);
  if (pl.tn == 32) return launch<T, Mma, 32>(pl, x, w_gate_up, w_down, stream);
  launch<T, Mma, 64>(pl, x, w_gate_up, w_down, stream);
}

}  // namespace

size_t streamk_mlp_scratch_bytes(DType dtype, int64_t T, int64_t H, int64_t S,
                                 const DeviceProps& device) {
  if (!shape_fits(dtype, T, H, S) || !device.sm90() || device.sms <= 0) return 0;
  const Plan pl = make_plan(T, H, S, device.sms, device.sms);
  return pl.counter_bytes + pl.partial_bytes;
}

void run_streamk_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                     const void* w_gate_up, const void* w_down, void* act, void* out,
                     DType out_dtype, int grid, void* scratch, cudaStream_t stream) {
  const int sms = device_props().sm90() ? device_props().sms : 0;
  Plan pl = make_plan(T, H, S, sms, grid);
  if (!shape_fits(dtype, T, H, S) || grid < 1 || grid > sms || !scratch)
    throw Error("moekit: stream-K MLP called for a shape or device it does not support");
  pl.p.act = act;
  pl.p.out = out;
  pl.p.out_f32 = out_dtype == DType::kF32;
  pl.p.counters = static_cast<int*>(scratch);
  pl.p.partials = reinterpret_cast<float*>(static_cast<char*>(scratch) + pl.counter_bytes);
  dispatch_float(dtype, "streamk_mlp", [&](auto in_type) {
    using E = typename decltype(in_type)::type;
    using Mma = std::conditional_t<std::is_same_v<E, __half>, gemm::MmaF16, gemm::MmaBF16>;
    launch_tn<E, Mma>(pl, x, w_gate_up, w_down, stream);
  });
}

}  // namespace moekit::detail
