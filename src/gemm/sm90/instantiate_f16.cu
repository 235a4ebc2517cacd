// f16-input instantiations of the SM90 (TMA + wgmma) grouped-GEMM config.
// GemmKernel::kSm90 at plan.tile_n (256 here, 192 / 224 in their own units); see
// sm90/grouped_gemm.cuh.
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"
#include "gemm/sm90/grouped_gemm.cuh"

namespace moekit::detail {

void launch_grouped_gemm_sm90_f16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  const char* op = "moe_grouped_gemm";
  const int tile_n = problem.plan.tile_n;
  if (tile_n == 192) {
    launch_grouped_gemm_sm90_n192_f16(problem, stream);
    return;
  }
  if (tile_n == 224) {
    launch_grouped_gemm_sm90_n224_f16(problem, stream);
    return;
  }
  const gemm::RowsDesc rows = gemm::rows_desc(problem);
  if (problem.out_dtype == DType::kF32) {
    gemm::sm90::launch<cutlass::half_t, float>(problem, rows, stream, op);
  } else {
    gemm::sm90::launch<cutlass::half_t, __half>(problem, rows, stream, op);
  }
}

}  // namespace moekit::detail
