// MoEPermuteAlignFwd, MoEPrePermuteFwd, MoEPostPermuteFwd: CPU references vs
// hand-computed cases, validation errors, and (with a Hopper GPU) the kernels vs
// the references on fresh random inputs and edge shapes, with poisoned outputs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/host_dtype.h"
#include "moekit/error.h"
#include "moekit/permute.h"
#include "moekit/reference.h"
#include "permute/permute_kernels.h"
#include "reference/accuracy.h"
#include "reference/host_tensor.h"
#include "support/gpu.h"

namespace moekit {
namespace {

HostTensor i32_tensor(std::vector<int64_t> shape, std::vector<int32_t> v) {
  HostTensor t(DType::kI32, std::move(shape));
  std::copy(v.begin(), v.end(), t.as<int32_t>());
  return t;
}

std::vector<int32_t> to_vec(const HostTensor& t) {
  return std::vector<int32_t>(t.as<int32_t>(), t.as<int32_t>() + t.numel());
}

template <class F>
void expect_error(F&& call, const std::string& arg) {
  try {
    call();
    ADD_FAILURE() << "no error for bad '" << arg << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
  }
}

// Without a GPU a valid call of `op` passes every check and stops at the launch target
// (with one, `call` is not made: it would launch on host memory).
template <class F>
void expect_valid_without_gpu(const char* op, F&& call) {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return;
  cudaGetLastError();
  try {
    call();
    ADD_FAILURE() << op << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(std::string("moekit::") + op +
                                              ": argument 'stream': expected a CUDA device to "
                                              "launch on",
                                          0),
              0u)
        << e.what();
  }
}

// A host buffer of `bytes` (a fake workspace), 256-byte aligned.
struct HostWorkspace {
  explicit HostWorkspace(size_t bytes) : buf(bytes + 256) {}
  Workspace get() {
    const auto p = (reinterpret_cast<uintptr_t>(buf.data()) + 255) / 256 * 256;
    return Workspace{reinterpret_cast<void*>(p), buf.size() - 256};
  }
  std::vector<uint8_t> buf;
};

// ---------------------------------------------------------------- CPU: references

TEST(PermuteAlignReference, HandComputed) {
  // Routes 0..5; route 3 is -1 and route 1 has an out-of-range id (dropped alike).
  HostTensor ids = i32_tensor({3, 2}, {1, 9, 1, -1, 3, 1});
  const int E = 4, bs = 16;
  ASSERT_EQ(permute_align_sorted_size(6, E, bs), 66);
  ASSERT_EQ(permute_align_num_blocks(6, E, bs), 5);
  HostTensor sorted(DType::kI32, {66}), eids(DType::kI32, {5}), npp(DType::kI32, {1});
  PermuteAlignArgs a;
  a.topk_ids = ids.view();
  a.num_experts = E;
  a.block_size = bs;
  a.sorted_token_ids = sorted.view();
  a.expert_ids = eids.view();
  a.num_tokens_post_padded = npp.view();
  reference::moe_permute_align(a);
  std::vector<int32_t> want(66, 6);  // sentinel T*K
  want[0] = 0;                       // expert 1: routes 0, 2, 5 (expert 0 and 2 are empty)
  want[1] = 2;
  want[2] = 5;
  want[16] = 4;  // expert 3: route 4
  EXPECT_EQ(to_vec(sorted), want);
  EXPECT_EQ(to_vec(eids), (std::vector<int32_t>{1, 3, -1, -1, -1}));
  EXPECT_EQ(npp.as<int32_t>()[0], 32);
}

TEST(PrePermuteReference, HandComputedWithAlignment) {
  HostTensor ids = i32_tensor({3, 2}, {1, 0, 1, -1, 3, 1});
  const int E = 4, A = 4, H = 8;
  HostTensor x(DType::kF32, {3, H});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 100.0 * (i / H) + i % H);
  const int64_t P = permuted_rows(3, 2, E, A);
  ASSERT_EQ(P, 18);
  HostTensor permuted(DType::kF32, {P, H}), meta(DType::kI32, {E}), inv(DType::kI32, {6});
  permuted.fill_bytes(0xFF);
  PrePermuteArgs a;
  a.hidden_states = x.view();
  a.local_expert_ids = ids.view();
  a.num_local_experts = E;
  a.layout = PermutedLayout::contiguous(A);
  a.permuted = permuted.view();
  a.layout_metadata = meta.view();
  a.inverse_indices = inv.view();
  reference::moe_pre_permute(a);
  // counts {1, 3, 0, 1}: blocks [0,1) [4,7) [8,8) [8,9).
  EXPECT_EQ(to_vec(meta), (std::vector<int32_t>{1, 7, 8, 9}));
  EXPECT_EQ(to_vec(inv), (std::vector<int32_t>{4, 0, 5, -1, 8, 6}));
  const int src_of_row[] = {0, -1, -1, -1, 0, 1, 2, -1, 2};
  for (int r = 0; r < P; ++r) {
    const int src = r < 9 ? src_of_row[r] : -1;
    for (int h = 0; h < H; ++h) {
      if (src >= 0) {
        EXPECT_EQ(permuted.at(r * H + h), 100.0 * src + h) << "row " << r;
      } else {
        EXPECT_TRUE(std::isnan(permuted.at(r * H + h))) << "padding row " << r << " written";
      }
    }
  }
}

TEST(PostPermuteReference, WeightsAndEmptyTokens) {
  const int H = 8;
  HostTensor y(DType::kF32, {3, H});
  for (int64_t i = 0; i < y.numel(); ++i) y.set(i, 1.0 + (i / H) * 10 + i % H);
  HostTensor w(DType::kF32, {3, 2});
  const double wv[] = {0.5, 9, 1, 2, 3, 4};
  for (int i = 0; i < 6; ++i) w.set(i, wv[i]);
  HostTensor inv = i32_tensor({6}, {2, -1, 0, 1, -1, 7});  // 7 >= P: skipped
  HostTensor out(DType::kF32, {3, H});
  PostPermuteArgs a;
  a.expert_output = y.view();
  a.topk_weights = w.view();
  a.inverse_indices = inv.view();
  a.out = out.view();
  reference::moe_post_permute(a);
  for (int h = 0; h < H; ++h) {
    EXPECT_DOUBLE_EQ(out.at(h), 0.5 * y.at(2 * H + h));
    EXPECT_DOUBLE_EQ(out.at(H + h), y.at(h) + 2 * y.at(H + h));
    EXPECT_EQ(out.at(2 * H + h), 0.0);
  }
}

// ---------------------------------------------------------------- CPU: validation

// The small post-permute kernel's token index: n / d as a multiply-high, exact for
// every n < 2^31 (all n for small d; around every multiple of d and at the ends for
// large d), and the shapes that take that kernel.
TEST(PostPermuteDivisor, ExactBelow2To31) {
  std::mt19937_64 rng(7);
  auto check = [](uint32_t n, int d, detail::PostPermuteDivisor dv) {
    ASSERT_EQ(detail::post_permute_divide(n, dv), n / static_cast<uint32_t>(d))
        << "n=" << n << " d=" << d;
  };
  std::vector<int> divisors;
  for (int d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (int d : {2047, 2048, 2049, 65535, 65536, 65537, 1 << 20, (1 << 28) - 1, 1 << 28, 1000003,
                INT32_MAX / 3, INT32_MAX - 1, INT32_MAX})
    divisors.push_back(d);
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<int>(rng() % INT32_MAX) + 1);
  for (int d : divisors) {
    const detail::PostPermuteDivisor dv = detail::post_permute_divisor(d);
    const uint32_t top = INT32_MAX;
    for (uint32_t n = 0; n < 4096; ++n) check(n, d, dv);
    for (uint32_t n = top - 4096; n < top; ++n) check(n, d, dv);
    check(top, d, dv);
    for (int i = 0; i < 2000; ++i) {  // both sides of multiples of d
      const uint64_t q = rng() % (uint64_t{top} / d + 1);
      for (int64_t delta : {-1, 0, 1}) {
        const int64_t n = static_cast<int64_t>(q) * d + delta;
        if (n >= 0 && n <= top) check(static_cast<uint32_t>(n), d, dv);
      }
      check(static_cast<uint32_t>(rng() % (uint64_t{top} + 1)), d, dv);
    }
  }
  for (uint32_t n = 0; n < (1u << 22); ++n) check(n, 7, detail::post_permute_divisor(7));
  detail::PostPermuteLaunch l;
  l.num_tokens = 32;
  l.hidden = 128;
  l.num_rows = 64;
  l.top_k = 2;
  EXPECT_TRUE(detail::post_permute_small_ok(l));
  l.top_k = 9;
  EXPECT_FALSE(detail::post_permute_small_ok(l));
  l.top_k = 8;
  l.num_rows = (int64_t{1} << 31) / 128;  // P*H = 2^31
  EXPECT_FALSE(detail::post_permute_small_ok(l));
  l.num_rows = 64;
  l.num_tokens = (int64_t{1} << 24);  // T*H = 2^31
  EXPECT_FALSE(detail::post_permute_small_ok(l));
}

// The launch decisions: up to 512 experts both ops run the kernels they ran before E > 512
// was taken (the one-launch kernel up to their route limits, no workspace; the 512-expert
// instances). Past 512: PermuteAlign takes the chunked kernels at every route count (a
// workspace); PrePermute keeps its route limit (its 1024-expert one-launch instance).
TEST(PermuteLimits, OneLaunchKernelsOnlyUpTo512Experts) {
  EXPECT_EQ(detail::kPermuteMaxExperts, 1024);
  for (int E : {1, 129, 257, 384, 512}) {
    EXPECT_TRUE(detail::align_one_launch(1, E));
    EXPECT_TRUE(detail::align_one_launch(detail::kAlignFusedMaxRoutes, E));
    EXPECT_FALSE(detail::align_one_launch(detail::kAlignFusedMaxRoutes + 1, E));
    EXPECT_TRUE(detail::pre_permute_one_launch(1, E));
    EXPECT_TRUE(detail::pre_permute_one_launch(detail::kPrePermuteFusedMaxRoutes, E));
    EXPECT_FALSE(detail::pre_permute_one_launch(detail::kPrePermuteFusedMaxRoutes + 1, E));
    EXPECT_EQ(detail::chunk_experts_cap(E), 512);
  }
  for (int E : {513, 777, 1023, 1024}) {
    EXPECT_FALSE(detail::align_one_launch(0, E));
    EXPECT_FALSE(detail::align_one_launch(1, E));
    EXPECT_TRUE(detail::pre_permute_one_launch(1, E));
    EXPECT_TRUE(detail::pre_permute_one_launch(detail::kPrePermuteFusedMaxRoutes, E));
    EXPECT_FALSE(detail::pre_permute_one_launch(detail::kPrePermuteFusedMaxRoutes + 1, E));
    EXPECT_EQ(detail::chunk_experts_cap(E), 1024);
  }
  // The workspace queries follow: none at E = 512 and T*K = 8; PermuteAlign's chunked
  // scratch at 513; none for PrePermute up to 4096 routes.
  std::vector<int32_t> ids(8);
  for (int E : {512, 513, 1024}) {
    SCOPED_TRACE(E);
    PermuteAlignArgs a;
    a.topk_ids = make_view(ids.data(), DType::kI32, {1, 8});
    a.num_experts = E;
    a.block_size = 16;
    const size_t want = E <= 512 ? 0 : detail::route_chunk_workspace_bytes(8, E);
    EXPECT_EQ(permute_align_workspace_size(a), want);
    PrePermuteArgs p;
    p.local_expert_ids = a.topk_ids;
    p.num_local_experts = E;
    EXPECT_EQ(pre_permute_workspace_size(p), 0u);
  }
}

TEST(PermuteAlignValidation, RejectsBadInput) {
  const int64_t T = 4, K = 2;
  const int E = 8, bs = 16;
  std::vector<int32_t> ids(T * K), sorted(permute_align_sorted_size(T * K, E, bs)),
      eids(permute_align_num_blocks(T * K, E, bs)), npp(1);
  auto args = [&] {
    PermuteAlignArgs a;
    a.topk_ids = make_view(ids.data(), DType::kI32, {T, K});
    a.num_experts = E;
    a.block_size = bs;
    a.sorted_token_ids = make_view(sorted.data(), DType::kI32, {int64_t(sorted.size())});
    a.expert_ids = make_view(eids.data(), DType::kI32, {int64_t(eids.size())});
    a.num_tokens_post_padded = make_view(npp.data(), DType::kI32, {1});
    return a;
  };
  auto bad = [&](PermuteAlignArgs a, const char* arg) {
    expect_error([&] { moe_permute_align(a, nullptr); }, arg);
  };
  expect_valid_without_gpu("moe_permute_align", [&] { moe_permute_align(args(), nullptr); });
  PermuteAlignArgs a = args();
  a.topk_ids.dtype = DType::kF32;
  bad(a, "topk_ids");
  a = args();
  a.topk_ids = make_view(ids.data(), DType::kI32, {T * K});
  bad(a, "topk_ids");
  for (int b : {0, 8, 48, 512, -16}) {
    a = args();
    a.block_size = b;
    bad(a, "block_size");
  }
  for (int e : {0, -1, 1025}) {
    a = args();
    a.num_experts = e;
    bad(a, "num_experts");
  }
  a = args();
  a.sorted_token_ids.shape[0] -= 1;
  bad(a, "sorted_token_ids");
  a = args();
  a.expert_ids.shape[0] += 1;
  bad(a, "expert_ids");
  a = args();
  a.num_tokens_post_padded.dtype = DType::kF32;
  bad(a, "num_tokens_post_padded");
  a = args();
  a.sorted_token_ids.data = nullptr;
  bad(a, "sorted_token_ids");
  a = args();
  a.num_tokens_post_padded = TensorView{};
  bad(a, "num_tokens_post_padded");

  // Large T*K takes the multi-block path, which needs a workspace.
  const int64_t bigT = 40000;
  std::vector<int32_t> big_ids(bigT), big_sorted(permute_align_sorted_size(bigT, E, bs)),
      big_eids(permute_align_num_blocks(bigT, E, bs));
  a = args();
  a.topk_ids = make_view(big_ids.data(), DType::kI32, {bigT, 1});
  a.sorted_token_ids = make_view(big_sorted.data(), DType::kI32, {int64_t(big_sorted.size())});
  a.expert_ids = make_view(big_eids.data(), DType::kI32, {int64_t(big_eids.size())});
  EXPECT_GT(permute_align_workspace_size(a), 0u);
  bad(a, "workspace");
  a.workspace = Workspace{reinterpret_cast<void*>(256), 16};  // too small
  bad(a, "workspace");
  HostWorkspace align_ws(permute_align_workspace_size(a));  // with one, valid
  a.workspace = align_ws.get();
  expect_valid_without_gpu("moe_permute_align", [&] { moe_permute_align(a, nullptr); });
  EXPECT_EQ(permute_align_workspace_size(args()), 0u);

  // 2147483000 routes: below the i32 position limits, above the chunk-arithmetic one;
  // rejected before anything is read
  // (the views' memory is never touched, so a small buffer stands in for a huge one).
  a = args();
  a.topk_ids = make_view(ids.data(), DType::kI32, {268435375, 8});
  bad(a, "topk_ids");
}

TEST(PrePermuteValidation, RejectsBadInput) {
  const int64_t T = 4, K = 2, H = 16;
  const int E = 4, A = 4;
  alignas(16) static uint16_t x[T * H];
  alignas(16) static uint16_t perm[(T * K + E * (A - 1)) * H];
  std::vector<int32_t> ids(T * K), meta(E), inv(T * K);
  auto args = [&] {
    PrePermuteArgs a;
    a.hidden_states = make_view(x, DType::kBF16, {T, H});
    a.local_expert_ids = make_view(ids.data(), DType::kI32, {T, K});
    a.num_local_experts = E;
    a.layout = PermutedLayout::contiguous(A);
    a.permuted = make_view(perm, DType::kBF16, {permuted_rows(T, K, E, A), H});
    a.layout_metadata = make_view(meta.data(), DType::kI32, {E});
    a.inverse_indices = make_view(inv.data(), DType::kI32, {T * K});
    return a;
  };
  auto bad = [&](PrePermuteArgs a, const char* arg) {
    expect_error([&] { moe_pre_permute(a, nullptr); }, arg);
  };
  expect_valid_without_gpu("moe_pre_permute", [&] { moe_pre_permute(args(), nullptr); });
  PrePermuteArgs a = args();
  a.hidden_states.dtype = DType::kI32;
  bad(a, "hidden_states");
  a = args();  // more routes than the i32 chunk arithmetic holds (memory never touched)
  a.hidden_states = make_view(x, DType::kBF16, {268435375, H});
  a.local_expert_ids = make_view(ids.data(), DType::kI32, {268435375, 8});
  bad(a, "local_expert_ids");
  a = args();
  a.permuted.dtype = DType::kF16;  // must match hidden_states
  bad(a, "permuted");
  a = args();
  a.hidden_states = make_view(x, DType::kBF16, {T * 4, 4});  // H not a multiple of 8
  bad(a, "hidden_states");
  a = args();
  a.hidden_states.data = reinterpret_cast<char*>(x) + 2;  // not 16-byte aligned
  bad(a, "hidden_states");
  a = args();
  a.local_expert_ids = make_view(ids.data(), DType::kI32, {T - 1, K});
  bad(a, "local_expert_ids");
  a = args();
  a.local_expert_ids.dtype = DType::kF32;
  bad(a, "local_expert_ids");
  for (int e : {0, 1025}) {
    a = args();
    a.num_local_experts = e;
    bad(a, "num_local_experts");
  }
  a = args();
  a.layout = PermutedLayout::masked(8);
  bad(a, "layout");
  a = args();
  a.layout = PermutedLayout::contiguous(0);
  bad(a, "layout.alignment");
  a = args();
  a.layout = PermutedLayout::contiguous(2);  // P shrinks: permuted has the wrong row count
  bad(a, "permuted");
  a = args();
  a.layout_metadata = make_view(meta.data(), DType::kI32, {E + 1});
  bad(a, "layout_metadata");
  a = args();
  a.inverse_indices = make_view(inv.data(), DType::kI32, {T, K});
  bad(a, "inverse_indices");
  a = args();
  a.permuted.data = nullptr;
  bad(a, "permuted");

  const int64_t bigT = 5000;  // > 4096 routes: the multi-kernel path needs a workspace
  std::vector<int32_t> big_ids(bigT), big_inv(bigT);
  std::vector<uint16_t> big_x(bigT * H + 8), big_perm((bigT + E * (A - 1)) * H + 8);
  auto align16 = [](uint16_t* p) {
    return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(p) + 15) / 16 * 16);
  };
  a = args();
  a.hidden_states = make_view(align16(big_x.data()), DType::kBF16, {bigT, H});
  a.local_expert_ids = make_view(big_ids.data(), DType::kI32, {bigT, 1});
  a.permuted = make_view(align16(big_perm.data()), DType::kBF16, {permuted_rows(bigT, 1, E, A), H});
  a.inverse_indices = make_view(big_inv.data(), DType::kI32, {bigT});
  EXPECT_GT(pre_permute_workspace_size(a), 0u);
  bad(a, "workspace");
  HostWorkspace pre_ws(pre_permute_workspace_size(a));  // with one, valid
  a.workspace = pre_ws.get();
  expect_valid_without_gpu("moe_pre_permute", [&] { moe_pre_permute(a, nullptr); });
}

TEST(PostPermuteValidation, RejectsBadInput) {
  const int64_t T = 4, K = 2, H = 16, P = 8;
  alignas(16) static uint16_t y[P * H];
  alignas(16) static float out[T * H];
  std::vector<float> w(T * K);
  std::vector<int32_t> inv(T * K);
  auto args = [&] {
    PostPermuteArgs a;
    a.expert_output = make_view(y, DType::kBF16, {P, H});
    a.topk_weights = make_view(w.data(), DType::kF32, {T, K});
    a.inverse_indices = make_view(inv.data(), DType::kI32, {T * K});
    a.out = make_view(out, DType::kF32, {T, H});
    return a;
  };
  auto bad = [&](PostPermuteArgs a, const char* arg) {
    expect_error([&] { moe_post_permute(a, nullptr); }, arg);
  };
  expect_valid_without_gpu("moe_post_permute", [&] { moe_post_permute(args(), nullptr); });
  PostPermuteArgs a = args();
  a.expert_output.dtype = DType::kFP8E4M3;
  bad(a, "expert_output");
  a = args();
  a.out.dtype = DType::kF16;  // neither bf16 (the input's) nor f32
  bad(a, "out");
  a = args();
  a.out = make_view(out, DType::kF32, {T, H / 2});
  bad(a, "out");
  a = args();
  a.expert_output = make_view(y, DType::kBF16, {P * 4, 4});
  bad(a, "expert_output");
  a = args();
  a.topk_weights.dtype = DType::kBF16;
  bad(a, "topk_weights");
  a = args();
  a.inverse_indices = make_view(inv.data(), DType::kI32, {T * K - 1});
  bad(a, "inverse_indices");
  a = args();
  a.out.data = reinterpret_cast<char*>(out) + 4;
  bad(a, "out");
  a = args();
  a.inverse_indices.data = nullptr;
  bad(a, "inverse_indices");
}

// ---------------------------------------------------------------- GPU helpers

enum class IdMode {
  kUniform,     // ids in [0, E)
  kMixed,       // ids in [-3, E + 3), plus INT_MIN / INT_MAX: -1 and out-of-range dropped
  kOneExpert,   // every route on one expert
  kDuplicates,  // ids in {0, 1, 2}: most rows repeat an id
  kNoneLocal,   // every route -1 or >= E
};

HostTensor random_ids(int64_t T, int64_t K, int E, IdMode mode, std::mt19937_64& rng) {
  HostTensor ids(DType::kI32, {T, K});
  int32_t* p = ids.as<int32_t>();
  std::uniform_int_distribution<int> uni(0, E - 1), mixed(-3, E + 2), small(0, std::min(2, E - 1)),
      coin(0, 99);
  const int one = uni(rng);
  for (int64_t i = 0; i < T * K; ++i) {
    switch (mode) {
      case IdMode::kUniform:
        p[i] = uni(rng);
        break;
      case IdMode::kMixed: {
        const int c = coin(rng);
        p[i] = c == 0 ? INT_MIN : c == 1 ? INT_MAX : mixed(rng);
        break;
      }
      case IdMode::kOneExpert:
        p[i] = one;
        break;
      case IdMode::kDuplicates:
        p[i] = small(rng);
        break;
      case IdMode::kNoneLocal:
        p[i] = coin(rng) < 50 ? -1 : E + coin(rng);
        break;
    }
  }
  return ids;
}

const char* mode_name(IdMode m) {
  switch (m) {
    case IdMode::kUniform:
      return "uniform";
    case IdMode::kMixed:
      return "mixed";
    case IdMode::kOneExpert:
      return "one-expert";
    case IdMode::kDuplicates:
      return "duplicates";
    case IdMode::kNoneLocal:
      return "none-local";
  }
  return "?";
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

int64_t first_diff(const HostTensor& a, const HostTensor& b) {
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.as<int32_t>()[i] != b.as<int32_t>()[i]) return i;
  return -1;
}

// ---------------------------------------------------------------- GPU: PermuteAlign

struct AlignCase {
  int64_t T, K;
  int E, bs;
  IdMode mode;
};

struct AlignBuffers {
  testing::DeviceTensor ids, sorted, eids, npp;
  testing::DeviceWorkspace ws;
  PermuteAlignArgs args;
  AlignBuffers(const HostTensor& h_ids, int E, int bs, size_t ws_bytes)
      : ids(h_ids),
        sorted(DType::kI32, {permute_align_sorted_size(h_ids.numel(), E, bs)}, 0x5A),
        eids(DType::kI32, {permute_align_num_blocks(h_ids.numel(), E, bs)}, 0x5A),
        npp(DType::kI32, {1}, 0x5A),
        ws(ws_bytes) {
    args.topk_ids = ids.view();
    args.num_experts = E;
    args.block_size = bs;
    args.sorted_token_ids = sorted.view();
    args.expert_ids = eids.view();
    args.num_tokens_post_padded = npp.view();
    args.workspace = ws.get();
  }
};

size_t align_ws_bytes(const HostTensor& ids, int E, int bs) {
  PermuteAlignArgs q;
  q.topk_ids = ids.view();
  q.num_experts = E;
  q.block_size = bs;
  return permute_align_workspace_size(q);
}

void check_align_case(const AlignCase& c, uint64_t seed) {
  SCOPED_TRACE("T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + " E=" +
               std::to_string(c.E) + " bs=" + std::to_string(c.bs) + " " + mode_name(c.mode));
  std::mt19937_64 rng(seed);
  HostTensor ids = random_ids(c.T, c.K, c.E, c.mode, rng);
  const int64_t S = permute_align_sorted_size(c.T * c.K, c.E, c.bs);
  const int64_t NB = permute_align_num_blocks(c.T * c.K, c.E, c.bs);
  HostTensor r_sorted(DType::kI32, {S}), r_eids(DType::kI32, {NB}), r_npp(DType::kI32, {1});
  PermuteAlignArgs r;
  r.topk_ids = ids.view();
  r.num_experts = c.E;
  r.block_size = c.bs;
  r.sorted_token_ids = r_sorted.view();
  r.expert_ids = r_eids.view();
  r.num_tokens_post_padded = r_npp.view();
  reference::moe_permute_align(r);

  AlignBuffers d(ids, c.E, c.bs, align_ws_bytes(ids, c.E, c.bs));
  moe_permute_align(d.args, nullptr);
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  HostTensor sorted = d.sorted.download(), eids = d.eids.download(), npp = d.npp.download();
  EXPECT_EQ(npp.as<int32_t>()[0], r_npp.as<int32_t>()[0]);
  EXPECT_TRUE(same_bytes(sorted, r_sorted))
      << "sorted_token_ids differ first at " << first_diff(sorted, r_sorted);
  EXPECT_TRUE(same_bytes(eids, r_eids))
      << "expert_ids differ first at " << first_diff(eids, r_eids);
  // Deterministic: a second run into freshly poisoned outputs gives the same bytes.
  MOEKIT_CUDA_OK(cudaMemset(d.sorted.data(), 0x5A, sorted.nbytes()));
  MOEKIT_CUDA_OK(cudaMemset(d.eids.data(), 0x5A, eids.nbytes()));
  MOEKIT_CUDA_OK(cudaMemset(d.npp.data(), 0x5A, npp.nbytes()));
  moe_permute_align(d.args, nullptr);
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_bytes(d.sorted.download(), sorted));
  EXPECT_TRUE(same_bytes(d.eids.download(), eids));
  EXPECT_TRUE(same_bytes(d.npp.download(), npp));
}

// ---------------------------------------------------------------- GPU: PrePermute

struct PreCase {
  DType dtype;
  int64_t T, K;
  int E, A;
  int64_t H;
  IdMode mode;
};

struct PreBuffers {
  testing::DeviceTensor x, ids, permuted, meta, inv;
  testing::DeviceWorkspace ws;
  PrePermuteArgs args;
  static size_t ws_bytes(const HostTensor& ids, int E) {
    PrePermuteArgs q;
    q.local_expert_ids = ids.view();
    q.num_local_experts = E;
    return pre_permute_workspace_size(q);
  }
  PreBuffers(const HostTensor& h_x, const HostTensor& h_ids, int E, int A, uint8_t poison)
      : x(h_x),
        ids(h_ids),
        permuted(h_x.dtype(),
                 {permuted_rows(h_ids.shape()[0], int(h_ids.shape()[1]), E, A), h_x.shape()[1]},
                 poison),
        meta(DType::kI32, {E}, 0x5A),
        inv(DType::kI32, {h_ids.numel()}, 0x5A),
        ws(ws_bytes(h_ids, E)) {
    args.hidden_states = x.view();
    args.local_expert_ids = ids.view();
    args.num_local_experts = E;
    args.layout = PermutedLayout::contiguous(A);
    args.permuted = permuted.view();
    args.layout_metadata = meta.view();
    args.inverse_indices = inv.view();
    args.workspace = ws.get();
  }
};

void check_pre_case(const PreCase& c, uint64_t seed) {
  SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " T=" + std::to_string(c.T) +
               " K=" + std::to_string(c.K) + " E=" + std::to_string(c.E) +
               " A=" + std::to_string(c.A) + " H=" + std::to_string(c.H) + " " + mode_name(c.mode));
  std::mt19937_64 rng(seed);
  HostTensor x(c.dtype, {c.T, c.H});
  x.fill_normal(rng);
  HostTensor ids = random_ids(c.T, c.K, c.E, c.mode, rng);
  const uint8_t poison = 0xA5;
  const int64_t P = permuted_rows(c.T, int(c.K), c.E, c.A);
  HostTensor r_perm(c.dtype, {P, c.H}), r_meta(DType::kI32, {c.E}), r_inv(DType::kI32, {c.T * c.K});
  r_perm.fill_bytes(poison);  // the reference leaves padding rows as they were
  PrePermuteArgs r;
  r.hidden_states = x.view();
  r.local_expert_ids = ids.view();
  r.num_local_experts = c.E;
  r.layout = PermutedLayout::contiguous(c.A);
  r.permuted = r_perm.view();
  r.layout_metadata = r_meta.view();
  r.inverse_indices = r_inv.view();
  reference::moe_pre_permute(r);

  PreBuffers d(x, ids, c.E, c.A, poison);
  moe_pre_permute(d.args, nullptr);
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  HostTensor perm = d.permuted.download(), meta = d.meta.download(), inv = d.inv.download();
  EXPECT_TRUE(same_bytes(meta, r_meta))
      << "layout_metadata differ first at " << first_diff(meta, r_meta);
  EXPECT_TRUE(same_bytes(inv, r_inv))
      << "inverse_indices differ first at " << first_diff(inv, r_inv);
  // Data rows equal bit for bit; padding rows still hold the poison.
  if (!same_bytes(perm, r_perm)) {
    const size_t row = c.H * dtype_size(c.dtype);
    int64_t bad_row = -1;
    for (int64_t i = 0; i < P && bad_row < 0; ++i)
      if (std::memcmp(static_cast<const uint8_t*>(perm.data()) + i * row,
                      static_cast<const uint8_t*>(r_perm.data()) + i * row, row) != 0)
        bad_row = i;
    ADD_FAILURE() << "permuted differs first at row " << bad_row;
  }
  // The same ids as int64 (an engine's topk_ids): the same bytes.
  HostTensor ids64(DType::kI64, ids.shape());
  for (int64_t i = 0; i < ids.numel(); ++i) ids64.as<int64_t>()[i] = ids.as<int32_t>()[i];
  PreBuffers d64(x, ids64, c.E, c.A, poison);
  moe_pre_permute(d64.args, nullptr);
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_bytes(d64.permuted.download(), perm)) << "int64 ids: permuted differs";
  EXPECT_TRUE(same_bytes(d64.meta.download(), meta)) << "int64 ids: layout_metadata differs";
  EXPECT_TRUE(same_bytes(d64.inv.download(), inv)) << "int64 ids: inverse_indices differs";
}

// ---------------------------------------------------------------- GPU: PostPermute

struct PostCase {
  DType in, out;
  int64_t T, K, P, H;
  bool holes;  // -1, out-of-range and all-dropped tokens among the inverse indices
};

void check_post_case(const PostCase& c, uint64_t seed) {
  SCOPED_TRACE(std::string(dtype_name(c.in)) + "/" + dtype_name(c.out) + " T=" +
               std::to_string(c.T) + " K=" + std::to_string(c.K) + " P=" + std::to_string(c.P) +
               " H=" + std::to_string(c.H) + (c.holes ? " holes" : ""));
  std::mt19937_64 rng(seed);
  HostTensor y(c.in, {c.P, c.H}), w(DType::kF32, {c.T, c.K}), inv(DType::kI32, {c.T * c.K});
  y.fill_normal(rng);
  w.fill_normal(rng, 0.5);
  std::vector<int32_t> rows(std::max<int64_t>(c.P, 1));
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  std::uniform_int_distribution<int> coin(0, 19);
  std::uniform_int_distribution<int64_t> any_row(0, std::max<int64_t>(c.P - 1, 0));
  for (int64_t i = 0; i < c.T * c.K; ++i) {
    int32_t v = c.P > 0 ? (i < c.P ? rows[i] : static_cast<int32_t>(any_row(rng))) : -1;
    if (c.holes) {
      const int f = coin(rng);
      if (f == 0) v = -1;
      if (f == 1) v = static_cast<int32_t>(c.P + coin(rng));  // past the buffer
      if (f == 2) v = -7;
    }
    inv.as<int32_t>()[i] = v;
  }
  if (c.holes && c.T > 2) {  // tokens 1 and T-1 have no route at all
    for (int64_t k = 0; k < c.K; ++k) {
      inv.as<int32_t>()[1 * c.K + k] = -1;
      inv.as<int32_t>()[(c.T - 1) * c.K + k] = int32_t(c.P + k);
    }
  }
  HostTensor ref(c.out, {c.T, c.H});
  PostPermuteArgs r;
  r.expert_output = y.view();
  r.topk_weights = w.view();
  r.inverse_indices = inv.view();
  r.out = ref.view();
  reference::moe_post_permute(r);

  testing::DeviceTensor dy(y), dw(w), dinv(inv), dout(c.out, {c.T, c.H}, 0xFF);  // NaN poison
  PostPermuteArgs a;
  a.expert_output = dy.view();
  a.topk_weights = dw.view();
  a.inverse_indices = dinv.view();
  a.out = dout.view();
  moe_post_permute(a, nullptr);
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  HostTensor out = dout.download();
  const Tolerance tol = tolerance_for(c.out);
  const Accuracy acc = compare(out.view(), ref.view(), tol);
  EXPECT_TRUE(acc.pass(tol)) << acc.str() << " nonfinite=" << acc.nonfinite;
  if (c.holes && c.T > 2) {
    for (int64_t h = 0; h < c.H; ++h) {
      EXPECT_EQ(out.at(1 * c.H + h), 0.0);
      EXPECT_EQ(out.at((c.T - 1) * c.H + h), 0.0);
    }
  }
  MOEKIT_CUDA_OK(cudaMemset(dout.data(), 0xFF, out.nbytes()));  // a fresh poison for the rerun
  moe_post_permute(a, nullptr);
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_bytes(dout.download(), out));
}

// ---------------------------------------------------------------- GPU: graphs and timing

// Captures `launch` kReps times into a CUDA graph; returns the per-call device time.
double graph_time_us(cudaStream_t s, const std::function<void()>& launch) {
  constexpr int kReps = 50;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  // The timing tests print their times; what they check is that every launch captures and
  // replays (a failure here fails the test).
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) != cudaSuccess) {
    ADD_FAILURE() << "cudaStreamBeginCapture failed";
    return -1;
  }
  for (int i = 0; i < kReps; ++i) launch();
  if (cudaStreamEndCapture(s, &graph) != cudaSuccess) {
    ADD_FAILURE() << "the launches did not capture into a graph";
    return -1;
  }
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    ADD_FAILURE() << "cudaGraphInstantiate failed";
    cudaGraphDestroy(graph);
    return -1;
  }
  cudaGraphLaunch(exec, s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, s);
  for (int i = 0; i < 5; ++i) cudaGraphLaunch(exec, s);
  cudaEventRecord(e1, s);
  EXPECT_EQ(cudaEventSynchronize(e1), cudaSuccess) << "the graph's replays failed";
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1000.0 * ms / (5 * kReps);
}

// The ops are graph-capturable on every path (this runs first, so the one-time
// shared-memory opt-ins also happen under capture), and a replay equals eager runs.
TEST(PermuteGpu, GraphCaptureMatchesEager) {
  MOEKIT_REQUIRE_GPU();
  cudaStream_t s;
  MOEKIT_CUDA_OK(cudaStreamCreate(&s));
  std::mt19937_64 rng(41);
  for (int64_t T : {512, 65536}) {  // single-block / multi-block align
    SCOPED_TRACE("align T=" + std::to_string(T));
    HostTensor ids = random_ids(T, 8, 256, IdMode::kMixed, rng);
    AlignBuffers d(ids, 256, 64, align_ws_bytes(ids, 256, 64));
    EXPECT_GT(graph_time_us(s, [&] { moe_permute_align(d.args, s); }), 0);
    MOEKIT_CUDA_OK(cudaStreamSynchronize(s));
    HostTensor g_sorted = d.sorted.download();
    moe_permute_align(d.args, s);
    MOEKIT_CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(same_bytes(d.sorted.download(), g_sorted));
  }
  for (int64_t T : {100, 5000}) {  // fused / multi-kernel pre-permute
    SCOPED_TRACE("pre_permute T=" + std::to_string(T));
    HostTensor x(DType::kBF16, {T, 256});
    x.fill_normal(rng);
    HostTensor ids = random_ids(T, 8, 32, IdMode::kMixed, rng);
    PreBuffers d(x, ids, 32, 8, 0);
    EXPECT_GT(graph_time_us(s, [&] { moe_pre_permute(d.args, s); }), 0);
    MOEKIT_CUDA_OK(cudaStreamSynchronize(s));
    HostTensor g_perm = d.permuted.download(), g_inv = d.inv.download();
    moe_pre_permute(d.args, s);
    MOEKIT_CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(same_bytes(d.permuted.download(), g_perm));
    EXPECT_TRUE(same_bytes(d.inv.download(), g_inv));
  }
  MOEKIT_CUDA_OK(cudaStreamDestroy(s));
}

// Small shapes only: quick, and small enough for compute-sanitizer runs.
TEST(PermuteAlignGpu, SmallShapes) {
  MOEKIT_REQUIRE_GPU();
  check_align_case({1, 8, 384, 64, IdMode::kUniform}, 91);
  check_align_case({3, 2, 4, 16, IdMode::kMixed}, 92);
  check_align_case({33, 8, 128, 64, IdMode::kDuplicates}, 93);
  check_align_case({300, 8, 512, 16, IdMode::kMixed}, 94);
  check_align_case({129, 8, 256, 256, IdMode::kOneExpert}, 95);
}

TEST(PermuteAlignGpu, MatchesReference) {
  MOEKIT_REQUIRE_GPU();
  const std::vector<AlignCase> cases = {
      {0, 8, 256, 64, IdMode::kUniform},       {1, 8, 384, 64, IdMode::kUniform},
      {1, 1, 1, 16, IdMode::kUniform},         {3, 2, 4, 16, IdMode::kMixed},
      {32, 8, 128, 64, IdMode::kUniform},      {33, 8, 128, 64, IdMode::kDuplicates},
      {513, 6, 160, 32, IdMode::kMixed},       {77, 16, 512, 256, IdMode::kOneExpert},
      {99, 4, 64, 128, IdMode::kNoneLocal},    {4096, 8, 256, 64, IdMode::kUniform},
      {4096, 8, 384, 64, IdMode::kMixed},      {4097, 8, 512, 256, IdMode::kDuplicates},
      {32768, 1, 64, 16, IdMode::kUniform},    {4097, 16, 512, 16, IdMode::kMixed},
      {65536, 8, 256, 64, IdMode::kUniform},   {65536, 8, 384, 64, IdMode::kOneExpert},
      {65536, 16, 512, 16, IdMode::kMixed},    {50001, 3, 7, 32, IdMode::kNoneLocal},
      {40000, 1, 2, 256, IdMode::kDuplicates}, {32768, 1, 512, 16, IdMode::kMixed},
      {32769, 1, 512, 16, IdMode::kMixed},  // the first multi-kernel shape
  };
  uint64_t seed = 11;
  for (const AlignCase& c : cases) check_align_case(c, seed++);
}

// The one-launch path at its limits (T*K up to kAlignFusedMaxRoutes) and its count's
// 1 / 4 / 16 loads per thread (T*K <= 1024, <= 4096, more).
TEST(PermuteAlignGpu, FusedPathEdges) {
  MOEKIT_REQUIRE_GPU();
  const std::vector<AlignCase> cases = {
      {2048, 16, 512, 16, IdMode::kMixed},     {2048, 16, 512, 256, IdMode::kUniform},
      {4096, 8, 384, 64, IdMode::kDuplicates}, {4095, 8, 128, 64, IdMode::kOneExpert},
      {7, 16, 512, 256, IdMode::kNoneLocal},   {1, 1, 512, 16, IdMode::kMixed},
      {31, 3, 5, 32, IdMode::kMixed},          {511, 8, 256, 64, IdMode::kUniform},
      {32, 8, 384, 64, IdMode::kUniform},      {512, 8, 128, 64, IdMode::kUniform},
      {1024, 1, 300, 32, IdMode::kMixed},      {1025, 1, 300, 32, IdMode::kUniform},
      {4096, 1, 64, 16, IdMode::kDuplicates},  {4097, 1, 64, 16, IdMode::kDuplicates},
      {4096, 8, 512, 256, IdMode::kUniform},
  };
  uint64_t seed = 600;
  for (const AlignCase& c : cases) check_align_case(c, seed++);
}

// Odd expert counts and counts past 512 (PermuteAlign: the chunked kernels at every route
// count past 512 experts; PrePermute: the 1024-expert instances of its one-launch kernel
// up to 4096 routes and of the chunked count / scan above; E <= 512 as before):
// T = 1, 7, 64, 4096 with every id pattern (-1 and out-of-range ids, duplicates, empty
// experts, every route on one expert, no local route), and multi-chunk sizes.
std::vector<AlignCase> many_experts_align_cases() {
  const IdMode modes[] = {IdMode::kUniform, IdMode::kMixed, IdMode::kDuplicates, IdMode::kOneExpert,
                          IdMode::kNoneLocal};
  std::vector<AlignCase> cases;
  int i = 0;
  for (int E : {129, 257, 513, 1024}) {
    for (int64_t T : {1, 7, 64, 4096}) {
      for (IdMode m : modes) cases.push_back({T, 8, E, 16 << (i++ % 5), m});
    }
  }
  cases.push_back({40000, 1, 1024, 16, IdMode::kMixed});  // 5 chunks
  cases.push_back({65536, 8, 513, 64, IdMode::kUniform});
  cases.push_back({32769, 1, 1023, 256, IdMode::kDuplicates});
  return cases;
}

TEST(PermuteAlignGpu, ManyAndOddExperts) {
  MOEKIT_REQUIRE_GPU();
  uint64_t seed = 700;
  for (const AlignCase& c : many_experts_align_cases()) check_align_case(c, seed++);
}

TEST(PrePermuteGpu, ManyAndOddExperts) {
  MOEKIT_REQUIRE_GPU();
  const DType dts[] = {DType::kBF16, DType::kF16, DType::kF32};
  const int aligns[] = {1, 8, 16, 128, 3};
  uint64_t seed = 900;
  int i = 0;
  for (const AlignCase& a : many_experts_align_cases()) {
    const PreCase c{dts[i % 3], a.T, a.K, a.E, aligns[i % 5], 64, a.mode};
    ++i;
    check_pre_case(c, seed++);
  }
}

TEST(PrePermuteGpu, MatchesReference) {
  MOEKIT_REQUIRE_GPU();
  const std::vector<PreCase> cases = {
      {DType::kBF16, 0, 8, 32, 1, 128, IdMode::kUniform},
      {DType::kBF16, 1, 8, 16, 1, 2048, IdMode::kUniform},
      {DType::kF16, 32, 2, 4, 1, 128, IdMode::kUniform},
      {DType::kBF16, 512, 2, 4, 1, 128, IdMode::kMixed},
      {DType::kBF16, 100, 8, 32, 1, 7168, IdMode::kUniform},
      {DType::kF16, 100, 8, 32, 128, 7168, IdMode::kMixed},
      {DType::kBF16, 513, 2, 4, 8, 136, IdMode::kDuplicates},
      {DType::kF32, 77, 3, 7, 3, 24, IdMode::kMixed},  // alignment not a power of two
      {DType::kBF16, 61, 16, 512, 16, 8, IdMode::kUniform},
      {DType::kBF16, 45, 8, 16, 4, 64, IdMode::kOneExpert},
      {DType::kF16, 45, 8, 16, 4, 64, IdMode::kNoneLocal},
      {DType::kF16, 333, 8, 1, 1, 64, IdMode::kMixed},
      {DType::kBF16, 4096, 1, 8, 1, 64, IdMode::kUniform},  // last fused size
      {DType::kBF16, 4097, 1, 8, 1, 64, IdMode::kUniform},  // first multi-kernel size
      {DType::kBF16, 2000, 8, 64, 16, 256, IdMode::kMixed},
      {DType::kF32, 1999, 5, 3, 1, 16, IdMode::kDuplicates},
      {DType::kBF16, 3000, 8, 32, 128, 8, IdMode::kOneExpert},
      {DType::kBF16, 3000, 8, 32, 1, 8, IdMode::kNoneLocal},
      {DType::kBF16, 65536, 8, 256, 1, 8, IdMode::kMixed},
  };
  uint64_t seed = 21;
  for (const PreCase& c : cases) check_pre_case(c, seed++);
}

TEST(PostPermuteGpu, MatchesReference) {
  MOEKIT_REQUIRE_GPU();
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const std::vector<PostCase> cases = {
      {bf, bf, 32, 2, 64, 128, false},     {f16, f16, 32, 2, 64, 128, false},
      {bf, f32, 512, 2, 1024, 128, true},  {f16, f32, 512, 2, 1024, 128, true},
      {f32, f32, 7, 3, 30, 24, true},      {bf, bf, 100, 8, 800, 7168, false},
      {f16, f16, 100, 8, 800, 7168, true}, {bf, bf, 1, 8, 8, 2048, false},
      {bf, bf, 0, 8, 0, 128, false},       {bf, bf, 57, 5, 400, 40, true},
      {f16, f32, 33, 16, 600, 8, true},    {bf, bf, 20, 1, 20, 64, true},
      {bf, bf, 9, 4, 0, 64, true},  // P = 0: every route dropped
  };
  uint64_t seed = 31;
  for (const PostCase& c : cases) check_post_case(c, seed++);
}

// Both post-permute kernels give exactly the SPEC's f32 FMAs in k order, rounded once:
// the small one (<= 32768 threads, top_k <= 8: each compile-time bound 2, 4, 8) and the
// generic one (K = 9 / 16, or more threads), against a host emulation, bit for bit.
TEST(PostPermuteGpu, BothKernelsMatchF32FmaOrderBitForBit) {
  MOEKIT_REQUIRE_GPU();
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  struct C {
    DType in, out;
    int64_t T, K, P, H;
  };
  const std::vector<C> cases = {
      {bf, bf, 32, 2, 64, 128},      {f16, f32, 513, 1, 600, 136}, {bf, f32, 77, 3, 300, 24},
      {f16, f16, 45, 4, 200, 64},    {f32, f32, 19, 5, 100, 40},   {bf, bf, 100, 8, 800, 7168},
      {bf, bf, 1, 8, 8, 2048},       {f16, f16, 33, 6, 250, 8},    {bf, bf, 21, 7, 170, 2056},
      {bf, f32, 5, 9, 50, 64},       {f16, f16, 3, 16, 48, 16},    {bf, f32, 30, 8, 240, 1024},
      {bf, bf, 2, 8, 16, 1024},       // 256 threads: 64-thread blocks
      {f16, f16, 256, 8, 900, 1024},  // 32768 threads: the largest small-kernel grid
      {f16, f16, 257, 8, 900, 1024},  // one token more: the generic kernel
      {bf, f32, 3000, 2, 900, 128},   // 48000 threads: the generic kernel
  };
  std::mt19937_64 rng(4242);
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.in)) + "/" + dtype_name(c.out) + " T=" +
                 std::to_string(c.T) + " K=" + std::to_string(c.K) + " H=" + std::to_string(c.H));
    HostTensor y(c.in, {c.P, c.H}), w(DType::kF32, {c.T, c.K}), inv(DType::kI32, {c.T * c.K});
    y.fill_normal(rng);
    w.fill_normal(rng, 0.5);
    std::uniform_int_distribution<int64_t> any(-2, c.P + 1);  // a few dropped routes
    for (int64_t i = 0; i < c.T * c.K; ++i) inv.as<int32_t>()[i] = static_cast<int32_t>(any(rng));
    HostTensor want(c.out, {c.T, c.H});
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t h = 0; h < c.H; ++h) {
        float acc = 0.f;
        for (int64_t k = 0; k < c.K; ++k) {
          const int32_t r = inv.as<int32_t>()[t * c.K + k];
          if (r < 0 || r >= c.P) continue;
          acc = std::fmaf(w.as<float>()[t * c.K + k], static_cast<float>(y.at(r * c.H + h)), acc);
        }
        want.set(t * c.H + h, acc);
      }
    }
    testing::DeviceTensor dy(y), dw(w), dinv(inv), dout(c.out, {c.T, c.H}, 0xFF);
    PostPermuteArgs a;
    a.expert_output = dy.view();
    a.topk_weights = dw.view();
    a.inverse_indices = dinv.view();
    a.out = dout.view();
    moe_post_permute(a, nullptr);
    MOEKIT_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bytes(dout.download(), want));
  }
}

// Every rows-per-block size the fused pre-permute kernel takes (1 to 32 by T*K and H).
TEST(PermuteGpu, FusedPrePermuteRowsPerBlock) {
  MOEKIT_REQUIRE_GPU();
  check_pre_case({DType::kBF16, 100, 8, 32, 1, 7168, IdMode::kMixed}, 71);     // 2 rows
  check_pre_case({DType::kBF16, 513, 2, 4, 8, 136, IdMode::kDuplicates}, 81);  // 8 rows
  check_pre_case({DType::kBF16, 512, 8, 64, 1, 7168, IdMode::kMixed}, 82);     // 8 rows
  check_pre_case({DType::kBF16, 30, 8, 16, 1, 8, IdMode::kUniform}, 83);       // 32 rows
  check_pre_case({DType::kF32, 3, 1, 4, 1, 4096, IdMode::kUniform}, 84);       // 1 row
  check_pre_case({DType::kBF16, 1500, 1, 8, 1, 2048, IdMode::kMixed}, 85);     // 3 rows
}

TEST(PermuteGpu, TimingOfSeedShapes) {
  MOEKIT_REQUIRE_GPU();
  cudaStream_t s;
  MOEKIT_CUDA_OK(cudaStreamCreate(&s));
  std::mt19937_64 rng(51);
  for (int E : {384, 256, 128}) {
    for (int64_t T : {1, 32, 512, 4096}) {
      HostTensor ids = random_ids(T, 8, E, IdMode::kUniform, rng);
      AlignBuffers d(ids, E, 64, align_ws_bytes(ids, E, 64));
      printf("[timing] moe_permute_align E=%d T=%-5lld K=8 bs=64          %7.2f us/call\n", E,
             static_cast<long long>(T), graph_time_us(s, [&] { moe_permute_align(d.args, s); }));
    }
  }
  {
    HostTensor ids = random_ids(65536, 8, 256, IdMode::kUniform, rng);
    AlignBuffers d(ids, 256, 64, align_ws_bytes(ids, 256, 64));
    printf("[timing] moe_permute_align E=256 T=65536 K=8 bs=64 (multi)  %7.2f us/call\n",
           graph_time_us(s, [&] { moe_permute_align(d.args, s); }));
  }
  struct Shape {
    const char* name;
    int64_t T, K, H;
    int E;
  };
  const Shape shapes[] = {{"decode-t32", 32, 2, 128, 4},
                          {"prefill-t512", 512, 2, 128, 4},
                          {"ds-v3-ep8-t100", 100, 8, 7168, 32},
                          {"qwen3-30b-ep8-b1", 1, 8, 2048, 16}};
  for (const Shape& sh : shapes) {
    HostTensor x(DType::kBF16, {sh.T, sh.H});
    x.fill_normal(rng);
    HostTensor ids = random_ids(sh.T, sh.K, sh.E, IdMode::kUniform, rng);
    PreBuffers d(x, ids, sh.E, 1, 0);
    printf("[timing] moe_pre_permute  %-18s bf16       %7.2f us/call\n", sh.name,
           graph_time_us(s, [&] { moe_pre_permute(d.args, s); }));
    // Post-permute on the permuted buffer (P = T*K) with the inverse indices just made.
    moe_pre_permute(d.args, s);
    HostTensor w(DType::kF32, {sh.T, sh.K});
    w.fill_normal(rng);
    testing::DeviceTensor dw(w), out(DType::kBF16, {sh.T, sh.H});
    PostPermuteArgs a;
    a.expert_output = d.permuted.view();
    a.topk_weights = dw.view();
    a.inverse_indices = d.inv.view();
    a.out = out.view();
    printf("[timing] moe_post_permute %-18s bf16       %7.2f us/call\n", sh.name,
           graph_time_us(s, [&] { moe_post_permute(a, s); }));
  }
  MOEKIT_CUDA_OK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace moekit
