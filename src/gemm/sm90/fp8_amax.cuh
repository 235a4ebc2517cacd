// max |c| of an FP8 GEMM's bf16 output, gathered in its epilogue (GroupedGemmFP8Problem::
// c_amax): the FP8 MLP's dynamic per-tensor activation scale without a pass over the
// activations (fp8_mlp.cpp). The value the amax kernel finds over the stored bf16 values:
// bf16 rounding is monotonic and symmetric, so the max of the rounded |values| is the
// rounded max; NaN is ignored (fmaxf), as there.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace moekit::detail::gemm::sm90 {

// store_accumulators' observer: this thread's max |v| over the values it stores.
struct AmaxObserver {
  float m = 0.f;
  __device__ __forceinline__ void operator()(float v, bool stored) {
    if (stored) m = fmaxf(m, fabsf(v));
  }
};

// The warp's max, bf16-rounded, into *amax (the f32 bits: non-negative floats order as
// their bits). Every lane of the warp calls it.
__device__ __forceinline__ void publish_amax(float m, uint32_t* amax) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0)
    atomicMax(amax, __float_as_uint(__bfloat162float(__float2bfloat16_rn(m))));
}

}  // namespace moekit::detail::gemm::sm90
