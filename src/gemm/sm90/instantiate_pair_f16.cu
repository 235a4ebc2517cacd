// f16-input instantiations of the paired SM90 grouped-GEMM configs (2-CTA clusters that
// load the operand they share once, multicast): kGemmConfigSm90PairN (7),
// kGemmConfigSm90PingpongPairM (8), kGemmConfigSm90PairM (10) and kGemmConfigSm90PairAuto
// (11). docs/gemm.md, "Paired SM90 configs" and "Adaptive pairs".
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"
#include "gemm/sm90/pingpong.cuh"

namespace moekit::detail {

void launch_grouped_gemm_sm90_pair_f16(const GroupedGemmProblem& problem, int config,
                                       cudaStream_t stream) {
  gemm::sm90::launch_paired<cutlass::half_t, __half>(problem, config, gemm::rows_desc(problem),
                                                     stream, "moe_grouped_gemm");
}

}  // namespace moekit::detail
