// f16-input instantiations of the SM90 config 2 with 192-row b tiles (the dense rule in
// sm90_tile_math.h, or MOEKIT_SM90_BN=192); see sm90_grouped_gemm.cuh. Its own .cu so
// it compiles in parallel with the 256-wide kernels.
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"
#include "gemm/sm90/grouped_gemm.cuh"

namespace moekit::detail {

void launch_grouped_gemm_sm90_n192_f16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  const char* op = "moe_grouped_gemm";
  const gemm::RowsDesc rows = gemm::rows_desc(problem);
  using gemm::sm90::kPairNone;
  if (problem.out_dtype == DType::kF32) {
    gemm::sm90::launch<cutlass::half_t, float, kPairNone, 192>(problem, rows, stream, op);
  } else {
    gemm::sm90::launch<cutlass::half_t, __half, kPairNone, 192>(problem, rows, stream, op);
  }
}

}  // namespace moekit::detail
