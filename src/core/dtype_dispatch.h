// Host-side dtype dispatch: calls a generic lambda with the CUDA element types that runtime
// DTypes name, to pick a kernel template's instantiation. The lambda takes TypeTag values:
//   dispatch_in_out(dtype, out_dtype, op, [&](auto in_type, auto out_type) {
//     using T = typename decltype(in_type)::type;      // __nv_bfloat16 or __half
//     using TOut = typename decltype(out_type)::type;  // T or float
//     ...
//   });
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "moekit/error.h"
#include "moekit/tensor.h"

namespace moekit::detail {

template <class T>
struct TypeTag {
  using type = T;
};

// f(TypeTag<T>{}), T the CUDA type of a bf16 or f16 dtype (or f32, where kWithF32); any other
// dtype throws "moekit::<op>: unsupported dtype <name>" (as MOEKIT_DISPATCH_HALF does).
template <bool kWithF32 = false, class F>
auto dispatch_float(DType dtype, const char* op, F&& f) {
  if (dtype == DType::kBF16) return f(TypeTag<__nv_bfloat16>{});
  if (dtype == DType::kF16) return f(TypeTag<__half>{});
  if constexpr (kWithF32) {
    if (dtype == DType::kF32) return f(TypeTag<float>{});
  }
  throw Error(std::string("moekit::") + op + ": unsupported dtype " + dtype_name(dtype));
}

// f(in, out): `in` as dispatch_float gives it; `out` TypeTag<float> where out_dtype is f32,
// else `in` (an output in the input's dtype or in f32).
template <bool kWithF32 = false, class F>
auto dispatch_in_out(DType dtype, DType out_dtype, const char* op, F&& f) {
  return dispatch_float<kWithF32>(dtype, op, [&](auto in) {
    if (out_dtype == DType::kF32) return f(in, TypeTag<float>{});
    return f(in, in);
  });
}

}  // namespace moekit::detail
