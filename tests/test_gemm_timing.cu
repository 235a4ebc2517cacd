// Rough timings of the grouped GEMMs on the seed page's DeepSeek-V3 shapes (CUDA
// events). DISABLED_: run by hand with --gtest_also_run_disabled_tests on an H200.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"
#include "support/gpu.h"

namespace moekit {
namespace {

// Deterministic pseudo-random fill on the device: uniform in [-scale, scale).
template <class T>
__global__ void fill_kernel(T* p, int64_t n, float scale, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (h & 0xffffff) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    if constexpr (sizeof(T) == 1) {
      p[i] = static_cast<T>(__nv_cvt_float_to_fp8(u * scale, __NV_SATFINITE, __NV_E4M3));
    } else {
      p[i] = static_cast<T>(u * scale);
    }
  }
}

template <class T>
void fill(void* p, int64_t n, float scale, uint32_t seed) {
  fill_kernel<T><<<4096, 256>>>(static_cast<T*>(p), n, scale, seed);
}

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes ? bytes : 256), cudaSuccess); }
  ~Buf() { cudaFree(p); }
};

std::vector<int32_t> multinomial_counts(int64_t rows, int groups, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::uniform_int_distribution<int> d(0, groups - 1);
  std::vector<int32_t> c(groups, 0);
  for (int64_t i = 0; i < rows; ++i) ++c[d(r)];
  return c;
}

template <class Fn>
float time_ms(Fn&& fn, int iters = 10) {
  fn();
  fn();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < iters; ++i) fn();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return ms / iters;
}

TEST(GemmTiming, DISABLED_DeepSeekV3Shapes) {
  MOEKIT_REQUIRE_GPU();
  const int E = 256;
  const int64_t N = 4096, K = 7168, P_MAX = 32768;
  Buf b(size_t(E) * N * K * 2), a(size_t(P_MAX) * K * 2), c(size_t(P_MAX) * N * 4), meta(E * 4);
  fill<__nv_bfloat16>(b.p, int64_t(E) * N * K, 1.7f / 84.0f, 1);
  fill<__nv_bfloat16>(a.p, P_MAX * K, 1.7f, 2);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  struct Scenario {
    int64_t P;  // routed rows (contiguous, alignment 1); 0 = dense shared-expert shape
    bool balanced;
    bool silu;
    int64_t dense_m;
  };
  const Scenario scenarios[] = {
      {4096, false, false, 0}, {4096, false, true, 0},   {4096, true, false, 0},
      {8192, false, false, 0}, {16384, false, false, 0}, {32768, false, false, 0},
      {32768, false, true, 0}, {32768, true, false, 0},  {32768, true, true, 0},
      {0, false, true, 64},    {0, false, true, 4096},
  };
  for (const Scenario& sc : scenarios) {
    const int64_t P = sc.P ? sc.P : sc.dense_m;
    std::vector<int32_t> counts = sc.balanced ? std::vector<int32_t>(E, static_cast<int32_t>(P / E))
                                              : multinomial_counts(P, E, 7 + P);
    std::vector<int32_t> ends(E);
    int64_t end = 0;
    for (int e = 0; e < E; ++e) ends[e] = static_cast<int32_t>(end += counts[e]);
    cudaMemcpy(meta.p, ends.data(), E * 4, cudaMemcpyHostToDevice);
    for (int config = -1; config < detail::kGemmConfigCount; ++config) {
      detail::GroupedGemmProblem p;
      p.in_dtype = p.out_dtype = DType::kBF16;
      p.a = a.p;
      p.b = b.p;
      p.c = c.p;
      p.num_groups = sc.P ? E : 1;
      p.n = sc.silu ? N / 2 : N;
      p.k = K;
      p.activation = sc.silu ? Activation::kSiluAndMul : Activation::kNone;
      p.rows = sc.P ? detail::GemmRows::kContiguous : detail::GemmRows::kDense;
      p.layout_metadata = static_cast<const int32_t*>(meta.p);
      p.alignment = 1;
      p.m = P;
      p.config = config;
      const int picked = detail::select_grouped_gemm_config(p);
      const float ms = time_ms([&] { detail::run_grouped_gemm(p, nullptr); });
      const double flops = 2.0 * P * N * K;
      const double bytes =
          double(p.num_groups) * N * K * 2 + double(P) * K * 2 + double(P) * p.n * 2;
      std::printf(
          "bf16 %-7s P=%-6lld %-8s %-4s config=%2d (ran %d): %8.3f ms  %7.1f TFLOP/s  "
          "%7.1f GB/s\n",
          sc.P ? "grouped" : "dense", static_cast<long long>(P),
          sc.balanced ? "balanced" : "random", sc.silu ? "silu" : "none", config, picked, ms,
          flops / ms / 1e9, bytes / ms / 1e6);
    }
  }

  // FP8 masked: T = 64 valid rows over 32 experts, max_m 64, N = 4096, Kd = 7168.
  const int E8 = 32;
  const int64_t max_m = 64, KB = K / 128, NB = N / 128;
  Buf a8(size_t(E8) * max_m * K), b8(size_t(E8) * N * K), as(size_t(E8) * max_m * KB * 4),
      bs(size_t(E8) * NB * KB * 4), c8(size_t(E8) * max_m * N * 2), meta8(E8 * 4);
  fill<__nv_fp8_storage_t>(a8.p, E8 * max_m * K, 2.0f, 3);
  fill<__nv_fp8_storage_t>(b8.p, int64_t(E8) * N * K, 2.0f, 4);
  fill<float>(as.p, E8 * max_m * KB, 0.01f, 5);
  fill<float>(bs.p, E8 * NB * KB, 1.0f, 6);
  for (int64_t T : {int64_t{64}, int64_t{1024}}) {
    std::vector<int32_t> counts = multinomial_counts(T, E8, 11 + T);
    for (int32_t& x : counts) x = std::min<int32_t>(x, static_cast<int32_t>(max_m));
    cudaMemcpy(meta8.p, counts.data(), E8 * 4, cudaMemcpyHostToDevice);
    for (int config = -1; config < detail::kFp8ConfigCount; ++config) {
      detail::GroupedGemmFP8Problem p;
      p.a = a8.p;
      p.a_scale = static_cast<const float*>(as.p);
      p.b = b8.p;
      p.b_scale = static_cast<const float*>(bs.p);
      p.c = c8.p;
      p.layout_metadata = static_cast<const int32_t*>(meta8.p);
      p.num_groups = E8;
      p.max_m = max_m;
      p.n = N;
      p.k = K;
      p.config = config;
      const int picked = detail::select_grouped_gemm_fp8_config(p);
      const float ms = time_ms([&] { detail::run_grouped_gemm_fp8(p, nullptr); });
      int64_t rows = 0;
      for (int32_t x : counts) rows += x;
      const double bytes = double(E8) * N * K + double(rows) * K + double(rows) * N * 2;
      std::printf(
          "fp8 masked E=32 max_m=64 T=%-5lld config=%2d (ran %d): %8.3f ms  %7.1f TFLOP/s  %7.1f "
          "GB/s\n",
          static_cast<long long>(T), config, picked, ms, 2.0 * rows * N * K / ms / 1e9,
          bytes / ms / 1e6);
    }
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The SM90 (TMA + wgmma) config against the default heuristic on the prefill shapes
// (the heuristic picks it for these since 2026-12-02). Targets (docs/gemm.md): ds-v3 prefill
// up-projection, 32768 rows over 256 experts, n 4096, k 7168 (1.924 TFLOP): the page's
// 3.99 ms = 483 TFLOP/s; 600 TFLOP/s (3.2 ms) = 75% of the 799 measured dense peak.
TEST(GemmTiming, DISABLED_Sm90PrefillShapes) {
  MOEKIT_REQUIRE_GPU();
  const int E = 256;
  const int64_t N = 4096, K = 7168, P = 32768;
  Buf b(size_t(E) * N * K * 2), a(size_t(P) * K * 2), c(size_t(P) * N * 4), meta(E * 4);
  fill<__nv_bfloat16>(b.p, int64_t(E) * N * K, 1.7f / 84.0f, 1);
  fill<__nv_bfloat16>(a.p, P * K, 1.7f, 2);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  struct Scenario {
    bool dense, balanced, silu;
    int64_t rows;
  };
  const Scenario scenarios[] = {{false, false, false, P},  {false, true, false, P},
                                {false, false, true, P},   {false, true, true, P},
                                {true, false, true, 4096}, {true, false, false, 8192}};
  for (const Scenario& sc : scenarios) {
    std::vector<int32_t> counts = sc.balanced
                                      ? std::vector<int32_t>(E, static_cast<int32_t>(sc.rows / E))
                                      : multinomial_counts(sc.rows, E, 7 + sc.rows);
    std::vector<int32_t> ends(E);
    int64_t end = 0;
    for (int e = 0; e < E; ++e) ends[e] = static_cast<int32_t>(end += counts[e]);
    cudaMemcpy(meta.p, ends.data(), E * 4, cudaMemcpyHostToDevice);
    for (int config : {-1, static_cast<int>(detail::kGemmConfigSm90)}) {
      detail::GroupedGemmProblem p;
      p.in_dtype = p.out_dtype = DType::kBF16;
      p.a = a.p;
      p.b = b.p;
      p.c = c.p;
      p.num_groups = sc.dense ? 1 : E;
      p.n = sc.silu ? N / 2 : N;
      p.k = K;
      p.activation = sc.silu ? Activation::kSiluAndMul : Activation::kNone;
      p.rows = sc.dense ? detail::GemmRows::kDense : detail::GemmRows::kContiguous;
      p.layout_metadata = static_cast<const int32_t*>(meta.p);
      p.alignment = 1;
      p.m = sc.rows;
      p.config = config;
      const int picked = detail::select_grouped_gemm_config(p);
      const float ms = time_ms([&] { detail::run_grouped_gemm(p, nullptr); });
      std::printf("sm90 %-7s rows=%-6lld %-8s %-4s config=%2d (ran %d): %8.3f ms  %7.1f TFLOP/s\n",
                  sc.dense ? "dense" : "grouped", static_cast<long long>(sc.rows),
                  sc.balanced ? "balanced" : "random", sc.silu ? "silu" : "none", config, picked,
                  ms, 2.0 * sc.rows * N * K / ms / 1e9);
    }
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace moekit
