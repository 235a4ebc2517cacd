// The weight-only FP8 instantiations of the persistent decode GEMM (fp8_weight_tiles.cuh): bf16
// rows, e4m3 weights with per-channel or per-tensor scales, bf16 c; 32 x 128 or 32 x 256 tiles
// (plan.tile_n).
#include "core/device.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/launch.h"
#include "gemm/mma/fp8_weight_tiles.cuh"
#include "gemm/mma/launch.cuh"
#include "gemm/mma/persistent_kernel.cuh"

namespace moekit::detail {

void launch_grouped_gemm_fp8_weights(const GroupedGemmProblem& problem, cudaStream_t stream) {
  // gemm_plan_rejection has checked: decode_persistent, bf16 a and c, k % 16 == 0, k > 0,
  // at most kGemmPersistentMaxGroups groups, per-channel or per-tensor scales.
  gemm::GemmParams p{};
  p.a = problem.a;
  p.b = problem.b;
  p.c = problem.c;
  p.rows = gemm::rows_desc(problem);
  p.n = problem.n;
  p.k = problem.k;
  p.silu = problem.activation == Activation::kSiluAndMul ? 1 : 0;
  const int64_t b_rows = p.silu ? 2 * problem.n : problem.n;
  p.b_evict_first = gemm_b_evict_first(problem.num_groups * b_rows * problem.k) ? 1 : 0;
  const Fp8ScaleIndex index = fp8_scale_index(problem.b_scales, b_rows, problem.k);
  p.b_scale = problem.b_scale;
  p.b_scale_group = index.b_group;
  p.b_scale_row = index.b_row;
  const int sms = device_props().sms > 0 ? device_props().sms : 132;
  if (problem.plan.tile_n == 256) {
    gemm::launch_grouped_gemm_persistent<gemm::Fp8WeightTiles<gemm::Fp8WeightWideConfig>>(
        p, sms, stream, "moe_grouped_gemm");
  } else {
    gemm::launch_grouped_gemm_persistent<gemm::Fp8WeightTiles<gemm::Fp8WeightConfig>>(
        p, sms, stream, "moe_grouped_gemm");
  }
}

}  // namespace moekit::detail
