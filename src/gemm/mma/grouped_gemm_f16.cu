// f16-input instantiations of the grouped-GEMM engine's mma.sync kernels.
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"

namespace moekit::detail {

void launch_grouped_gemm_f16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  gemm::launch_16bit<__half, gemm::MmaF16>(problem, stream);
}

}  // namespace moekit::detail
