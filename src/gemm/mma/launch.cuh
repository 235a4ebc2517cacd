// Shared body of grouped_gemm_bf16.cu / grouped_gemm_f16.cu: problem -> kernel params,
// then the (config, out dtype) instantiation.
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
void launch_16bit(const GroupedGemmProblem& prob, int config, cudaStream_t stream) {
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
  // Configs 4 / 5 with a forced split (problem.split_k >= 2; measured by the sweep
  // GemmTiming.DISABLED_DecodeSplitSweep, never picked by the heuristic yet): the stream
  // tiles' 256-byte stages with config 3's cluster split-K and DSMEM reduction.
  auto launch_split = [&](auto cfg, int split) {
    using Cfg = decltype(cfg);
    if (f32_out) {
      launch_grouped_gemm_splitk<Cfg, In, float, Mma>(p, split, stream, op);
    } else {
      launch_grouped_gemm_splitk<Cfg, In, In, Mma>(p, split, stream, op);
    }
  };
  // The decode-regime configs an MLP's GEMMs take (0, 3, 4, 5 unsplit, 4 split): the PDL
  // kernels when run_grouped_gemm_pair chained them (prob.pdl; grouped_gemm.h GemmPdl,
  // docs/gemm.md "PDL chain of an MLP's GEMMs"), else the plain launches above. The
  // first GEMM has out == in (silu_and_mul into the activation); the second either.
  static_assert(kPdlFirst == static_cast<int>(GemmPdl::kFirst) &&
                    kPdlSecond == static_cast<int>(GemmPdl::kSecond),
                "the device roles mirror GemmPdl");
  auto launch_decode = [&](auto cfg) {
    using Cfg = decltype(cfg);
    if (prob.pdl == GemmPdl::kFirst && !f32_out) {
      launch_grouped_gemm_kernel<Cfg, In, In, Mma, kPdlFirst>(p, stream, op);
    } else if (prob.pdl == GemmPdl::kSecond && f32_out) {
      launch_grouped_gemm_kernel<Cfg, In, float, Mma, kPdlSecond>(p, stream, op);
    } else if (prob.pdl == GemmPdl::kSecond) {
      launch_grouped_gemm_kernel<Cfg, In, In, Mma, kPdlSecond>(p, stream, op);
    } else {
      launch(cfg);
    }
  };
  auto launch_split_decode = [&](auto cfg, int split) {
    using Cfg = decltype(cfg);
    if (prob.pdl == GemmPdl::kFirst && !f32_out) {
      launch_grouped_gemm_splitk<Cfg, In, In, Mma, kPdlFirst>(p, split, stream, op);
    } else if (prob.pdl == GemmPdl::kSecond && f32_out) {
      launch_grouped_gemm_splitk<Cfg, In, float, Mma, kPdlSecond>(p, split, stream, op);
    } else if (prob.pdl == GemmPdl::kSecond) {
      launch_grouped_gemm_splitk<Cfg, In, In, Mma, kPdlSecond>(p, split, stream, op);
    } else {
      launch_split(cfg, split);
    }
  };
  const bool stream_split =
      (config == kGemmConfigDecodeStream || config == kGemmConfigDecodeStreamDeep) &&
      prob.split_k >= 2;
  if (stream_split) {
    const int split = decode_split_k(prob, device_props().sms);
    if (config == kGemmConfigDecodeStream) {
      launch_split_decode(DecodeStreamConfig{}, split);
    } else {
      launch_split(DecodeStreamDeepConfig{}, split);
    }
  } else if (config == kGemmConfigPrefill) {
    launch(PrefillConfig{});
  } else if (config == kGemmConfigDecodeStream) {
    launch_decode(DecodeStreamConfig{});
  } else if (config == kGemmConfigDecodeStreamNarrow) {
    launch(DecodeStreamNarrowConfig{});  // no PDL variant (pdl_config leaves it out)
  } else if (config == kGemmConfigDecodePersistent) {
    if (prob.k > 0 && p.rows.num_groups <= kPersistentMaxGroups) {
      if (f32_out) {
        launch_grouped_gemm_persistent<DecodeStreamConfig, In, float, Mma>(p, device_props().sms,
                                                                           stream, op);
      } else {
        launch_grouped_gemm_persistent<DecodeStreamConfig, In, In, Mma>(p, device_props().sms,
                                                                        stream, op);
      }
    } else {
      launch(DecodeStreamConfig{});  // config 4's one-CTA-per-tile kernel
    }
  } else if (config == kGemmConfigDecodeStreamDeep) {
    launch_decode(DecodeStreamDeepConfig{});
  } else if (config == kGemmConfigDecodeSplitK) {
    // Forced or picked: at least 2 (a forced split of a big problem still runs split).
    int split = decode_split_k(prob, device_props().sms, splitk_cluster_capacity_table());
    if (prob.split_k <= 0 && split < 2) split = 2;
    if (split_uses_stream_tiles(prob.k, static_cast<int>(sizeof(In)), split)) {
      launch_split_decode(DecodeStreamConfig{}, split);  // long k slices: 256-byte stages
    } else {
      launch_split_decode(DecodeConfig{}, split);
    }
  } else {
    launch_decode(DecodeConfig{});
  }
}

}  // namespace moekit::detail::gemm
