// MoEPostPermuteFwd kernels: one thread per (token, 8 consecutive columns). Each
// thread reads the token's route rows as 16-byte vectors, all in flight at once, and
// accumulates w * x in f32 in k order (a fixed order: deterministic). Routes whose
// inverse index is -1 or outside [0, P) are skipped.
//  * post_permute_small_kernel (at most 32768 threads, top_k <= 8 and every index
//    fits in 31 bits: the latency-bound shapes): 32-bit index math, the token found with a
//    multiply-high by a host-computed magic number, K rounded up to 2, 4 or 8 at compile time
//    (loads predicated, no loop), blocks sized so that small shapes spread over many SMs: a
//    fraction of the generic kernel's instructions per thread (docs/routing-permute.md).
//  * post_permute_kernel: any shape (64-bit indices, K in chunks of 8); the larger,
//    bandwidth-bound grids use it (see launch_typed).
#include <cstdint>

#include "core/check.h"
#include "core/dtype_dispatch.h"
#include "core/pdl.cuh"
#include "core/vec8.cuh"
#include "permute/permute_kernels.h"

namespace moekit::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kInFlight = 8;  // route rows loaded before the first FMA (K = 8 in one round trip)
constexpr int64_t kPostSmallMaxThreads = 32768;  // larger grids take the generic kernel

// Fast path: top_k <= kMaxK <= 8; T*H, P*H and T*K below 2^31. Thread g handles
// token t = g / V (V = H / 8 vectors per row), computed as
// (umulhi(g, magic) + g) >> shift (exact for g < 2^31; post_permute_divisor()).
template <class Tin, class Tout, int kMaxK>
__global__ void __launch_bounds__(kThreads)
    post_permute_small_kernel(const Tin* __restrict__ expert_output, int num_rows, int hidden,
                              int vecs_per_row, unsigned magic, int shift,
                              const float* __restrict__ weights,
                              const int32_t* __restrict__ inverse, int total, int top_k,
                              Tout* __restrict__ out) {
  pdl_wait();  // PDL: before any global access (core/pdl.cuh)
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= total) return;
  const unsigned ug = static_cast<unsigned>(g);
  const int t = static_cast<int>((__umulhi(ug, magic) + ug) >> shift);
  const int col = (g - t * vecs_per_row) * 8;
  const int32_t* inv_t = inverse + t * top_k;
  const float* w_t = weights + t * top_k;
  int row[kMaxK];
  float w[kMaxK];
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {  // independent loads: one round trip
    row[k] = k < top_k ? __ldg(inv_t + k) : -1;
    w[k] = k < top_k ? __ldg(w_t + k) : 0.f;
  }
  Pack8<Tin> x[kMaxK];
  bool ok[kMaxK];
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {
    ok[k] = static_cast<unsigned>(row[k]) < static_cast<unsigned>(num_rows);
    if (ok[k]) x[k].load(expert_output + (row[k] * hidden + col));
  }
  pdl_trigger();  // every load is issued; only the store is left
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {
    if (ok[k]) {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(w[k], x[k].get(i), acc[i]);
    }
  }
  store8(out + (t * hidden + col), acc);
}

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
  store8(out + t * hidden + col, acc);
}

// Threads per block of the small kernel: 128 (64 for <= 256 threads), so a small
// grid spreads over several SMs (the best of a block-size sweep, docs/routing-permute.md).
int post_small_threads(int64_t threads) {
  return threads <= 256 ? 64 : 128;
}

template <class Tin, class Tout, int kMaxK>
void launch_small(const PostPermuteLaunch& l, int total, cudaStream_t stream) {
  const int V = static_cast<int>(l.hidden / 8);
  const PostPermuteDivisor d = post_permute_divisor(V);
  const int tpb = post_small_threads(total);
  const int blocks = (total + tpb - 1) / tpb;
  launch_pdl(post_permute_small_kernel<Tin, Tout, kMaxK>, dim3(static_cast<unsigned>(blocks)),
             dim3(tpb), 0, stream, static_cast<const Tin*>(l.expert_output),
             static_cast<int>(l.num_rows), static_cast<int>(l.hidden), V, d.magic, d.shift,
             l.topk_weights, l.inverse_indices, total, l.top_k, static_cast<Tout*>(l.out));
}

template <class Tin, class Tout>
void launch_typed(const PostPermuteLaunch& l, cudaStream_t stream) {
  const int64_t threads = l.num_tokens * (l.hidden / 8);
  // The small kernel for latency-bound grids only: on bandwidth-bound grids the generic
  // kernel is faster (docs/routing-permute.md).
  if (post_permute_small_ok(l) && threads <= kPostSmallMaxThreads) {
    const int total = static_cast<int>(threads);
    if (l.top_k <= 2) {
      launch_small<Tin, Tout, 2>(l, total, stream);
    } else if (l.top_k <= 4) {
      launch_small<Tin, Tout, 4>(l, total, stream);
    } else {
      launch_small<Tin, Tout, 8>(l, total, stream);
    }
    return;
  }
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  launch_pdl(post_permute_kernel<Tin, Tout>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
             stream, static_cast<const Tin*>(l.expert_output), l.num_rows, l.hidden, l.topk_weights,
             l.inverse_indices, l.num_tokens, l.top_k, static_cast<Tout*>(l.out));
}

}  // namespace

void launch_post_permute(const PostPermuteLaunch& l, cudaStream_t stream) {
  if (l.num_tokens == 0) return;
  const auto launch = [&](auto in_type, auto out_type) {
    launch_typed<typename decltype(in_type)::type, typename decltype(out_type)::type>(l, stream);
  };
  dispatch_in_out</*kWithF32=*/true>(l.in_dtype, l.out_dtype, "moe_post_permute", launch);
  check_launch("moe_post_permute");
}

}  // namespace moekit::detail
