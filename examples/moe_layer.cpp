// A whole MoE layer through moekit's public C++ API: routing, routed experts and
// a shared expert, first as one fused call, then step by step, and the two compared.
//
//   ./build/examples/moe_layer_example [num_tokens]
//
// Shapes are a small DeepSeek-V3-like layer (grouped sigmoid routing with a
// correction bias); weights are random, so the numbers mean nothing but the
// call sequence is what an inference engine writes.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "moekit/moekit.h"

#define CUDA_OK(expr)                                                           \
  do {                                                                          \
    cudaError_t err_ = (expr);                                                  \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

namespace {

std::vector<void*> g_device_buffers;  // freed at the end of main

// bf16 bits of a float (round to nearest even).
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A device buffer filled with N(0, stddev^2) values of the given dtype (bf16 or f32).
void* random_device(size_t count, moekit::DType dtype, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, stddev);
  void* dev = nullptr;
  size_t bytes = count * moekit::dtype_size(dtype);
  CUDA_OK(cudaMalloc(&dev, bytes ? bytes : 1));
  g_device_buffers.push_back(dev);
  if (dtype == moekit::DType::kBF16) {
    std::vector<uint16_t> host(count);
    for (auto& v : host) v = to_bf16(dist(rng));
    CUDA_OK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
  } else {
    std::vector<float> host(count);
    for (auto& v : host) v = dist(rng);
    CUDA_OK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  return dev;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, bytes ? bytes : 256));
  g_device_buffers.push_back(p);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  using moekit::DType;
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 16;
  const int64_t H = 1024, F = 256, E = 64, K = 8, S = 512;

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "moe_layer_example: no CUDA GPU found (moekit needs an sm_90 GPU)\n");
    return 1;
  }
  std::mt19937 rng(2026);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));

  // Inputs and weights (nn.Linear layout: [out_features, in_features]).
  void* x = random_device(T * H, DType::kBF16, 1.0f, rng);
  void* logits = random_device(T * E, DType::kF32, 1.0f, rng);
  void* bias = random_device(E, DType::kF32, 0.1f, rng);
  void* w_gate_up = random_device(E * 2 * F * H, DType::kBF16, 1.0f / std::sqrt(float(H)), rng);
  void* w_down = random_device(E * H * F, DType::kBF16, 1.0f / std::sqrt(float(F)), rng);
  void* s_gate_up = random_device(2 * S * H, DType::kBF16, 1.0f / std::sqrt(float(H)), rng);
  void* s_down = random_device(H * S, DType::kBF16, 1.0f / std::sqrt(float(S)), rng);

  moekit::TopKParams routing;
  routing.top_k = K;
  routing.renormalize = true;
  routing.scoring_func = moekit::ScoringFunc::kSigmoid;
  routing.num_expert_group = 8;
  routing.topk_group = 4;
  routing.routed_scaling_factor = 2.5f;

  // 1) The whole layer in one call. Workspace sizes depend on shapes only.
  moekit::FusedMoESharedExpertArgs layer;
  layer.moe.hidden_states = moekit::make_view(x, DType::kBF16, {T, H});
  layer.moe.gating_output = moekit::make_view(logits, DType::kF32, {T, E});
  layer.moe.correction_bias = moekit::make_view(bias, DType::kF32, {E});
  layer.moe.params = routing;
  layer.moe.w_gate_up = moekit::make_view(w_gate_up, DType::kBF16, {E, 2 * F, H});
  layer.moe.w_down = moekit::make_view(w_down, DType::kBF16, {E, H, F});
  void* fused_out = device_alloc(T * H * 2);
  layer.moe.output = moekit::make_view(fused_out, DType::kBF16, {T, H});
  layer.shared_w_gate_up = moekit::make_view(s_gate_up, DType::kBF16, {2 * S, H});
  layer.shared_w_down = moekit::make_view(s_down, DType::kBF16, {H, S});
  size_t ws_bytes = moekit::fused_moe_shared_expert_workspace_size(layer);
  layer.moe.workspace = {device_alloc(ws_bytes), ws_bytes};
  moekit::fused_moe_shared_expert(layer, stream);

  // 2) The same layer step by step: routing, routed experts, shared expert.
  void* weights = device_alloc(T * K * 4);
  void* ids = device_alloc(T * K * 4);
  moekit::FusedTopKArgs topk;
  topk.gating_output = layer.moe.gating_output;
  topk.correction_bias = layer.moe.correction_bias;
  topk.params = routing;
  topk.topk_weights = moekit::make_view(weights, DType::kF32, {T, K});
  topk.topk_ids = moekit::make_view(ids, DType::kI32, {T, K});
  moekit::fused_topk(topk, stream);

  moekit::FusedMoEExpertsArgs experts;
  experts.hidden_states = layer.moe.hidden_states;
  experts.w_gate_up = layer.moe.w_gate_up;
  experts.w_down = layer.moe.w_down;
  experts.topk_weights = topk.topk_weights;
  experts.topk_ids = topk.topk_ids;
  void* routed_out = device_alloc(T * H * 2);
  experts.output = moekit::make_view(routed_out, DType::kBF16, {T, H});
  size_t experts_ws = moekit::fused_moe_experts_workspace_size(experts);
  experts.workspace = {device_alloc(experts_ws), experts_ws};
  moekit::fused_moe_experts(experts, stream);

  moekit::SharedExpertMLPArgs shared;
  shared.hidden_states = layer.moe.hidden_states;
  shared.w_gate_up = layer.shared_w_gate_up;
  shared.w_down = layer.shared_w_down;
  void* shared_out = device_alloc(T * H * 2);
  shared.output = moekit::make_view(shared_out, DType::kBF16, {T, H});
  size_t shared_ws = moekit::shared_expert_mlp_workspace_size(shared);
  shared.workspace = {device_alloc(shared_ws), shared_ws};
  moekit::shared_expert_mlp(shared, stream);

  // Bad input is reported before anything runs, naming the argument.
  try {
    moekit::FusedTopKArgs bad = topk;
    bad.topk_ids.dtype = DType::kF32;
    moekit::fused_topk(bad, stream);
  } catch (const moekit::Error& e) {
    std::printf("validation example: %s\n", e.what());
  }

  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> a(T * H), b(T * H), c(T * H);
  std::vector<int32_t> host_ids(T * K);
  CUDA_OK(cudaMemcpy(a.data(), fused_out, a.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(b.data(), routed_out, b.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(c.data(), shared_out, c.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(host_ids.data(), ids, host_ids.size() * 4, cudaMemcpyDeviceToHost));

  // fused == routed + shared, up to bf16 rounding of the two partial outputs.
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < T * H; ++i) {
    double step = double(from_bf16(b[i])) + double(from_bf16(c[i]));
    diff2 += (from_bf16(a[i]) - step) * (from_bf16(a[i]) - step);
    ref2 += step * step;
  }
  std::printf("tokens=%lld hidden=%lld experts=%lld top_k=%lld shared=%lld\n", (long long)T,
              (long long)H, (long long)E, (long long)K, (long long)S);
  if (T > 0) {
    std::printf("token 0 routes to experts:");
    for (int k = 0; k < K; ++k) std::printf(" %d", host_ids[k]);
    std::printf("\n");
  }
  for (void* p : g_device_buffers) CUDA_OK(cudaFree(p));
  CUDA_OK(cudaStreamDestroy(stream));
  double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : 0.0;
  std::printf("fused layer vs step-by-step: rel_l2 = %.3e (%s)\n", rel,
              rel < 1e-2 ? "match" : "MISMATCH");
  return rel < 1e-2 ? 0 : 1;
}
