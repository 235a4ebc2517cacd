// f16-input instantiations of the SM90 ping-pong grouped-GEMM config (config 6,
// kGemmConfigSm90Pingpong), H200-verified 2026-12-02; see sm90_pingpong.cuh.
#include "gemm/launch.h"
#include "gemm/mma/launch.cuh"
#include "gemm/sm90/pingpong.cuh"

namespace moekit::detail {

void launch_grouped_gemm_sm90_pingpong_f16(const GroupedGemmProblem& problem, cudaStream_t stream) {
  const char* op = "moe_grouped_gemm";
  const gemm::RowsDesc rows = gemm::rows_desc(problem);
  if (problem.out_dtype == DType::kF32) {
    gemm::sm90::launch_pingpong<cutlass::half_t, float>(problem, rows, stream, op);
  } else {
    gemm::sm90::launch_pingpong<cutlass::half_t, __half>(problem, rows, stream, op);
  }
}

}  // namespace moekit::detail
