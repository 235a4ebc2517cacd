// Shared body of grouped_gemm_bf16.cu / grouped_gemm_f16.cu: problem -> kernel params,
// then the (plan.kernel, out dtype) instantiation.
#pragma once

#include "core/device.h"
#include "gemm/grouped_gemm.h"
#include "gemm/mma/configs.cuh"
#include "gemm/mma/grouped_gemm_kernel.cuh"
#include "gemm/mma/persistent_kernel.cuh"
#include "gemm/mma/splitk_kernel.cuh"

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
void launch_16bit(const GroupedGemmProblem& prob, cudaStream_t stream) {
  GemmParams p{};
  p.a = prob.a;
  p.b = prob.b;
  p.c = prob.c;
  p.rows = rows_desc(prob);
  p.n = prob.n;
  p.k = prob.k;
  p.silu = prob.activation == Activation::kSiluAndMul ? 1 : 0;
  const int64_t b_rows = prob.activation == Activation::kSiluAndMul ? 2 * prob.n : prob.n;
  p.b_evict_first =
      gemm_b_evict_first(static_cast<int64_t>(prob.num_groups) * b_rows * prob.k * 2) ? 1 : 0;
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
  auto launch_split = [&](auto cfg, int split) {
    using Cfg = decltype(cfg);
    if (f32_out) {
      launch_grouped_gemm_splitk<Cfg, In, float, Mma>(p, split, stream, op);
    } else {
      launch_grouped_gemm_splitk<Cfg, In, In, Mma>(p, split, stream, op);
    }
  };
  const GemmPlan& plan = prob.plan;
  switch (plan.kernel) {
    case GemmKernel::kDecodeSplitK:
      // Long k slices per CTA: the 256-byte stream stages (split_k.h).
      if (split_uses_stream_tiles(prob.k, static_cast<int>(sizeof(In)), plan.split)) {
        launch_split(DecodeStreamConfig{}, plan.split);
      } else {
        launch_split(DecodeConfig{}, plan.split);
      }
      break;
    case GemmKernel::kDecodeStream:
      launch(DecodeStreamConfig{});
      break;
    case GemmKernel::kDecodeStreamDeep:
      launch(DecodeStreamDeepConfig{});
      break;
    case GemmKernel::kDecodeStreamNarrow:
      launch(DecodeStreamNarrowConfig{});
      break;
    case GemmKernel::kDecodePersistent: {
      // k > 0 and at most kPersistentMaxGroups groups (gemm_plan_rejection checked).
      const int sms = device_props().sms > 0 ? device_props().sms : 132;
      if (f32_out) {
        launch_grouped_gemm_persistent<Mma16Tiles<DecodeStreamConfig, In, float, Mma>>(p, sms,
                                                                                       stream, op);
      } else {
        launch_grouped_gemm_persistent<Mma16Tiles<DecodeStreamConfig, In, In, Mma>>(p, sms, stream,
                                                                                    op);
      }
      break;
    }
    default:
      launch(DecodeConfig{});
      break;
  }
}

}  // namespace moekit::detail::gemm
