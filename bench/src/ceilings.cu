#include <cstdio>

#include "ceilings.h"

namespace moekit::bench {

namespace {

__global__ void stream_read_kernel(const uint4* __restrict__ p, int64_t n,
                                   unsigned long long* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  uint32_t acc = 0;
  // Four independent 16-byte loads in flight per thread.
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
          d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) {
    uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1ull);  // keeps the loads alive
}

template <class F>
double median_ms(F&& launch, int warmup, int iters, cudaStream_t s) {
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(ev[2 * i], s));
    launch();
    BENCH_CUDA(cudaEventRecord(ev[2 * i + 1], s));
  }
  BENCH_CUDA(cudaStreamSynchronize(s));
  std::vector<double> t(iters);
  for (int i = 0; i < iters; ++i) {
    float ms;
    BENCH_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return median(t);
}

double measure_read_tbps(const Device& dev, cudaStream_t s) {
  const size_t bytes = size_t(4) << 30;
  DBuffer buf(bytes), sink(sizeof(unsigned long long));
  BENCH_CUDA(cudaMemsetAsync(buf.data(), 1, bytes, s));
  BENCH_CUDA(cudaMemsetAsync(sink.data(), 0, sink.bytes(), s));
  const int64_t n = static_cast<int64_t>(bytes / 16);
  double best = 0;
  for (int per_sm = 2; per_sm <= 4; ++per_sm) {
    unsigned blocks = static_cast<unsigned>(dev.sms * per_sm);
    double ms = median_ms(
        [&] {
          stream_read_kernel<<<blocks, 512, 0, s>>>(static_cast<const uint4*>(buf.data()), n,
                                                    static_cast<unsigned long long*>(sink.data()));
        },
        3, 15, s);
    BENCH_CUDA(cudaGetLastError());
    best = std::max(best, bytes / (ms * 1e-3) / 1e12);
  }
  return best;
}

double measure_bf16_tflops(Blas& blas, cudaStream_t s) {
  const int64_t n = 8192;
  DTensor a(DType::kBF16, {n, n}), b(DType::kBF16, {n, n}), c(DType::kBF16, {n, n});
  fill_normal(a, 11, 1.f, 0.f, s);
  fill_normal(b, 12, 1.f, 0.f, s);
  double ms = median_ms(
      [&] { gemm_nt(blas, DType::kBF16, DType::kBF16, a.data(), b.data(), c.data(), n, n, n, s); },
      3, 20, s);
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

double measure_fp8_tflops(Blas& blas, cudaStream_t s) {
  const int64_t n = 8192;
  DTensor a(DType::kFP8E4M3, {n, n}), b(DType::kFP8E4M3, {n, n}), c(DType::kBF16, {n, n});
  fill_normal(a, 13, 1.f, 0.f, s);
  fill_normal(b, 14, 1.f, 0.f, s);
  LtFp8Gemm g(blas, n, n, n, false);
  double ms =
      median_ms([&] { g.run(blas, a.data(), b.data(), c.data(), nullptr, nullptr, s); }, 3, 20, s);
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

}  // namespace

Ceilings measure_ceilings(const Device& dev, Blas& blas, cudaStream_t s, std::string* failed) {
  Ceilings c;
  try {
    c.read_tbps = measure_read_tbps(dev, s);
  } catch (const std::exception& e) {
    *failed += std::string(" read (") + e.what() + ")";
  }
  try {
    c.bf16_tflops = measure_bf16_tflops(blas, s);
  } catch (const std::exception& e) {
    *failed += std::string(" bf16 (") + e.what() + ")";
  }
  try {
    c.fp8_tflops = measure_fp8_tflops(blas, s);
  } catch (const std::exception& e) {
    *failed += std::string(" fp8 (") + e.what() + ")";
  }
  return c;
}

}  // namespace moekit::bench
