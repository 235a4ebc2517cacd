// bf16-input instantiations of the grouped-GEMM engine's mma.sync kernels.
#include "gemm/common/cluster_launch.h"
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"

namespace moekit::detail {

int splitk_co_resident_clusters(int split) {
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
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t config = gemm::cluster_launch_config(
      int64_t{split} * 64, Cfg::THREADS, Cfg::SMEM_BYTES, split, nullptr, attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

void launch_grouped_gemm_bf16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  gemm::launch_16bit<__nv_bfloat16, gemm::MmaBF16>(problem, stream);
}

}  // namespace moekit::detail
