// The bf16 engine's kernel parameters for the FP8 grouped GEMM on 128 x 256 tiles (plan
// fp8_sm90 128x256: fp8_fast_gemm.cu's whole-k sums, fp8_block256_gemm.cu's block scales).
#pragma once

#include <cuda_runtime_api.h>

#include "gemm/grouped_gemm_fp8.h"
#include "gemm/sm90/fp8_rows.cuh"
#include "gemm/sm90/grouped_gemm.cuh"

namespace moekit::detail::gemm::sm90 {

// make_params reads a, b, c, n, k and the activation (the plan's swap_tails stays off); a
// dynamic plan claims tile ids from the problem's zeroed counter, else the static walk.
// Returns the tile count (<= 0: nothing to launch).
template <class Cfg>
int64_t wide_fp8_params(const GroupedGemmFP8Problem& prob, const char* op, cudaStream_t stream,
                        Params<Cfg, cutlass::float_e4m3_t>& p) {
  GroupedGemmProblem g;
  g.a = prob.a;
  g.b = prob.b;
  g.c = prob.c;
  g.n = prob.n;
  g.k = prob.k;
  g.activation = prob.activation;
  const int64_t tiles = make_params<Cfg, cutlass::float_e4m3_t>(g, fp8_rows(prob), op, p);
  if (tiles <= 0) return tiles;
  unsigned* counter = prob.plan.schedule == GemmSchedule::kDynamic ? prob.tile_counter : nullptr;
  p.tile_counter = sm90_tile_counter(counter, stream, op, &p.dynamic_waves);
  return tiles;
}

}  // namespace moekit::detail::gemm::sm90
