// Activation quantization to FP8 e4m3 (quantize_fp8.h has the formula): one warp per source
// row, 8 columns (16 bytes of bf16 / f16) per lane, 256 columns per warp step. Group-128
// scales come from a 16-lane max (a step holds two groups); per-token scales from a first
// pass over the row (its second read hits L1 / L2). Each quantized row is stored to every
// destination row (the pre-permute's routes of a token) from registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "core/check.h"
#include "core/pdl.cuh"
#include "core/vec8.cuh"
#include "mlp/row_groups.cuh"
#include "moekit/error.h"
#include "permute/quantize_fp8.h"

namespace moekit::detail {
namespace {

constexpr int kQuantThreads = 256;  // 8 warps, one source row each
constexpr int kRowsPerBlock = kQuantThreads / 32;
constexpr int kStepCols = 32 * 8;

// Columns c .. c + 7 of row `row` (zeros past k: they never raise a max nor get stored).
template <class T>
__device__ __forceinline__ void load8(const T* x, int64_t row, int64_t k, int64_t c,
                                      float (&v)[8]) {
  if (c < k) {
    Pack8<T> u;
    u.load(x + row * k + c);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = u.get(i);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.f;
  }
}

__device__ __forceinline__ float amax8(const float (&v)[8]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
  return m;
}

// e4m3(v / scale) for 8 values, packed little-endian (column c in the lowest byte).
__device__ __forceinline__ uint2 quantize8(const float (&v)[8], float scale) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __nv_fp8_storage_t b =
        __nv_cvt_float_to_fp8(__fdiv_rn(v[i], scale), __NV_SATFINITE, __NV_E4M3);
    w[i / 4] |= static_cast<uint32_t>(b) << (8 * (i % 4));
  }
  return make_uint2(w[0], w[1]);
}

struct QuantParams {
  const void* x;
  int64_t src_rows, k;
  int mode;  // Fp8ActScales
  const float* tensor_scale;
  const int32_t* dest;
  int fanout;
  uint8_t* q;
  float* scales;
  int64_t k_groups;  // ceil(k / 128)
  const int32_t* group_ends;
  int groups, alignment;
};

// Output row of source row r's j-th destination (-1: none).
__device__ __forceinline__ int64_t dest_row(const QuantParams& p, int64_t r, int j) {
  return p.dest ? static_cast<int64_t>(__ldg(p.dest + r * p.fanout + j)) : r;
}

template <class T>
__global__ void __launch_bounds__(kQuantThreads) quantize_fp8_kernel(const QuantParams p) {
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= p.src_rows || !row_in_groups(r, p.group_ends, p.groups, p.alignment)) return;
  const T* x = static_cast<const T*>(p.x);
  const int fanout = p.dest ? p.fanout : 1;

  float row_scale = 0.f;  // kPerToken / kPerTensor
  if (p.mode == static_cast<int>(Fp8ActScales::kPerTensor)) {
    row_scale = __ldg(p.tensor_scale);
  } else if (p.mode == static_cast<int>(Fp8ActScales::kPerToken)) {
    float m = 0.f;
    for (int64_t c0 = 0; c0 < p.k; c0 += kStepCols) {
      float v[8];
      load8(x, r, p.k, c0 + lane * 8, v);
      m = fmaxf(m, amax8(v));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    row_scale = fp8_dynamic_scale(m);
    for (int j = 0; j < fanout; ++j) {
      const int64_t d = dest_row(p, r, j);
      if (d >= 0 && lane == 0) p.scales[d] = row_scale;
    }
  }
  pdl_trigger();

  for (int64_t c0 = 0; c0 < p.k; c0 += kStepCols) {
    const int64_t c = c0 + lane * 8;
    float v[8];
    load8(x, r, p.k, c, v);
    float scale = row_scale;
    if (p.mode == static_cast<int>(Fp8ActScales::kGroup128)) {
      // Lanes 0..15 hold group c0 / 128, lanes 16..31 the next one (128 = 16 lanes x 8).
      float m = amax8(v);
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      scale = fp8_dynamic_scale(m);
    }
    const uint2 qv = quantize8(v, scale);
    const bool group_head =
        p.mode == static_cast<int>(Fp8ActScales::kGroup128) && (lane & 15) == 0 && c < p.k;
    for (int j = 0; j < fanout; ++j) {
      const int64_t d = dest_row(p, r, j);
      if (d < 0) continue;
      if (c < p.k) *reinterpret_cast<uint2*>(p.q + d * p.k + c) = qv;
      if (group_head) p.scales[d * p.k_groups + c / 128] = scale;
    }
  }
}

}  // namespace

void launch_quantize_fp8(const QuantizeFp8Launch& l, cudaStream_t stream) {
  if (l.src_rows <= 0 || l.k <= 0) return;
  if (l.k % 16 != 0 || (l.dest && l.fanout < 1) ||
      (l.mode == Fp8ActScales::kPerTensor && !l.tensor_scale) ||
      (l.mode != Fp8ActScales::kPerTensor && !l.scales) ||
      (l.dtype != DType::kBF16 && l.dtype != DType::kF16) ||
      (l.group_ends && (l.dest || l.groups < 1 || l.groups > INT32_MAX || l.alignment < 1))) {
    throw Error("moekit: internal: launch_quantize_fp8 got arguments outside its contract");
  }
  QuantParams p;
  p.x = l.x;
  p.src_rows = l.src_rows;
  p.k = l.k;
  p.mode = static_cast<int>(l.mode);
  p.tensor_scale = l.tensor_scale;
  p.dest = l.dest;
  p.fanout = l.dest ? l.fanout : 1;
  p.q = static_cast<uint8_t*>(l.q);
  p.scales = l.scales;
  p.k_groups = (l.k + 127) / 128;
  p.group_ends = l.group_ends;
  p.groups = static_cast<int>(l.groups);
  p.alignment = l.alignment;
  const int64_t blocks = (l.src_rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (blocks > INT32_MAX) throw Error("moekit: internal: launch_quantize_fp8: too many rows");
  const dim3 grid(static_cast<unsigned>(blocks));
  if (l.dtype == DType::kBF16) {
    launch_pdl(quantize_fp8_kernel<__nv_bfloat16>, grid, dim3(kQuantThreads), 0, stream, p);
  } else {
    launch_pdl(quantize_fp8_kernel<__half>, grid, dim3(kQuantThreads), 0, stream, p);
  }
  check_launch("quantize_fp8");
}

void launch_pre_permute_fp8(const PrePermuteFp8Launch& l, cudaStream_t stream) {
  PrePermuteLaunch routes = l.routes;
  routes.row_bytes = 0;  // the routes only: the rows follow, quantized
  launch_pre_permute(routes, stream);
  if (l.routes.top_k <= 0) return;
  QuantizeFp8Launch q;
  q.x = l.routes.hidden;
  q.dtype = l.dtype;
  q.src_rows = l.num_tokens;
  q.k = l.hidden_size;
  q.mode = l.mode;
  q.tensor_scale = l.tensor_scale;
  q.dest = l.routes.inverse_indices;
  q.fanout = l.routes.top_k;
  q.q = l.routes.permuted;
  q.scales = l.permuted_scales;
  launch_quantize_fp8(q, stream);
}

}  // namespace moekit::detail
