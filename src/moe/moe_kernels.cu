// Kernels of the MoE compositions:
//  - the direct ("indexed") small-batch path with bf16 / f16 weights: the two stages of
//    direct_gemv_kernel (direct_tiles.cuh), persistent GEMV-like kernels that read routes
//    straight from topk_ids (no sort) and stream each active expert's weights once with
//    16-byte loads, using mma.sync so up to 8 routes of an expert share every weight load;
//  - the weighted combine back to token order (k order, f32, deterministic).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "core/check.h"
#include "core/device.h"
#include "core/dtype.cuh"
#include "core/dtype_dispatch.h"
#include "core/vec8.cuh"
#include "moe/direct_routes.cuh"
#include "moe/direct_tiles.cuh"
#include "moe/moe_internal.h"

namespace moekit::detail {
namespace {

using namespace direct;  // NOLINT: the shared direct-kernel pieces (direct_*.cuh)

// ---- the direct GEMV kernel ----

// bf16 / f16 weights for direct_gemv_kernel (direct_tiles.cuh): a 16-byte load is 8
// consecutive k, already the mma's element pairs; no scales.
template <class T>
struct HalfWeights {
  using Elem = T;
  static constexpr int kPerLoad = 8;
  __device__ __forceinline__ static void to_pairs(const uint4& v, uint32_t (&out)[4]) {
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
};

// Arguments (in, w, topk_ids, out, ...); out (void*): kGateUp, act [R, F] (T); else down
// [R, H] f32.
template <class T, bool kGateUp, int MT, int U>
constexpr auto direct_half_kernel =
    direct_gemv_kernel<T, HalfWeights<T>, NoScales, RouteIds, kGateUp, MT, U,
                       std::conditional_t<kGateUp, T, float>, void, kPdlNone>;

constexpr int kGateUpMT = 2, kGateUpU = 4;  // 32 weight rows per tile, 4 steps in flight
constexpr int kDownMT = 4, kDownU = 2;      // 64 weight rows per tile, 2 steps in flight

template <bool kGateUp>
void launch_direct(const MoEShapes& s, const void* in, const void* w, const int32_t* topk_ids,
                   void* out, cudaStream_t stream, const char* op) {
  const int64_t R = s.T * s.K;
  if (R == 0) return;
  const int64_t n_out = kGateUp ? s.F : s.H;
  const int64_t kdim = kGateUp ? s.H : s.F;
  const int64_t tile_cols = kGateUp ? 16 : 16 * kDownMT;
  const int64_t tiles = (n_out + tile_cols - 1) / tile_cols;
  const int64_t slots = std::min<int64_t>(s.E, R);
  MOEKIT_DISPATCH_HALF(s.dtype, op, [&] {
    auto kernel = kGateUp ? direct_half_kernel<scalar_t, true, kGateUpMT, kGateUpU>
                          : direct_half_kernel<scalar_t, false, kDownMT, kDownU>;
    const int64_t grid = persistent_grid(kernel, direct::max_direct_items(slots, R, tiles));
    kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(in), static_cast<const scalar_t*>(w), topk_ids, out,
        static_cast<int>(R), static_cast<int>(s.K), static_cast<int>(s.E), n_out, kdim, tiles);
  });
  check_launch(op);
}

// ---- combine ----

constexpr int kCombineThreads = 128;

template <class TOut, class TRow>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const TRow* __restrict__ rows, int64_t num_rows,
                   const int32_t* __restrict__ inverse, const int32_t* __restrict__ topk_ids, int E,
                   const float* __restrict__ topk_weights, const float* __restrict__ addend,
                   TOut* __restrict__ out, int64_t T, int K, int64_t H) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x) * 8;
  if (c >= H) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int k = 0; k < K; ++k) {
      const int64_t r = t * K + k;
      int64_t row;
      if (inverse != nullptr) {
        row = inverse[r];
        if (row < 0 || row >= num_rows) continue;
      } else {
        const int id = topk_ids[r];
        if (id < 0 || id >= E) continue;
        row = r;
      }
      const float wt = topk_weights[r];
      float v[8];
      load8(rows + row * H + c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = fmaf(wt, v[j], acc[j]);
    }
    if (addend != nullptr) {
      float a[8];
      load8(addend + t * H + c, a);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += a[j];
    }
    store8(out + t * H + c, acc);
  }
}

}  // namespace

void launch_direct_gate_up(const MoEShapes& s, const void* hidden, const void* w_gate_up,
                           const int32_t* topk_ids, void* act, cudaStream_t stream) {
  launch_direct<true>(s, hidden, w_gate_up, topk_ids, act, stream, "indexed_expert_mlp");
}

void launch_direct_down(const MoEShapes& s, const void* act, const void* w_down,
                        const int32_t* topk_ids, float* down, cudaStream_t stream) {
  launch_direct<false>(s, act, w_down, topk_ids, down, stream, "indexed_expert_mlp");
}

void launch_combine(const CombineProblem& p, cudaStream_t stream) {
  if (p.T == 0 || p.H == 0) return;
  const dim3 grid(static_cast<unsigned>((p.H / 8 + kCombineThreads - 1) / kCombineThreads),
                  static_cast<unsigned>(std::min<int64_t>(p.T, 65535)));
  const auto launch = [&](auto out_type, auto rows_type) {
    using TOut = typename decltype(out_type)::type;
    using TRow = typename decltype(rows_type)::type;
    combine_kernel<TOut, TRow><<<grid, kCombineThreads, 0, stream>>>(
        static_cast<const TRow*>(p.rows), p.num_rows, p.inverse, p.topk_ids, static_cast<int>(p.E),
        p.topk_weights, p.addend, static_cast<TOut*>(p.out), p.T, static_cast<int>(p.K), p.H);
  };
  dispatch_float(p.out_dtype, "moe_combine", [&](auto out_type) {
    if (p.rows_dtype == DType::kF32) {
      launch(out_type, TypeTag<float>{});
    } else if (p.rows_dtype == DType::kBF16 && p.out_dtype != DType::kBF16) {
      launch(out_type, TypeTag<__nv_bfloat16>{});  // the FP8 GEMMs' bf16 rows under an f16 output
    } else {
      launch(out_type, out_type);
    }
  });
  check_launch("moe_combine");
}

}  // namespace moekit::detail
