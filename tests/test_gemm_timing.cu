// Rough timings of the grouped GEMMs on the seed page's DeepSeek-V3 shapes (CUDA
// events), the decode split sweep and the MLP PDL chain. DISABLED_: run by hand with
// --gtest_also_run_disabled_tests on an H200.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/mma/split_k.h"
#include "mlp/streamk_mlp.h"
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

// bf16 gate_up [2I, H] and down [H, I] weights of a gated MLP, in as many copies as
// fill `rotate_bytes` (at least one), so that calls rotating over them read HBM; and the
// MLP's activations for m rows: x [m, H] (filled), h [m, I], y [m, H].
struct MlpBuffers {
  std::vector<std::unique_ptr<Buf>> gate_up, down;
  int64_t one_copy_bytes = 0;  // gate_up + down, one copy
  Buf x, h, y;
  MlpBuffers(int64_t m, int64_t H, int64_t I, int64_t rotate_bytes)
      : one_copy_bytes((2 * I * H + H * I) * 2),
        x(static_cast<size_t>(m * H * 2)),
        h(static_cast<size_t>(m * I * 2)),
        y(static_cast<size_t>(m * H * 2)) {
    const int64_t w_bytes = one_copy_bytes;
    const int64_t n = std::max<int64_t>(1, (rotate_bytes + w_bytes - 1) / w_bytes);
    for (int64_t i = 0; i < n; ++i) {
      gate_up.push_back(std::make_unique<Buf>(static_cast<size_t>(2 * I * H * 2)));
      down.push_back(std::make_unique<Buf>(static_cast<size_t>(H * I * 2)));
      fill<__nv_bfloat16>(gate_up.back()->p, 2 * I * H, 1.7f / 84.0f, 200 + uint32_t(i));
      fill<__nv_bfloat16>(down.back()->p, H * I, 1.7f / 45.0f, 300 + uint32_t(i));
    }
    fill<__nv_bfloat16>(x.p, m * H, 1.7f, 4);
  }
  int copies() const { return static_cast<int>(gate_up.size()); }
  double bytes() const { return static_cast<double>(one_copy_bytes); }
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

// One warm-up replay of `exec`, then the best of three timed replays (ms per replay).
float best_graph_ms(cudaGraphExec_t exec, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1) {
  cudaGraphLaunch(exec, stream);
  float best = 1e30f;
  for (int r = 0; r < 3; ++r) {
    cudaEventRecord(e0, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  return best;
}

int split_k_sms() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return sms;
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

// Per-GEMM sweep of the decode-regime configs on the small bench rows (issue 5): the
// two GEMMs of SharedExpertMLPFwd ds-v3-t32, glm45-t32, kimi-k2-t1 (gate_up with
// silu_and_mul, then down) and MoEGroupedGemmFwd qwen3-30b-ep8-routed256 / -decode. Each
// cell is a CUDA graph of kCalls back-to-back calls rotating over >= 128 MB of weight
// copies (more than twice the 50 MB L2), so the weights come from HBM as in the bench;
// the time is the best of 3 graph launches / kCalls. Prints the co-resident clusters per
// split first, one line per (shape, config, split), the best cell per shape, then each
// MLP (gate_up + down) at the heuristic's and at the best cells. Run (one line):
//   build-gpu/tests/test_gemm --gtest_also_run_disabled_tests
//   --gtest_filter=GemmTiming.DISABLED_DecodeSplitSweep
// (~15 s on an H200; docs/gemm.md "Decode split-K").
TEST(GemmTiming, DISABLED_DecodeSplitSweep) {
  MOEKIT_REQUIRE_GPU();
  constexpr int kCalls = 200;
  constexpr int64_t kRotateBytes = int64_t{128} << 20;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);

  // Co-resident clusters of the split kernel per cluster size (GPC packing decides
  // whether tiles x split CTAs fit one wave); the heuristic reads the same table.
  // Queried here, before any capture.
  {
    const int* cap = detail::splitk_cluster_capacity_table();
    std::printf("split-K co-resident clusters (SMs %d, %d CTAs/SM):", sms,
                detail::kDecodeBlocksPerSm);
    for (int s = 1; s <= detail::kMaxSplitK; ++s) {
      std::printf(" %d:%d (%d CTAs)", s, cap ? cap[s] : -1, cap ? cap[s] * s : -1);
    }
    std::printf("\n");
  }

  struct Shape {
    const char* name;
    int64_t m, n, k;  // dense: m rows; grouped: m = rows per group
    bool silu;
    int groups;  // 0: dense; > 0: contiguous, `groups` groups of m rows, alignment 1
    int active;  // contiguous: groups 0..active-1 hold m rows each, the rest none
  };
  const Shape shapes[] = {
      {"ds-v3-t32 gate_up", 32, 2048, 7168, true, 0, 0},
      {"ds-v3-t32 down", 32, 7168, 2048, false, 0, 0},
      {"glm45-t32 gate_up", 32, 1536, 5120, true, 0, 0},
      {"glm45-t32 down", 32, 5120, 1536, false, 0, 0},
      {"kimi-k2-t1 gate_up", 1, 18432, 7168, true, 0, 0},
      {"kimi-k2-t1 down", 1, 7168, 18432, false, 0, 0},
      {"routed256 (16x16)", 16, 1536, 2048, false, 16, 16},
      {"qwen3-ep8-dec (8x1)", 1, 1536, 2048, false, 16, 8},
  };
  struct Cell {
    int config, split;  // config -1 = heuristic
  };
  std::vector<Cell> cells = {{-1, 0}, {0, 0}, {4, 0}, {5, 0}};
  for (int s = 2; s <= detail::kMaxSplitK; ++s) cells.push_back({3, s});
  for (int config : {4, 5}) {
    for (int s : {2, 3, 4, 6, 8}) cells.push_back({config, s});
  }

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  // Captures kCalls calls of `call(i)` into a graph, runs it once, then returns the best
  // of 3 timed launches per call in µs (-1 and `err` set on a failure).
  auto time_graph = [&](const std::function<void(int)>& call, std::string& err) -> float {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaGetLastError();
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      err = "begin capture failed";
    } else {
      try {
        for (int i = 0; i < kCalls; ++i) call(i);
      } catch (const std::exception& ex) {
        err = ex.what();
      }
      if (cudaStreamEndCapture(stream, &graph) != cudaSuccess && err.empty()) {
        err = "capture failed";
      }
      if (err.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
        err = "instantiate failed";
      }
    }
    float us = -1.f;
    if (err.empty()) {
      const float ms_best = best_graph_ms(exec, stream, e0, e1);
      const cudaError_t e = cudaStreamSynchronize(stream);
      if (e != cudaSuccess) {
        err = cudaGetErrorString(e);
      } else {
        us = ms_best * 1000.f / kCalls;
      }
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return us;
  };
  std::vector<Cell> best_cell(std::size(shapes), Cell{-1, 0});

  std::printf("%-20s %6s %6s %6s %4s | %-10s %5s | %9s %8s | %s\n", "shape", "m", "n", "k", "silu",
              "config", "split", "us", "GB/s", "notes");
  for (size_t si = 0; si < std::size(shapes); ++si) {
    const Shape& sh = shapes[si];
    const int groups = sh.groups > 0 ? sh.groups : 1;
    const int active = sh.groups > 0 ? sh.active : 1;
    const int64_t rows = sh.m * active;
    const int64_t b_rows = sh.silu ? 2 * sh.n : sh.n;
    const int64_t b_bytes = int64_t{groups} * b_rows * sh.k * 2;
    const int copies =
        static_cast<int>(std::max<int64_t>(1, (kRotateBytes + b_bytes - 1) / b_bytes));
    std::vector<std::unique_ptr<Buf>> bs;
    for (int i = 0; i < copies; ++i) {
      bs.push_back(std::make_unique<Buf>(static_cast<size_t>(b_bytes)));
      fill<__nv_bfloat16>(bs.back()->p, b_bytes / 2, 1.7f / 84.0f, 100 + i);
    }
    Buf a(static_cast<size_t>(rows * sh.k * 2)), c(static_cast<size_t>(rows * sh.n * 2)),
        meta(static_cast<size_t>(groups * 4));
    fill<__nv_bfloat16>(a.p, rows * sh.k, 1.7f, 3);
    std::vector<int32_t> ends(groups);
    for (int g = 0; g < groups; ++g) ends[g] = static_cast<int32_t>(std::min(g + 1, active) * sh.m);
    cudaMemcpy(meta.p, ends.data(), groups * 4, cudaMemcpyHostToDevice);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // Bytes moved: the weights of the groups with rows, a, c.
    const double bytes =
        double(b_bytes) / groups * active + double(rows) * sh.k * 2 + double(rows) * sh.n * 2;
    float best_us = 1e30f;
    std::string best;
    for (const Cell& cell : cells) {
      detail::GroupedGemmProblem p;
      p.in_dtype = p.out_dtype = DType::kBF16;
      p.a = a.p;
      p.c = c.p;
      p.num_groups = groups;
      p.n = sh.n;
      p.k = sh.k;
      p.activation = sh.silu ? Activation::kSiluAndMul : Activation::kNone;
      p.rows = sh.groups > 0 ? detail::GemmRows::kContiguous : detail::GemmRows::kDense;
      p.layout_metadata = static_cast<const int32_t*>(meta.p);
      p.alignment = 1;
      p.m = rows;
      p.config = cell.config;
      p.split_k = cell.split;
      const int ran = detail::select_grouped_gemm_config(p);
      const int ran_split =
          ran == detail::kGemmConfigDecodeSplitK || cell.split >= 2
              ? detail::decode_split_k(p, sms, detail::splitk_cluster_capacity_table())
              : 0;
      std::string err;
      const float us = time_graph(
          [&](int i) {
            p.b = bs[i % copies]->p;
            detail::run_grouped_gemm(p, stream);
          },
          err);
      char cfg[32];
      if (cell.config < 0) {
        std::snprintf(cfg, sizeof cfg, "heur->%d", ran);
      } else {
        std::snprintf(cfg, sizeof cfg, "%d", cell.config);
      }
      const int64_t tiles = detail::decode_tiles_upper(p);
      std::printf(
          "%-20s %6lld %6lld %6lld %4s | %-10s %5d | %9.2f %8.0f | tiles %lld x split = %lld CTAs, "
          "k slices/CTA %lld, copies %d %s\n",
          sh.name, static_cast<long long>(rows), static_cast<long long>(sh.n),
          static_cast<long long>(sh.k), sh.silu ? "yes" : "no", cfg, ran_split, us,
          us > 0 ? bytes / us / 1e3 : 0.0, static_cast<long long>(tiles),
          static_cast<long long>(tiles * (ran_split > 0 ? ran_split : 1)),
          static_cast<long long>(sh.k * 2 / detail::kDecodeBKBytes /
                                 (ran_split > 0 ? ran_split : 1)),
          copies, err.c_str());
      if (cell.config >= 0 && us > 0 && us < best_us) {
        best_us = us;
        best_cell[si] = cell;
        best = std::string(cfg) + (ran_split ? " split " + std::to_string(ran_split) : "");
      }
    }
    std::printf("%-20s best: config %s %.2f us\n", sh.name, best.c_str(), best_us);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  // The three MLPs as the op runs them (gate_up with silu_and_mul into h, then down),
  // at the heuristic's cells and at the best cell of each GEMM above: is the MLP the sum
  // of its parts? (kCalls MLPs, weights rotating over >= 128 MB as above.)
  for (size_t si = 0; si + 1 < std::size(shapes) && shapes[si].silu; si += 2) {
    const Shape& up = shapes[si];
    const Shape& dn = shapes[si + 1];
    const int64_t m = up.m, I = up.n, H = up.k;
    const MlpBuffers w(m, H, I, kRotateBytes);
    const int copies = w.copies();
    const auto& wu = w.gate_up;
    const auto& wd = w.down;
    const Buf &x = w.x, &h = w.h, &y = w.y;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto problem = [&](const Shape& sh, const Cell& cell, const void* a, void* c) {
      detail::GroupedGemmProblem p;
      p.in_dtype = p.out_dtype = DType::kBF16;
      p.a = a;
      p.c = c;
      p.n = sh.n;
      p.k = sh.k;
      p.activation = sh.silu ? Activation::kSiluAndMul : Activation::kNone;
      p.rows = detail::GemmRows::kDense;
      p.m = sh.m;
      p.config = cell.config;
      p.split_k = cell.split;
      return p;
    };
    for (int variant = 0; variant < 2; ++variant) {
      const Cell cu = variant ? best_cell[si] : Cell{-1, 0};
      const Cell cd = variant ? best_cell[si + 1] : Cell{-1, 0};
      detail::GroupedGemmProblem pu = problem(up, cu, x.p, h.p);
      detail::GroupedGemmProblem pd = problem(dn, cd, h.p, y.p);
      std::string err;
      const float us = time_graph(
          [&](int i) {
            pu.b = wu[i % copies]->p;
            pd.b = wd[i % copies]->p;
            detail::run_grouped_gemm(pu, stream);
            detail::run_grouped_gemm(pd, stream);
          },
          err);
      std::printf(
          "MLP %-10.10s %s: gate_up config %d split %d + down config %d split %d: %8.2f us  %8.0f "
          "GB/s %s\n",
          up.name, variant ? "best cells" : "heuristic ", cu.config, cu.split, cd.config, cd.split,
          us, us > 0 ? (w.bytes() + 2.0 * m * (H + I)) / us / 1e3 : 0.0, err.c_str());
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
}

// The opt-in PDL chain of an MLP's two GEMMs (run_grouped_gemm_pair, gemm_pdl_override();
// docs/gemm.md "PDL chain of an MLP's GEMMs") on the three SharedExpertMLPFwd rows of
// issue 5, bf16: a CUDA graph of kCalls back-to-back MLP calls (gate_up + silu_and_mul
// into h, then down; weights rotating over >= 128 MB of copies, so they come from HBM),
// chain off vs on, interleaved over 3 rounds, best graph launch / kCalls each; the
// outputs of both must be equal. Also each GEMM alone (plain) for the sum. Run:
//   build-gpu/tests/test_gemm --gtest_also_run_disabled_tests
//   --gtest_filter=GemmTiming.DISABLED_MlpPdlChain
TEST(GemmTiming, DISABLED_MlpPdlChain) {
  MOEKIT_REQUIRE_GPU();
  constexpr int kCalls = 200;
  constexpr int64_t kRotateBytes = int64_t{128} << 20;
  struct Row {
    const char* name;
    int64_t m, H, I;
  };
  const Row rows[] = {
      {"ds-v3-t32", 32, 7168, 2048}, {"glm45-t32", 32, 5120, 1536}, {"kimi-k2-t1", 1, 7168, 18432}};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const int prev_override = detail::gemm_pdl_override();
  // A graph of kCalls calls of `call(i)`, with the chain override `pdl` while capturing.
  auto capture = [&](int pdl, const std::function<void(int)>& call) -> cudaGraphExec_t {
    detail::gemm_pdl_override() = pdl;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    for (int i = 0; i < kCalls; ++i) call(i);
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
    detail::gemm_pdl_override() = prev_override;
    cudaGraphLaunch(exec, stream);  // warm-up
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return exec;
  };
  auto launch_us = [&](cudaGraphExec_t exec) {
    cudaEventRecord(e0, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms * 1000.f / kCalls;
  };
  std::printf("%-11s | %9s %9s | %9s %9s %7s | %s\n", "row", "gate_up", "down", "MLP plain",
              "MLP PDL", "gain", "configs (gate_up / down), weight copies");
  for (const Row& row : rows) {
    const int64_t m = row.m, H = row.H, I = row.I;
    const MlpBuffers w(m, H, I, kRotateBytes);
    const int copies = w.copies();
    const auto& wu = w.gate_up;
    const auto& wd = w.down;
    const Buf &x = w.x, &h = w.h, &y = w.y;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    detail::GroupedGemmProblem up;
    up.in_dtype = up.out_dtype = DType::kBF16;
    up.a = x.p;
    up.c = h.p;
    up.n = I;
    up.k = H;
    up.activation = Activation::kSiluAndMul;
    up.rows = detail::GemmRows::kDense;
    up.m = m;
    detail::GroupedGemmProblem down = up;
    down.a = h.p;
    down.c = y.p;
    down.n = H;
    down.k = I;
    down.activation = Activation::kNone;
    detail::gemm_pdl_override() = 1;
    const bool chained = detail::gemm_pdl_chain(up, down);
    detail::gemm_pdl_override() = prev_override;
    auto mlp = [&](int i) {
      up.b = wu[i % copies]->p;
      down.b = wd[i % copies]->p;
      detail::run_grouped_gemm_pair(up, down, stream);
    };
    cudaGraphExec_t g_plain = capture(2, mlp);
    std::vector<uint8_t> y_plain(static_cast<size_t>(m * H * 2)), y_pdl(y_plain.size());
    cudaMemcpy(y_plain.data(), y.p, y_plain.size(), cudaMemcpyDeviceToHost);
    cudaMemset(y.p, 0xFF, y_plain.size());
    cudaGraphExec_t g_pdl = capture(1, mlp);
    cudaMemcpy(y_pdl.data(), y.p, y_pdl.size(), cudaMemcpyDeviceToHost);
    EXPECT_EQ(std::memcmp(y_plain.data(), y_pdl.data(), y_plain.size()), 0) << row.name;
    cudaGraphExec_t g_up = capture(2, [&](int i) {
      up.b = wu[i % copies]->p;
      detail::run_grouped_gemm(up, stream);
    });
    cudaGraphExec_t g_down = capture(2, [&](int i) {
      down.b = wd[i % copies]->p;
      detail::run_grouped_gemm(down, stream);
    });
    float best_plain = 1e30f, best_pdl = 1e30f, best_up = 1e30f, best_down = 1e30f;
    for (int r = 0; r < 3; ++r) {  // interleaved: clock and thermal drift hit both alike
      best_plain = std::min(best_plain, launch_us(g_plain));
      best_pdl = std::min(best_pdl, launch_us(g_pdl));
      best_up = std::min(best_up, launch_us(g_up));
      best_down = std::min(best_down, launch_us(g_down));
    }
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const int sms = split_k_sms();
    const int cu = detail::select_grouped_gemm_config(up),
              cd = detail::select_grouped_gemm_config(down);
    const int su = cu == detail::kGemmConfigDecodeSplitK
                       ? detail::decode_split_k(up, sms, detail::splitk_cluster_capacity_table())
                       : 0;
    const int sd = cd == detail::kGemmConfigDecodeSplitK
                       ? detail::decode_split_k(down, sms, detail::splitk_cluster_capacity_table())
                       : 0;
    std::printf("%-11s | %9.2f %9.2f | %9.2f %9.2f %6.1f%% | %d/%d, %d/%d, %d copies%s\n", row.name,
                best_up, best_down, best_plain, best_pdl,
                100.0 * (best_plain - best_pdl) / best_plain, cu, su, cd, sd, copies,
                chained ? "" : "  (NOT chained: the same kernels twice)");
    for (cudaGraphExec_t g : {g_plain, g_pdl, g_up, g_down}) cudaGraphExecDestroy(g);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
}

// The stream-K MLP (src/gemm/streamk_mlp.h) against the two-GEMM path on the bench's
// small shared-expert rows: graphs of back-to-back calls over rotating weights (HBM
// reads), each phase alone, one L2-flushed call as the bench times it, and that call's
// per-CTA timeline (globaltimer stamps, microseconds from the first CTA's entry).
TEST(GemmTiming, DISABLED_StreamkMlp) {
  MOEKIT_REQUIRE_GPU();
  constexpr int kCalls = 100;
  constexpr int64_t kRotateBytes = int64_t{256} << 20;
  struct Row {
    const char* name;
    int64_t m, H, I;
  };
  const Row rows[] = {{"ds-v3-t32", 32, 7168, 2048},
                      {"glm45-t32", 32, 5120, 1536},
                      {"kimi-k2-t1", 1, 7168, 18432},
                      {"ds-v3-t1", 1, 7168, 2048},
                      {"ds-v3-t64", 64, 7168, 2048}};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  Buf flush(size_t{128} << 20);
  detail::StreamkMlpDebug& dbg = detail::streamk_mlp_debug();
  auto graph_us = [&](int calls, const std::function<void(int)>& call) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    for (int i = 0; i < calls; ++i) call(i);
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
    const float best = best_graph_ms(exec, stream, e0, e1) * 1000.f / calls;
    cudaGraphExecDestroy(exec);
    return best;
  };
  // Median over 20 single calls, each after a 128 MB memset (the bench's flush).
  auto flushed_us = [&](const std::function<void()>& call) {
    std::vector<float> t;
    for (int r = 0; r < 21; ++r) {
      cudaMemsetAsync(flush.p, r & 0xff, size_t{128} << 20, stream);
      cudaEventRecord(e0, stream);
      call();
      cudaEventRecord(e1, stream);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (r) t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  std::printf("%-11s | %8s %8s %8s %8s | %8s %8s | %s\n", "row (us)", "streamK", "gate_up", "down",
              "2 GEMMs", "flush SK", "flush 2G", "ideal at 4.5 TB/s");
  for (const Row& row : rows) {
    const int64_t m = row.m, H = row.H, I = row.I;
    const MlpBuffers w(m, H, I, kRotateBytes);
    const int copies = w.copies();
    const size_t scratch_bytes =
        detail::streamk_mlp_scratch_bytes(DType::kBF16, m, H, I, detail::device_props());
    ASSERT_GT(scratch_bytes, 0u);
    Buf scratch(scratch_bytes);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto streamk = [&](int i) {
      detail::run_streamk_mlp(DType::kBF16, w.x.p, m, H, I, w.gate_up[i % copies]->p,
                              w.down[i % copies]->p, w.h.p, w.y.p, DType::kBF16,
                              detail::device_props().sms, scratch.p, stream);
    };
    detail::GroupedGemmProblem up;
    up.in_dtype = up.out_dtype = DType::kBF16;
    up.a = w.x.p;
    up.c = w.h.p;
    up.n = I;
    up.k = H;
    up.activation = Activation::kSiluAndMul;
    up.rows = detail::GemmRows::kDense;
    up.m = m;
    detail::GroupedGemmProblem down = up;
    down.a = w.h.p;
    down.c = w.y.p;
    down.n = H;
    down.k = I;
    down.activation = Activation::kNone;
    auto gemms = [&](int i) {
      up.b = w.gate_up[i % copies]->p;
      down.b = w.down[i % copies]->p;
      detail::run_grouped_gemm_pair(up, down, stream);
    };
    const float sk = graph_us(kCalls, streamk);
    dbg.phases = 1;
    const float sk1 = graph_us(kCalls, streamk);
    dbg.phases = 2;
    const float sk2 = graph_us(kCalls, streamk);
    dbg.phases = 3;
    const float g2 = graph_us(kCalls, gemms);
    const float fsk = flushed_us([&] { streamk(0); });
    dbg.weight_evict_first = 0;
    const float fsk0 = flushed_us([&] { streamk(0); });
    dbg.weight_evict_first = 1;
    const float fg2 = flushed_us([&] { gemms(0); });
    std::printf("%-11s | %8.2f %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f | %.2f\n", row.name, sk, sk1,
                sk2, g2, fsk, fsk0, fg2, w.bytes() / 4.5e6);
    // One flushed call's timeline.
    const int grid = split_k_sms();
    Buf trace(static_cast<size_t>(grid) * 6 * 8);
    cudaMemset(trace.p, 0, static_cast<size_t>(grid) * 6 * 8);
    dbg.trace = static_cast<unsigned long long*>(trace.p);
    cudaMemsetAsync(flush.p, 1, size_t{128} << 20, stream);
    streamk(0);
    dbg.trace = nullptr;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<unsigned long long> t(static_cast<size_t>(grid) * 6);
    cudaMemcpy(t.data(), trace.p, t.size() * 8, cudaMemcpyDeviceToHost);
    unsigned long long t0 = ~0ull;
    for (int c = 0; c < grid; ++c) t0 = std::min(t0, t[c * 6]);
    const char* names[6] = {"entry",   "grid barrier", "gate_up mainloop",
                            "h ready", "last W load",  "end"};
    for (int e = 0; e < 6; ++e) {
      std::vector<double> v;
      for (int c = 0; c < grid; ++c)
        if (t[c * 6 + e]) v.push_back((t[c * 6 + e] - t0) * 1e-3);
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      std::printf("    %-17s min %7.2f  median %7.2f  max %7.2f  (%zu CTAs)\n", names[e], v.front(),
                  v[v.size() / 2], v.back(), v.size());
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
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
