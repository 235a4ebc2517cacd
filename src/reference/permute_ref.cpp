// CPU references of MoEPermuteAlignFwd, MoEPrePermuteFwd and MoEPostPermuteFwd,
// written from SPEC.md (f64 accumulation). Ids outside [0, E) (after the expert map, when
// given) are dropped like -1; inverse indices outside [0, P) are skipped like -1.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/reference.h"
#include "reference/route_ids_ref.h"

namespace moekit::reference {

namespace {

// Flat route indices per (local) expert, ascending; ids i32 or i64, through the optional
// expert map.
std::vector<std::vector<int64_t>> routes_by_expert(const TensorView& ids, int num_experts,
                                                   const TensorView& expert_map = TensorView{}) {
  std::vector<std::vector<int64_t>> lists(num_experts);
  for (int64_t i = 0, n = ids.numel(); i < n; ++i) {
    const int64_t e = local_expert(ids, i, expert_map, num_experts);
    if (e >= 0) lists[e].push_back(i);
  }
  return lists;
}

int64_t align_up(int64_t v, int64_t a) {
  return (v + a - 1) / a * a;
}

}  // namespace

void moe_permute_align(const PermuteAlignArgs& args) {
  const int64_t N = args.topk_ids.numel();
  const int E = args.num_experts, bs = args.block_size;
  int32_t* sorted = args.sorted_token_ids.ptr<int32_t>();
  int32_t* expert_ids = args.expert_ids.ptr<int32_t>();
  const int64_t S = args.sorted_token_ids.numel(), NB = args.expert_ids.numel();
  for (int64_t i = 0; i < S; ++i) sorted[i] = static_cast<int32_t>(N);  // sentinel
  for (int64_t b = 0; b < NB; ++b) expert_ids[b] = -1;
  const auto lists = routes_by_expert(args.topk_ids, E, args.expert_map);
  int64_t pos = 0;
  for (int e = 0; e < E; ++e) {
    const int64_t start = pos;
    for (int64_t i : lists[e]) sorted[pos++] = static_cast<int32_t>(i);
    const int64_t end = start + align_up(static_cast<int64_t>(lists[e].size()), bs);
    for (int64_t b = start / bs; b < end / bs; ++b) expert_ids[b] = e;
    pos = end;
  }
  args.num_tokens_post_padded.ptr<int32_t>()[0] = static_cast<int32_t>(pos);
}

void moe_pre_permute(const PrePermuteArgs& args) {
  const TensorView& x = args.hidden_states;
  const int64_t K = args.local_expert_ids.size(1);
  const int E = args.num_local_experts, A = args.layout.alignment;
  const size_t row_bytes = static_cast<size_t>(x.size(1)) * dtype_size(x.dtype);
  const uint8_t* src = static_cast<const uint8_t*>(x.data);
  uint8_t* dst = static_cast<uint8_t*>(args.permuted.data);
  int32_t* inverse = args.inverse_indices.ptr<int32_t>();
  int32_t* metadata = args.layout_metadata.ptr<int32_t>();
  for (int64_t i = 0, n = args.inverse_indices.numel(); i < n; ++i) inverse[i] = -1;
  const auto lists = routes_by_expert(args.local_expert_ids, E);
  int64_t end = 0;
  for (int e = 0; e < E; ++e) {
    int64_t row = align_up(end, A);  // start_e = align_up(end_{e-1}, A)
    for (int64_t i : lists[e]) {
      std::memcpy(dst + row * row_bytes, src + (i / K) * row_bytes, row_bytes);
      inverse[i] = static_cast<int32_t>(row);
      ++row;
    }
    end = row;
    metadata[e] = static_cast<int32_t>(end);
  }
}

void moe_post_permute(const PostPermuteArgs& args) {
  const TensorView& y = args.expert_output;
  const int64_t P = y.size(0), H = y.size(1);
  const int64_t T = args.topk_weights.size(0), K = args.topk_weights.size(1);
  const float* w = args.topk_weights.ptr<const float>();
  const int32_t* inv = args.inverse_indices.ptr<const int32_t>();
  std::vector<double> acc(H);
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t r = inv[t * K + k];
      if (r < 0 || r >= P) continue;
      for (int64_t h = 0; h < H; ++h)
        acc[h] += static_cast<double>(w[t * K + k]) * host::load(y, r * H + h);
    }
    for (int64_t h = 0; h < H; ++h) host::store(args.out, t * H + h, acc[h]);
  }
}

}  // namespace moekit::reference
