// CPU references of MoEGroupedGemmFwd and MoEGroupedGemmFP8Fwd (every layout, scale mode
// and activation), written from SPEC.md and gemm.h: f64 accumulation, one rounding to the
// output dtype, rows outside every expert's block left untouched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/reference.h"
#include "reference/host_tensor.h"

namespace moekit::reference {
namespace {

double dot(const double* x, const double* y, int64_t k) {
  double s = 0;
  for (int64_t i = 0; i < k; ++i) s += x[i] * y[i];
  return s;
}

double silu(double z) {
  return z / (1.0 + std::exp(-z));
}

// Expert e's rows [first, first + count) of the flattened a / c rows: masked, slab e of
// max_m rows and its count; contiguous, start_e = align_up(end_{e-1}, A) to end_e
// (*prev_end: end_{e-1}, advanced).
void expert_rows(bool masked, const PermutedLayout& layout, int64_t max_m, const int32_t* meta,
                 int64_t e, int64_t* prev_end, int64_t* first, int64_t* count) {
  if (masked) {
    *first = e * max_m;
    *count = meta[e];
  } else {
    const int64_t A = layout.alignment;
    *first = (*prev_end + A - 1) / A * A;
    *count = meta[e] - *first;
    *prev_end = meta[e];
  }
}

}  // namespace

void moe_grouped_gemm(const GroupedGemmArgs& args) {
  const bool silu_and_mul = args.activation == Activation::kSiluAndMul;
  const bool masked = args.layout.kind == PermutedLayout::Kind::kMasked;
  const int64_t E = args.b.shape[0], Kd = args.b.shape[2];
  const int64_t N = silu_and_mul ? args.b.shape[1] / 2 : args.b.shape[1];
  const int64_t b_rows = args.b.shape[1];
  const std::vector<double> a = to_doubles(args.a), b = to_doubles(args.b);
  const int32_t* meta = static_cast<const int32_t*>(args.layout_metadata.data);

  int64_t prev_end = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t first, count;
    expert_rows(masked, args.layout, args.layout.max_m, meta, e, &prev_end, &first, &count);
    const double* be = b.data() + e * b_rows * Kd;
    for (int64_t r = first; r < first + count; ++r) {
      const double* ar = a.data() + r * Kd;
      for (int64_t j = 0; j < N; ++j) {
        double v = dot(ar, be + j * Kd, Kd);
        if (silu_and_mul) v = silu(v) * dot(ar, be + (N + j) * Kd, Kd);
        host::store(args.c, r * N + j, v);
      }
    }
  }
}

void moe_grouped_gemm_fp8(const GroupedGemmFP8Args& args) {
  const bool silu_and_mul = args.activation == Activation::kSiluAndMul;
  const bool masked = args.layout.kind == PermutedLayout::Kind::kMasked;
  const int64_t E = args.b.shape[0], b_rows = args.b.shape[1], Kd = args.b.shape[2];
  const int64_t N = silu_and_mul ? b_rows / 2 : b_rows;
  const int64_t KB = (Kd + 127) / 128, NB = (b_rows + 127) / 128;
  const std::vector<double> a = to_doubles(args.a), b = to_doubles(args.b);
  const float* a_scale = static_cast<const float*>(args.a_scale.data);
  const float* b_scale = static_cast<const float*>(args.b_scale.data);
  const int32_t* meta = static_cast<const int32_t*>(args.layout_metadata.data);
  // An e4m3 c holds value / c_scale (rounded once, saturated).
  const double c_scale = args.c.dtype == DType::kFP8E4M3
                             ? static_cast<double>(static_cast<const float*>(args.c_scale.data)[0])
                             : 1.0;
  // The scales of a's row `row` and of expert e's b row j over k block kb (gemm.h Fp8Scales).
  const auto a_s = [&](int64_t row, int64_t kb) -> double {
    switch (args.scales) {
      case Fp8Scales::kBlock:
        return a_scale[row * KB + kb];
      case Fp8Scales::kPerChannel:
        return a_scale[row];
      default:
        return a_scale[0];
    }
  };
  const auto b_s = [&](int64_t e, int64_t j, int64_t kb) -> double {
    switch (args.scales) {
      case Fp8Scales::kBlock:
        return b_scale[(e * NB + j / 128) * KB + kb];
      case Fp8Scales::kPerChannel:
        return b_scale[e * b_rows + j];
      default:
        return b_scale[e];
    }
  };
  // sum over k blocks kb of a_scale * b_scale * (a[row] . b[e, j] over kb)
  const auto scaled_dot = [&](int64_t row, int64_t e, int64_t j) {
    const double* ar = a.data() + row * Kd;
    const double* bj = b.data() + (e * b_rows + j) * Kd;
    double sum = 0;
    for (int64_t kb = 0; kb < KB; ++kb) {
      const int64_t k0 = kb * 128, len = std::min<int64_t>(128, Kd - k0);
      sum += a_s(row, kb) * b_s(e, j, kb) * dot(ar + k0, bj + k0, len);
    }
    return sum;
  };
  int64_t prev_end = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t first, count;
    expert_rows(masked, args.layout, args.a.shape[1], meta, e, &prev_end, &first, &count);
    for (int64_t row = first; row < first + count; ++row) {
      for (int64_t j = 0; j < N; ++j) {
        double v = scaled_dot(row, e, j);
        if (silu_and_mul) v = silu(v) * scaled_dot(row, e, N + j);
        host::store(args.c, row * N + j, v / c_scale);
      }
    }
  }
}

}  // namespace moekit::reference
