// Non-finite test inputs and what they may reach: NaN / Inf stored as raw bits (a NaN's
// sign and payload reach the kernel as written; HostTensor::set rounds through double),
// and a map of the output elements each input reaches, checked against a clean run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/host_tensor.h"

namespace moekit::testing {

enum class NonFinite {
  kNan,          // the quiet NaN with the sign bit clear
  kNegativeNan,  // sign bit set, a non-zero payload
  kPosInf,
  kNegInf,
};

// Element i (flat) of a bf16 / f16 / f32 tensor set to `value`.
void set_nonfinite(HostTensor& t, int64_t i, NonFinite value);

// What the non-finite inputs make of each element of an output viewed as [rows, cols]:
// kNone (the clean run's bits), kNonFinite (Inf or NaN), kNan. Marks only raise an
// element (a NaN wins over an Inf).
enum class Reach : uint8_t { kNone, kNonFinite, kNan };
class ReachMap {
 public:
  ReachMap(int64_t rows, int64_t cols);
  void mark(int64_t row, int64_t col, Reach r);
  void mark_row(int64_t row, Reach r);
  void mark_col(int64_t col, Reach r);
  Reach at(int64_t row, int64_t col) const { return map_[row * cols_ + col]; }
  int64_t count(Reach r) const;  // elements at exactly r

 private:
  int64_t rows_, cols_;
  std::vector<Reach> map_;
};

// gtest failures (the first few named) for every element of `got` that breaks `map`:
// kNone elements must equal `clean` bit for bit, kNonFinite ones be Inf or NaN, kNan ones
// NaN. `got` and `clean` have map's element count, in one dtype. Returns the bad count.
int64_t expect_reach(const HostTensor& got, const HostTensor& clean, const ReachMap& map,
                     const std::string& what);

}  // namespace moekit::testing
