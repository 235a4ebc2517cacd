// bf16-input instantiations of the grouped-GEMM engine.
#include "gemm/grouped_gemm_launch.cuh"
#include "gemm/launch.h"

namespace moekit::detail {

void launch_grouped_gemm_bf16(const GroupedGemmProblem& problem, int config, cudaStream_t stream) {
  gemm::launch_16bit<__nv_bfloat16, gemm::MmaBF16>(problem, config, stream);
}

}  // namespace moekit::detail
