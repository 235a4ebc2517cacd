// MoEPrePermuteFwd and MoEPostPermuteFwd with NaN / Inf in the data (IEEE arithmetic, no
// check): the gather copies non-finite rows bit for bit (a NaN's sign and payload too); the
// combine gives NaN in every element of a token that has a valid route to a NaN row or with
// a NaN weight (0 * NaN included), non-finite elements where an Inf weight or an Inf element
// reaches it, and every other token the clean run's bytes (a NaN weight on a dropped route
// reaches nothing). Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moekit/permute.h"
#include "reference/host_tensor.h"
#include "support/gpu.h"
#include "support/nonfinite.h"

namespace moekit {
namespace {

using testing::DeviceTensor;
using testing::NonFinite;
using testing::Reach;

// [T, K] ids: K distinct experts per token, ~1/8 of them -1.
HostTensor draw_ids(std::mt19937_64& rng, int64_t T, int K, int E) {
  HostTensor ids(DType::kI32, {T, K});
  std::vector<int32_t> perm(static_cast<size_t>(E));
  std::uniform_int_distribution<int> eighth(0, 7);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < K; ++k) ids.as<int32_t>()[t * K + k] = eighth(rng) == 0 ? -1 : perm[k];
  }
  return ids;
}

const uint8_t* row_bytes(const HostTensor& t, int64_t row) {
  const int64_t width = t.shape().back() * static_cast<int64_t>(dtype_size(t.dtype()));
  return static_cast<const uint8_t*>(t.data()) + row * width;
}

struct PreOut {
  HostTensor permuted, meta, inv;
};

PreOut pre_permute(const HostTensor& x, const HostTensor& ids, int E, int A) {
  const int64_t T = x.shape()[0], H = x.shape()[1];
  const int K = static_cast<int>(ids.shape()[1]);
  DeviceTensor dx(x), dids(ids), perm(x.dtype(), {permuted_rows(T, K, E, A), H}, 0xA5),
      meta(DType::kI32, {E}, 0x5A), inv(DType::kI32, {T * K}, 0x5A);
  PrePermuteArgs a;
  a.hidden_states = dx.view();
  a.local_expert_ids = dids.view();
  a.num_local_experts = E;
  a.layout = PermutedLayout::contiguous(A);
  a.permuted = perm.view();
  a.layout_metadata = meta.view();
  a.inverse_indices = inv.view();
  testing::DeviceWorkspace ws(pre_permute_workspace_size(a));
  a.workspace = ws.get();
  moe_pre_permute(a, nullptr);
  const cudaError_t err = cudaDeviceSynchronize();
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  return {perm.download(), meta.download(), inv.download()};
}

TEST(PrePermuteNonFiniteGpu, CopiesNonFiniteRowsBitForBit) {
  MOEKIT_REQUIRE_GPU();
  const int64_t T = 300, H = 136;
  const int K = 4, E = 16, A = 8;
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dt));
    std::mt19937_64 rng(2810);
    HostTensor x(dt, {T, H});
    x.fill_normal(rng, 1.0);
    const HostTensor ids = draw_ids(rng, T, K, E);
    const PreOut clean = pre_permute(x, ids, E, A);
    // Every fifth token: all four non-finite kinds across its row.
    for (int64_t t = 2; t < T; t += 5)
      for (int64_t j = 0; j < H; ++j)
        testing::set_nonfinite(x, t * H + j, static_cast<NonFinite>((t + j) % 4));
    const PreOut dirty = pre_permute(x, ids, E, A);
    EXPECT_EQ(std::memcmp(dirty.meta.data(), clean.meta.data(), clean.meta.nbytes()), 0);
    EXPECT_EQ(std::memcmp(dirty.inv.data(), clean.inv.data(), clean.inv.nbytes()), 0);
    const size_t width = static_cast<size_t>(H) * dtype_size(dt);
    int64_t wrong = 0;
    for (int64_t r = 0; r < T * K; ++r) {
      const int32_t row = dirty.inv.as<int32_t>()[r];
      if (row < 0) continue;
      wrong += std::memcmp(row_bytes(dirty.permuted, row), row_bytes(x, r / K), width) != 0;
    }
    EXPECT_EQ(wrong, 0) << "permuted rows that are not their token's row, bit for bit";
  }
}

HostTensor post_permute(const HostTensor& y, const HostTensor& w, const HostTensor& inv,
                        DType out_dtype) {
  const int64_t T = w.shape()[0], H = y.shape()[1];
  DeviceTensor dy(y), dw(w), dinv(inv), out(out_dtype, {T, H}, 0x5A);
  PostPermuteArgs a;
  a.expert_output = dy.view();
  a.topk_weights = dw.view();
  a.inverse_indices = dinv.view();
  a.out = out.view();
  moe_post_permute(a, nullptr);
  const cudaError_t err = cudaDeviceSynchronize();
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  return out.download();
}

TEST(PostPermuteNonFiniteGpu, NanAndInfReachOnlyTheirTokens) {
  MOEKIT_REQUIRE_GPU();
  const int64_t T = 200, H = 136;
  struct Dtypes {
    DType in, out;
    int K;  // 4: the small kernel; 12: the generic one
  };
  for (const Dtypes& d :
       {Dtypes{DType::kBF16, DType::kBF16, 4}, Dtypes{DType::kF16, DType::kF32, 12},
        Dtypes{DType::kBF16, DType::kF32, 12}}) {
    SCOPED_TRACE(std::string(dtype_name(d.in)) + " -> " + dtype_name(d.out) +
                 " K=" + std::to_string(d.K));
    const int K = d.K;
    const int64_t P = T * K + 40;
    std::mt19937_64 rng(2820 + K);
    HostTensor y(d.in, {P, H}), w(DType::kF32, {T, K}), inv(DType::kI32, {T * K});
    y.fill_normal(rng, 1.0);
    std::uniform_real_distribution<double> weight(0.05, 1.0);
    for (int64_t i = 0; i < T * K; ++i) w.set(i, weight(rng));
    std::vector<int32_t> rows(static_cast<size_t>(P));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    for (int64_t r = 0; r < T * K; ++r) inv.as<int32_t>()[r] = r % 9 == 4 ? -1 : rows[r];
    const HostTensor clean = post_permute(y, w, inv, d.out);

    // What each token's output elements should hold.
    testing::ReachMap reach(T, H);
    std::vector<bool> inf_col_taken(static_cast<size_t>(T), false);
    std::uniform_int_distribution<int64_t> col(0, H - 1);
    for (int64_t r = 0; r < T * K; ++r) {
      const int64_t t = r / K, row = inv.as<int32_t>()[r];
      switch (r % 37) {
        case 3:  // the route's row all NaN (both signs)
          if (row < 0) break;
          for (int64_t j = 0; j < H; ++j)
            testing::set_nonfinite(y, row * H + j,
                                   j % 2 ? NonFinite::kNegativeNan : NonFinite::kNan);
          reach.mark_row(t, Reach::kNan);
          break;
        case 10:  // a NaN weight
          w.set(r, NAN);
          if (row >= 0) reach.mark_row(t, Reach::kNan);
          break;
        case 17:  // a zero weight on a NaN row: 0 * NaN is NaN
          if (row < 0) break;
          w.set(r, 0.0);
          for (int64_t j = 0; j < H; ++j) testing::set_nonfinite(y, row * H + j, NonFinite::kNan);
          reach.mark_row(t, Reach::kNan);
          break;
        case 24:  // an Inf weight
          w.set(r, INFINITY);
          if (row >= 0) reach.mark_row(t, Reach::kNonFinite);
          break;
        case 31:  // one +Inf element of the route's row: that one column
          if (row < 0 || inf_col_taken[t]) break;
          inf_col_taken[t] = true;
          {
            const int64_t j = col(rng);
            testing::set_nonfinite(y, row * H + j, NonFinite::kPosInf);
            reach.mark(t, j, Reach::kNonFinite);
          }
          break;
        default:
          break;
      }
    }
    // A NaN weight on every dropped route of the tokens nothing reaches: it must reach
    // nothing either.
    int64_t dropped_nan = 0;
    for (int64_t r = 0; r < T * K; ++r) {
      const int64_t t = r / K;
      bool untouched = true;
      for (int64_t j = 0; j < H && untouched; ++j) untouched = reach.at(t, j) == Reach::kNone;
      if (inv.as<int32_t>()[r] < 0 && untouched) {
        w.set(r, NAN);
        ++dropped_nan;
      }
    }
    ASSERT_GT(dropped_nan, 0);
    ASSERT_GT(reach.count(Reach::kNone), 0);
    ASSERT_GT(reach.count(Reach::kNonFinite), 0);
    ASSERT_GT(reach.count(Reach::kNan), 0);
    const HostTensor got = post_permute(y, w, inv, d.out);
    testing::expect_reach(got, clean, reach, "moe_post_permute");
  }
}

}  // namespace
}  // namespace moekit
