// f16-input instantiations of the paired SM90 grouped-GEMM configs (2-CTA clusters that
// load the operand they share once, multicast): kGemmConfigSm90PairN (7, config 2's tiles
// on n-tile pairs, a multicast) and kGemmConfigSm90PingpongPairM (8, config 6's tiles on
// m-tile pairs, b multicast). docs/gemm.md, "Paired SM90 configs".
#include "gemm/grouped_gemm_launch.cuh"
#include "gemm/launch.h"
#include "gemm/sm90_pingpong.cuh"

namespace moekit::detail {

void launch_grouped_gemm_sm90_pair_f16(const GroupedGemmProblem& problem, int config,
                                       cudaStream_t stream) {
  using gemm::sm90::kPairM;
  using gemm::sm90::kPairN;
  const char* op = "moe_grouped_gemm";
  const gemm::RowsDesc rows = gemm::rows_desc(problem);
  const bool f32 = problem.out_dtype == DType::kF32;
  if (config == kGemmConfigSm90PairN) {
    if (f32) {
      gemm::sm90::launch<cutlass::half_t, float, kPairN>(problem, rows, stream, op);
    } else {
      gemm::sm90::launch<cutlass::half_t, __half, kPairN>(problem, rows, stream, op);
    }
  } else if (f32) {
    gemm::sm90::launch_pingpong<cutlass::half_t, float, kPairM>(problem, rows, stream, op);
  } else {
    gemm::sm90::launch_pingpong<cutlass::half_t, __half, kPairM>(problem, rows, stream, op);
  }
}

}  // namespace moekit::detail
