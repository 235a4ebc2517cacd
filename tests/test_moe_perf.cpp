// Timing of the routed-experts paths on DeepSeek-V3 shapes (H=7168, F=2048, E=256,
// K=8, bf16). Opt-in (MOEKIT_PERF=1): it needs ~23 GB of GPU memory and prints
// times and the bandwidth of the active experts' weights; it asserts nothing.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <vector>

#include "moekit/moe.h"
#include "support/gpu.h"
#include "test_moe_common.h"

namespace moekit {
namespace {

using testing::DeviceTensor;
using testing::DeviceWorkspace;

// A DeepSeek-V3 layer's activations and routing (grouped sigmoid with a bias); the caller
// sets the weights and the workspace.
FusedMoESharedExpertArgs ds_v3_layer(const DeviceTensor& x, const DeviceTensor& logits,
                                     const DeviceTensor& bias, const DeviceTensor& out, int64_t K) {
  FusedMoESharedExpertArgs a;
  a.moe.hidden_states = x.view();
  a.moe.gating_output = logits.view();
  a.moe.correction_bias = bias.view();
  a.moe.params.top_k = static_cast<int>(K);
  a.moe.params.scoring_func = ScoringFunc::kSigmoid;
  a.moe.params.renormalize = true;
  a.moe.params.num_expert_group = 8;
  a.moe.params.topk_group = 4;
  a.moe.params.routed_scaling_factor = 2.5f;
  a.moe.output = out.view();
  return a;
}

TEST(MoEPerf, DeepSeekV3RoutedExperts) {
  MOEKIT_REQUIRE_GPU();
  const char* env = std::getenv("MOEKIT_PERF");
  if (!env || env[0] != '1') GTEST_SKIP() << "set MOEKIT_PERF=1 to time the MoE paths";
  const int64_t H = 7168, F = 2048, E = 256, K = 8;
  const DType dt = DType::kBF16;
  // Weights: a constant bit pattern (bf16 0x3c3c ~ 0.0115) is enough for timing.
  void *wgu = nullptr, *wd = nullptr;
  const size_t wgu_bytes = size_t(E) * 2 * F * H * 2, wd_bytes = size_t(E) * H * F * 2;
  ASSERT_EQ(cudaMalloc(&wgu, wgu_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&wd, wd_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(wgu, 0x3c, wgu_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(wd, 0x3c, wd_bytes), cudaSuccess);
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  struct Run {
    int64_t T;
    bool indexed;
  };
  const Run runs[] = {{1, true},   {1, false}, {8, true},   {32, true},
                      {32, false}, {64, true}, {64, false}, {512, false}};
  for (const Run& run : runs) {
    const int64_t T = run.T;
    std::mt19937_64 rng(11 + T);
    HostTensor x = moetest::normal(rng, dt, {T, H}, 1.0);
    HostTensor w = moetest::make_topk_weights(rng, T, K);
    HostTensor ids = moetest::make_ids(rng, T, K, E, moetest::Ids::kDistinct);
    std::set<int32_t> active(ids.as<int32_t>(), ids.as<int32_t>() + T * K);
    DeviceTensor dx(x), dw(w), dids(ids);
    DeviceTensor out(dt, {T, H});
    FusedMoEExpertsArgs a;
    a.hidden_states = dx.view();
    a.w_gate_up = make_view(wgu, dt, {E, 2 * F, H});
    a.w_down = make_view(wd, dt, {E, H, F});
    a.topk_weights = dw.view();
    a.topk_ids = dids.view();
    a.output = out.view();
    const size_t bytes =
        run.indexed ? indexed_expert_mlp_workspace_size(a) : fused_moe_experts_workspace_size(a);
    DeviceWorkspace ws(bytes);
    a.workspace = ws.get();
    auto call = [&] {
      if (run.indexed) {
        indexed_expert_mlp(a, nullptr);
      } else {
        fused_moe_experts(a, nullptr);
      }
    };
    for (int i = 0; i < 3; ++i) call();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const int iters = T >= 32 ? 10 : 50;
    cudaEventRecord(t0);
    for (int i = 0; i < iters; ++i) call();
    cudaEventRecord(t1);
    ASSERT_EQ(cudaEventSynchronize(t1), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    ms /= iters;
    const double weight_bytes = double(active.size()) * 3.0 * F * H * 2;
    std::printf("[perf] %-19s T=%-4lld active=%3zu  %8.3f ms  %7.0f GB/s of active weights\n",
                run.indexed ? "indexed_expert_mlp" : "fused_moe_experts", (long long)T,
                active.size(), ms, weight_bytes / (ms * 1e-3) / 1e9);
  }
  // The whole layer with a shared expert (ds-v3-grouped-t*: S = 2048, grouped sigmoid
  // routing with bias).
  const int64_t S = 2048;
  void *sgu = nullptr, *sd = nullptr;
  ASSERT_EQ(cudaMalloc(&sgu, size_t(2 * S * H * 2)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&sd, size_t(H * S * 2)), cudaSuccess);
  ASSERT_EQ(cudaMemset(sgu, 0x3c, size_t(2 * S * H * 2)), cudaSuccess);
  ASSERT_EQ(cudaMemset(sd, 0x3c, size_t(H * S * 2)), cudaSuccess);
  for (int64_t T : {1, 32, 64, 512}) {
    std::mt19937_64 rng(99 + T);
    HostTensor x = moetest::normal(rng, dt, {T, H}, 1.0);
    HostTensor logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
    HostTensor bias = moetest::normal(rng, DType::kF32, {E}, 0.1);
    DeviceTensor dx(x), dlogits(logits), dbias(bias);
    DeviceTensor out(dt, {T, H});
    FusedMoESharedExpertArgs a = ds_v3_layer(dx, dlogits, dbias, out, K);
    a.moe.w_gate_up = make_view(wgu, dt, {E, 2 * F, H});
    a.moe.w_down = make_view(wd, dt, {E, H, F});
    a.shared_w_gate_up = make_view(sgu, dt, {2 * S, H});
    a.shared_w_down = make_view(sd, dt, {H, S});
    DeviceWorkspace ws(fused_moe_shared_expert_workspace_size(a));
    a.moe.workspace = ws.get();
    for (int i = 0; i < 3; ++i) fused_moe_shared_expert(a, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const int iters = T >= 32 ? 10 : 50;
    cudaEventRecord(t0);
    for (int i = 0; i < iters; ++i) fused_moe_shared_expert(a, nullptr);
    cudaEventRecord(t1);
    ASSERT_EQ(cudaEventSynchronize(t1), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    std::printf("[perf] fused_moe_shared_expert ds-v3-grouped T=%-4lld %8.3f ms\n", (long long)T,
                ms / iters);
  }
  cudaFree(sgu);
  cudaFree(sd);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaFree(wgu);
  cudaFree(wd);
}

// The FP8 direct kernels (docs/moe.md "FP8 direct kernels"): indexed_expert_mlp and the layer
// with a FP8 shared expert on DeepSeek-V3's FP8 checkpoint layout (128 x 128 block scales);
// prints the bandwidth of the active experts' e4m3 weights (the target: >= 90% of the
// H200's ~4.54 TB/s read rate at T = 1 to 32).
TEST(MoEPerf, DeepSeekV3Fp8Decode) {
  MOEKIT_REQUIRE_GPU();
  const char* env = std::getenv("MOEKIT_PERF");
  if (!env || env[0] != '1') GTEST_SKIP() << "set MOEKIT_PERF=1 to time the MoE paths";
  const int64_t H = 7168, F = 2048, E = 256, K = 8, S = 2048;
  const DType dt = DType::kBF16, fp8 = DType::kFP8E4M3;
  const int64_t hb = H / 128, fb = F / 128;
  // e4m3 0x38 = 1.0 everywhere and every scale 0x3c3c3c3c (~0.0115): enough for timing.
  std::vector<void*> bufs;
  const auto filled = [&](size_t bytes, int byte) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, byte, bytes), cudaSuccess);
    bufs.push_back(p);
    return p;
  };
  void* wgu = filled(size_t(E) * 2 * F * H, 0x38);
  void* wd = filled(size_t(E) * H * F, 0x38);
  void* sgu_scale = filled(size_t(E) * 2 * fb * hb * 4, 0x3c);
  void* sd_scale = filled(size_t(E) * hb * fb * 4, 0x3c);
  void* shared_gu = filled(size_t(2 * S * H), 0x38);
  void* shared_d = filled(size_t(H * S), 0x38);
  void* shared_gu_scale = filled(size_t(2 * S / 128 * hb * 4), 0x3c);
  void* shared_d_scale = filled(size_t(hb * S / 128 * 4), 0x3c);
  WeightQuant q;
  q.scheme = QuantScheme::kFp8Block128;
  q.w_gate_up_scale = make_view(sgu_scale, DType::kF32, {E, 2 * fb, hb});
  q.w_down_scale = make_view(sd_scale, DType::kF32, {E, hb, fb});
  WeightQuant sq;
  sq.scheme = QuantScheme::kFp8Block128;
  sq.w_gate_up_scale = make_view(shared_gu_scale, DType::kF32, {2 * S / 128, hb});
  sq.w_down_scale = make_view(shared_d_scale, DType::kF32, {hb, S / 128});
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  const auto time_ms = [&](const std::function<void()>& call, int iters) {
    for (int i = 0; i < 3; ++i) call();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaEventRecord(t0);
    for (int i = 0; i < iters; ++i) call();
    cudaEventRecord(t1);
    EXPECT_EQ(cudaEventSynchronize(t1), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    return ms / iters;
  };
  for (int64_t T : {1, 8, 32, 64}) {
    std::mt19937_64 rng(11 + T);
    HostTensor x = moetest::normal(rng, dt, {T, H}, 1.0);
    HostTensor w = moetest::make_topk_weights(rng, T, K);
    HostTensor ids = moetest::make_ids(rng, T, K, E, moetest::Ids::kDistinct);
    std::set<int32_t> active(ids.as<int32_t>(), ids.as<int32_t>() + T * K);
    DeviceTensor dx(x), dw(w), dids(ids), out(dt, {T, H});
    FusedMoEExpertsArgs a;
    a.hidden_states = dx.view();
    a.w_gate_up = make_view(wgu, fp8, {E, 2 * F, H});
    a.w_down = make_view(wd, fp8, {E, H, F});
    a.quant = q;
    a.topk_weights = dw.view();
    a.topk_ids = dids.view();
    a.output = out.view();
    DeviceWorkspace ws(indexed_expert_mlp_workspace_size(a));
    a.workspace = ws.get();
    const float ms = time_ms([&] { indexed_expert_mlp(a, nullptr); }, T >= 32 ? 20 : 100);
    const double bytes = double(active.size()) * 3.0 * F * H;
    std::printf(
        "[perf] indexed_expert_mlp fp8_block128 T=%-3lld active=%3zu  %8.4f ms  "
        "%6.0f GB/s of active e4m3 weights (%.0f%% of 4540)\n",
        (long long)T, active.size(), ms, bytes / (ms * 1e-3) / 1e9,
        100.0 * bytes / (ms * 1e-3) / 4.54e12);
  }
  for (int64_t T : {1, 32}) {
    std::mt19937_64 rng(99 + T);
    HostTensor x = moetest::normal(rng, dt, {T, H}, 1.0);
    HostTensor logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
    HostTensor bias = moetest::normal(rng, DType::kF32, {E}, 0.1);
    DeviceTensor dx(x), dlogits(logits), dbias(bias), out(dt, {T, H});
    FusedMoESharedExpertArgs a = ds_v3_layer(dx, dlogits, dbias, out, K);
    a.moe.w_gate_up = make_view(wgu, fp8, {E, 2 * F, H});
    a.moe.w_down = make_view(wd, fp8, {E, H, F});
    a.moe.quant = q;
    a.shared_w_gate_up = make_view(shared_gu, fp8, {2 * S, H});
    a.shared_w_down = make_view(shared_d, fp8, {H, S});
    a.shared_quant = sq;
    DeviceWorkspace ws(fused_moe_shared_expert_workspace_size(a));
    a.moe.workspace = ws.get();
    const float ms = time_ms([&] { fused_moe_shared_expert(a, nullptr); }, T >= 32 ? 20 : 100);
    std::printf("[perf] fused_moe_shared_expert fp8_block128 ds-v3-grouped T=%-3lld %8.4f ms\n",
                (long long)T, ms);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  for (void* p : bufs) cudaFree(p);
}

}  // namespace
}  // namespace moekit
