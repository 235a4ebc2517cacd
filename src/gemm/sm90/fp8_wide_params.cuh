// The bf16 engine's kernel parameters and launch for the FP8 grouped GEMM on 128 x 256 tiles
// (plan fp8_sm90 128x256: fp8_fast_gemm.cu's whole-k sums, fp8_block256_gemm.cu's block
// scales).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/device.h"
#include "core/kernel_launch.h"
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

// Launches `Kernel` (one of the two 128 x 256 FP8 kernels) over `tiles` tiles: a persistent
// grid of at most one block an SM with `Shared` as its shared memory (the engine's storage, or
// a struct that holds it first; a refused smem limit fails the launch, check_launch).
template <class Cfg, auto Kernel, class Shared = SharedStorage<Cfg, cutlass::float_e4m3_t>,
          class Scales>
void launch_wide_fp8(int64_t tiles, const Params<Cfg, cutlass::float_e4m3_t>& p,
                     const Scales& scales, cudaStream_t stream) {
  static_assert(sizeof(Shared) <= 227 * 1024, "SM90 shared memory per block");
  constexpr int kSmem = static_cast<int>(sizeof(Shared));
  raise_smem_limit<Kernel>(kSmem);
  const int64_t grid = std::min<int64_t>(tiles, device_props().sms);
  Kernel<<<static_cast<unsigned>(grid), Cfg::THREADS, kSmem, stream>>>(p, scales);
}

}  // namespace moekit::detail::gemm::sm90
