// bf16-input instantiations of the grouped-GEMM engine's mma.sync kernels.
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
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(split * 64));
  config.blockDim = dim3(Cfg::THREADS);
  config.dynamicSmemBytes = Cfg::SMEM_BYTES;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(split);
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

void launch_grouped_gemm_bf16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  gemm::launch_16bit<__nv_bfloat16, gemm::MmaBF16>(problem, stream);
}

}  // namespace moekit::detail
