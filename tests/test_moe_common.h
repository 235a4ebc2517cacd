// Input generation shared by the MoE tests (test_moe*.cpp).
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "reference/host_tensor.h"

namespace moekit::moetest {

// How topk_ids are drawn. Every pattern starts from K distinct random ids per token
// (K <= E), then:
enum class Ids {
  kDistinct,    // as drawn
  kMinusOne,    // ~25% of the entries are -1 (some tokens get no route at all)
  kDuplicates,  // about half of the tokens repeat one id
  kOutOfRange,  // some entries are E, E+7, -3, INT_MAX: skipped like -1
  kOneExpert,   // every route goes to one expert
  kFewExperts,  // ids drawn from 3 experts only: most experts are empty
  kMixed,       // -1, duplicates and out-of-range together
};

inline const char* ids_name(Ids p) {
  switch (p) {
    case Ids::kDistinct:
      return "distinct";
    case Ids::kMinusOne:
      return "minus_one";
    case Ids::kDuplicates:
      return "duplicates";
    case Ids::kOutOfRange:
      return "out_of_range";
    case Ids::kOneExpert:
      return "one_expert";
    case Ids::kFewExperts:
      return "few_experts";
    case Ids::kMixed:
      return "mixed";
  }
  return "?";
}

inline HostTensor make_ids(std::mt19937_64& rng, int64_t T, int64_t K, int64_t E, Ids pattern) {
  HostTensor ids(DType::kI32, {T, K});
  int32_t* p = ids.as<int32_t>();
  std::vector<int32_t> perm(static_cast<size_t>(E));
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  const int32_t few[3] = {1 % static_cast<int32_t>(E), static_cast<int32_t>(E / 2),
                          static_cast<int32_t>(E - 1)};
  const int32_t bad[4] = {static_cast<int32_t>(E), static_cast<int32_t>(E + 7), -3, INT_MAX};
  const int32_t one = static_cast<int32_t>(E > 3 ? 3 : E - 1);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t k = 0; k < K; ++k) {  // partial Fisher-Yates: K distinct ids
      std::uniform_int_distribution<int64_t> pick(k, E - 1);
      std::swap(perm[k], perm[pick(rng)]);
      p[t * K + k] = perm[k];
    }
    for (int64_t k = 0; k < K; ++k) {
      int32_t& id = p[t * K + k];
      const double r = u01(rng);
      switch (pattern) {
        case Ids::kDistinct:
          break;
        case Ids::kMinusOne:
          if (r < 0.25 || t % 7 == 3) id = -1;
          break;
        case Ids::kDuplicates:
          if (k > 0 && t % 2 == 0 && k == K - 1) id = p[t * K];
          break;
        case Ids::kOutOfRange:
          if (r < 0.2) id = bad[static_cast<int>(r * 20) % 4];
          break;
        case Ids::kOneExpert:
          id = one;
          break;
        case Ids::kFewExperts:
          id = few[static_cast<int>(r * 3) % 3];
          break;
        case Ids::kMixed:
          if (r < 0.15) {
            id = -1;
          } else if (r < 0.25) {
            id = bad[static_cast<int>(r * 40) % 4];
          } else if (r < 0.4 && k > 0) {
            id = p[t * K + k - 1];
          }
          break;
      }
    }
  }
  return ids;
}

// topk weights uniform in (0, 1].
inline HostTensor make_topk_weights(std::mt19937_64& rng, int64_t T, int64_t K) {
  HostTensor w(DType::kF32, {T, K});
  std::uniform_real_distribution<double> dist(0.05, 1.0);
  for (int64_t i = 0; i < T * K; ++i) w.set(i, dist(rng));
  return w;
}

inline HostTensor normal(std::mt19937_64& rng, DType dtype, std::vector<int64_t> shape,
                         double stddev) {
  HostTensor t(dtype, std::move(shape));
  t.fill_normal(rng, stddev);
  return t;
}

// A contiguous permuted layout: expert e gets count(e) rows starting at a multiple of
// `alignment`; meta = the ends (i32 [E]), P = the last end + alignment + 3 (rows past the
// last block too), expert_of_row[r] = row r's expert, or -1 for padding.
struct RaggedRows {
  HostTensor meta;
  int64_t P = 0;
  std::vector<int> expert_of_row;
};
template <class Count>
RaggedRows ragged_rows(int64_t E, int alignment, Count&& count) {
  RaggedRows r;
  r.meta = HostTensor(DType::kI32, {E});
  int64_t end = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = count(e);
    const int64_t start = (end + alignment - 1) / alignment * alignment;
    r.expert_of_row.resize(static_cast<size_t>(start), -1);
    r.expert_of_row.resize(static_cast<size_t>(start + n), static_cast<int>(e));
    end = start + n;
    r.meta.as<int32_t>()[e] = static_cast<int32_t>(end);
  }
  r.P = end + alignment + 3;
  r.expert_of_row.resize(static_cast<size_t>(r.P), -1);
  return r;
}

}  // namespace moekit::moetest
