// f16-input instantiations of the SM90 (TMA + wgmma) grouped-GEMM config.
// Verified on the H200 2026-12-02 (tests/test_gemm_gpu.cpp); see sm90_grouped_gemm.cuh.
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"
#include "gemm/sm90/grouped_gemm.cuh"

namespace moekit::detail {

void launch_grouped_gemm_sm90_f16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  const char* op = "moe_grouped_gemm";
  const int tile_n = sm90_tile_n(problem);
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
