// Shared body of grouped_gemm_bf16.cu / grouped_gemm_f16.cu: problem -> kernel params,
// then the (config, out dtype) instantiation.
#pragma once

#include "gemm/configs.cuh"
#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_kernel.cuh"

namespace moekit::detail::gemm {

inline RowsDesc rows_desc(const GroupedGemmProblem& p) {
  RowsDesc d;
  d.num_groups = p.num_groups;
  d.meta = p.layout_metadata;
  d.alignment = p.alignment < 1 ? 1 : p.alignment;
  switch (p.rows) {
    case GemmRows::kContiguous:
      d.mode = kRowsContiguous;
      d.total_rows = p.m;
      break;
    case GemmRows::kMasked:
      d.mode = kRowsMasked;
      d.max_m = p.max_m;
      break;
    case GemmRows::kDense:
      d.mode = kRowsDense;
      d.num_groups = 1;
      d.total_rows = p.m;
      break;
  }
  return d;
}

template <class In, class Mma>
void launch_16bit(const GroupedGemmProblem& prob, int config, cudaStream_t stream) {
  GemmParams p{};
  p.a = prob.a;
  p.b = prob.b;
  p.c = prob.c;
  p.rows = rows_desc(prob);
  p.n = prob.n;
  p.k = prob.k;
  p.silu = prob.activation == Activation::kSiluAndMul ? 1 : 0;
  const char* op = "moe_grouped_gemm";
  const bool f32_out = prob.out_dtype == DType::kF32;
  auto launch = [&](auto cfg) {
    using Cfg = decltype(cfg);
    if (f32_out) {
      launch_grouped_gemm_kernel<Cfg, In, float, Mma>(p, stream, op);
    } else {
      launch_grouped_gemm_kernel<Cfg, In, In, Mma>(p, stream, op);
    }
  };
  if (config == kGemmConfigPrefill) {
    launch(PrefillConfig{});
  } else {
    launch(DecodeConfig{});
  }
}

}  // namespace moekit::detail::gemm
