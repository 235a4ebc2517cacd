// Inputs of the engine-argument tests (test_moe_engine_args*.cpp): expert maps of an
// expert-parallel rank, global ids, i64 copies and the host-side meaning of each
// argument (docs/moe.md, "Engine inputs"), which the ops must match.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/host_dtype.h"
#include "reference/host_tensor.h"

namespace moekit::enginetest {

// How a rank's expert map is drawn over E_global = ranks * E_local global experts.
enum class Map {
  kBlocked,    // rank r holds globals [r*E_local, (r+1)*E_local), in order (vLLM's linear)
  kShuffled,   // E_local random globals, in random local order
  kAllRemote,  // every entry -1: the rank holds none of the routed experts
  kAllLocal,   // E_global == E_local, a permutation
  kBadLocal,   // kBlocked plus entries past E_local and below -1: skipped like -1
};

inline HostTensor make_map(std::mt19937_64& rng, int64_t E_global, int64_t E_local, int rank,
                           Map kind) {
  HostTensor map(DType::kI32, {E_global});
  int32_t* m = map.as<int32_t>();
  std::fill(m, m + E_global, -1);
  std::vector<int32_t> perm(static_cast<size_t>(E_global));
  std::iota(perm.begin(), perm.end(), 0);
  switch (kind) {
    case Map::kBlocked:
    case Map::kBadLocal:
      for (int64_t l = 0; l < E_local; ++l) m[rank * E_local + l] = static_cast<int32_t>(l);
      if (kind == Map::kBadLocal) {
        m[(rank * E_local + E_local) % E_global] = static_cast<int32_t>(E_local);
        m[(rank * E_local + E_local + 1) % E_global] = -5;
        m[rank * E_local] = static_cast<int32_t>(E_local + 100);
      }
      break;
    case Map::kShuffled:
    case Map::kAllLocal:
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t l = 0; l < E_local; ++l) m[perm[l]] = static_cast<int32_t>(l);
      break;
    case Map::kAllRemote:
      break;
  }
  return map;
}

// ids [T, K] as i64 (the same values).
inline HostTensor widen(const HostTensor& ids) {
  HostTensor out(DType::kI64, ids.shape());
  for (int64_t i = 0; i < ids.numel(); ++i) out.as<int64_t>()[i] = ids.as<int32_t>()[i];
  return out;
}

// The local ids an engine would compute by hand: map[id] for ids in range, else -1
// (and -1 for map entries outside [0, E_local)).
inline HostTensor gather_local(const HostTensor& ids, const HostTensor& map, int64_t E_local) {
  HostTensor out(DType::kI32, ids.shape());
  const int64_t n = map.numel();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = ids.as<int32_t>()[i];
    const int64_t l = id >= 0 && id < n ? map.as<int32_t>()[id] : -1;
    out.as<int32_t>()[i] = l >= 0 && l < E_local ? static_cast<int32_t>(l) : -1;
  }
  return out;
}

// apply_router_weight_on_input done by hand (K = 1): x'[t] = round(round(w[t]) * x[t]), and
// unit weights.
inline void scale_by_hand(const HostTensor& x, const HostTensor& w, HostTensor* scaled,
                          HostTensor* ones) {
  const int64_t T = x.shape()[0], H = x.shape()[1];
  *scaled = HostTensor(x.dtype(), {T, H});
  *ones = HostTensor(DType::kF32, {T, 1});
  for (int64_t t = 0; t < T; ++t) {
    const double wr = host::round_to(x.dtype(), w.at(t));
    for (int64_t h = 0; h < H; ++h) scaled->set(t * H + h, wr * x.at(t * H + h));
    ones->set(t, 1.0);
  }
}

}  // namespace moekit::enginetest
