// The general MLP path's elementwise kernel (activation.h): bias add, activation and one
// rounding from the f32 pre-activations of plain GEMMs. Memory-bound: each thread takes 8
// output columns of a row with 16-byte loads and stores; the activation is a uniform branch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/dtype.cuh"
#include "core/dtype_dispatch.h"
#include "core/vec8.cuh"
#include "mlp/activation.cuh"
#include "mlp/activation.h"
#include "mlp/row_groups.cuh"

namespace moekit::detail {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxGridRows = 65535;

// Where a column's inputs sit in a row of the pre-activations.
enum class InputLayout : int {
  kSingle,        // one value per column (kRelu2, kNone)
  kConcatenated,  // gate columns [0, cols), then up columns [cols, 2 cols)
  kInterleaved,   // gate j at 2j, up j at 2j + 1 (kSwigluOai)
};

struct Params {
  const float* in;
  int64_t rows, cols, in_cols;
  Activation act;
  InputLayout layout;
  const void* bias;
  bool bias_f32;
  const int32_t* ends;
  int E, alignment;
  void* out;
};

// 8 consecutive values of x (f32 pre-activations) plus 8 of the bias row (f32 or T).
template <class T>
__device__ __forceinline__ void load_biased8(const float* x, const void* bias, bool bias_f32,
                                             int64_t i, float (&v)[8]) {
  load8(x + i, v);
  if (bias == nullptr) return;
  float b[8];
  if (bias_f32) {
    load8(static_cast<const float*>(bias) + i, b);
  } else {
    load8(static_cast<const T*>(bias) + i, b);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] += b[j];
}

// The expert of permuted row r, or -1 for a padding row or one past the last group.
__device__ __forceinline__ int expert_of_row(const int32_t* ends, int E, int alignment, int64_t r) {
  const int e = group_ending_after(ends, E, r);
  if (e == E) return -1;
  return past_group_start(ends, e, alignment, r) ? e : -1;
}

// Not __restrict__: the bias pass may run in place (out == in, f32).
template <class T, class TOut>
__global__ void __launch_bounds__(kThreads) activation_kernel(const Params p) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * 8;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    int e = 0;
    if (p.ends != nullptr) {
      e = expert_of_row(p.ends, p.E, p.alignment, r);
      if (e < 0) continue;
    }
    const float* x = p.in + r * p.in_cols;
    const void* bias = p.bias == nullptr
                           ? nullptr
                           : static_cast<const char*>(p.bias) +
                                 e * p.in_cols * (p.bias_f32 ? sizeof(float) : sizeof(T));
    float v[8];
    if (p.layout == InputLayout::kSingle) {
      load_biased8<T>(x, bias, p.bias_f32, c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = activate(p.act, v[j], 0.0f);
    } else if (p.layout == InputLayout::kConcatenated) {
      float u[8];
      load_biased8<T>(x, bias, p.bias_f32, c, v);
      load_biased8<T>(x, bias, p.bias_f32, p.cols + c, u);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = activate(p.act, v[j], u[j]);
    } else {
      float a[8], b[8];
      load_biased8<T>(x, bias, p.bias_f32, 2 * c, a);
      load_biased8<T>(x, bias, p.bias_f32, 2 * c + 8, b);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = activate(p.act, a[2 * j], a[2 * j + 1]);
        v[4 + j] = activate(p.act, b[2 * j], b[2 * j + 1]);
      }
    }
    store8(static_cast<TOut*>(p.out) + r * p.cols + c, v);
  }
}

InputLayout input_layout(Activation act) {
  if (!is_gated(act)) return InputLayout::kSingle;
  return act == Activation::kSwigluOai ? InputLayout::kInterleaved : InputLayout::kConcatenated;
}

}  // namespace

void launch_activation(const ActivationLaunch& a, cudaStream_t stream, const char* op) {
  if (a.rows <= 0 || a.cols <= 0) return;
  if (a.cols % 8 != 0)
    throw Error(std::string("moekit::") + op +
                ": internal: activation columns not a multiple of 8");
  Params p;
  p.in = a.in;
  p.rows = a.rows;
  p.cols = a.cols;
  p.act = a.act;
  p.layout = input_layout(a.act);
  p.in_cols = p.layout == InputLayout::kSingle ? a.cols : 2 * a.cols;
  p.bias = a.bias;
  p.bias_f32 = a.bias_dtype == DType::kF32;
  p.ends = a.ends;
  p.E = a.E;
  p.alignment = a.alignment;
  p.out = a.out;
  const int64_t col_blocks = (a.cols / 8 + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>(std::min<int64_t>(a.rows, kMaxGridRows)));
  dispatch_in_out(a.dtype, a.out_dtype, op, [&](auto in_type, auto out_type) {
    using T = typename decltype(in_type)::type;
    using TOut = typename decltype(out_type)::type;
    activation_kernel<T, TOut><<<grid, kThreads, 0, stream>>>(p);
  });
  check_launch(op);
}

}  // namespace moekit::detail
