// The direct dense MLP's timeline (docs/dense-mlp.md "Direct dense MLP"): %globaltimer stamps of
// every CTA of both kernels (gate_up, down) in the last call of a CUDA graph of
// back-to-back SharedExpertMLP calls over rotating weight copies, as moekit-bench times
// the 32-token rows. Prints per kernel and point the min / median / max in us from the
// earliest gate_up start. Built only with -DMOEKIT_DIRECT_TRACE_TOOL=ON (it compiles the
// direct kernels again with MOEKIT_DIRECT_TRACE); run on the GPU:
//   build/bench/direct_trace [T H S ...]     (default: ds-v3-t32 and glm45-t32 shapes)
#include <cuda_runtime.h>
#include <moekit/moe.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace moekit::detail {
void set_direct_trace_buffer(unsigned long long* buffer);  // src/mlp/direct_mlp.cu
}

namespace {

constexpr int kStamps = 6, kMaxCtas = 2048;  // gemm::direct::kTraceStamps, kTraceMaxCtas
const char* const kPoints[kStamps] = {"start",       "after wait", "x staged",
                                      "k loop done", "reduced",    "stored"};

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

void trace_shape(int64_t T, int64_t H, int64_t S) {
  using moekit::DType;
  const size_t w_bytes = static_cast<size_t>(3 * H * S) * 2;
  const int copies = static_cast<int>(std::min<size_t>(8, 400000000 / w_bytes + 1));
  const int calls = 24;
  void* x;
  void* out;
  CK(cudaMalloc(&x, T * H * 2));
  CK(cudaMalloc(&out, T * H * 2));
  CK(cudaMemset(x, 0x11, T * H * 2));
  std::vector<void*> gu(copies), dn(copies);
  for (int i = 0; i < copies; ++i) {
    CK(cudaMalloc(&gu[i], 2 * S * H * 2));
    CK(cudaMalloc(&dn[i], H * S * 2));
    CK(cudaMemset(gu[i], 0x11, 2 * S * H * 2));  // small finite bf16 / f16 values
    CK(cudaMemset(dn[i], 0x11, H * S * 2));
  }
  moekit::SharedExpertMLPArgs args;
  args.hidden_states = moekit::make_view(x, DType::kBF16, {T, H});
  args.w_gate_up = moekit::make_view(gu[0], DType::kBF16, {2 * S, H});
  args.w_down = moekit::make_view(dn[0], DType::kBF16, {H, S});
  args.output = moekit::make_view(out, DType::kBF16, {T, H});
  args.workspace.bytes = moekit::shared_expert_mlp_workspace_size(args);
  CK(cudaMalloc(&args.workspace.data, std::max<size_t>(args.workspace.bytes, 1)));

  unsigned long long* trace;
  const size_t trace_bytes = 2 * kMaxCtas * kStamps * sizeof(unsigned long long);
  CK(cudaMalloc(&trace, trace_bytes));
  moekit::detail::set_direct_trace_buffer(trace);

  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) {
    args.w_gate_up.data = gu[i % copies];
    args.w_down.data = dn[i % copies];
    moekit::shared_expert_mlp(args, st);
  }
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, st));  // warm-up
  CK(cudaStreamSynchronize(st));
  CK(cudaMemset(trace, 0, trace_bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, st));
  CK(cudaGraphLaunch(exec, st));
  CK(cudaEventRecord(e1, st));
  CK(cudaStreamSynchronize(st));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  std::vector<unsigned long long> h(2 * kMaxCtas * kStamps);
  CK(cudaMemcpy(h.data(), trace, trace_bytes, cudaMemcpyDeviceToHost));
  moekit::detail::set_direct_trace_buffer(nullptr);

  // The last call's stamps (each call overwrites the buffer); t0 = its earliest gate_up start.
  unsigned long long t0 = ~0ull;
  for (int c = 0; c < kMaxCtas; ++c)
    if (h[c * kStamps] != 0) t0 = std::min(t0, h[c * kStamps]);
  std::printf("T %lld H %lld S %lld: %.2f us per call (graph of %d, %d weight copies)\n",
              static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(S),
              1000.0 * ms / calls, calls, copies);
  std::printf("  %-8s %-12s %6s %9s %9s %9s\n", "kernel", "point", "CTAs", "min us", "median",
              "max");
  for (int k = 0; k < 2; ++k) {
    for (int pt = 0; pt < kStamps; ++pt) {
      std::vector<double> v;
      for (int c = 0; c < kMaxCtas; ++c) {
        const unsigned long long t = h[(k * kMaxCtas + c) * kStamps + pt];
        if (t != 0 && t >= t0) v.push_back((t - t0) / 1000.0);
      }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      std::printf("  %-8s %-12s %6zu %9.2f %9.2f %9.2f\n", k == 0 ? "gate_up" : "down", kPoints[pt],
                  v.size(), v.front(), v[v.size() / 2], v.back());
    }
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
  for (int i = 0; i < copies; ++i) {
    CK(cudaFree(gu[i]));
    CK(cudaFree(dn[i]));
  }
  CK(cudaFree(x));
  CK(cudaFree(out));
  CK(cudaFree(args.workspace.data));
  CK(cudaFree(trace));
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("direct_trace: no CUDA device, nothing to trace\n");
    return 0;
  }
  if (argc >= 4) {
    for (int i = 1; i + 2 < argc; i += 3)
      trace_shape(std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2]));
  } else {
    trace_shape(32, 7168, 2048);  // SharedExpertMLP ds-v3-t32
    trace_shape(32, 5120, 1536);  // glm45-t32
  }
  return 0;
}
