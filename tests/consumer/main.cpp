// What an engine's first call into moekit looks like, from an installed package or a
// subproject: the version, a workspace-size query and an op's argument validation on
// the host; then, where there is a Hopper GPU, FusedTopK against the library's own CPU
// reference (include/moekit/reference.h). Without a GPU it says so and exits 0: the
// host part is what a CPU-only CI checks. Exit 1 on any mismatch.
#include <cuda_runtime_api.h>
#include <moekit/moekit.h>
#include <moekit/reference.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// A fused layer's scratch, from shapes alone (no pointer is read): qwen3-30b, 16 tokens.
void workspace_query() {
  const int64_t T = 16, H = 2048, E = 128, F = 768;
  moekit::FusedMoEArgs args;
  args.hidden_states = moekit::make_view(nullptr, moekit::DType::kBF16, {T, H});
  args.gating_output = moekit::make_view(nullptr, moekit::DType::kF32, {T, E});
  args.params.top_k = 8;
  args.params.renormalize = true;
  args.w_gate_up = moekit::make_view(nullptr, moekit::DType::kBF16, {E, 2 * F, H});
  args.w_down = moekit::make_view(nullptr, moekit::DType::kBF16, {E, H, F});
  args.output = moekit::make_view(nullptr, moekit::DType::kBF16, {T, H});
  const size_t bytes = moekit::fused_moe_workspace_size(args);
  expect(bytes > 0, "fused_moe_workspace_size(T=16, H=2048, E=128, F=768, top-8) = " +
                        std::to_string(bytes) + " bytes");
}

// Bad input throws moekit::Error naming the argument, before touching the device.
void validation() {
  const int64_t T = 4, E = 8;
  std::vector<float> logits(T * E), weights(T * 2);
  std::vector<int32_t> ids(T * 2);
  moekit::FusedTopKArgs args;
  args.gating_output = moekit::make_view(logits.data(), moekit::DType::kF32, {T, E});
  args.params.top_k = 9;  // more than the 8 experts
  args.topk_weights = moekit::make_view(weights.data(), moekit::DType::kF32, {T, 2});
  args.topk_ids = moekit::make_view(ids.data(), moekit::DType::kI32, {T, 2});
  std::string message;
  try {
    moekit::fused_topk(args, nullptr);
  } catch (const moekit::Error& e) {
    message = e.what();
  }
  expect(message.find("top_k") != std::string::npos,
         "fused_topk(top_k=9 of 8 experts) throws moekit::Error: " + message);
}

#define CUDA_OK(call)                                                      \
  do {                                                                     \
    const cudaError_t err_ = (call);                                       \
    if (err_ != cudaSuccess) {                                             \
      expect(false, std::string(#call) + ": " + cudaGetErrorString(err_)); \
      return;                                                              \
    }                                                                      \
  } while (0)

// FusedTopK on the GPU against moekit::reference::fused_topk on the same logits.
void topk_on_gpu() {
  const int64_t T = 33, E = 64;
  const int K = 6;
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> logits(T * E);
  for (float& v : logits) v = normal(rng);

  moekit::FusedTopKArgs host;
  host.gating_output = moekit::make_view(logits.data(), moekit::DType::kF32, {T, E});
  host.params.top_k = K;
  host.params.renormalize = true;
  std::vector<float> ref_w(T * K);
  std::vector<int32_t> ref_ids(T * K);
  host.topk_weights = moekit::make_view(ref_w.data(), moekit::DType::kF32, {T, K});
  host.topk_ids = moekit::make_view(ref_ids.data(), moekit::DType::kI32, {T, K});
  moekit::reference::fused_topk(host);

  void *d_logits = nullptr, *d_w = nullptr, *d_ids = nullptr;
  CUDA_OK(cudaMalloc(&d_logits, logits.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_w, ref_w.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_ids, ref_ids.size() * sizeof(int32_t)));
  CUDA_OK(
      cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_w, 0xff, ref_w.size() * sizeof(float)));  // poisoned: NaN
  CUDA_OK(cudaMemset(d_ids, 0xff, ref_ids.size() * sizeof(int32_t)));
  moekit::FusedTopKArgs dev = host;
  dev.gating_output.data = d_logits;
  dev.topk_weights.data = d_w;
  dev.topk_ids.data = d_ids;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  moekit::fused_topk(dev, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaStreamDestroy(stream));
  std::vector<float> w(ref_w.size());
  std::vector<int32_t> ids(ref_ids.size());
  CUDA_OK(cudaMemcpy(w.data(), d_w, w.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(ids.data(), d_ids, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  cudaFree(d_logits);
  cudaFree(d_w);
  cudaFree(d_ids);

  int bad = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (ids[i] != ref_ids[i] || !(std::fabs(w[i] - ref_w[i]) <= 1e-5f)) ++bad;
  }
  expect(bad == 0, "fused_topk on the GPU (T=33, E=64, top-6) matches the CPU reference (" +
                       std::to_string(bad) + " of " + std::to_string(w.size()) + " routes differ)");
}

}  // namespace

int main() {
  std::printf("moekit consumer: moekit %s (MOEKIT_VERSION %d)\n", MOEKIT_VERSION_STRING,
              MOEKIT_VERSION);
  workspace_query();
  validation();

  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no GPU: cudaGetDeviceCount: %s; the GPU check (FusedTopK) is skipped\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
  } else {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9) {
      std::printf("GPU: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
      topk_on_gpu();
    } else {
      std::printf("no Hopper GPU (device 0: %s, sm_%d%d); the GPU check is skipped\n", prop.name,
                  prop.major, prop.minor);
    }
  }
  std::printf("moekit consumer: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
