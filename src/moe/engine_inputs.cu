// apply_router_weight_on_input's pass (engine_inputs.h): one thread per 8 columns.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/dtype.cuh"
#include "moe/engine_inputs.h"

namespace moekit::detail {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void __launch_bounds__(kThreads)
    scale_rows_kernel(const T* __restrict__ x, const float* __restrict__ w, int64_t T_, int64_t H,
                      T* __restrict__ y, float* __restrict__ unit) {
  const int64_t vecs = H / 8;  // 16-byte vectors per row
  const int64_t n = T_ * vecs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = i / vecs;
    // The weight rounded to the dtype; the product of two dtype values is exact in f32,
    // so from_float rounds it once.
    const float wt = to_float(from_float<T>(w[t]));
    const uint4 raw = reinterpret_cast<const uint4*>(x)[i];
    const T* in = reinterpret_cast<const T*>(&raw);
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = from_float<T>(wt * to_float(in[j]));
    reinterpret_cast<uint4*>(y)[i] = out;
    if (i % vecs == 0) unit[t] = 1.0f;
  }
}

}  // namespace

void launch_router_weight_on_input(const RouterWeightOnInput& p, cudaStream_t stream) {
  if (p.T == 0) return;
  const int64_t items = p.T * (p.H / 8);
  const int64_t blocks =
      std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, 8192));
  MOEKIT_DISPATCH_HALF(p.dtype, "apply_router_weight_on_input", [&] {
    scale_rows_kernel<scalar_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(p.x), p.weights, p.T, p.H, static_cast<scalar_t*>(p.x_scaled),
        p.unit_weights);
  });
  check_launch("apply_router_weight_on_input");
}

}  // namespace moekit::detail
