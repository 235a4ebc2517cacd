// bf16-input instantiations of the grouped-GEMM engine.
#include <array>
#include <utility>

#include "core/device.h"
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"

namespace moekit::detail {

namespace {

// Co-resident S-CTA clusters of the split-K kernel on the current device (0: unknown).
template <int S>
int splitk_clusters() {
  // The first GEMM may run inside a graph capture: relaxed mode for these queries.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  struct Restore {
    cudaStreamCaptureMode& m;
    ~Restore() { cudaThreadExchangeStreamCaptureMode(&m); }
  } restore{mode};
  using Cfg = gemm::DecodeConfig;
  auto kernel = gemm::grouped_gemm_splitk_kernel<Cfg, __nv_bfloat16, __nv_bfloat16, gemm::MmaBF16>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES) !=
      cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(S * 64));
  config.blockDim = dim3(Cfg::THREADS);
  config.dynamicSmemBytes = Cfg::SMEM_BYTES;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(S);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

template <int... S>
void fill_splitk_clusters(std::array<int, kMaxSplitK + 1>& t, std::integer_sequence<int, S...>) {
  ((t[S + 1] = device_cached(kSlotSplitKClusters + S, splitk_clusters<S + 1>)), ...);
}

}  // namespace

// Measured once per device (device_cached); nullptr unless every split's count is known.
const int* splitk_cluster_capacity_table() {
  thread_local std::array<int, kMaxSplitK + 1> table{};
  fill_splitk_clusters(table, std::make_integer_sequence<int, kMaxSplitK>{});
  for (int s = 1; s <= kMaxSplitK; ++s) {
    if (table[s] <= 0) return nullptr;
  }
  return table.data();
}

void launch_grouped_gemm_bf16(const GroupedGemmProblem& problem, int config, cudaStream_t stream) {
  gemm::launch_16bit<__nv_bfloat16, gemm::MmaBF16>(problem, config, stream);
}

}  // namespace moekit::detail
