// Device-side plumbing of moekit-bench: CUDA checks, owning device tensors with
// rotation copies, deterministic on-device input generation, and the timing harness.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moekit/tensor.h"
#include "reference/host_tensor.h"

namespace moekit::bench {

// Throws std::runtime_error("<what>: <cuda error>") on failure.
void cuda_check(cudaError_t e, const char* what);
#define BENCH_CUDA(expr) ::moekit::bench::cuda_check((expr), #expr)

// Waits for the stream, throwing on any error it reports.
inline void sync(cudaStream_t s) {
  BENCH_CUDA(cudaStreamSynchronize(s));
}

DType parse_dtype(const std::string& name);  // throws on unknown names

// An owning device tensor. With copies > 1 it holds that many byte-identical copies
// (for rotating inputs between timed calls so the L2 cache does not serve them).
class DTensor {
 public:
  DTensor() = default;
  DTensor(DType dtype, std::vector<int64_t> shape);
  ~DTensor();
  DTensor(const DTensor&) = delete;
  DTensor& operator=(const DTensor&) = delete;
  DTensor(DTensor&& o) noexcept;
  DTensor& operator=(DTensor&& o) noexcept;

  TensorView view(int copy = 0) const;
  void* data(int copy = 0) const;
  template <class T>
  T* ptr(int copy = 0) const {
    return static_cast<T*>(data(copy));
  }
  size_t bytes() const { return bytes_; }  // one copy
  int64_t numel() const;
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  bool defined() const { return dtype_ != DType::kUndefined; }
  int copies() const { return copies_; }
  // Re-allocates with n copies, each a copy of copy 0.
  void set_copies(int n);

  HostTensor download(int copy = 0) const;
  void upload(const HostTensor& h);  // into copy 0 (small tensors only: metadata, masks)
  void fill_bytes(uint8_t byte);     // every copy

 private:
  void release();
  void* base_ = nullptr;
  size_t bytes_ = 0, stride_ = 0;
  int copies_ = 1;
  DType dtype_ = DType::kUndefined;
  std::vector<int64_t> shape_;
};

// Scratch memory (not rotated).
class DBuffer {
 public:
  DBuffer() = default;
  explicit DBuffer(size_t bytes);
  ~DBuffer();
  DBuffer(const DBuffer&) = delete;
  DBuffer& operator=(const DBuffer&) = delete;
  DBuffer(DBuffer&& o) noexcept;
  DBuffer& operator=(DBuffer&& o) noexcept;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Workspace workspace() const { return {data_, bytes_}; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// ---- deterministic inputs (counter-based RNG on the device) ----------------------------

uint64_t seed_of(const std::string& key, uint64_t global_seed);
// Every element ~ N(mean, stddev^2) (Box–Muller from a hash of (seed, index)), rounded to
// the tensor's dtype (fp8 saturates). Copy 0 only.
void fill_normal(DTensor& t, uint64_t seed, float stddev = 1.0f, float mean = 0.0f,
                 cudaStream_t stream = nullptr);
// f32 tensors: uniform in [lo, hi).
void fill_uniform(DTensor& t, uint64_t seed, float lo, float hi, cudaStream_t stream = nullptr);
// logits[t, e] += bias[e] (bias: device f32 [E]); logits bf16 / f16 / f32.
void add_expert_bias(DTensor& logits, const float* bias, cudaStream_t stream = nullptr);

// ---- bench-side kernels used by the cuBLAS compositions ------------------------------------

// out[r, f] = silu(in[r, f]) * in[r, F + f] for r < rows (16-bit in/out, f32 math).
void silu_and_mul(const void* in, void* out, DType dtype, int64_t rows, int64_t F,
                  cudaStream_t stream);
void silu_and_mul_to(const void* in, DType in_dtype, void* out, DType out_dtype, int64_t rows,
                     int64_t F, cudaStream_t stream);
// out[t] = sum_k (inv >= 0) w[t,k] * y[inv[t*K+k]] (+ shared[t]), f32 math, rounded once.
void combine_routes(const void* y, const float* w, const int32_t* inverse, const void* shared,
                    void* out, DType dtype, int64_t T, int K, int64_t H, cudaStream_t stream);

// ---- timing -----------------------------------------------------------------------------------

struct Device {
  int id = 0;
  std::string name, uuid;
  int sms = 0;
  size_t l2_bytes = 0, total_mem = 0;
};
// False (with a message) when no CUDA device is usable.
bool open_device(Device* dev, std::string* why);

// One implementation of a row: `run(copy, stream)` enqueues one call on copy `copy`.
struct Impl {
  std::string name;
  std::function<void(int copy, cudaStream_t)> run;
  std::string note;  // caveat, or why it is unavailable
  bool available = true;
  bool skip_timing = false;  // e.g. too slow: reported with its note only
};

enum class TimingMode { kGraph, kFlush, kPlain };

struct TimingPlan {
  TimingMode mode = TimingMode::kPlain;
  int copies = 1;  // rotation copies the graph mode cycles through
  int rounds = 3;
  double max_ms = 200;  // device time per implementation per round
  int min_calls = 30;
  int max_samples = 100;
  std::string describe() const;
};

struct TimingResult {
  double ms = -1;  // median of the round medians
  std::string note;
  std::vector<double> round_medians;
};

// Times the implementations interleaved (round r: impl 0, impl 1, ...). Each call is
// replayed from a CUDA graph (so host launch gaps do not count): one call per replay
// with the L2 flushed before it (kFlush) or not (kPlain), or many back-to-back calls
// over rotating copies (kGraph, the per-call time is replay time / calls).
std::vector<TimingResult> time_impls(std::vector<Impl>& impls, const TimingPlan& plan,
                                     const Device& dev, cudaStream_t stream);

double median(std::vector<double> v);

// Per-call device time of an empty kernel (blocks x threads), timed by time_impls with
// `plan` (the graph mode of the latency-bound rows): the launch floor.
double measure_launch_floor(int blocks, int threads, const TimingPlan& plan, const Device& dev,
                            cudaStream_t stream);

}  // namespace moekit::bench
