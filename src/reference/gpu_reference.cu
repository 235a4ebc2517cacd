#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "core/dtype.cuh"
#include "moekit/error.h"
#include "reference/gpu_reference.h"

namespace moekit::gpu_reference {
namespace {

constexpr int kRowsPerBlock = 8;   // rows of one expert per GEMM thread block
constexpr int kColsPerBlock = 64;  // output columns per GEMM thread block (8 per warp)
constexpr int kChunk = 1024;       // reduction columns staged in shared memory at a time
constexpr int kThreads = 256;
constexpr int kSortThreads = 1024;

// ---- element access --------------------------------------------------------------------

// f32 / f16 / bf16 as the kernels convert them (core/dtype.cuh), and e4m3.
template <class T>
__device__ __forceinline__ float ld(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {
    return static_cast<float>(p[i]);
  } else {
    return detail::to_float(p[i]);
  }
}

template <class T>
__device__ __forceinline__ T cvt(float v) {
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {
    return __nv_fp8_e4m3(v);  // nearest even, saturated at +-448
  } else {
    return detail::from_float<T>(v);
  }
}

// v rounded to T and widened back.
template <class T>
__device__ __forceinline__ float rounded(float v) {
  const T r = cvt<T>(v);
  return ld(&r, 0);
}

__device__ __forceinline__ float silu_ref(float z) {
  return z / (1.0f + expf(-z));
}

__host__ __device__ inline int64_t align_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}
inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(std::string("moekit::gpu_reference::") + what + ": " + cudaGetErrorString(e));
}

void check_experts(const char* what, int64_t e) {
  if (e > kMaxExperts || e < 0)
    throw Error(std::string("moekit::gpu_reference::") + what + ": at most " +
                std::to_string(kMaxExperts) + " experts, got " + std::to_string(e));
}

// Carves 256-byte aligned pieces out of a scratch buffer (or, with a null base,
// only adds up the size).
struct Carver {
  char* base;
  size_t off = 0;
  template <class T>
  T* take(int64_t n) {
    off = (off + 255) / 256 * 256;
    T* p = base ? reinterpret_cast<T*>(base + off) : nullptr;
    off += static_cast<size_t>(n) * sizeof(T);
    return p;
  }
};

// ---- route ids ---------------------------------------------------------------------------

// Route ids as the ops take them: i32 or i64, global ids read through an optional expert
// map (docs/routing-permute.md, "Engine ids"). local(r, E): the route's expert in [0, E),
// or -1 (no route, an out-of-range id, another rank's expert).
struct RouteIds {
  const void* ids = nullptr;
  bool i64 = false;
  const int32_t* map = nullptr;
  int64_t map_size = 0;

  __device__ int local(int64_t r, int E) const {
    int64_t id = i64 ? static_cast<const int64_t*>(ids)[r]
                     : static_cast<int64_t>(static_cast<const int32_t*>(ids)[r]);
    if (map != nullptr) id = id >= 0 && id < map_size ? map[id] : -1;
    return id >= 0 && id < E ? static_cast<int>(id) : -1;
  }
};

RouteIds route_ids(const TensorView& ids, const TensorView& expert_map = TensorView{}) {
  RouteIds r;
  r.ids = ids.data;
  r.i64 = ids.dtype == DType::kI64;
  r.map = expert_map.defined() ? expert_map.ptr<int32_t>() : nullptr;
  r.map_size = expert_map.defined() ? expert_map.numel() : 0;
  return r;
}

// fn(c) for every column c < cols of this thread (strided over the threads of blockIdx.y).
template <class Fn>
__device__ __forceinline__ void for_cols(int64_t cols, Fn fn) {
  for (int64_t c = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.y) * blockDim.x)
    fn(c);
}

// apply_router_weight_on_input (top-1): y[t, h] = round(round(w[t]) * x[t, h]).
template <class T>
__global__ void scale_rows_kernel(const T* x, const float* w, int64_t H, T* y) {
  const int64_t t = blockIdx.x;
  const T w_rounded = cvt<T>(w[t]);
  const float wt = ld(&w_rounded, 0);
  for_cols(H, [&](int64_t h) { y[t * H + h] = cvt<T>(wt * ld(x, t * H + h)); });
}

// ---- routing ----------------------------------------------------------------------------

// The expert groups topk_kernel keeps a bit for: fused_topk's expert limit (groups of one).
constexpr int kTopKRefMaxGroups = 1024;

template <class T>
__global__ void topk_kernel(const T* logits, int64_t num_tokens, int E, const float* bias, int K,
                            bool renormalize, bool use_sigmoid, int num_groups, int topk_group,
                            float scale, float* weights, int32_t* ids) {
  int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= num_tokens) return;
  const T* l = logits + t * E;
  float mx = -INFINITY, sum = 0.f;
  if (!use_sigmoid) {
    for (int e = 0; e < E; ++e) mx = fmaxf(mx, ld(l, e));
    for (int e = 0; e < E; ++e) sum += expf(ld(l, e) - mx);
  }
  auto score = [&](int e) {
    float x = ld(l, e);
    return use_sigmoid ? 1.0f / (1.0f + expf(-x)) : expf(x - mx) / sum;
  };
  auto sel = [&](int e) { return score(e) + (bias ? bias[e] : 0.0f); };
  // Grouping as the CPU reference does it: any number of groups (up to E, at most
  // kTopKRefMaxGroups: fused_topk refuses more), a group's score the sum of its two largest
  // sel with a bias (its largest when it has one expert), else its largest; ties to the
  // lower group index.
  const bool grouped = num_groups > 1 && topk_group < num_groups;
  const int gsize = grouped ? E / num_groups : E;
  uint64_t kept[kTopKRefMaxGroups / 64] = {};
  const auto is_kept = [&](int g) { return (kept[g / 64] >> (g % 64)) & 1; };
  if (grouped) {
    for (int s = 0; s < topk_group; ++s) {
      int best = -1;
      float best_v = -INFINITY;
      for (int g = 0; g < num_groups; ++g) {
        if (is_kept(g)) continue;
        float m1 = -INFINITY, m2 = -INFINITY;
        for (int e = g * gsize; e < (g + 1) * gsize; ++e) {
          float v = sel(e);
          if (v > m1) {
            m2 = m1;
            m1 = v;
          } else if (v > m2) {
            m2 = v;
          }
        }
        float gs = bias && gsize >= 2 ? m1 + m2 : m1;
        if (best < 0 || gs > best_v) {
          best = g;
          best_v = gs;
        }
      }
      if (best >= 0) kept[best / 64] |= 1ull << (best % 64);
    }
  }
  // Top-K in the order (sel descending, id ascending): pick k is the largest key
  // strictly after pick k-1.
  float prev_v = INFINITY;
  int prev_id = -1;
  float wsum = 0.f;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    float best_v = -INFINITY;
    for (int e = 0; e < E; ++e) {
      if (grouped && !is_kept(e / gsize)) continue;
      float v = sel(e);
      if (!(v < prev_v || (v == prev_v && e > prev_id))) continue;
      if (best < 0 || v > best_v) {
        best = e;
        best_v = v;
      }
    }
    ids[t * K + k] = best;
    float w = best >= 0 ? score(best) : 0.0f;
    weights[t * K + k] = w;
    wsum += w;
    if (best >= 0) {
      prev_v = best_v;
      prev_id = best;
    }
  }
  for (int k = 0; k < K; ++k) {
    float w = weights[t * K + k];
    if (renormalize && wsum > 0) w /= wsum;
    weights[t * K + k] = w * scale;
  }
}

// Stable counting sort of routes by expert, in one thread block. Route r (= t*K + k)
// is valid when its local expert ids.local(r, E) is not -1 and its token passes the mask. Each
// expert's routes start at a multiple of `bs`; optional outputs: sorted[pos] = r (the rest
// `sentinel`), block_expert[b] (-1 past the last used block), total (padded length), inverse[r]
// (pos or -1) and ends[e] (start + count).
__global__ void sort_routes_kernel(RouteIds ids, int64_t num_routes, int K, int E, int bs,
                                   const uint8_t* token_mask, int32_t* sorted, int64_t sorted_len,
                                   int32_t sentinel, int32_t* block_expert, int64_t num_blocks,
                                   int32_t* total, int32_t* inverse, int32_t* ends) {
  __shared__ int32_t counts[kMaxExperts];
  __shared__ int32_t cursor[kMaxExperts];
  const int tid = threadIdx.x;
  auto expert_of = [&](int64_t r) -> int {
    const int e = ids.local(r, E);
    if (e < 0) return -1;
    if (token_mask && !token_mask[r / K]) return -1;
    return e;
  };
  if (sorted)
    for (int64_t i = tid; i < sorted_len; i += blockDim.x) sorted[i] = sentinel;
  if (block_expert)
    for (int64_t i = tid; i < num_blocks; i += blockDim.x) block_expert[i] = -1;
  for (int e = tid; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int64_t r = tid; r < num_routes; r += blockDim.x) {
    int e = expert_of(r);
    if (e >= 0) atomicAdd(&counts[e], 1);  // integer counts: order-independent
  }
  __syncthreads();
  if (tid == 0) {
    int64_t run = 0;
    for (int e = 0; e < E; ++e) {
      cursor[e] = static_cast<int32_t>(run);
      int64_t padded = align_up(counts[e], bs);
      if (block_expert)
        for (int64_t b = run / bs; b < (run + padded) / bs && b < num_blocks; ++b)
          block_expert[b] = e;
      if (ends) ends[e] = static_cast<int32_t>(run + counts[e]);
      run += padded;
    }
    if (total) *total = static_cast<int32_t>(run);
  }
  __syncthreads();
  if (tid >= 32) return;
  // One warp scatters in route order: ranks within each 32-route chunk come from
  // match_any, so every expert's routes stay in ascending order.
  const int lane = tid;
  const unsigned lt = (1u << lane) - 1;
  for (int64_t base = 0; base < num_routes; base += 32) {
    int64_t r = base + lane;
    int e = r < num_routes ? expert_of(r) : -1;
    int key = e >= 0 ? e : -(lane + 1);
    unsigned peers = __match_any_sync(0xffffffffu, key);
    if (e >= 0) {
      int pos = cursor[e] + __popc(peers & lt);
      if (sorted) sorted[pos] = static_cast<int32_t>(r);
      if (inverse) inverse[r] = pos;
    } else if (r < num_routes && inverse) {
      inverse[r] = -1;
    }
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) cursor[e] += __popc(peers);
    __syncwarp();
  }
}

// Row blocks of a permuted layout: rows[b*8 + i] lists the rows of block b (all of
// expert block_expert[b]), -1 for unused slots. Layouts: contiguous (ends in meta,
// blocks start at align_up(end of the previous expert)), masked (counts in meta,
// rows e*max_m + m), or dense (dense_m >= 0: rows [0, dense_m) of one expert).
__global__ void layout_blocks_kernel(const int32_t* meta, int E, int alignment, int64_t max_m,
                                     int64_t rows_alloc, int64_t dense_m, const uint8_t* row_mask,
                                     int32_t* rows, int32_t* block_expert, int64_t num_blocks) {
  __shared__ int32_t offs[kMaxExperts];
  const int tid = threadIdx.x;
  for (int64_t i = tid; i < num_blocks * kRowsPerBlock; i += blockDim.x) rows[i] = -1;
  for (int64_t i = tid; i < num_blocks; i += blockDim.x) block_expert[i] = -1;
  const int n_experts = dense_m >= 0 ? 1 : E;
  auto range = [&](int e, int64_t& lo, int64_t& hi) {
    if (dense_m >= 0) {
      lo = 0;
      hi = dense_m;
    } else if (max_m > 0) {
      lo = e * max_m;
      hi = lo + min(max(static_cast<int64_t>(meta[e]), int64_t(0)), max_m);
    } else {
      lo = align_up(e ? max(static_cast<int64_t>(meta[e - 1]), int64_t(0)) : 0, alignment);
      hi = min(static_cast<int64_t>(meta[e]), rows_alloc);
      if (hi < lo) hi = lo;
    }
  };
  __syncthreads();
  for (int e = tid; e < n_experts; e += blockDim.x) {
    int64_t lo, hi, n = 0;
    range(e, lo, hi);
    for (int64_t r = lo; r < hi; ++r) n += (!row_mask || row_mask[r]) ? 1 : 0;
    offs[e] = static_cast<int32_t>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  }
  __syncthreads();
  if (tid == 0) {
    int32_t run = 0;
    for (int e = 0; e < n_experts; ++e) {
      int32_t n = offs[e];
      offs[e] = run;
      run += n;
    }
  }
  __syncthreads();
  for (int e = tid; e < n_experts; e += blockDim.x) {
    int64_t lo, hi, j = 0;
    range(e, lo, hi);
    int64_t off = offs[e];
    for (int64_t r = lo; r < hi; ++r) {
      if (row_mask && !row_mask[r]) continue;
      int64_t b = off + j / kRowsPerBlock;
      if (b >= num_blocks) break;
      rows[b * kRowsPerBlock + j % kRowsPerBlock] = static_cast<int32_t>(r);
      if (j % kRowsPerBlock == 0) block_expert[b] = e;
      ++j;
    }
  }
}

// ---- GEMM --------------------------------------------------------------------------------

// Where FP8 scales live (gemm.h Fp8Scales), as strides: a row ar over k block kb at
// a[ar * a_row + kb * a_kb]; expert e's b row j at b[e * b_group + (j / b_row_div) * b_row +
// kb * b_kb]. b alone (a == nullptr): FP8 weights with activations as given.
struct ScaleStrides {
  const float* a = nullptr;
  const float* b = nullptr;
  int64_t a_row = 0, a_kb = 0, b_group = 0, b_row = 0, b_kb = 0;
  int64_t b_row_div = 1;
};

// The weight scales of `scheme` over [rows, cols] weight matrices (moekit/quant.h; b only).
ScaleStrides weight_scale_strides(QuantScheme scheme, const TensorView& scale, int64_t rows,
                                  int64_t cols) {
  ScaleStrides w;
  w.b = scale.defined() ? scale.ptr<const float>() : nullptr;
  switch (scheme) {
    case QuantScheme::kNone:
      w.b = nullptr;
      break;
    case QuantScheme::kFp8PerTensor:
      w.b_group = 1;
      break;
    case QuantScheme::kFp8PerChannel:
      w.b_group = rows;
      w.b_row = 1;
      break;
    case QuantScheme::kFp8Block128:
      w.b_kb = 1;
      w.b_row_div = 128;
      w.b_row = ceil_div(cols, 128);
      w.b_group = ceil_div(rows, 128) * w.b_row;
      break;
  }
  return w;
}

// c[row] = a[row / a_div] . b[e]^T over the rows of each block (FP8: with the activation and
// weight scales applied per 128-column block of k, per ScaleStrides; weight scales alone
// when sc.b is given without kFP8).
template <class TA, class TB, class TC, bool kFP8>
__global__ void __launch_bounds__(kThreads)
    gemm_rows_kernel(const TA* a, int64_t lda, int a_div, const TB* b, int64_t n, int64_t k,
                     ScaleStrides sc, const int32_t* rows, const int32_t* block_expert, TC* c,
                     int64_t ldc) {
  __shared__ float as[kRowsPerBlock][kChunk];
  const int e = block_expert[blockIdx.x];
  if (e < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int32_t row[kRowsPerBlock];
#pragma unroll
  for (int i = 0; i < kRowsPerBlock; ++i) row[i] = rows[blockIdx.x * kRowsPerBlock + i];
  float acc[8][kRowsPerBlock];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < kRowsPerBlock; ++i) acc[j][i] = 0.f;
  const TB* be = b + static_cast<int64_t>(e) * n * k;
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int len = static_cast<int>(min(static_cast<int64_t>(kChunk), k - k0));
    __syncthreads();
    for (int idx = threadIdx.x; idx < kRowsPerBlock * kChunk; idx += kThreads) {
      int i = idx / kChunk, kk = idx % kChunk;
      float v = 0.f;
      if (row[i] >= 0 && kk < len) {
        int64_t ar = row[i] / a_div;
        v = ld(a, ar * lda + k0 + kk);
        if (kFP8) v *= sc.a[ar * sc.a_row + (k0 + kk) / 128 * sc.a_kb];
      }
      as[i][kk] = v;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t col = static_cast<int64_t>(blockIdx.y) * kColsPerBlock + warp * 8 + j;
      if (col >= n) continue;
      const TB* brow = be + col * k + k0;
      for (int kk = lane * 8; kk < len; kk += 32 * 8) {
        float w[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) w[q] = kk + q < len ? ld(brow, kk + q) : 0.f;
        float s = 1.f;
        if (sc.b != nullptr)  // a chunk of 8 k lies in one 128-column block
          s = sc.b[e * sc.b_group + col / sc.b_row_div * sc.b_row + (k0 + kk) / 128 * sc.b_kb];
#pragma unroll
        for (int i = 0; i < kRowsPerBlock; ++i) {
          float d = 0.f;
#pragma unroll
          for (int q = 0; q < 8; ++q) d += as[i][kk + q] * w[q];
          acc[j][i] += sc.b != nullptr ? d * s : d;
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t col = static_cast<int64_t>(blockIdx.y) * kColsPerBlock + warp * 8 + j;
#pragma unroll
    for (int i = 0; i < kRowsPerBlock; ++i) {
      float v = acc[j][i];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == i && col < n && row[i] >= 0)
        c[static_cast<int64_t>(row[i]) * ldc + col] = cvt<TC>(v);
    }
  }
}

// fn(r, c) for every listed row r of this block (rows[blockIdx.x * kRowsPerBlock + i]; -1:
// none) and every column c < cols of this thread (strided over the threads of blockIdx.y).
template <class Fn>
__device__ __forceinline__ void for_listed_rows(const int32_t* rows, int64_t cols, Fn fn) {
#pragma unroll 1
  for (int i = 0; i < kRowsPerBlock; ++i) {
    int32_t r = rows[blockIdx.x * kRowsPerBlock + i];
    if (r < 0) continue;
    for_cols(cols, [&](int64_t c) { fn(r, c); });
  }
}

// out[r, f] = (silu(h[r, f]) * h[r, F + f] with act, else h[r, f]; h rows of 2F or F) divided
// by scale[0] when a scale is given, rounded to TOut, for the listed rows.
template <class TOut>
__global__ void act_rows_kernel(const float* h, int64_t F, const int32_t* rows, TOut* out,
                                bool act = true, const float* scale = nullptr) {
  const float s = scale ? scale[0] : 1.f;
  for_listed_rows(rows, F, [&](int32_t r, int64_t f) {
    const float* hr = h + static_cast<int64_t>(r) * (act ? 2 * F : F);
    const float v = act ? silu_ref(hr[f]) * hr[F + f] : hr[f];
    out[static_cast<int64_t>(r) * F + f] = cvt<TOut>(scale ? v / s : v);
  });
}

// An MLP's activation and optional biases (f32 or the op's dtype T; null: none).
struct MlpSpec {
  Activation act = Activation::kSiluAndMul;
  const void* gate_up_bias = nullptr;
  bool gate_up_bias_f32 = true;
  const void* down_bias = nullptr;
  bool down_bias_f32 = true;
};

template <class T>
__device__ __forceinline__ float ld_bias(const void* b, bool f32, int64_t i) {
  return f32 ? static_cast<const float*>(b)[i] : ld(static_cast<const T*>(b), i);
}

// The activation of one column from its f32 gate g and up u (kRelu2: g alone), written
// from docs/moe.md "Activations" with precise math.
__device__ float act_ref(Activation act, float g, float u) {
  switch (act) {
    case Activation::kGeluTanhAndMul:
      return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    case Activation::kGeluAndMul:
      return 0.5f * g * (1.0f + erff(g / 1.4142135623730951f)) * u;
    case Activation::kRelu2:
      return g > 0.0f ? g * g : (g != g ? g : 0.0f);
    case Activation::kSwigluOai: {
      const float gc = g != g ? g : fminf(g, 7.0f);
      const float uc = u != u ? u : fminf(fmaxf(u, -7.0f), 7.0f);
      return gc / (1.0f + expf(-1.702f * gc)) * (uc + 1.0f);
    }
    default:
      return silu_ref(g) * u;
  }
}

// out[r, f] = act(h[r, gate cols] + bias, h[r, up cols] + bias) rounded to TOut (through
// bf16 first when round_bf16), for the listed rows (bias row: the block's expert; biases of
// the op's type T). Gate/up columns: f and F + f (concatenated), 2f and 2f + 1 (kSwigluOai),
// f (kRelu2).
template <class T, class TOut = T>
__global__ void mlp_act_rows_kernel(const float* h, int64_t F, const int32_t* rows,
                                    const int32_t* block_expert, MlpSpec spec, TOut* out,
                                    bool round_bf16 = false) {
  const bool single = spec.act == Activation::kRelu2;
  const bool inter = spec.act == Activation::kSwigluOai;
  const int64_t cols = single ? F : 2 * F;
  const int64_t e = block_expert ? block_expert[blockIdx.x] : 0;
  for_listed_rows(rows, F, [&](int32_t r, int64_t f) {
    const float* hr = h + static_cast<int64_t>(r) * cols;
    const int64_t gi = single ? f : (inter ? 2 * f : f), ui = inter ? 2 * f + 1 : F + f;
    float g = hr[gi], u = single ? 0.0f : hr[ui];
    if (spec.gate_up_bias) {
      g += ld_bias<T>(spec.gate_up_bias, spec.gate_up_bias_f32, e * cols + gi);
      if (!single) u += ld_bias<T>(spec.gate_up_bias, spec.gate_up_bias_f32, e * cols + ui);
    }
    float v = act_ref(spec.act, g, u);
    if (round_bf16) v = rounded<__nv_bfloat16>(v);
    out[static_cast<int64_t>(r) * F + f] = cvt<TOut>(v);
  });
}

// y[r, :] += down_bias[e] for the listed rows (e: the block's expert).
template <class T>
__global__ void down_bias_rows_kernel(float* y, int64_t H, const int32_t* rows,
                                      const int32_t* block_expert, MlpSpec spec) {
  const int64_t e = block_expert ? block_expert[blockIdx.x] : 0;
  for_listed_rows(rows, H, [&](int32_t r, int64_t h) {
    y[static_cast<int64_t>(r) * H + h] += ld_bias<T>(spec.down_bias, spec.down_bias_f32, e * H + h);
  });
}

// In place: the listed rows of y [.., H] rounded to bf16 (the FP8 GEMMs' stored rows).
__global__ void bf16_rows_kernel(float* y, int64_t H, const int32_t* rows) {
  for_listed_rows(rows, H, [&](int32_t r, int64_t h) {
    float& v = y[static_cast<int64_t>(r) * H + h];
    v = rounded<__nv_bfloat16>(v);
  });
}

template <class TOut>
__global__ void round_rows_kernel(const float* y, int64_t H, const int32_t* rows, TOut* out) {
  for_listed_rows(rows, H, [&](int32_t r, int64_t h) {
    out[static_cast<int64_t>(r) * H + h] = cvt<TOut>(y[static_cast<int64_t>(r) * H + h]);
  });
}

// How the combine reads each route's MLP output: as computed (f32), or rounded as the
// library's sorted path stores its rows (the op's dtype; bf16 on the FP8 GEMM path).
enum class RouteRows : uint8_t { kF32, kOpDtype, kBF16 };

// out[t] = sum_k valid w[t,k] * y[t*K+k] (+ shared[t]), in f32, k order, each y read as
// `rows` says; rounded once. w == nullptr: weight 1 (apply_router_weight_on_input weighted
// the input instead).
template <class TOut>
__global__ void combine_kernel(RouteIds ids, const float* w, const float* y, const float* shared,
                               int64_t H, int K, int E, const uint8_t* token_mask, RouteRows rows,
                               TOut* out) {
  const int64_t t = blockIdx.x;
  if (token_mask && !token_mask[t]) return;
  for (int64_t h = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; h < H;
       h += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float acc = 0.f;
    for (int k = 0; k < K; ++k) {
      if (ids.local(t * K + k, E) < 0) continue;
      float v = y[(t * K + k) * H + h];
      if (rows == RouteRows::kOpDtype) v = rounded<TOut>(v);
      if (rows == RouteRows::kBF16) v = rounded<__nv_bfloat16>(v);
      acc += (w != nullptr ? w[t * K + k] : 1.0f) * v;
    }
    if (shared) acc += shared[t * H + h];
    out[t * H + h] = cvt<TOut>(acc);
  }
}

template <class TIn, class TOut>
__global__ void post_permute_kernel(const TIn* x, const float* w, const int32_t* inverse, int64_t H,
                                    int K, TOut* out) {
  const int64_t t = blockIdx.x;
  for (int64_t h = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; h < H;
       h += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float acc = 0.f;
    for (int k = 0; k < K; ++k) {
      int32_t p = inverse[t * K + k];
      if (p >= 0) acc += w[t * K + k] * ld(x, static_cast<int64_t>(p) * H + h);
    }
    out[t * H + h] = cvt<TOut>(acc);
  }
}

__global__ void gather_rows_kernel(const uint16_t* src, const int32_t* inverse, int64_t H, int K,
                                   uint16_t* dst) {
  const int64_t r = blockIdx.x;
  const int32_t p = inverse[r];
  if (p < 0) return;
  for_cols(H, [&](int64_t h) { dst[static_cast<int64_t>(p) * H + h] = src[(r / K) * H + h]; });
}

// ---- host helpers -------------------------------------------------------------------------

unsigned grid_y(int64_t cols, int64_t per) {
  return static_cast<unsigned>(std::min<int64_t>(ceil_div(std::max<int64_t>(cols, 1), per), 65535));
}

bool is_half(DType d) {
  return d == DType::kBF16 || d == DType::kF16;
}

void require(bool ok, const char* what, const std::string& msg) {
  if (!ok) throw Error(std::string("moekit::gpu_reference::") + what + ": " + msg);
}

// The bytes carve(cv) takes from a counting Carver.
template <class Carve>
size_t carved_bytes(Carve&& carve) {
  Carver cv{nullptr};
  carve(cv);
  return cv.off;
}

// A carver over an op's scratch of at least `needed` bytes.
Carver scratch_carver(const Workspace& ws, size_t needed, const char* what) {
  require(ws.bytes >= needed, what, "scratch too small");
  return Carver{static_cast<char*>(ws.data)};
}

// Runs `fn` with scalar_t bound to the CUDA type of a bf16/f16 dtype.
template <class Fn>
void dispatch_half(DType d, const char* what, Fn&& fn) {
  if (d == DType::kBF16) {
    fn(__nv_bfloat16{});
  } else if (d == DType::kF16) {
    fn(__half{});
  } else {
    require(false, what, std::string("unsupported dtype ") + dtype_name(d));
  }
}

template <class TA, class TB, class TC, bool kFP8>
void launch_gemm(const TA* a, int64_t lda, int a_div, const TB* b, int64_t n, int64_t k,
                 ScaleStrides sc, const int32_t* rows, const int32_t* block_expert,
                 int64_t num_blocks, TC* c, int64_t ldc, cudaStream_t stream) {
  if (num_blocks <= 0 || n <= 0) return;
  dim3 grid(static_cast<unsigned>(num_blocks), static_cast<unsigned>(ceil_div(n, kColsPerBlock)));
  gemm_rows_kernel<TA, TB, TC, kFP8>
      <<<grid, kThreads, 0, stream>>>(a, lda, a_div, b, n, k, sc, rows, block_expert, c, ldc);
  check_launch("gemm");
}

void launch_layout_blocks(const int32_t* meta, int E, int alignment, int64_t max_m,
                          int64_t rows_alloc, int64_t dense_m, const uint8_t* mask, int32_t* rows,
                          int32_t* block_expert, int64_t num_blocks, cudaStream_t stream) {
  layout_blocks_kernel<<<1, kSortThreads, 0, stream>>>(
      meta, E, alignment, max_m, rows_alloc, dense_m, mask, rows, block_expert, num_blocks);
  check_launch("layout_blocks");
}

// Blocks for a permuted layout of `rows_total` rows over E experts.
int64_t layout_num_blocks(int64_t rows_total, int64_t E) {
  return ceil_div(rows_total, kRowsPerBlock) + E;
}

// The scratch of an MLP over n rows in num_blocks row blocks (the routed pipeline's rows:
// its routes sorted by expert): the blocks' rows and experts, f32 pre-activations h [n,
// h_cols], the activation act [n, act_cols] and f32 outputs y [n, H]; then x_rows input
// rows of H (dtype dt) scaled (apply_router_weight_on_input) and, FP8 weights, f32 copies of
// the input rows and the activation quantized (exact dequantized values, as the FP8 GEMMs
// multiply them) with 2 floats: the amax bits and the dynamic scale.
struct MlpScratch {
  int32_t* rows;
  int32_t* block_expert;
  float* h;
  void* act;
  float* y;
  int64_t num_blocks;
  void* scaled = nullptr;
  float* xq = nullptr;
  float* actq = nullptr;
  float* qscratch = nullptr;
};
MlpScratch carve_mlp(Carver& cv, int64_t num_blocks, int64_t n, int64_t h_cols, int64_t act_cols,
                     int64_t H, DType dt, int64_t x_rows, bool scaled, bool fp8) {
  const int64_t dsize = static_cast<int64_t>(dtype_size(dt));
  MlpScratch s;
  s.num_blocks = num_blocks;
  s.rows = cv.take<int32_t>(num_blocks * kRowsPerBlock);
  s.block_expert = cv.take<int32_t>(num_blocks);
  s.h = cv.take<float>(n * h_cols);
  s.act = cv.take<uint8_t>(n * act_cols * dsize);
  s.y = cv.take<float>(n * H);
  if (scaled) s.scaled = cv.take<uint8_t>(x_rows * H * dsize);
  if (fp8) {
    s.xq = cv.take<float>(x_rows * H);
    s.actq = cv.take<float>(n * act_cols);
    s.qscratch = cv.take<float>(2);
  }
  return s;
}

// The routed-MLP pipeline's (FusedMoEExperts / FusedMoE / FusedMoESharedExpert) for the
// arguments a (K routes per token): the routes padded per expert into blocks, w_gate_up's rows
// per expert as the pre-activation columns.
template <class Args>
MlpScratch carve_routed(Carver& cv, const Args& a, int K) {
  const int64_t T = a.hidden_states.shape[0], E = a.w_gate_up.shape[0];
  const int64_t gu_rows = a.w_gate_up.shape[1], routes = T * K;
  return carve_mlp(cv, ceil_div(routes + E * (kRowsPerBlock - 1), kRowsPerBlock), routes, gu_rows,
                   gu_rows, a.hidden_states.shape[1], a.hidden_states.dtype, T,
                   a.apply_router_weight_on_input, a.quant.scheme != QuantScheme::kNone);
}

// A dense MLP's (the shared expert's) over the T rows of hidden [T, H] with w_gate_up [gu_rows, H].
MlpScratch carve_dense(Carver& cv, const TensorView& hidden, const TensorView& w_gate_up,
                       const WeightQuant& quant) {
  const int64_t T = hidden.shape[0], gu_rows = w_gate_up.shape[0];
  return carve_mlp(cv, layout_num_blocks(T, 1), T, gu_rows, gu_rows, hidden.shape[1], hidden.dtype,
                   T, false, quant.scheme != QuantScheme::kNone);
}

// ---- FP8 activation quantization (Fp8Activations::kQuantized) ----

using reference::Fp8Activations;

// v quantized to e4m3 with scale s and back (quantize_fp8.h's formula).
__device__ __forceinline__ float fp8_round_trip(float v, float s) {
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3))) * s;
}

// Row i of a block: rows[b * kRowsPerBlock + i] (-1: none), or b * kRowsPerBlock + i below
// n_rows without a list.
__device__ __forceinline__ int64_t listed_row(const int32_t* rows, int64_t n_rows, int i) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + i;
  if (rows != nullptr) return rows[r];
  return r < n_rows ? r : -1;
}

constexpr int kQuantThreads = 128;

// amax (f32 bits) over the listed rows of x [.., cols].
template <class T>
__global__ void amax_rows_kernel(const T* x, int64_t cols, const int32_t* rows, int64_t n_rows,
                                 unsigned* amax) {
  float m = 0.f;
  for (int i = 0; i < kRowsPerBlock; ++i) {
    const int64_t r = listed_row(rows, n_rows, i);
    if (r < 0) continue;
    for (int64_t c = threadIdx.x; c < cols; c += kQuantThreads)
      m = fmaxf(m, fabsf(ld(x, r * cols + c)));
  }
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) atomicMax(amax, __float_as_uint(m));
}

// ulps: the amax moved by that many bf16 steps first (Fp8Acts::act_amax_ulps; a bf16 value's
// f32 bits end in 16 zero bits, so one step is 0x10000), never below zero.
__global__ void amax_scale_kernel(const unsigned* amax, float* scale, int ulps) {
  const long long bits = static_cast<long long>(*amax) + static_cast<long long>(ulps) * 0x10000;
  const float m = __uint_as_float(static_cast<unsigned>(bits < 0 ? 0 : bits));
  *scale = __fdiv_rn(fmaxf(m, 1e-10f), 448.f);
}

// The listed rows of x [.., cols] quantized to e4m3 and back into the same rows of y (f32:
// the exact dequantized values; y may be x), each `group` columns with their own scale
// max(amax, 1e-10) / 448, or all with *tensor_scale when given.
template <class T>
__global__ void fp8_rows_kernel(const T* x, float* y, int64_t cols, const int32_t* rows,
                                int64_t n_rows, int64_t group, const float* tensor_scale) {
  __shared__ float part[kQuantThreads / 32];
  for (int i = 0; i < kRowsPerBlock; ++i) {
    const int64_t r = listed_row(rows, n_rows, i);
    if (r < 0) continue;  // uniform over the block
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
      const int64_t g1 = min(cols, g0 + group);
      float s;
      if (tensor_scale != nullptr) {
        s = *tensor_scale;
      } else {
        float m = 0.f;
        for (int64_t c = g0 + threadIdx.x; c < g1; c += kQuantThreads)
          m = fmaxf(m, fabsf(ld(x, r * cols + c)));
        for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        __syncthreads();
        if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = m;
        __syncthreads();
        m = 0.f;
        for (int w = 0; w < kQuantThreads / 32; ++w) m = fmaxf(m, part[w]);
        s = __fdiv_rn(fmaxf(m, 1e-10f), 448.f);
      }
      for (int64_t c = g0 + threadIdx.x; c < g1; c += kQuantThreads)
        y[r * cols + c] = fp8_round_trip(ld(x, r * cols + c), s);
    }
  }
}

// What a FP8 GEMM path quantizes (scheme kNone: nothing): static_scale, fp8_per_tensor's given
// scale; scratch: 2 floats (the amax bits and the dynamic per-tensor scale).
struct ActQuant {
  QuantScheme scheme = QuantScheme::kNone;
  const float* static_scale = nullptr;
  float* scratch = nullptr;
  int amax_ulps = 0;  // a dynamic per-tensor scale's amax moved by this many bf16 steps
};

// The listed rows (num_blocks blocks of `rows`, or n_rows rows without a list) of x [.., cols]
// quantized to e4m3 by q's scheme and back into y (f32; may be x).
template <class T>
void fp8_round_trip_rows(const T* x, float* y, int64_t cols, const int32_t* rows,
                         int64_t num_blocks, int64_t n_rows, const ActQuant& q,
                         cudaStream_t stream) {
  if (q.scheme == QuantScheme::kNone || num_blocks <= 0) return;
  const float* tensor_scale = nullptr;
  if (q.scheme == QuantScheme::kFp8PerTensor) {
    tensor_scale = q.static_scale;
    if (tensor_scale == nullptr) {
      unsigned* amax = reinterpret_cast<unsigned*>(q.scratch);
      require(cudaMemsetAsync(amax, 0, sizeof(unsigned), stream) == cudaSuccess, "fp8 amax",
              "cudaMemsetAsync failed");
      amax_rows_kernel<T><<<static_cast<unsigned>(num_blocks), kQuantThreads, 0, stream>>>(
          x, cols, rows, n_rows, amax);
      amax_scale_kernel<<<1, 1, 0, stream>>>(amax, q.scratch + 1, q.amax_ulps);
      check_launch("fp8 amax");
      tensor_scale = q.scratch + 1;
    }
  }
  const int64_t group = q.scheme == QuantScheme::kFp8Block128 ? 128 : cols;
  fp8_rows_kernel<T><<<static_cast<unsigned>(num_blocks), kQuantThreads, 0, stream>>>(
      x, y, cols, rows, n_rows, group, tensor_scale);
  check_launch("fp8 round trip");
}

// The input's and the activation's quantization of weights q (acts kQuantized, a FP8 scheme).
ActQuant input_quant(const WeightQuant& q, Fp8Acts acts, float* scratch) {
  if (acts.mode == Fp8Activations::kQuantizedTiesFlipped) {
    throw Error(
        "moekit::gpu_reference: Fp8Activations::kQuantizedTiesFlipped is a CPU reference "
        "reading only");
  }
  if (acts.mode != Fp8Activations::kQuantized) return {};
  return {q.scheme, q.a_gate_up_scale.defined() ? q.a_gate_up_scale.ptr<float>() : nullptr,
          scratch};
}
ActQuant act_quant(const WeightQuant& q, Fp8Acts acts, float* scratch) {
  if (acts.mode != Fp8Activations::kQuantized) return {};
  return {q.scheme, q.a_down_scale.defined() ? q.a_down_scale.ptr<float>() : nullptr, scratch,
          acts.act_amax_ulps};
}

// y[r] = MLP(x[r / a_div]) in f32 for the rows of the blocks of s (f32 gate/up plus bias, the
// activation rounded to scalar_t, f32 down plus bias). `dense`: one expert (bias row 0).
// FP8 weights (WT = e4m3) with their scales: dequantized as they are read; act_q: the
// activation quantized as the FP8 GEMM paths do (x then is the quantized f32 input, TX =
// float): rounded to bf16 as the gate/up epilogue stores it (not with a static scale: the
// epilogue writes e4m3 from f32), then to e4m3 and back into s.actq, which the down GEMM reads.
template <class scalar_t, class WT = scalar_t, class TX = scalar_t>
void mlp_rows(const TX* x, int a_div, const WT* w_gate_up, const WT* w_down, int64_t F, int64_t H,
              const MlpScratch& s, const MlpSpec& spec, bool dense, cudaStream_t stream,
              ScaleStrides s_gate_up = {}, ScaleStrides s_down = {}, const ActQuant& act_q = {}) {
  const int64_t up_cols = spec.act == Activation::kRelu2 ? F : 2 * F;
  launch_gemm<TX, WT, float, false>(x, H, a_div, w_gate_up, up_cols, H, s_gate_up, s.rows,
                                    s.block_expert, s.num_blocks, s.h, up_cols, stream);
  if (s.num_blocks <= 0) return;
  const int32_t* bias_expert = dense ? nullptr : s.block_expert;
  const dim3 act_grid(static_cast<unsigned>(s.num_blocks), grid_y(F, 256));
  if constexpr (std::is_same_v<WT, __nv_fp8_e4m3>) {
    if (act_q.scheme != QuantScheme::kNone) {
      mlp_act_rows_kernel<scalar_t, float><<<act_grid, 256, 0, stream>>>(
          s.h, F, s.rows, bias_expert, spec, s.actq, act_q.static_scale == nullptr);
      check_launch("act");
      fp8_round_trip_rows<float>(s.actq, s.actq, F, s.rows, s.num_blocks, 0, act_q, stream);
      launch_gemm<float, WT, float, false>(s.actq, F, 1, w_down, H, F, s_down, s.rows,
                                           s.block_expert, s.num_blocks, s.y, H, stream);
    }
  }
  if (act_q.scheme == QuantScheme::kNone) {
    scalar_t* act = static_cast<scalar_t*>(s.act);
    mlp_act_rows_kernel<scalar_t>
        <<<act_grid, 256, 0, stream>>>(s.h, F, s.rows, bias_expert, spec, act);
    check_launch("act");
    launch_gemm<scalar_t, WT, float, false>(act, F, 1, w_down, H, F, s_down, s.rows, s.block_expert,
                                            s.num_blocks, s.y, H, stream);
  }
  if (spec.down_bias) {
    down_bias_rows_kernel<scalar_t>
        <<<dim3(static_cast<unsigned>(s.num_blocks), grid_y(H, 256)), 256, 0, stream>>>(
            s.y, H, s.rows, bias_expert, spec);
    check_launch("down_bias");
  }
}

// mlp_rows with the weights of `q`'s scheme (bf16 / f16 as scalar_t, or e4m3 and scales). TX:
// float for the quantized input (FP8 weights only).
template <class scalar_t, class TX = scalar_t>
void mlp_rows_quant(const TX* x, int a_div, const TensorView& w_gate_up, const TensorView& w_down,
                    const WeightQuant& q, int64_t F, int64_t H, const MlpScratch& s,
                    const MlpSpec& spec, bool dense, cudaStream_t stream,
                    const ActQuant& act_q = {}) {
  if constexpr (std::is_same_v<TX, scalar_t>) {
    if (q.scheme == QuantScheme::kNone) {
      mlp_rows<scalar_t>(x, a_div, w_gate_up.ptr<scalar_t>(), w_down.ptr<scalar_t>(), F, H, s, spec,
                         dense, stream);
      return;
    }
  }
  const int64_t up_cols = spec.act == Activation::kRelu2 ? F : 2 * F;
  mlp_rows<scalar_t, __nv_fp8_e4m3, TX>(
      x, a_div, w_gate_up.ptr<__nv_fp8_e4m3>(), w_down.ptr<__nv_fp8_e4m3>(), F, H, s, spec, dense,
      stream, weight_scale_strides(q.scheme, q.w_gate_up_scale, up_cols, H),
      weight_scale_strides(q.scheme, q.w_down_scale, H, F), act_q);
}

// mlp_rows_quant over x [x_rows, H] (a_div: row r reads x row r / a_div) or, when the input
// is quantized (FP8 weights, Fp8Activations::kQuantized), over its f32 round trip in s.xq:
// all x_rows rows (x_rows < 0: the rows of s's blocks).
template <class scalar_t>
void quantizing_mlp_rows(const scalar_t* x, int64_t x_rows, int a_div, const TensorView& w_gate_up,
                         const TensorView& w_down, const WeightQuant& q, Fp8Acts acts, int64_t F,
                         int64_t H, const MlpScratch& s, const MlpSpec& spec, bool dense,
                         cudaStream_t stream) {
  const ActQuant in_q = input_quant(q, acts, s.qscratch);
  const ActQuant act_q = act_quant(q, acts, s.qscratch);
  if (in_q.scheme == QuantScheme::kNone) {
    mlp_rows_quant<scalar_t>(x, a_div, w_gate_up, w_down, q, F, H, s, spec, dense, stream, act_q);
    return;
  }
  if (x_rows < 0) {
    fp8_round_trip_rows(x, s.xq, H, s.rows, s.num_blocks, 0, in_q, stream);
  } else {
    fp8_round_trip_rows(x, s.xq, H, nullptr, ceil_div(x_rows, kRowsPerBlock), x_rows, in_q, stream);
  }
  mlp_rows_quant<scalar_t, float>(s.xq, a_div, w_gate_up, w_down, q, F, H, s, spec, dense, stream,
                                  act_q);
  // The FP8 down GEMM stores its rows in bf16 (then cast where the op's dtype is f16).
  if (s.num_blocks > 0) {
    bf16_rows_kernel<<<dim3(static_cast<unsigned>(s.num_blocks), grid_y(H, 256)), 256, 0, stream>>>(
        s.y, H, s.rows);
    check_launch("fp8 rows");
  }
}

MlpSpec mlp_spec(Activation act, const TensorView& gate_up_bias, const TensorView& down_bias) {
  MlpSpec s;
  s.act = act;
  s.gate_up_bias = gate_up_bias.defined() ? gate_up_bias.data : nullptr;
  s.gate_up_bias_f32 = gate_up_bias.dtype == DType::kF32;
  s.down_bias = down_bias.defined() ? down_bias.data : nullptr;
  s.down_bias_f32 = down_bias.dtype == DType::kF32;
  return s;
}

// The intermediate size of an MLP whose w_gate_up has `rows` rows (per expert).
int64_t mlp_width(Activation act, int64_t rows) {
  return act == Activation::kRelu2 ? rows : rows / 2;
}

// s.scaled given: apply_router_weight_on_input (K = 1), the MLP reads the scaled rows
// and the combine weighs nothing.
template <class scalar_t>
void routed_mlp(const TensorView& hidden, const TensorView& w_gate_up, const TensorView& w_down,
                const WeightQuant& quant, RouteIds ids, const float* weights, int K,
                const uint8_t* token_mask, const MlpScratch& s, const float* shared_y,
                const TensorView& out, bool round_routes, const MlpSpec& spec, cudaStream_t stream,
                Fp8Acts acts) {
  const int64_t T = hidden.shape[0], H = hidden.shape[1];
  const int64_t E = w_gate_up.shape[0], F = mlp_width(spec.act, w_gate_up.shape[1]);
  check_experts("routed_mlp", E);
  const scalar_t* x = hidden.ptr<scalar_t>();
  if (s.scaled != nullptr && T > 0 && H > 0) {
    scale_rows_kernel<scalar_t><<<dim3(static_cast<unsigned>(T), grid_y(H, 256)), 256, 0, stream>>>(
        x, weights, H, static_cast<scalar_t*>(s.scaled));
    check_launch("apply_router_weight_on_input");
    x = static_cast<const scalar_t*>(s.scaled);
    weights = nullptr;
  }
  if (T > 0 && K > 0) {
    const int64_t routes = T * K;
    sort_routes_kernel<<<1, kSortThreads, 0, stream>>>(
        ids, routes, K, static_cast<int>(E), kRowsPerBlock, token_mask, s.rows,
        s.num_blocks * kRowsPerBlock, -1, s.block_expert, s.num_blocks, nullptr, nullptr, nullptr);
    check_launch("sort_routes");
    // Quantizing: all T rows, after the scaling.
    quantizing_mlp_rows<scalar_t>(x, T, K, w_gate_up, w_down, quant, acts, F, H, s, spec, false,
                                  stream);
  }
  if (T > 0 && H > 0) {
    const bool bf16_rows = input_quant(quant, acts, nullptr).scheme != QuantScheme::kNone;
    const RouteRows rows = !round_routes ? RouteRows::kF32
                           : bf16_rows   ? RouteRows::kBF16
                                         : RouteRows::kOpDtype;
    combine_kernel<scalar_t><<<dim3(static_cast<unsigned>(T), grid_y(H, 256)), 256, 0, stream>>>(
        ids, weights, s.y, shared_y, H, K, static_cast<int>(E), token_mask, rows,
        out.ptr<scalar_t>());
    check_launch("combine");
  }
}

template <class scalar_t>
void dense_mlp(const TensorView& hidden, const TensorView& w_gate_up, const TensorView& w_down,
               const WeightQuant& quant, const uint8_t* token_mask, const MlpScratch& s,
               const MlpSpec& spec, cudaStream_t stream, Fp8Acts acts) {
  const int64_t T = hidden.shape[0], H = hidden.shape[1];
  const int64_t S = mlp_width(spec.act, w_gate_up.shape[0]);
  if (T == 0) return;
  launch_layout_blocks(nullptr, 1, 1, 0, T, T, token_mask, s.rows, s.block_expert, s.num_blocks,
                       stream);
  quantizing_mlp_rows<scalar_t>(hidden.ptr<scalar_t>(), T, 1, w_gate_up, w_down, quant, acts, S, H,
                                s, spec, true, stream);
}

}  // namespace

// ---- public entries -----------------------------------------------------------------------

void fused_topk(const FusedTopKArgs& args, cudaStream_t stream) {
  const int64_t T = args.gating_output.shape[0];
  const int E = static_cast<int>(args.gating_output.shape[1]);
  const TopKParams& p = args.params;
  if (T == 0) return;
  const float* bias = args.correction_bias.defined() ? args.correction_bias.ptr<float>() : nullptr;
  const bool sig = p.scoring_func == ScoringFunc::kSigmoid;
  if (p.num_expert_group > kTopKRefMaxGroups)
    throw Error("moekit::gpu_reference::fused_topk: at most " + std::to_string(kTopKRefMaxGroups) +
                " expert groups, got " + std::to_string(p.num_expert_group));
  const unsigned blocks = static_cast<unsigned>(ceil_div(T, 128));
  auto go = [&](auto tag) {
    using T_ = decltype(tag);
    topk_kernel<T_><<<blocks, 128, 0, stream>>>(
        args.gating_output.ptr<T_>(), T, E, bias, p.top_k, p.renormalize, sig, p.num_expert_group,
        p.topk_group, p.routed_scaling_factor, args.topk_weights.ptr<float>(),
        args.topk_ids.ptr<int32_t>());
  };
  if (args.gating_output.dtype == DType::kF32)
    go(float{});
  else
    dispatch_half(args.gating_output.dtype, "fused_topk", go);
  check_launch("fused_topk");
}

void moe_permute_align(const PermuteAlignArgs& args, cudaStream_t stream) {
  const int64_t routes = args.topk_ids.numel();
  const int K = args.topk_ids.ndim == 2 ? static_cast<int>(args.topk_ids.shape[1]) : 1;
  check_experts("moe_permute_align", args.num_experts);
  sort_routes_kernel<<<1, kSortThreads, 0, stream>>>(
      route_ids(args.topk_ids, args.expert_map), routes, std::max(K, 1), args.num_experts,
      args.block_size, nullptr, args.sorted_token_ids.ptr<int32_t>(), args.sorted_token_ids.numel(),
      static_cast<int32_t>(routes), args.expert_ids.ptr<int32_t>(), args.expert_ids.numel(),
      args.num_tokens_post_padded.ptr<int32_t>(), nullptr, nullptr);
  check_launch("moe_permute_align");
}

void moe_pre_permute(const PrePermuteArgs& args, cudaStream_t stream) {
  const int64_t T = args.hidden_states.shape[0], H = args.hidden_states.shape[1];
  const int K = static_cast<int>(args.local_expert_ids.shape[1]);
  const int64_t routes = T * K;
  check_experts("moe_pre_permute", args.num_local_experts);
  require(is_half(args.hidden_states.dtype), "moe_pre_permute", "hidden_states must be bf16/f16");
  sort_routes_kernel<<<1, kSortThreads, 0, stream>>>(
      route_ids(args.local_expert_ids), routes, std::max(K, 1), args.num_local_experts,
      std::max(args.layout.alignment, 1), nullptr, nullptr, 0, 0, nullptr, 0, nullptr,
      args.inverse_indices.ptr<int32_t>(), args.layout_metadata.ptr<int32_t>());
  check_launch("moe_pre_permute.sort");
  if (routes > 0 && H > 0) {
    gather_rows_kernel<<<dim3(static_cast<unsigned>(routes), grid_y(H, 256)), 256, 0, stream>>>(
        args.hidden_states.ptr<uint16_t>(), args.inverse_indices.ptr<int32_t>(), H, K,
        args.permuted.ptr<uint16_t>());
    check_launch("moe_pre_permute.gather");
  }
}

void moe_post_permute(const PostPermuteArgs& args, cudaStream_t stream) {
  const int64_t T = args.topk_weights.shape[0], H = args.expert_output.shape[1];
  const int K = static_cast<int>(args.topk_weights.shape[1]);
  if (T == 0 || H == 0) return;
  dim3 grid(static_cast<unsigned>(T), grid_y(H, 256));
  dispatch_half(args.expert_output.dtype, "moe_post_permute", [&](auto tag) {
    using TIn = decltype(tag);
    if (args.out.dtype == DType::kF32) {
      post_permute_kernel<TIn, float><<<grid, 256, 0, stream>>>(
          args.expert_output.ptr<TIn>(), args.topk_weights.ptr<float>(),
          args.inverse_indices.ptr<int32_t>(), H, K, args.out.ptr<float>());
    } else {
      post_permute_kernel<TIn, TIn><<<grid, 256, 0, stream>>>(
          args.expert_output.ptr<TIn>(), args.topk_weights.ptr<float>(),
          args.inverse_indices.ptr<int32_t>(), H, K, args.out.ptr<TIn>());
    }
  });
  check_launch("moe_post_permute");
}

namespace {

struct GemmLayout {
  int64_t rows_total, num_blocks, E, max_m;
  int alignment;
};

GemmLayout gemm_layout(const TensorView& a, const TensorView& b, const PermutedLayout& layout) {
  GemmLayout g;
  g.E = b.shape[0];
  const bool masked = layout.kind == PermutedLayout::Kind::kMasked;
  g.max_m = masked ? a.shape[1] : 0;
  g.rows_total = masked ? a.shape[0] * a.shape[1] : a.shape[0];
  g.alignment = std::max(layout.alignment, 1);
  g.num_blocks = layout_num_blocks(g.rows_total, g.E);
  return g;
}

// A GEMM's scratch: the row blocks (rows, block_expert), then (with_h) f32 rows h [rows_total,
// b's rows]; carved from base (null: only sized).
struct GemmScratch {
  int32_t* rows;
  int32_t* be;
  float* h;
  size_t bytes;
};
GemmScratch carve_gemm(char* base, const GemmLayout& g, const TensorView& b, bool with_h) {
  Carver cv{base};
  GemmScratch s;
  s.rows = cv.take<int32_t>(g.num_blocks * kRowsPerBlock);
  s.be = cv.take<int32_t>(g.num_blocks);
  s.h = with_h ? cv.take<float>(g.rows_total * b.shape[1]) : nullptr;
  s.bytes = cv.off;
  return s;
}

// The layout and scratch of a GEMM op's call (scratch checked), its row blocks listed (none
// when it has no rows).
struct GemmCall {
  GemmLayout g;
  GemmScratch s;
};
GemmCall gemm_call(const char* op, const TensorView& a, const TensorView& b,
                   const PermutedLayout& layout, const TensorView& layout_metadata, bool with_h,
                   Workspace scratch, const uint8_t* row_mask, cudaStream_t stream) {
  GemmCall c;
  c.g = gemm_layout(a, b, layout);
  check_experts(op, c.g.E);
  require(scratch.bytes >= carve_gemm(nullptr, c.g, b, with_h).bytes, op, "scratch too small");
  c.s = carve_gemm(static_cast<char*>(scratch.data), c.g, b, with_h);
  if (c.g.rows_total > 0) {
    launch_layout_blocks(layout_metadata.ptr<int32_t>(), static_cast<int>(c.g.E), c.g.alignment,
                         c.g.max_m, c.g.rows_total, -1, row_mask, c.s.rows, c.s.be, c.g.num_blocks,
                         stream);
  }
  return c;
}

}  // namespace

size_t grouped_gemm_scratch_bytes(const GroupedGemmArgs& args) {
  return carve_gemm(nullptr, gemm_layout(args.a, args.b, args.layout), args.b,
                    args.activation == Activation::kSiluAndMul)
      .bytes;
}

void moe_grouped_gemm(const GroupedGemmArgs& args, Workspace scratch, cudaStream_t stream,
                      const uint8_t* row_mask) {
  const bool act = args.activation == Activation::kSiluAndMul;
  const GemmCall c = gemm_call("moe_grouped_gemm", args.a, args.b, args.layout,
                               args.layout_metadata, act, scratch, row_mask, stream);
  const GemmLayout& g = c.g;
  if (g.rows_total == 0) return;
  const int64_t kd = args.b.shape[2], nb = args.b.shape[1], n = act ? nb / 2 : nb;
  dispatch_half(args.a.dtype, "moe_grouped_gemm", [&](auto tag) {
    using T = decltype(tag);
    const T* a = args.a.ptr<T>();
    const T* b = args.b.ptr<T>();
    if (act) {
      launch_gemm<T, T, float, false>(a, kd, 1, b, nb, kd, ScaleStrides{}, c.s.rows, c.s.be,
                                      g.num_blocks, c.s.h, nb, stream);
      dim3 grid(static_cast<unsigned>(g.num_blocks), grid_y(n, 256));
      if (args.c.dtype == DType::kF32)
        act_rows_kernel<float><<<grid, 256, 0, stream>>>(c.s.h, n, c.s.rows, args.c.ptr<float>());
      else
        act_rows_kernel<T><<<grid, 256, 0, stream>>>(c.s.h, n, c.s.rows, args.c.ptr<T>());
      check_launch("moe_grouped_gemm.act");
    } else if (args.c.dtype == DType::kF32) {
      launch_gemm<T, T, float, false>(a, kd, 1, b, n, kd, ScaleStrides{}, c.s.rows, c.s.be,
                                      g.num_blocks, args.c.ptr<float>(), n, stream);
    } else {
      launch_gemm<T, T, T, false>(a, kd, 1, b, n, kd, ScaleStrides{}, c.s.rows, c.s.be,
                                  g.num_blocks, args.c.ptr<T>(), n, stream);
    }
  });
}

namespace {

PermutedLayout fp8_layout(const GroupedGemmFP8Args& args) {
  return args.layout.kind == PermutedLayout::Kind::kMasked ? PermutedLayout::masked(args.a.shape[1])
                                                           : args.layout;
}

// gemm.h Fp8Scales as strides (b_rows: b's rows per expert, KB k blocks).
ScaleStrides fp8_strides(const GroupedGemmFP8Args& args) {
  const int64_t b_rows = args.b.shape[1], KB = ceil_div(args.b.shape[2], int64_t{128});
  ScaleStrides sc;
  sc.a = args.a_scale.ptr<float>();
  sc.b = args.b_scale.ptr<float>();
  if (args.scales == Fp8Scales::kBlock) {
    sc.a_row = KB;
    sc.a_kb = 1;
    sc.b_group = ceil_div(b_rows, int64_t{128}) * KB;
    sc.b_row_div = 128;
    sc.b_row = KB;
    sc.b_kb = 1;
  } else if (args.scales == Fp8Scales::kPerChannel) {
    sc.a_row = 1;
    sc.b_group = b_rows;
    sc.b_row = 1;
  } else {
    sc.b_group = 1;
  }
  return sc;
}

}  // namespace

size_t grouped_gemm_fp8_scratch_bytes(const GroupedGemmFP8Args& args) {
  return carve_gemm(nullptr, gemm_layout(args.a, args.b, fp8_layout(args)), args.b,
                    args.activation == Activation::kSiluAndMul || args.c.dtype == DType::kFP8E4M3)
      .bytes;
}

void moe_grouped_gemm_fp8(const GroupedGemmFP8Args& args, Workspace scratch, cudaStream_t stream,
                          const uint8_t* row_mask) {
  const bool act = args.activation == Activation::kSiluAndMul;
  const bool fp8_out = args.c.dtype == DType::kFP8E4M3;
  const GemmCall c = gemm_call("moe_grouped_gemm_fp8", args.a, args.b, fp8_layout(args),
                               args.layout_metadata, act || fp8_out, scratch, row_mask, stream);
  const GemmLayout& g = c.g;
  if (g.rows_total == 0) return;
  const int64_t kd = args.b.shape[2], nb = args.b.shape[1], n = act ? nb / 2 : nb;
  const auto* a = args.a.ptr<__nv_fp8_e4m3>();
  const auto* b = args.b.ptr<__nv_fp8_e4m3>();
  if (act || fp8_out) {
    launch_gemm<__nv_fp8_e4m3, __nv_fp8_e4m3, float, true>(
        a, kd, 1, b, nb, kd, fp8_strides(args), c.s.rows, c.s.be, g.num_blocks, c.s.h, nb, stream);
    dim3 grid(static_cast<unsigned>(g.num_blocks), grid_y(n, 256));
    if (fp8_out) {
      act_rows_kernel<__nv_fp8_e4m3><<<grid, 256, 0, stream>>>(
          c.s.h, n, c.s.rows, args.c.ptr<__nv_fp8_e4m3>(), act, args.c_scale.ptr<float>());
    } else {
      act_rows_kernel<__nv_bfloat16>
          <<<grid, 256, 0, stream>>>(c.s.h, n, c.s.rows, args.c.ptr<__nv_bfloat16>());
    }
    check_launch("moe_grouped_gemm_fp8.out");
  } else {
    launch_gemm<__nv_fp8_e4m3, __nv_fp8_e4m3, __nv_bfloat16, true>(
        a, kd, 1, b, n, kd, fp8_strides(args), c.s.rows, c.s.be, g.num_blocks,
        args.c.ptr<__nv_bfloat16>(), n, stream);
  }
}

namespace {

// moe_expert_mlp's: the P rows of the layout's blocks, f32 gate/up rows [P, 2F].
MlpScratch carve_expert_mlp(Carver& cv, const ExpertMLPArgs& args) {
  const int64_t P = args.expert_input.shape[0], E = args.w_gate_up.shape[0];
  const int64_t F = mlp_width(args.activation, args.w_gate_up.shape[1]);
  return carve_mlp(cv, layout_num_blocks(P, E), P, 2 * F, F, args.expert_input.shape[1],
                   args.expert_input.dtype, P, false, args.quant.scheme != QuantScheme::kNone);
}

}  // namespace

size_t expert_mlp_scratch_bytes(const ExpertMLPArgs& args) {
  return carved_bytes([&](Carver& cv) { carve_expert_mlp(cv, args); });
}

void moe_expert_mlp(const ExpertMLPArgs& args, cudaStream_t stream, const uint8_t* row_mask,
                    Fp8Acts acts) {
  const int64_t P = args.expert_input.shape[0], H = args.expert_input.shape[1];
  const int64_t E = args.w_gate_up.shape[0],
                F = mlp_width(args.activation, args.w_gate_up.shape[1]);
  check_experts("moe_expert_mlp", E);
  Carver cv = scratch_carver(args.workspace, expert_mlp_scratch_bytes(args), "moe_expert_mlp");
  if (P == 0) return;
  const MlpScratch s = carve_expert_mlp(cv, args);
  launch_layout_blocks(args.layout_metadata.ptr<int32_t>(), static_cast<int>(E),
                       std::max(args.layout.alignment, 1), 0, P, -1, row_mask, s.rows,
                       s.block_expert, s.num_blocks, stream);
  dispatch_half(args.expert_input.dtype, "moe_expert_mlp", [&](auto tag) {
    using T = decltype(tag);
    // Quantizing: the rows in the groups (padding rows hold no data).
    quantizing_mlp_rows<T>(
        args.expert_input.ptr<T>(), -1, 1, args.w_gate_up, args.w_down, args.quant, acts, F, H, s,
        mlp_spec(args.activation, args.gate_up_bias, args.down_bias), false, stream);
    round_rows_kernel<T>
        <<<dim3(static_cast<unsigned>(s.num_blocks), grid_y(H, 256)), 256, 0, stream>>>(
            s.y, H, s.rows, args.expert_output.ptr<T>());
    check_launch("moe_expert_mlp.round");
  });
}

size_t fused_moe_experts_scratch_bytes(const FusedMoEExpertsArgs& args) {
  return carved_bytes(
      [&](Carver& cv) { carve_routed(cv, args, static_cast<int>(args.topk_ids.shape[1])); });
}

void fused_moe_experts(const FusedMoEExpertsArgs& args, cudaStream_t stream,
                       const uint8_t* row_mask, bool round_routes, Fp8Acts acts) {
  Carver cv =
      scratch_carver(args.workspace, fused_moe_experts_scratch_bytes(args), "fused_moe_experts");
  const int K = static_cast<int>(args.topk_ids.shape[1]);
  const MlpScratch s = carve_routed(cv, args, K);
  dispatch_half(args.hidden_states.dtype, "fused_moe_experts", [&](auto tag) {
    using T = decltype(tag);
    routed_mlp<T>(args.hidden_states, args.w_gate_up, args.w_down, args.quant,
                  route_ids(args.topk_ids, args.expert_map), args.topk_weights.ptr<float>(), K,
                  row_mask, s, nullptr, args.output, round_routes,
                  mlp_spec(args.activation, args.gate_up_bias, args.down_bias), stream, acts);
  });
}

size_t shared_expert_mlp_scratch_bytes(const SharedExpertMLPArgs& args) {
  return carved_bytes(
      [&](Carver& cv) { carve_dense(cv, args.hidden_states, args.w_gate_up, args.quant); });
}

void shared_expert_mlp(const SharedExpertMLPArgs& args, cudaStream_t stream,
                       const uint8_t* row_mask, Fp8Acts acts) {
  Carver cv =
      scratch_carver(args.workspace, shared_expert_mlp_scratch_bytes(args), "shared_expert_mlp");
  const int64_t T = args.hidden_states.shape[0], H = args.hidden_states.shape[1];
  const MlpScratch s = carve_dense(cv, args.hidden_states, args.w_gate_up, args.quant);
  if (T == 0) return;
  dispatch_half(args.hidden_states.dtype, "shared_expert_mlp", [&](auto tag) {
    using T_ = decltype(tag);
    dense_mlp<T_>(args.hidden_states, args.w_gate_up, args.w_down, args.quant, row_mask, s,
                  mlp_spec(args.activation, args.gate_up_bias, args.down_bias), stream, acts);
    round_rows_kernel<T_>
        <<<dim3(static_cast<unsigned>(s.num_blocks), grid_y(H, 256)), 256, 0, stream>>>(
            s.y, H, s.rows, args.output.ptr<T_>());
    check_launch("shared_expert_mlp.round");
  });
}

namespace {

// The layer's scratch: the routing's ids and weights [T, K], the routed MLP's, then (a shared
// expert) the dense MLP's.
struct FusedScratch {
  int32_t* ids;
  float* w;
  MlpScratch routed;
  MlpScratch shared{};
};
FusedScratch carve_fused(Carver& cv, const FusedMoEArgs& a,
                         const FusedMoESharedExpertArgs* shared) {
  const int64_t T = a.hidden_states.shape[0];
  const int K = a.params.top_k;
  FusedScratch s;
  s.ids = cv.take<int32_t>(T * K);
  s.w = cv.take<float>(T * K);
  s.routed = carve_routed(cv, a, K);
  if (shared && shared->shared_w_gate_up.defined())
    s.shared = carve_dense(cv, a.hidden_states, shared->shared_w_gate_up, shared->shared_quant);
  return s;
}

void run_fused(const FusedMoEArgs& a, cudaStream_t stream, const uint8_t* mask,
               const FusedMoESharedExpertArgs* shared, bool round_routes, Carver& cv, Fp8Acts acts,
               Fp8Acts shared_acts) {
  const int64_t T = a.hidden_states.shape[0];
  const int K = a.params.top_k;
  const FusedScratch fs = carve_fused(cv, a, shared);
  int32_t* ids = fs.ids;
  float* w = fs.w;
  const MlpScratch& rs = fs.routed;
  const MlpScratch& ds = fs.shared;
  const bool has_shared = shared && shared->shared_w_gate_up.defined();
  FusedTopKArgs tk;
  tk.gating_output = a.gating_output;
  tk.correction_bias = a.correction_bias;
  tk.params = a.params;
  tk.topk_weights = make_view(w, DType::kF32, {T, K});
  tk.topk_ids = make_view(ids, DType::kI32, {T, K});
  gpu_reference::fused_topk(tk, stream);
  dispatch_half(a.hidden_states.dtype, "fused_moe", [&](auto tag) {
    using T_ = decltype(tag);
    const float* shared_y = nullptr;
    if (has_shared) {
      dense_mlp<T_>(a.hidden_states, shared->shared_w_gate_up, shared->shared_w_down,
                    shared->shared_quant, mask, ds,
                    mlp_spec(a.activation, shared->shared_gate_up_bias, shared->shared_down_bias),
                    stream, shared_acts);
      shared_y = ds.y;
    }
    // The routing's ids are global ones when an expert map is given.
    routed_mlp<T_>(a.hidden_states, a.w_gate_up, a.w_down, a.quant,
                   route_ids(make_view(ids, DType::kI32, {T, K}), a.expert_map), w, K, mask, rs,
                   shared_y, a.output, round_routes,
                   mlp_spec(a.activation, a.gate_up_bias, a.down_bias), stream, acts);
  });
}

}  // namespace

size_t fused_moe_scratch_bytes(const FusedMoEArgs& args) {
  return carved_bytes([&](Carver& cv) { carve_fused(cv, args, nullptr); });
}

void fused_moe(const FusedMoEArgs& args, cudaStream_t stream, const uint8_t* row_mask,
               bool round_routes, Fp8Acts acts) {
  Carver cv = scratch_carver(args.workspace, fused_moe_scratch_bytes(args), "fused_moe");
  run_fused(args, stream, row_mask, nullptr, round_routes, cv, acts, Fp8Activations::kAsGiven);
}

size_t fused_moe_shared_expert_scratch_bytes(const FusedMoESharedExpertArgs& args) {
  return carved_bytes([&](Carver& cv) { carve_fused(cv, args.moe, &args); });
}

void fused_moe_shared_expert(const FusedMoESharedExpertArgs& args, cudaStream_t stream,
                             const uint8_t* row_mask, bool round_routes, Fp8Acts acts,
                             Fp8Acts shared_acts) {
  Carver cv = scratch_carver(args.moe.workspace, fused_moe_shared_expert_scratch_bytes(args),
                             "fused_moe_shared_expert");
  run_fused(args.moe, stream, row_mask, &args, round_routes, cv, acts, shared_acts);
}

}  // namespace moekit::gpu_reference
