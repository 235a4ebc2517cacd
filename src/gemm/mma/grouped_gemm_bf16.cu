// bf16-input instantiations of the grouped-GEMM engine's mma.sync kernels.
#include "core/kernel_launch.h"
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
  constexpr auto kernel =
      gemm::grouped_gemm_splitk_kernel<Cfg, __nv_bfloat16, __nv_bfloat16, gemm::MmaBF16>;
  if (raise_smem_limit<kernel>(Cfg::SMEM_BYTES) != cudaSuccess) return 0;
  return co_resident_clusters(reinterpret_cast<const void*>(kernel), split, Cfg::THREADS,
                              Cfg::SMEM_BYTES);
}

void launch_grouped_gemm_bf16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  gemm::launch_16bit<__nv_bfloat16, gemm::MmaBF16>(problem, stream);
}

}  // namespace moekit::detail
