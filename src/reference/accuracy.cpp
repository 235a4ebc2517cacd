#include "reference/accuracy.h"

#include <cmath>
#include <cstdio>

#include "core/host_dtype.h"

namespace moekit {

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {1e-5, 1e-5, 1e-5};
    case DType::kF16:
      return {5e-3, 5e-3, 5e-3};
    case DType::kFP8E4M3:
      return {3e-2, 3e-2, 3e-2};
    case DType::kBF16:
    default:
      return {1e-2, 1e-2, 1e-2};
  }
}

std::string Accuracy::str() const {
  char buf[128];
  std::snprintf(buf, sizeof buf, "rel_l2=%.2e err_ratio=%.2e%s", rel_l2, err_ratio,
                nonfinite ? " NONFINITE" : "");
  return buf;
}

Accuracy compare(const TensorView& out, const TensorView& ref, const Tolerance& tol,
                 const uint8_t* row_mask) {
  Accuracy acc;
  int64_t n = ref.numel();
  int64_t row_len = ref.ndim ? ref.shape[ref.ndim - 1] : 1;
  double diff2 = 0, ref2 = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (row_mask && row_len > 0 && !row_mask[i / row_len]) continue;
    double o = host::load(out, i), r = host::load(ref, i);
    ++acc.count;
    if (!std::isfinite(o)) {
      ++acc.nonfinite;
      ++bad;
      continue;
    }
    diff2 += (o - r) * (o - r);
    ref2 += r * r;
    if (std::fabs(o - r) > tol.atol + tol.rtol * std::fabs(r)) ++bad;
  }
  acc.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0.0);
  acc.err_ratio = acc.count ? static_cast<double>(bad) / acc.count : 0.0;
  return acc;
}

}  // namespace moekit
