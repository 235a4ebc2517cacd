// 8 consecutive elements as 16-byte memory accesses (one for 16-bit types, two for f32),
// converted to / from f32: the memory-bound elementwise kernels' loads and stores.
// Kept out of core/dtype.cuh, which the SM90 GEMM units include.
#pragma once

#include <cstdint>

#include "core/dtype.cuh"

namespace moekit::detail {

// 8 elements of T held as raw 16-byte vectors, converted only on get(): every load of a
// loop can be in flight before the first conversion. load() reads through the read-only
// cache (__ldg): for inputs no kernel thread writes.
template <class T>
struct Pack8 {
  static constexpr int kVecs = sizeof(T) * 8 / 16;
  uint4 v[kVecs];
  __device__ __forceinline__ void load(const T* p) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) v[i] = __ldg(q + i);
  }
  __device__ __forceinline__ float get(int i) const {
    return to_float(reinterpret_cast<const T*>(v)[i]);
  }
};

// 8 values at p as floats (plain loads: p may be written by the same kernel, in place).
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <class T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = to_float(e[j]);
}

// 8 floats -> 8 elements of T at p, rounded to nearest even, written as 16-byte vectors
// (nvcc splits some 16-bit ones into four 4-byte stores, e.g. in the combine kernel).
template <class T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) e[j] = from_float<T>(v[j]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

}  // namespace moekit::detail
