// The engine arguments on the GPU (docs/moe.md, "Engine inputs"): expert maps (remote
// routes skipped, local ones exact), i64 ids and apply_router_weight_on_input, on the
// direct and sorted paths of the routed-experts ops, the layers and the permute ops.
// Each op is checked against the CPU reference, and bit for bit against the same op on
// the inputs an engine would prepare by hand (gathered local i32 ids, scaled rows with
// unit weights): after the one translation / scaling pass the same kernels run.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "support/gpu.h"
#include "test_moe_common.h"
#include "test_moe_engine_common.h"

namespace moekit {
namespace {

using enginetest::Map;
using moetest::Ids;
using testing::DeviceTensor;
using testing::DeviceWorkspace;

constexpr uint8_t kPoison = 0xFF;  // NaN in bf16 and f16

void sync_ok() {
  const cudaError_t err = cudaDeviceSynchronize();
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

void expect_close(const HostTensor& out, const HostTensor& ref, DType dt, const std::string& what) {
  const Tolerance tol = tolerance_for(dt);
  const Accuracy acc = compare(out.view(), ref.view(), tol);
  EXPECT_TRUE(acc.pass(tol)) << what << ": " << acc.str() << " over " << acc.count;
}

void expect_zero(const HostTensor& out, const std::string& what) {
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (out.at(i) != 0.0) {
      ADD_FAILURE() << what << ": element " << i << " = " << out.at(i) << ", expected 0";
      return;
    }
  }
}

// ---- routed experts ----

struct Case {
  DType dt;
  int64_t T, H, E_local, F, K;
  int64_t E_global;  // E_local * ranks (the ids' range)
  Map map;
  Ids ids;
  bool i64 = false;
  bool apply = false;  // apply_router_weight_on_input (K = 1)
};

std::string name(const Case& c) {
  static const char* maps[] = {"blocked", "shuffled", "all_remote", "all_local", "bad_local"};
  return std::string(dtype_name(c.dt)) + " T=" + std::to_string(c.T) +
         " E_local=" + std::to_string(c.E_local) + " E_global=" + std::to_string(c.E_global) +
         " K=" + std::to_string(c.K) + " map=" + maps[static_cast<int>(c.map)] +
         " ids=" + moetest::ids_name(c.ids) + (c.i64 ? " i64" : "") + (c.apply ? " apply" : "");
}

struct Inputs {
  HostTensor x, wgu, wd, w, ids, map;
  Inputs(const Case& c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    x = moetest::normal(rng, c.dt, {c.T, c.H}, 1.0);
    wgu = moetest::normal(rng, c.dt, {c.E_local, 2 * c.F, c.H}, 1.0 / std::sqrt(double(c.H)));
    wd = moetest::normal(rng, c.dt, {c.E_local, c.H, c.F}, 1.0 / std::sqrt(double(c.F)));
    w = moetest::make_topk_weights(rng, c.T, c.K);
    ids = moetest::make_ids(rng, c.T, c.K, c.E_global, c.ids);
    const int rank = static_cast<int>((seed % (c.E_global / c.E_local)));
    map = enginetest::make_map(rng, c.E_global, c.E_local, rank, c.map);
  }
};

// fused_moe_experts (or indexed_expert_mlp) on the device, on host inputs; `map` optional;
// `in_place`: the output written over the hidden states.
HostTensor run_op(bool indexed, const HostTensor& x, const HostTensor& wgu, const HostTensor& wd,
                  const HostTensor& w, const HostTensor& ids, const HostTensor* map, bool apply,
                  bool in_place = false) {
  const int64_t T = x.shape()[0], H = x.shape()[1];
  DeviceTensor dx(x), dwgu(wgu), dwd(wd), dw(w), dids(ids), out(x.dtype(), {T, H}, kPoison);
  DeviceTensor dmap;
  if (map) dmap = DeviceTensor(*map);
  FusedMoEExpertsArgs a;
  a.hidden_states = dx.view();
  a.w_gate_up = dwgu.view();
  a.w_down = dwd.view();
  a.topk_weights = dw.view();
  a.topk_ids = dids.view();
  a.output = in_place ? dx.view() : out.view();
  if (map) a.expert_map = dmap.view();
  a.apply_router_weight_on_input = apply;
  DeviceWorkspace ws(indexed ? indexed_expert_mlp_workspace_size(a)
                             : fused_moe_experts_workspace_size(a));
  a.workspace = ws.get();
  indexed ? indexed_expert_mlp(a, nullptr) : fused_moe_experts(a, nullptr);
  sync_ok();
  return in_place ? dx.download() : out.download();
}

// The op on the case. With `engine`, the case's arguments (map, ids dtype, apply); else
// what an engine would pass without them (local i32 ids, scaled rows, unit weights).
HostTensor run(const Case& c, const Inputs& in, bool indexed, bool engine) {
  if (engine) {
    return run_op(indexed, in.x, in.wgu, in.wd, in.w, c.i64 ? enginetest::widen(in.ids) : in.ids,
                  &in.map, c.apply);
  }
  HostTensor x = in.x, w = in.w;
  if (c.apply) enginetest::scale_by_hand(in.x, in.w, &x, &w);
  return run_op(indexed, x, in.wgu, in.wd, w, enginetest::gather_local(in.ids, in.map, c.E_local),
                nullptr, false);
}

HostTensor reference(const Case& c, const Inputs& in) {
  HostTensor ref(c.dt, {c.T, c.H});
  const HostTensor ids = c.i64 ? enginetest::widen(in.ids) : in.ids;
  FusedMoEExpertsArgs r;
  r.hidden_states = in.x.view();
  r.w_gate_up = in.wgu.view();
  r.w_down = in.wd.view();
  r.topk_weights = in.w.view();
  r.topk_ids = ids.view();
  r.expert_map = in.map.view();
  r.apply_router_weight_on_input = c.apply;
  r.output = ref.view();
  reference::fused_moe_experts(r);
  return ref;
}

void check_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(name(c));
  const Inputs in(c, seed);
  const HostTensor ref = reference(c, in);
  for (bool indexed : {false, true}) {
    const std::string op = indexed ? "indexed_expert_mlp" : "fused_moe_experts";
    const HostTensor got = run(c, in, indexed, /*engine=*/true);
    expect_close(got, ref, c.dt, op);
    EXPECT_TRUE(same_bytes(got, run(c, in, indexed, /*engine=*/false)))
        << op << ": differs from the same op on hand-prepared inputs";
    if (c.map == Map::kAllRemote) expect_zero(got, op + " (all remote)");
  }
}

// T <= 64: indexed_expert_mlp takes the direct path; fused_moe_experts always sorts.
// T = 200: both sort.
TEST(EngineArgsGpu, ExpertMapSkipsRemoteRoutesOnBothPaths) {
  MOEKIT_REQUIRE_GPU();
  const DType b = DType::kBF16, h = DType::kF16;
  const Case cases[] = {
      {b, 1, 256, 16, 128, 8, 64, Map::kBlocked, Ids::kDistinct},
      {b, 37, 256, 16, 128, 8, 64, Map::kBlocked, Ids::kMixed},
      {h, 64, 256, 16, 128, 4, 128, Map::kShuffled, Ids::kMinusOne},
      {b, 200, 256, 16, 128, 8, 64, Map::kShuffled, Ids::kDistinct},
      {h, 200, 136, 8, 72, 6, 32, Map::kBlocked, Ids::kOutOfRange},
      {b, 23, 256, 16, 128, 8, 64, Map::kAllRemote, Ids::kDistinct},
      {b, 300, 256, 16, 128, 8, 64, Map::kAllRemote, Ids::kMixed},
      {h, 19, 256, 32, 128, 8, 32, Map::kAllLocal, Ids::kDistinct},
      {b, 150, 256, 32, 128, 8, 32, Map::kAllLocal, Ids::kDuplicates},
      {b, 40, 256, 16, 128, 8, 64, Map::kBadLocal, Ids::kDistinct},
      {h, 130, 256, 16, 128, 8, 64, Map::kBadLocal, Ids::kMixed},
      {b, 48, 256, 16, 128, 8, 64, Map::kBlocked, Ids::kFewExperts},  // most experts empty
      {b, 0, 256, 16, 128, 8, 64, Map::kBlocked, Ids::kDistinct},
      {b, 4096, 64, 64, 32, 8, 1024, Map::kShuffled, Ids::kMixed},  // chunked route sort
  };
  uint64_t seed = 7000;
  for (const Case& c : cases) check_case(c, ++seed);
}

TEST(EngineArgsGpu, Int64IdsMatchInt32Ids) {
  MOEKIT_REQUIRE_GPU();
  const DType b = DType::kBF16, h = DType::kF16;
  Case cases[] = {
      {b, 7, 256, 64, 128, 8, 64, Map::kAllLocal, Ids::kMixed, true},
      {h, 200, 256, 64, 128, 8, 64, Map::kAllLocal, Ids::kOutOfRange, true},
      {b, 33, 256, 16, 128, 8, 64, Map::kBlocked, Ids::kMixed, true},
      {b, 5000, 64, 16, 32, 4, 64, Map::kShuffled, Ids::kMinusOne, true},
  };
  uint64_t seed = 7100;
  for (const Case& c : cases) check_case(c, ++seed);
  // Without a map: i64 ids against the op on the same i32 ids, bit for bit; an i64 id
  // whose low 32 bits are a valid id is out of range (skipped), never truncated.
  for (int64_t T : {int64_t{9}, int64_t{190}}) {
    const Case c{b, T, 256, 16, 128, 4, 16, Map::kAllLocal, Ids::kMixed, true};
    Inputs in(c, 7200 + T);
    std::iota(in.map.as<int32_t>(), in.map.as<int32_t>() + 16, 0);  // identity
    HostTensor wide = enginetest::widen(in.ids);
    wide.as<int64_t>()[1] = (int64_t{1} << 32) + 2;
    in.ids.as<int32_t>()[1] = -1;
    for (bool indexed : {false, true}) {
      EXPECT_TRUE(same_bytes(run_op(indexed, in.x, in.wgu, in.wd, in.w, wide, nullptr, false),
                             run_op(indexed, in.x, in.wgu, in.wd, in.w, in.ids, nullptr, false)))
          << "T=" << T << " indexed=" << indexed;
    }
  }
}

TEST(EngineArgsGpu, RouterWeightOnInputScalesTheInput) {
  MOEKIT_REQUIRE_GPU();
  const DType b = DType::kBF16, h = DType::kF16;
  Case cases[] = {
      {b, 1, 256, 16, 128, 1, 16, Map::kAllLocal, Ids::kDistinct},
      {h, 40, 256, 16, 128, 1, 16, Map::kAllLocal, Ids::kMinusOne},
      {b, 200, 256, 16, 128, 1, 16, Map::kAllLocal, Ids::kDistinct},
      {b, 57, 256, 16, 128, 1, 64, Map::kBlocked, Ids::kMixed, true},  // with map and i64
      {h, 500, 136, 8, 72, 1, 32, Map::kShuffled, Ids::kDistinct},
  };
  uint64_t seed = 7300;
  for (Case& c : cases) {
    c.apply = true;
    check_case(c, ++seed);
  }
}

// In place (output == hidden_states) with the engine passes: the translation and the
// scaling read their inputs before anything writes the output.
TEST(EngineArgsGpu, InPlaceWithEngineInputs) {
  MOEKIT_REQUIRE_GPU();
  for (int64_t T : {int64_t{9}, int64_t{120}}) {
    const Case c{DType::kBF16, T, 256, 16, 128, 1, 64, Map::kBlocked, Ids::kMixed, true, true};
    const Inputs in(c, 7400 + T);
    for (bool indexed : {false, true}) {
      const HostTensor want = run(c, in, indexed, /*engine=*/true);
      const HostTensor got = run_op(indexed, in.x, in.wgu, in.wd, in.w, enginetest::widen(in.ids),
                                    &in.map, true, /*in_place=*/true);
      EXPECT_TRUE(same_bytes(got, want)) << "T=" << T << " indexed=" << indexed;
    }
  }
}

// ---- layers ----

struct LayerCase {
  DType dt;
  int64_t T, H, E_local, F, K, E_global, S;  // S > 0: a shared expert
  Map map;
  bool apply = false;
};

HostTensor run_layer(const LayerCase& c, uint64_t seed) {
  SCOPED_TRACE(std::string(dtype_name(c.dt)) + " T=" + std::to_string(c.T) +
               " E_local=" + std::to_string(c.E_local) + " K=" + std::to_string(c.K) +
               " S=" + std::to_string(c.S) + (c.apply ? " apply" : ""));
  std::mt19937_64 rng(seed);
  HostTensor x = moetest::normal(rng, c.dt, {c.T, c.H}, 1.0);
  HostTensor logits = moetest::normal(rng, DType::kF32, {c.T, c.E_global}, 1.0);
  HostTensor wgu =
      moetest::normal(rng, c.dt, {c.E_local, 2 * c.F, c.H}, 1.0 / std::sqrt(double(c.H)));
  HostTensor wd = moetest::normal(rng, c.dt, {c.E_local, c.H, c.F}, 1.0 / std::sqrt(double(c.F)));
  const int64_t S = c.S > 0 ? c.S : 8;
  HostTensor sgu = moetest::normal(rng, c.dt, {2 * S, c.H}, 1.0 / std::sqrt(double(c.H)));
  HostTensor sd = moetest::normal(rng, c.dt, {c.H, S}, 1.0 / std::sqrt(double(S)));
  HostTensor map = enginetest::make_map(rng, c.E_global, c.E_local, 1, c.map);
  DeviceTensor dx(x), dlogits(logits), dwgu(wgu), dwd(wd), dsgu(sgu), dsd(sd), dmap(map);
  DeviceTensor out(c.dt, {c.T, c.H}, kPoison);
  FusedMoESharedExpertArgs a;
  a.moe.hidden_states = dx.view();
  a.moe.gating_output = dlogits.view();
  a.moe.params.top_k = static_cast<int>(c.K);
  a.moe.params.renormalize = c.K > 1;
  a.moe.w_gate_up = dwgu.view();
  a.moe.w_down = dwd.view();
  a.moe.output = out.view();
  a.moe.expert_map = dmap.view();
  a.moe.apply_router_weight_on_input = c.apply;
  if (c.S > 0) {
    a.shared_w_gate_up = dsgu.view();
    a.shared_w_down = dsd.view();
  }
  DeviceWorkspace ws(c.S > 0 ? fused_moe_shared_expert_workspace_size(a)
                             : fused_moe_workspace_size(a.moe));
  a.moe.workspace = ws.get();
  c.S > 0 ? fused_moe_shared_expert(a, nullptr) : fused_moe(a.moe, nullptr);
  sync_ok();
  HostTensor got = out.download();
  HostTensor ref(c.dt, {c.T, c.H});
  FusedMoESharedExpertArgs r = a;
  r.moe.hidden_states = x.view();
  r.moe.gating_output = logits.view();
  r.moe.w_gate_up = wgu.view();
  r.moe.w_down = wd.view();
  r.moe.expert_map = map.view();
  r.moe.output = ref.view();
  r.shared_w_gate_up = c.S > 0 ? sgu.view() : TensorView{};
  r.shared_w_down = c.S > 0 ? sd.view() : TensorView{};
  reference::fused_moe_shared_expert(r);
  expect_close(got, ref, c.dt, "layer");
  if (c.map == Map::kAllRemote && c.S == 0) expect_zero(got, "layer (all remote)");
  return got;
}

TEST(EngineArgsGpu, LayersWithAMapAndRouterWeightOnInput) {
  MOEKIT_REQUIRE_GPU();
  const DType b = DType::kBF16, h = DType::kF16;
  const LayerCase cases[] = {
      {b, 1, 256, 16, 128, 8, 64, 0, Map::kBlocked},
      {b, 37, 256, 16, 128, 8, 64, 0, Map::kShuffled},
      {h, 200, 256, 16, 128, 8, 64, 0, Map::kBlocked},
      {b, 64, 256, 16, 128, 6, 64, 128, Map::kShuffled},
      {h, 300, 256, 16, 128, 8, 64, 128, Map::kBlocked},
      {b, 20, 256, 16, 128, 8, 64, 0, Map::kAllRemote},
      {b, 100, 256, 16, 128, 8, 64, 128, Map::kAllRemote},  // the shared expert alone
      {b, 16, 256, 16, 128, 8, 1024, 0, Map::kShuffled},    // 1024 global experts
      {h, 50, 256, 16, 128, 8, 64, 0, Map::kBadLocal},      // map entries past E_local
      {b, 90, 256, 16, 128, 4, 600, 64, Map::kBadLocal},
      {b, 40, 256, 16, 128, 1, 64, 0, Map::kBlocked, true},
      {h, 250, 256, 16, 128, 1, 64, 128, Map::kShuffled, true},
      {b, 33, 256, 16, 128, 1, 16, 0, Map::kAllLocal, true},
  };
  uint64_t seed = 7500;
  for (const LayerCase& c : cases) run_layer(c, ++seed);
}

// ---- permute ops ----

TEST(EngineArgsGpu, PermuteAlignWithMapAndInt64IdsMatchesGatheredIds) {
  MOEKIT_REQUIRE_GPU();
  struct AlignCase {
    int64_t T, K, E_local, E_global;
    Map map;
    Ids ids;
  };
  const AlignCase cases[] = {
      {40, 4, 8, 32, Map::kBlocked, Ids::kMixed},
      {1000, 8, 64, 256, Map::kShuffled, Ids::kDistinct},
      {9000, 8, 32, 256, Map::kBlocked, Ids::kMixed},  // the chunked kernels (> 32768 routes)
      {100, 8, 16, 64, Map::kAllRemote, Ids::kDistinct},
      {300, 4, 600, 1024, Map::kShuffled, Ids::kMinusOne},
  };
  uint64_t seed = 7600;
  for (const AlignCase& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " E_local=" + std::to_string(c.E_local));
    std::mt19937_64 rng(++seed);
    const HostTensor ids = moetest::make_ids(rng, c.T, c.K, c.E_global, c.ids);
    const HostTensor map = enginetest::make_map(rng, c.E_global, c.E_local, 0, c.map);
    const HostTensor local = enginetest::gather_local(ids, map, c.E_local);
    const int bs = 64;
    const int64_t N = c.T * c.K;
    const int64_t S = permute_align_sorted_size(N, static_cast<int>(c.E_local), bs);
    const int64_t NB = permute_align_num_blocks(N, static_cast<int>(c.E_local), bs);
    DeviceTensor dmap(map);
    auto args = [&](const TensorView& topk_ids, const TensorView& sorted, const TensorView& experts,
                    const TensorView& post, const TensorView& expert_map) {
      PermuteAlignArgs a;
      a.topk_ids = topk_ids;
      a.num_experts = static_cast<int>(c.E_local);
      a.block_size = bs;
      a.sorted_token_ids = sorted;
      a.expert_ids = experts;
      a.num_tokens_post_padded = post;
      a.expert_map = expert_map;
      return a;
    };
    auto align = [&](const HostTensor& given, bool with_map) {
      DeviceTensor dids(given);
      DeviceTensor sorted(DType::kI32, {S}), experts(DType::kI32, {NB}), post(DType::kI32, {1});
      PermuteAlignArgs a = args(dids.view(), sorted.view(), experts.view(), post.view(),
                                with_map ? dmap.view() : TensorView{});
      DeviceWorkspace ws(permute_align_workspace_size(a));
      a.workspace = ws.get();
      moe_permute_align(a, nullptr);
      sync_ok();
      return std::vector<HostTensor>{sorted.download(), experts.download(), post.download()};
    };
    const auto want = align(local, false);
    // The CPU reference agrees on the used part.
    HostTensor rs(DType::kI32, {S}), re(DType::kI32, {NB}), rp(DType::kI32, {1});
    reference::moe_permute_align(args(ids.view(), rs.view(), re.view(), rp.view(), map.view()));
    EXPECT_TRUE(same_bytes(want[2], rp));
    const int64_t used = rp.as<int32_t>()[0];
    EXPECT_EQ(std::memcmp(want[0].data(), rs.data(), static_cast<size_t>(used) * 4), 0);
    EXPECT_EQ(std::memcmp(want[1].data(), re.data(), static_cast<size_t>(used / bs) * 4), 0);
    for (const HostTensor& given : {ids, enginetest::widen(ids)}) {
      const auto got = align(given, true);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same_bytes(got[i], want[i])) << i;
    }
  }
}

TEST(EngineArgsGpu, PrePermuteTakesInt64Ids) {
  MOEKIT_REQUIRE_GPU();
  for (int64_t T : {int64_t{50}, int64_t{3000}}) {  // one launch; chunked (> 4096 routes)
    SCOPED_TRACE("T=" + std::to_string(T));
    std::mt19937_64 rng(7700 + T);
    const int64_t K = 4, E = 32, H = 64;
    HostTensor x = moetest::normal(rng, DType::kBF16, {T, H}, 1.0);
    HostTensor ids = moetest::make_ids(rng, T, K, E, Ids::kMixed);
    HostTensor wide = enginetest::widen(ids);
    wide.as<int64_t>()[0] = (int64_t{1} << 32) + 1;  // out of range, never truncated
    ids.as<int32_t>()[0] = -1;
    DeviceTensor dx(x);
    const int64_t P = permuted_rows(T, static_cast<int>(K), static_cast<int>(E), 8);
    auto pre = [&](const HostTensor& given) {
      DeviceTensor dids(given);
      DeviceTensor perm(DType::kBF16, {P, H}, 0), meta(DType::kI32, {E}), inv(DType::kI32, {T * K});
      PrePermuteArgs a;
      a.hidden_states = dx.view();
      a.local_expert_ids = dids.view();
      a.num_local_experts = static_cast<int>(E);
      a.layout = PermutedLayout::contiguous(8);
      a.permuted = perm.view();
      a.layout_metadata = meta.view();
      a.inverse_indices = inv.view();
      DeviceWorkspace ws(pre_permute_workspace_size(a));
      a.workspace = ws.get();
      moe_pre_permute(a, nullptr);
      sync_ok();
      return std::vector<HostTensor>{perm.download(), meta.download(), inv.download()};
    };
    const auto want = pre(ids);
    const auto got = pre(wide);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same_bytes(got[i], want[i])) << i;
  }
}

}  // namespace
}  // namespace moekit
