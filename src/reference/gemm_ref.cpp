// CPU references of MoEGroupedGemmFwd and MoEGroupedGemmFP8Fwd, written from
// SPEC.md: f64 accumulation, one rounding to the output dtype, rows outside every
// expert's block left untouched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/reference.h"

namespace moekit::reference {
namespace {

std::vector<double> to_doubles(const TensorView& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = host::load(t, i);
  return v;
}

double dot(const double* x, const double* y, int64_t k) {
  double s = 0;
  for (int64_t i = 0; i < k; ++i) s += x[i] * y[i];
  return s;
}

double silu(double z) {
  return z / (1.0 + std::exp(-z));
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
    if (masked) {
      first = e * args.layout.max_m;
      count = meta[e];
    } else {
      const int64_t A = args.layout.alignment;
      first = (prev_end + A - 1) / A * A;  // start_e = align_up(end_{e-1}, A)
      count = meta[e] - first;
      prev_end = meta[e];
    }
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
  const int64_t E = args.a.shape[0], max_m = args.a.shape[1], Kd = args.a.shape[2];
  const int64_t N = args.b.shape[1];
  const int64_t KB = (Kd + 127) / 128, NB = (N + 127) / 128;
  const std::vector<double> a = to_doubles(args.a), b = to_doubles(args.b);
  const float* a_scale = static_cast<const float*>(args.a_scale.data);
  const float* b_scale = static_cast<const float*>(args.b_scale.data);
  const int32_t* meta = static_cast<const int32_t*>(args.layout_metadata.data);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t m = 0; m < meta[e]; ++m) {
      const int64_t row = e * max_m + m;
      const double* ar = a.data() + row * Kd;
      for (int64_t n = 0; n < N; ++n) {
        const double* bn = b.data() + (e * N + n) * Kd;
        double sum = 0;
        for (int64_t kb = 0; kb < KB; ++kb) {
          const int64_t k0 = kb * 128, len = std::min<int64_t>(128, Kd - k0);
          const double scale = static_cast<double>(a_scale[row * KB + kb]) *
                               static_cast<double>(b_scale[(e * NB + n / 128) * KB + kb]);
          sum += scale * dot(ar + k0, bn + k0, len);
        }
        host::store(args.c, row * N + n, sum);
      }
    }
  }
}

}  // namespace moekit::reference
