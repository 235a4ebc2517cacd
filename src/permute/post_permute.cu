// MoEPostPermuteFwd kernel: one thread per (token, 8 consecutive columns).
// Each thread reads the token's K route rows as 16-byte vectors, 8 routes in
// flight, and accumulates w * x in f32 in k order (a fixed order: deterministic).
// Routes whose inverse index is -1 or outside [0, P) are skipped.
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/dtype.cuh"
#include "core/pdl.cuh"
#include "permute/permute_kernels.h"

namespace moekit::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kInFlight = 8;  // route rows loaded before the first FMA (K = 8 in one round trip)

// 8 consecutive elements of T as 16-byte vectors (one for 16-bit types, two for f32).
template <class T>
struct Pack8 {
  static constexpr int kVecs = sizeof(T) * 8 / 16;
  uint4 v[kVecs];
  __device__ __forceinline__ void load(const T* p) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) v[i] = __ldg(q + i);
  }
  __device__ __forceinline__ float get(int i) const {
    return to_float(reinterpret_cast<const T*>(v)[i]);
  }
  __device__ __forceinline__ void set(int i, float x) {
    reinterpret_cast<T*>(v)[i] = from_float<T>(x);
  }
  __device__ __forceinline__ void store(T* p) const {
    uint4* q = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) q[i] = v[i];
  }
};

template <class Tin, class Tout>
__global__ void __launch_bounds__(kThreads)
    post_permute_kernel(const Tin* __restrict__ expert_output, int64_t num_rows, int64_t hidden,
                        const float* __restrict__ weights, const int32_t* __restrict__ inverse,
                        int64_t num_tokens, int top_k, Tout* __restrict__ out) {
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  const int64_t vecs_per_row = hidden / 8;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t total = num_tokens * vecs_per_row;
  if (g >= total) return;
  int64_t t;
  if (total <= INT32_MAX) {  // uniform: a 32-bit division instead of the 64-bit routine
    t = static_cast<uint32_t>(g) / static_cast<uint32_t>(vecs_per_row);
  } else {
    t = g / vecs_per_row;
  }
  const int64_t col = (g - t * vecs_per_row) * 8;
  const int32_t* inv_t = inverse + t * top_k;
  const float* w_t = weights + t * top_k;
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  for (int k0 = 0; k0 < top_k; k0 += kInFlight) {
    Pack8<Tin> x[kInFlight];
    float w[kInFlight];
    bool ok[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int k = k0 + j;
      const int32_t row = k < top_k ? __ldg(inv_t + k) : -1;
      w[j] = k < top_k ? __ldg(w_t + k) : 0.f;  // independent of row: loads in parallel
      ok[j] = row >= 0 && row < num_rows;
      if (ok[j]) x[j].load(expert_output + static_cast<int64_t>(row) * hidden + col);
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      if (ok[j]) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(w[j], x[j].get(i), acc[i]);
      }
    }
  }
  pdl_trigger();  // every load is issued; only the store is left
  Pack8<Tout> o;
#pragma unroll
  for (int i = 0; i < 8; ++i) o.set(i, acc[i]);
  o.store(out + t * hidden + col);
}

template <class Tin, class Tout>
void launch_typed(const PostPermuteLaunch& l, cudaStream_t stream) {
  const int64_t threads = l.num_tokens * (l.hidden / 8);
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  launch_pdl(post_permute_kernel<Tin, Tout>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
             stream, static_cast<const Tin*>(l.expert_output), l.num_rows, l.hidden, l.topk_weights,
             l.inverse_indices, l.num_tokens, l.top_k, static_cast<Tout*>(l.out));
}

template <class Tin>
void launch_out(const PostPermuteLaunch& l, cudaStream_t stream) {
  if (l.out_dtype == DType::kF32) {
    launch_typed<Tin, float>(l, stream);
  } else {
    launch_typed<Tin, Tin>(l, stream);
  }
}

}  // namespace

void launch_post_permute(const PostPermuteLaunch& l, cudaStream_t stream) {
  if (l.num_tokens == 0) return;
  switch (l.in_dtype) {
    case DType::kBF16:
      launch_out<__nv_bfloat16>(l, stream);
      break;
    case DType::kF16:
      launch_out<__half>(l, stream);
      break;
    case DType::kF32:
      launch_out<float>(l, stream);
      break;
    default:
      throw Error(std::string("moekit::moe_post_permute: unsupported dtype ") +
                  dtype_name(l.in_dtype));
  }
  check_launch("moe_post_permute");
}

}  // namespace moekit::detail
