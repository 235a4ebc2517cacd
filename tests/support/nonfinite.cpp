#include "support/nonfinite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace moekit::testing {

void set_nonfinite(HostTensor& t, int64_t i, NonFinite value) {
  const int v = static_cast<int>(value);  // kNan, kNegativeNan, kPosInf, kNegInf
  switch (t.dtype()) {
    case DType::kF32: {
      static const uint32_t bits[] = {0x7FC00000u, 0xFFC00123u, 0x7F800000u, 0xFF800000u};
      t.as<uint32_t>()[i] = bits[v];
      break;
    }
    case DType::kBF16: {
      static const uint16_t bits[] = {0x7FC0u, 0xFFC3u, 0x7F80u, 0xFF80u};
      t.as<uint16_t>()[i] = bits[v];
      break;
    }
    case DType::kF16: {
      static const uint16_t bits[] = {0x7E00u, 0xFE03u, 0x7C00u, 0xFC00u};
      t.as<uint16_t>()[i] = bits[v];
      break;
    }
    default:
      throw std::invalid_argument("set_nonfinite: a bf16, f16 or f32 tensor");
  }
}

ReachMap::ReachMap(int64_t rows, int64_t cols)
    : rows_(rows), cols_(cols), map_(static_cast<size_t>(rows * cols), Reach::kNone) {}

void ReachMap::mark(int64_t row, int64_t col, Reach r) {
  Reach& x = map_[row * cols_ + col];
  x = std::max(x, r);
}

void ReachMap::mark_row(int64_t row, Reach r) {
  for (int64_t c = 0; c < cols_; ++c) mark(row, c, r);
}

void ReachMap::mark_col(int64_t col, Reach r) {
  for (int64_t row = 0; row < rows_; ++row) mark(row, col, r);
}

int64_t ReachMap::count(Reach r) const {
  return std::count(map_.begin(), map_.end(), r);
}

int64_t expect_reach(const HostTensor& got, const HostTensor& clean, const ReachMap& map,
                     const std::string& what) {
  if (got.numel() != clean.numel() || got.dtype() != clean.dtype()) {
    ADD_FAILURE() << what << ": the outputs' shapes or dtypes differ";
    return 1;
  }
  const size_t esize = dtype_size(got.dtype());
  const auto* g = static_cast<const uint8_t*>(got.data());
  const auto* c = static_cast<const uint8_t*>(clean.data());
  int64_t bad[3] = {0, 0, 0};
  const int64_t n = got.numel();
  const int64_t width = got.shape().empty() ? 1 : got.shape().back();
  for (int64_t i = 0; i < n; ++i) {
    const Reach r = map.at(i / width, i % width);
    bool ok;
    if (r == Reach::kNone) {
      ok = std::memcmp(g + i * esize, c + i * esize, esize) == 0;
    } else if (r == Reach::kNan) {
      ok = std::isnan(got.at(i));
    } else {
      ok = !std::isfinite(got.at(i));
    }
    if (!ok && bad[static_cast<int>(r)]++ < 3) {
      ADD_FAILURE() << what << ": row " << i / width << " column " << i % width << " got "
                    << got.at(i) << " (clean " << clean.at(i) << "), expected "
                    << (r == Reach::kNone  ? "the clean bits"
                        : r == Reach::kNan ? "NaN"
                                           : "Inf or NaN");
    }
  }
  EXPECT_EQ(bad[0], 0) << what
                       << ": elements no non-finite input reaches differ from the clean run";
  EXPECT_EQ(bad[1], 0) << what << ": elements an Inf reaches are finite";
  EXPECT_EQ(bad[2], 0) << what << ": elements a NaN reaches are not NaN";
  return bad[0] + bad[1] + bad[2];
}

}  // namespace moekit::testing
