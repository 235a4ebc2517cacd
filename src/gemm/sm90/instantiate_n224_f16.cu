// f16-input instantiations of the SM90 config 2 with 224-row b tiles (no silu; the dense
// rule in sm90_tile_math.h, or MOEKIT_SM90_BN=224); see sm90_grouped_gemm.cuh. The
// 64x224x16 wgmma atom is one of CuTe's extended shapes, enabled for this file only (it
// instantiates no 256- or 192-wide kernel).
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"
#include "gemm/sm90/grouped_gemm.cuh"

namespace moekit::detail {

void launch_grouped_gemm_sm90_n224_f16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  const char* op = "moe_grouped_gemm";
  const gemm::RowsDesc rows = gemm::rows_desc(problem);
  using gemm::sm90::kPairNone;
  if (problem.out_dtype == DType::kF32) {
    gemm::sm90::launch<cutlass::half_t, float, kPairNone, 224>(problem, rows, stream, op);
  } else {
    gemm::sm90::launch<cutlass::half_t, __half, kPairNone, 224>(problem, rows, stream, op);
  }
}

}  // namespace moekit::detail
