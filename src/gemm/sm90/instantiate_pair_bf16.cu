// bf16-input instantiations of GemmKernel::kSm90Pairs, the adaptive pairs (2-CTA clusters
// that load the operand they share once, multicast: m-tile pairs, an odd last m-tile's
// n-tile pairs). docs/gemm.md "Paired SM90 tiles"; see sm90/grouped_gemm.cuh.
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"
#include "gemm/sm90/grouped_gemm.cuh"

namespace moekit::detail {

void launch_grouped_gemm_sm90_pair_bf16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  const char* op = "moe_grouped_gemm";
  const gemm::RowsDesc rows = gemm::rows_desc(problem);
  using gemm::sm90::kPairAuto;
  if (problem.out_dtype == DType::kF32) {
    gemm::sm90::launch<cutlass::bfloat16_t, float, kPairAuto>(problem, rows, stream, op);
  } else {
    gemm::sm90::launch<cutlass::bfloat16_t, __nv_bfloat16, kPairAuto>(problem, rows, stream, op);
  }
}

}  // namespace moekit::detail
