// Device plumbing of the sweep: one arena carved per case, deterministic input fills,
// poison, and the device-side checks (row scans, byte comparisons, row gathers) that keep
// large outputs on the GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "moekit/tensor.h"

namespace moekit::sweep {

// A CUDA error seen at a synchronization: the context may be unusable, the sweep stops.
struct CudaFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Throws CudaFault naming `what` when e is an error.
void cuda_ok(cudaError_t e, const char* what);

// The arena ran out: the caller grows it and retries the case.
struct ArenaFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One device allocation, handed out in 256-byte aligned pieces and reset between cases.
class Arena {
 public:
  explicit Arena(size_t bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  void* take(size_t bytes);  // throws ArenaFull
  void reset() { used_ = 0; }
  void grow(size_t bytes);  // reallocates (contents lost) when bytes > capacity
  size_t capacity() const { return bytes_; }
  size_t used() const { return used_; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0, used_ = 0;
};

// Every element ~ N(mean, stddev^2) from a hash of (seed, index), rounded to dt (bf16, f16,
// f32; fp8e4m3 saturates at +-448).
void fill_normal(void* p, DType dt, int64_t n, uint64_t seed, float stddev, cudaStream_t s);
// f32 elements uniform in [lo, hi).
void fill_uniform(float* p, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s);
// Integers from [0, levels) as dt values (exactly representable).
void fill_levels(void* p, DType dt, int64_t n, uint64_t seed, int levels, cudaStream_t s);
// logits[t, e] += bias[e] (bias: device f32 [E]), rounded back to dt.
void add_expert_bias(void* logits, DType dt, int64_t T, int64_t E, const float* bias,
                     cudaStream_t s);
// Rows (of row_bytes) whose keep byte is 0 are set to 0xFF bytes (NaN in every float dtype).
void poison_rows(void* p, int64_t rows, int64_t row_bytes, const uint8_t* keep, cudaStream_t s);

// counters[0] += non-finite elements in rows whose valid byte is non-zero (every row when
// valid is null); counters[1] += bytes other than 0xFF in the other rows.
void scan_rows(const void* p, DType dt, int64_t rows, int64_t row_elems, const uint8_t* valid,
               unsigned long long* counters, cudaStream_t s);
// *counter += bytes where a and b differ.
void diff_bytes(const void* a, const void* b, size_t n, unsigned long long* counter,
                cudaStream_t s);
// dst[i] = src row rows[i] (rows: device int64), rows of row_bytes.
void gather_rows(const void* src, size_t row_bytes, const int64_t* rows, int64_t n, void* dst,
                 cudaStream_t s);

}  // namespace moekit::sweep
