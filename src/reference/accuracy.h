// Accuracy of an op's output against its reference, as SPEC.md defines it.
#pragma once

#include <cstdint>
#include <string>

#include "moekit/tensor.h"

namespace moekit {

struct Tolerance {
  double atol;
  double rtol;
  double max_rel_l2;  // the SPEC's limit on rel_l2 (and on err_ratio)
};

// SPEC limits: f32 1e-5, f16 5e-3, bf16 1e-2, fp8 3e-2.
Tolerance tolerance_for(DType dtype);

struct Accuracy {
  double rel_l2 = 0;      // ||out - ref|| / ||ref|| (0 when both are zero)
  double err_ratio = 0;   // share of elements outside atol + rtol*|ref|
  int64_t nonfinite = 0;  // NaN / Inf elements in out
  int64_t count = 0;
  bool pass(const Tolerance& tol) const {
    return nonfinite == 0 && rel_l2 <= tol.max_rel_l2 && err_ratio <= tol.max_rel_l2;
  }
  std::string str() const;  // "rel_l2=1.2e-03 err_ratio=0.0e+00"
};

// Compares element-wise over views of the same shape (host memory).
// `row_mask` (optional, length = shape[0] or the product of all but the last dim)
// restricts the comparison to rows whose mask byte is non-zero.
Accuracy compare(const TensorView& out, const TensorView& ref, const Tolerance& tol,
                 const uint8_t* row_mask = nullptr);

}  // namespace moekit
