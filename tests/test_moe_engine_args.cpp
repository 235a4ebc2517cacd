// The engine arguments on the CPU (docs/moe.md, "Engine inputs"; docs/routing-permute.md,
// "Engine ids"): what the references compute with an expert map, i64 ids and
// apply_router_weight_on_input, against the same computation spelled out by hand (an
// engine's gather, cast and scaling), and what each adds to the workspace sizes (nothing
// on the default path). The rejections are rows of test_moe_bad_inputs.cpp ("engine").
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "moekit/moekit.h"
#include "moekit/reference.h"
#include "test_moe_common.h"
#include "test_moe_engine_common.h"

namespace moekit {
namespace {

using enginetest::Map;
using moetest::Ids;

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

struct Experts {
  HostTensor x, wgu, wd, w, ids;
};

Experts make_experts(std::mt19937_64& rng, int64_t T, int64_t H, int64_t E_local, int64_t F,
                     int64_t K, int64_t E_ids, Ids pattern) {
  Experts e;
  e.x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
  e.wgu = moetest::normal(rng, DType::kBF16, {E_local, 2 * F, H}, 0.2);
  e.wd = moetest::normal(rng, DType::kBF16, {E_local, H, F}, 0.2);
  e.w = moetest::make_topk_weights(rng, T, K);
  e.ids = moetest::make_ids(rng, T, K, E_ids, pattern);
  return e;
}

HostTensor ref_experts(const Experts& e, const TensorView& ids, const TensorView& map,
                       bool apply = false, const HostTensor* x = nullptr,
                       const HostTensor* w = nullptr) {
  HostTensor out(DType::kBF16, {e.x.shape()[0], e.x.shape()[1]});
  FusedMoEExpertsArgs a;
  a.hidden_states = (x ? *x : e.x).view();
  a.w_gate_up = e.wgu.view();
  a.w_down = e.wd.view();
  a.topk_weights = (w ? *w : e.w).view();
  a.topk_ids = ids;
  a.expert_map = map;
  a.apply_router_weight_on_input = apply;
  a.output = out.view();
  reference::fused_moe_experts(a);
  return out;
}

TEST(EngineArgsReference, ExpertMapIsTheGatherOfLocalIds) {
  std::mt19937_64 rng(11);
  const int64_t E_local = 8, ranks = 4, E_global = E_local * ranks;
  for (Map kind : {Map::kBlocked, Map::kShuffled, Map::kAllRemote, Map::kBadLocal}) {
    for (Ids pattern : {Ids::kDistinct, Ids::kMixed, Ids::kOutOfRange}) {
      const Experts e = make_experts(rng, 9, 32, E_local, 16, 4, E_global, pattern);
      const HostTensor map = enginetest::make_map(rng, E_global, E_local, 2, kind);
      const HostTensor local = enginetest::gather_local(e.ids, map, E_local);
      const HostTensor got = ref_experts(e, e.ids.view(), map.view());
      EXPECT_TRUE(same_bytes(got, ref_experts(e, local.view(), TensorView{})));
      const HostTensor wide = enginetest::widen(e.ids);
      EXPECT_TRUE(same_bytes(got, ref_experts(e, wide.view(), map.view())));
      if (kind == Map::kAllRemote) {
        for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.at(i), 0.0);
      }
    }
  }
}

TEST(EngineArgsReference, Int64IdsMatchInt32IdsAndOutOfRangeIsSkipped) {
  std::mt19937_64 rng(12);
  const Experts e = make_experts(rng, 7, 32, 8, 16, 3, 8, Ids::kMixed);
  HostTensor wide = enginetest::widen(e.ids);
  EXPECT_TRUE(same_bytes(ref_experts(e, e.ids.view(), TensorView{}),
                         ref_experts(e, wide.view(), TensorView{})));
  // An i64 id that wraps to a valid i32 id is out of range, never truncated.
  HostTensor ids32 = e.ids;
  ids32.as<int32_t>()[0] = -1;
  wide.as<int64_t>()[0] = (int64_t{1} << 32) + 3;
  EXPECT_TRUE(same_bytes(ref_experts(e, ids32.view(), TensorView{}),
                         ref_experts(e, wide.view(), TensorView{})));
}

TEST(EngineArgsReference, RouterWeightOnInputScalesTheInputRow) {
  std::mt19937_64 rng(13);
  const Experts e = make_experts(rng, 11, 32, 8, 16, 1, 8, Ids::kMinusOne);
  HostTensor scaled, ones;
  enginetest::scale_by_hand(e.x, e.w, &scaled, &ones);
  const HostTensor got = ref_experts(e, e.ids.view(), TensorView{}, /*apply=*/true);
  EXPECT_TRUE(same_bytes(got, ref_experts(e, e.ids.view(), TensorView{}, false, &scaled, &ones)));
  // Not the output-weighted layer (the MLP is not linear).
  EXPECT_FALSE(same_bytes(got, ref_experts(e, e.ids.view(), TensorView{})));
}

TEST(EngineArgsReference, FusedMoEWithAMapRoutesOverGlobalExperts) {
  std::mt19937_64 rng(14);
  const int64_t T = 6, H = 32, F = 16, E_local = 4, E_global = 16, K = 3;
  const Experts e = make_experts(rng, T, H, E_local, F, K, E_global, Ids::kDistinct);
  const HostTensor logits = moetest::normal(rng, DType::kF32, {T, E_global}, 1.0);
  const HostTensor map = enginetest::make_map(rng, E_global, E_local, 1, Map::kShuffled);
  HostTensor out(DType::kBF16, {T, H});
  FusedMoEArgs a;
  a.hidden_states = e.x.view();
  a.gating_output = logits.view();
  a.params.top_k = static_cast<int>(K);
  a.w_gate_up = e.wgu.view();
  a.w_down = e.wd.view();
  a.output = out.view();
  a.expert_map = map.view();
  reference::fused_moe(a);
  // By hand: the routing over the global experts, then the experts with the map.
  HostTensor w(DType::kF32, {T, K}), ids(DType::kI32, {T, K});
  FusedTopKArgs topk;
  topk.gating_output = logits.view();
  topk.params = a.params;
  topk.topk_weights = w.view();
  topk.topk_ids = ids.view();
  reference::fused_topk(topk);
  const HostTensor local = enginetest::gather_local(ids, map, E_local);
  EXPECT_TRUE(same_bytes(out, ref_experts(e, local.view(), TensorView{}, false, nullptr, &w)));
}

TEST(EngineArgsReference, PermuteWithAMapSortsLocalIds) {
  std::mt19937_64 rng(15);
  const int64_t T = 40, K = 4, E_local = 8, E_global = 32;
  const HostTensor ids = moetest::make_ids(rng, T, K, E_global, Ids::kMixed);
  const HostTensor map = enginetest::make_map(rng, E_global, E_local, 3, Map::kBlocked);
  const HostTensor local = enginetest::gather_local(ids, map, E_local);
  const int bs = 16;
  const int64_t S = permute_align_sorted_size(T * K, E_local, bs);
  const int64_t NB = permute_align_num_blocks(T * K, E_local, bs);
  auto align = [&](const HostTensor& topk_ids, const HostTensor* m) {
    HostTensor sorted(DType::kI32, {S}), experts(DType::kI32, {NB}), post(DType::kI32, {1});
    PermuteAlignArgs a;
    a.topk_ids = topk_ids.view();
    a.num_experts = static_cast<int>(E_local);
    a.block_size = bs;
    a.sorted_token_ids = sorted.view();
    a.expert_ids = experts.view();
    a.num_tokens_post_padded = post.view();
    if (m) a.expert_map = m->view();
    reference::moe_permute_align(a);
    return std::vector<HostTensor>{sorted, experts, post};
  };
  const auto want = align(local, nullptr);
  for (const HostTensor& given : {ids, enginetest::widen(ids)}) {
    const auto got = align(given, &map);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same_bytes(got[i], want[i])) << i;
  }
}

// ---- workspace sizes ----

FusedMoEExpertsArgs experts_shapes(int64_t T, int64_t K, DType ids_dtype) {
  FusedMoEExpertsArgs a;
  a.hidden_states = make_view(nullptr, DType::kBF16, {T, 256});
  a.w_gate_up = make_view(nullptr, DType::kBF16, {16, 256, 256});
  a.w_down = make_view(nullptr, DType::kBF16, {16, 256, 128});
  a.topk_weights = make_view(nullptr, DType::kF32, {T, K});
  a.topk_ids = make_view(nullptr, ids_dtype, {T, K});
  return a;
}

size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

TEST(EngineArgsWorkspace, ExpertsOpsAddTheTranslatedIdsAndScaledRowsOnly) {
  for (int64_t T : {int64_t{5}, int64_t{200}}) {
    for (bool indexed : {false, true}) {
      auto size = [&](const FusedMoEExpertsArgs& a) {
        return indexed ? indexed_expert_mlp_workspace_size(a) : fused_moe_experts_workspace_size(a);
      };
      const size_t base = size(experts_shapes(T, 4, DType::kI32));
      const size_t ids = align256(static_cast<size_t>(T) * 4 * 4);
      EXPECT_EQ(size(experts_shapes(T, 4, DType::kI64)), base + ids);
      FusedMoEExpertsArgs mapped = experts_shapes(T, 4, DType::kI32);
      mapped.expert_map = make_view(nullptr, DType::kI32, {64});
      EXPECT_EQ(size(mapped), base + ids);
      FusedMoEExpertsArgs top1 = experts_shapes(T, 1, DType::kI32);
      const size_t base1 = size(top1);
      top1.apply_router_weight_on_input = true;
      EXPECT_EQ(size(top1),
                base1 + align256(static_cast<size_t>(T) * 256 * 2) + align256(T * sizeof(float)));
    }
  }
}

TEST(EngineArgsWorkspace, LayerMapIsFreeAndRouterWeightOnInputAddsScaledRows) {
  const int64_t T = 37;
  FusedMoEArgs a;
  a.hidden_states = make_view(nullptr, DType::kBF16, {T, 256});
  a.gating_output = make_view(nullptr, DType::kF32, {T, 16});
  a.w_gate_up = make_view(nullptr, DType::kBF16, {16, 256, 256});
  a.w_down = make_view(nullptr, DType::kBF16, {16, 256, 128});
  a.params.top_k = 1;
  const size_t base = fused_moe_workspace_size(a);
  FusedMoEArgs mapped = a;
  mapped.w_gate_up = make_view(nullptr, DType::kBF16, {4, 256, 256});
  mapped.w_down = make_view(nullptr, DType::kBF16, {4, 256, 128});
  mapped.expert_map = make_view(nullptr, DType::kI32, {16});
  FusedMoEArgs local = mapped;
  local.expert_map = TensorView{};
  EXPECT_EQ(fused_moe_workspace_size(mapped), fused_moe_workspace_size(local));
  a.apply_router_weight_on_input = true;
  EXPECT_EQ(fused_moe_workspace_size(a),
            base + align256(static_cast<size_t>(T) * 256 * 2) + align256(T * sizeof(float)));
}

TEST(EngineArgsWorkspace, PermuteOpsAddTheTranslatedIdsOnly) {
  PermuteAlignArgs a;
  a.topk_ids = make_view(nullptr, DType::kI32, {40000, 2});  // the chunked path
  a.num_experts = 64;
  const size_t base = permute_align_workspace_size(a);
  EXPECT_GT(base, 0u);
  PermuteAlignArgs wide = a;
  wide.topk_ids.dtype = DType::kI64;
  EXPECT_EQ(permute_align_workspace_size(wide), base + align256(80000 * 4));
  PermuteAlignArgs mapped = a;
  mapped.expert_map = make_view(nullptr, DType::kI32, {256});
  EXPECT_EQ(permute_align_workspace_size(mapped), base + align256(80000 * 4));
  PrePermuteArgs p;
  p.local_expert_ids = make_view(nullptr, DType::kI32, {10, 2});  // one launch: no scratch
  p.num_local_experts = 8;
  EXPECT_EQ(pre_permute_workspace_size(p), 0u);
  p.local_expert_ids.dtype = DType::kI64;
  EXPECT_EQ(pre_permute_workspace_size(p), 256u);
}

}  // namespace
}  // namespace moekit
