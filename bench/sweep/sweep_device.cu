#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "sweep_device.h"

namespace moekit::sweep {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaFault(std::string(what) + ": " + cudaGetErrorString(e));
}

Arena::Arena(size_t bytes) {
  grow(bytes);
}

Arena::~Arena() {
  if (base_) cudaFree(base_);
}

void Arena::grow(size_t bytes) {
  if (bytes <= bytes_) return;
  if (base_) cuda_ok(cudaFree(base_), "cudaFree(arena)");
  base_ = nullptr;
  bytes_ = used_ = 0;
  cuda_ok(cudaMalloc(&base_, bytes), "cudaMalloc(arena)");
  bytes_ = bytes;
}

void* Arena::take(size_t bytes) {
  const size_t at = (used_ + 255) / 256 * 256;
  if (at + bytes > bytes_) {
    throw ArenaFull("arena of " + std::to_string(bytes_) + " bytes full (" + std::to_string(at) +
                    " used, " + std::to_string(bytes) + " more asked)");
  }
  used_ = at + bytes;
  return base_ + at;
}

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535 * 8));
}

__device__ uint64_t hash64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  return x ^ (x >> 33);
}

// Two uniforms in (0, 1] from one hashed counter.
__device__ void uniforms(uint64_t seed, int64_t i, float* u1, float* u2) {
  const uint64_t h = hash64(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
  *u1 = (static_cast<float>(h >> 40) + 1.0f) * 0x1.0p-24f;
  *u2 = (static_cast<float>((h >> 16) & 0xFFFFFF) + 1.0f) * 0x1.0p-24f;
}

template <class T>
__device__ T from_float(float v);
template <>
__device__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __half from_float<__half>(float v) {
  return __float2half(v);
}
template <>
__device__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float v) {
  __nv_fp8_e4m3 r;
  r.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  return r;
}

template <class T>
__global__ void normal_kernel(T* p, int64_t n, uint64_t seed, float sd) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float u1, u2;
    uniforms(seed, i, &u1, &u2);
    p[i] = from_float<T>(sd * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

template <class T>
__global__ void levels_kernel(T* p, int64_t n, uint64_t seed, int levels) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float u1, u2;
    uniforms(seed, i, &u1, &u2);
    p[i] = from_float<T>(static_cast<float>(min(static_cast<int>(u1 * levels), levels - 1)));
  }
}

__global__ void uniform_kernel(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float u1, u2;
    uniforms(seed, i, &u1, &u2);
    p[i] = lo + (hi - lo) * (u1 - 0x1.0p-24f);
  }
}

template <class T>
__global__ void bias_kernel(T* logits, int64_t T_, int64_t E, const float* bias) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < T_ * E;
       i += int64_t{gridDim.x} * blockDim.x) {
    logits[i] = from_float<T>(static_cast<float>(logits[i]) + bias[i % E]);
  }
}

__global__ void poison_kernel(uint8_t* p, int64_t rows, int64_t row_bytes, const uint8_t* keep) {
  const int64_t n = rows * row_bytes;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (!keep[i / row_bytes]) p[i] = 0xFF;
  }
}

// Non-finite: every exponent bit set.
__device__ bool nonfinite(const uint8_t* p, int64_t i, int dt) {
  switch (dt) {
    case 0: {  // bf16
      const uint16_t b = reinterpret_cast<const uint16_t*>(p)[i];
      return (b & 0x7F80) == 0x7F80;
    }
    case 1: {  // f16
      const uint16_t b = reinterpret_cast<const uint16_t*>(p)[i];
      return (b & 0x7C00) == 0x7C00;
    }
    case 2: {  // f32
      const uint32_t b = reinterpret_cast<const uint32_t*>(p)[i];
      return (b & 0x7F800000u) == 0x7F800000u;
    }
    case 4:  // e4m3: no Inf, NaN is s.1111.111
      return (p[i] & 0x7F) == 0x7F;
    default:  // integers: every value is finite
      return false;
  }
}

__global__ void scan_kernel(const uint8_t* p, int dt, int elem_bytes, int64_t rows,
                            int64_t row_elems, const uint8_t* valid, unsigned long long* counters) {
  const int64_t n = rows * row_elems;
  unsigned long long bad = 0, touched = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (!valid || valid[i / row_elems]) {
      bad += nonfinite(p, i, dt) ? 1 : 0;
    } else {
      for (int b = 0; b < elem_bytes; ++b) touched += p[i * elem_bytes + b] != 0xFF ? 1 : 0;
    }
  }
  if (bad) atomicAdd(&counters[0], bad);
  if (touched) atomicAdd(&counters[1], touched);
}

__global__ void diff_kernel(const uint8_t* a, const uint8_t* b, size_t n,
                            unsigned long long* counter) {
  unsigned long long d = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    d += a[i] != b[i] ? 1 : 0;
  }
  if (d) atomicAdd(counter, d);
}

__global__ void gather_kernel(const uint8_t* src, int64_t row_bytes, const int64_t* rows, int64_t n,
                              uint8_t* dst) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const uint8_t* from = src + rows[r] * row_bytes;
    for (int64_t b = threadIdx.x; b < row_bytes; b += blockDim.x) dst[r * row_bytes + b] = from[b];
  }
}

template <class Fn>
void by_dtype(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::kBF16:
      fn(static_cast<__nv_bfloat16*>(nullptr));
      break;
    case DType::kF16:
      fn(static_cast<__half*>(nullptr));
      break;
    case DType::kF32:
      fn(static_cast<float*>(nullptr));
      break;
    case DType::kFP8E4M3:
      fn(static_cast<__nv_fp8_e4m3*>(nullptr));
      break;
    default:
      throw std::logic_error(std::string("sweep: no fill for dtype ") + dtype_name(dt));
  }
}

int scan_code(DType dt) {
  return dt == DType::kBF16      ? 0
         : dt == DType::kF16     ? 1
         : dt == DType::kF32     ? 2
         : dt == DType::kFP8E4M3 ? 4
                                 : 3;
}

}  // namespace

void fill_normal(void* p, DType dt, int64_t n, uint64_t seed, float stddev, cudaStream_t s) {
  if (n <= 0) return;
  by_dtype(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    normal_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(p), n, seed, stddev);
  });
  cuda_ok(cudaGetLastError(), "fill_normal");
}

void fill_uniform(float* p, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
  if (n <= 0) return;
  uniform_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, n, seed, lo, hi);
  cuda_ok(cudaGetLastError(), "fill_uniform");
}

void fill_levels(void* p, DType dt, int64_t n, uint64_t seed, int levels, cudaStream_t s) {
  if (n <= 0) return;
  by_dtype(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    levels_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(p), n, seed, levels);
  });
  cuda_ok(cudaGetLastError(), "fill_levels");
}

void add_expert_bias(void* logits, DType dt, int64_t T, int64_t E, const float* bias,
                     cudaStream_t s) {
  if (T * E <= 0) return;
  by_dtype(dt, [&](auto* tag) {
    using V = std::remove_pointer_t<decltype(tag)>;
    bias_kernel<<<blocks_for(T * E), kThreads, 0, s>>>(static_cast<V*>(logits), T, E, bias);
  });
  cuda_ok(cudaGetLastError(), "add_expert_bias");
}

void poison_rows(void* p, int64_t rows, int64_t row_bytes, const uint8_t* keep, cudaStream_t s) {
  if (rows * row_bytes <= 0) return;
  poison_kernel<<<blocks_for(rows * row_bytes), kThreads, 0, s>>>(static_cast<uint8_t*>(p), rows,
                                                                  row_bytes, keep);
  cuda_ok(cudaGetLastError(), "poison_rows");
}

void scan_rows(const void* p, DType dt, int64_t rows, int64_t row_elems, const uint8_t* valid,
               unsigned long long* counters, cudaStream_t s) {
  if (rows * row_elems <= 0) return;
  scan_kernel<<<blocks_for(rows * row_elems), kThreads, 0, s>>>(
      static_cast<const uint8_t*>(p), scan_code(dt), static_cast<int>(dtype_size(dt)), rows,
      row_elems, valid, counters);
  cuda_ok(cudaGetLastError(), "scan_rows");
}

void diff_bytes(const void* a, const void* b, size_t n, unsigned long long* counter,
                cudaStream_t s) {
  if (n == 0) return;
  diff_kernel<<<blocks_for(static_cast<int64_t>(n)), kThreads, 0, s>>>(
      static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), n, counter);
  cuda_ok(cudaGetLastError(), "diff_bytes");
}

void gather_rows(const void* src, size_t row_bytes, const int64_t* rows, int64_t n, void* dst,
                 cudaStream_t s) {
  if (n <= 0 || row_bytes == 0) return;
  gather_kernel<<<static_cast<unsigned>(std::min<int64_t>(n, 65535)), 128, 0, s>>>(
      static_cast<const uint8_t*>(src), static_cast<int64_t>(row_bytes), rows, n,
      static_cast<uint8_t*>(dst));
  cuda_ok(cudaGetLastError(), "gather_rows");
}

}  // namespace moekit::sweep
