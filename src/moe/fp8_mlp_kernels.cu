// The FP8 MLP's small kernels (fp8_mlp.h): the dynamic per-tensor activation scale, the cast
// of the FP8 GEMMs' bf16 rows and a 1-group layout's end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/check.h"
#include "core/dtype.cuh"
#include "core/fp8_scale.h"
#include "mlp/row_groups.cuh"
#include "moe/fp8_mlp.h"

namespace moekit::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

// amax (the f32 bits of max |x|; non-negative floats order as their bits) over the rows of
// x [rows, cols] that hold data, 8 values (16 bytes) per load; NaN is ignored (fmaxf).
template <class T>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, const int32_t* ends, int E,
                int alignment, uint32_t* amax) {
  const int64_t chunks = rows * cols / 8;
  float m = 0.f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    if (!row_in_groups(i * 8 / cols, ends, E, alignment)) continue;
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x) + i);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(to_float(v[j])));
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) atomicMax(amax, __float_as_uint(m));
}

// scale = max(amax, 1e-10) / 448 (quantize_fp8.h's formula).
__global__ void tensor_scale_kernel(const uint32_t* amax, float* scale) {
  *scale = fp8_dynamic_scale(__uint_as_float(*amax));
}

template <class TOut>
__global__ void __launch_bounds__(kThreads)
    cast_bf16_kernel(const __nv_bfloat16* __restrict__ in, int64_t n, TOut* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    out[i] = from_float<TOut>(__bfloat162float(in[i]));
  }
}

__global__ void fill_i32_kernel(int32_t* p, int32_t value) {
  *p = value;
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(kMaxBlocks, (work + kThreads - 1) / kThreads)));
}

}  // namespace

void launch_fp8_tensor_scale(const void* x, DType dtype, int64_t rows, int64_t cols,
                             const Fp8RowGroups& groups, uint32_t* amax, float* tensor_scale,
                             cudaStream_t stream) {
  launch_fill_i32(reinterpret_cast<int32_t*>(amax), 0, stream);
  const unsigned grid = grid_for(rows * cols / 8);
  const int E = static_cast<int>(groups.E);
  if (dtype == DType::kBF16) {
    amax_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), rows, cols,
                                               groups.ends, E, groups.alignment, amax);
  } else {
    amax_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const __half*>(x), rows, cols,
                                               groups.ends, E, groups.alignment, amax);
  }
  check_launch("fp8_tensor_scale.amax");
  launch_fp8_scale_from_amax(amax, tensor_scale, stream);
}

void launch_fp8_scale_from_amax(const uint32_t* amax, float* tensor_scale, cudaStream_t stream) {
  tensor_scale_kernel<<<1, 1, 0, stream>>>(amax, tensor_scale);
  check_launch("fp8_tensor_scale");
}

void launch_cast_bf16(const void* in, int64_t n, void* out, DType out_dtype, cudaStream_t stream) {
  if (n == 0) return;
  const auto* src = static_cast<const __nv_bfloat16*>(in);
  if (out_dtype == DType::kF32) {
    cast_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, n, static_cast<float*>(out));
  } else {
    cast_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, n, static_cast<__half*>(out));
  }
  check_launch("fp8_mlp.cast");
}

void launch_fill_i32(int32_t* p, int32_t value, cudaStream_t stream) {
  fill_i32_kernel<<<1, 1, 0, stream>>>(p, value);
  check_launch("fp8_mlp.fill");
}

}  // namespace moekit::detail
