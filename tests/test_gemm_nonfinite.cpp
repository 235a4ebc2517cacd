// The bf16/f16 grouped GEMM with NaN / Inf in the activations and in one weight element of
// an expert (IEEE arithmetic, no check), on every candidate plan and the public op: a row of
// a holding a NaN gives a NaN output row; a row holding an Inf gives non-finite elements
// only; a NaN / Inf weight element of expert e reaches exactly the output columns it feeds
// (silu_and_mul: a gate or an up row feeds its one column), on e's rows only; every other
// element equals the clean run's bits. Contiguous rows with and without silu_and_mul, masked
// rows. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gemm/gemm_planner.h"
#include "moekit/gemm.h"
#include "reference/host_tensor.h"
#include "support/gpu.h"
#include "support/nonfinite.h"

namespace moekit {
namespace {

using testing::DeviceTensor;
using testing::NonFinite;
using testing::Reach;

struct Shape {
  const char* name;
  DType in, out;
  Activation act;
  detail::GemmRows rows;
  std::vector<int> counts;  // rows per group
  int alignment;            // contiguous
  int64_t max_m;            // masked
  int64_t n, k;
};

// The rows each group owns (-1: padding) and the layout metadata.
struct Rows {
  std::vector<int> group_of_row;
  HostTensor meta;
  int64_t total = 0;
};

Rows layout_rows(const Shape& s) {
  Rows r;
  const int G = static_cast<int>(s.counts.size());
  r.meta = HostTensor(DType::kI32, {G});
  if (s.rows == detail::GemmRows::kMasked) {
    r.total = G * s.max_m;
    r.group_of_row.assign(static_cast<size_t>(r.total), -1);
    for (int g = 0; g < G; ++g) {
      r.meta.as<int32_t>()[g] = s.counts[g];
      for (int i = 0; i < s.counts[g]; ++i) r.group_of_row[g * s.max_m + i] = g;
    }
    return r;
  }
  int64_t end = 0;
  for (int g = 0; g < G; ++g) {
    const int64_t start = (end + s.alignment - 1) / s.alignment * s.alignment;
    r.group_of_row.resize(static_cast<size_t>(start), -1);
    r.group_of_row.resize(static_cast<size_t>(start + s.counts[g]), g);
    end = start + s.counts[g];
    r.meta.as<int32_t>()[g] = static_cast<int32_t>(end);
  }
  r.total = end + s.alignment;  // rows past the last block too
  r.group_of_row.resize(static_cast<size_t>(r.total), -1);
  return r;
}

// The engine's problem of a shape (device pointers unset).
detail::GroupedGemmProblem problem_of(const Shape& s, const Rows& r) {
  detail::GroupedGemmProblem p;
  p.in_dtype = s.in;
  p.out_dtype = s.out;
  p.num_groups = static_cast<int>(s.counts.size());
  p.n = s.n;
  p.k = s.k;
  p.activation = s.act;
  p.rows = s.rows;
  p.alignment = s.alignment;
  p.max_m = s.max_m;
  p.m = r.total;
  return p;
}

// c of one run; plan nullptr: the public op (its planner's plan).
HostTensor run(const Shape& s, const Rows& r, const HostTensor& a, const HostTensor& b,
               const GemmPlan* plan) {
  const std::vector<int64_t> c_shape =
      s.rows == detail::GemmRows::kMasked
          ? std::vector<int64_t>{static_cast<int64_t>(s.counts.size()), s.max_m, s.n}
          : std::vector<int64_t>{r.total, s.n};
  DeviceTensor da(a), db(b), dmeta(r.meta), dc(s.out, c_shape, 0xFF);
  if (!plan) {
    GroupedGemmArgs g;
    // The public op takes a masked layout's a as [G, max_m, k] (the rows are laid out so).
    g.a = s.rows == detail::GemmRows::kMasked
              ? make_view(da.data(), s.in, {static_cast<int64_t>(s.counts.size()), s.max_m, s.k})
              : da.view();
    g.b = db.view();
    g.layout_metadata = dmeta.view();
    g.layout = s.rows == detail::GemmRows::kMasked ? PermutedLayout::masked(s.max_m)
                                                   : PermutedLayout::contiguous(s.alignment);
    g.activation = s.act;
    g.c = dc.view();
    moe_grouped_gemm(g, nullptr);
  } else {
    detail::GroupedGemmProblem p = problem_of(s, r);
    p.a = da.data();
    p.b = db.data();
    p.c = dc.data();
    p.layout_metadata = static_cast<const int32_t*>(dmeta.data());
    p.plan = *plan;
    detail::run_grouped_gemm(p, nullptr);
  }
  const cudaError_t err = cudaDeviceSynchronize();
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  return dc.download();
}

void check_shape(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Rows r = layout_rows(s);
  const bool silu = s.act == Activation::kSiluAndMul;
  const int G = static_cast<int>(s.counts.size());
  const int64_t b_rows = silu ? 2 * s.n : s.n;
  HostTensor a(s.in, {r.total, s.k}), b(s.in, {G, b_rows, s.k});
  a.fill_normal(rng, 1.0);
  b.fill_normal(rng, 1.0 / std::sqrt(static_cast<double>(s.k)));

  HostTensor a_bad = a, b_bad = b;
  testing::ReachMap reach(r.total, s.n);
  // Rows of a: every 7th valid row one NaN (a negative one every other time), every 7th
  // from the 3rd one +Inf; padding rows stay finite (never read as data).
  std::uniform_int_distribution<int64_t> col_k(0, s.k - 1), col_n(0, s.n - 1);
  int valid = 0;
  for (int64_t row = 0; row < r.total; ++row) {
    if (r.group_of_row[row] < 0) continue;
    if (valid % 7 == 0) {
      testing::set_nonfinite(a_bad, row * s.k + col_k(rng),
                             valid % 14 ? NonFinite::kNegativeNan : NonFinite::kNan);
      reach.mark_row(row, Reach::kNan);
    } else if (valid % 7 == 3) {
      testing::set_nonfinite(a_bad, row * s.k + col_k(rng), NonFinite::kPosInf);
      reach.mark_row(row, Reach::kNonFinite);
    }
    ++valid;
  }
  // One weight element of two experts with rows: a NaN in the first, an Inf in the second
  // (silu: the NaN in a gate row, the Inf in an up row, whose products stay non-finite).
  std::vector<int> with_rows;
  for (int g = 0; g < G; ++g)
    if (s.counts[g] > 0) with_rows.push_back(g);
  ASSERT_GE(with_rows.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const int group = with_rows[i];
    const int64_t column = col_n(rng);
    const NonFinite value = i == 0 ? NonFinite::kNan : NonFinite::kPosInf;
    const int64_t b_row = silu && value == NonFinite::kPosInf ? s.n + column : column;
    testing::set_nonfinite(b_bad, (group * b_rows + b_row) * s.k + col_k(rng), value);
    for (int64_t row = 0; row < r.total; ++row) {
      if (r.group_of_row[row] == group)
        reach.mark(row, column, i == 0 ? Reach::kNan : Reach::kNonFinite);
    }
  }
  ASSERT_GT(reach.count(Reach::kNone), 0);

  // The public op, then every plan that can run the shape.
  const std::vector<GemmPlan> plans =
      detail::gemm_plan_candidates(problem_of(s, r), detail::current_gemm_device());
  for (size_t i = 0; i <= plans.size(); ++i) {
    const GemmPlan* plan = i == 0 ? nullptr : &plans[i - 1];
    const std::string what = std::string(s.name) + ", " + (plan ? to_string(*plan) : "public op");
    const HostTensor clean = run(s, r, a, b, plan);
    const HostTensor got = run(s, r, a_bad, b_bad, plan);
    testing::expect_reach(got, clean, reach, what);  // padding rows keep the poison bytes
  }
}

TEST(GemmNonFiniteGpu, NanAndInfReachExactlyTheElementsTheyFeed) {
  MOEKIT_REQUIRE_GPU();
  using R = detail::GemmRows;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const Shape shapes[] = {
      {"contiguous",
       bf,
       bf,
       Activation::kNone,
       R::kContiguous,
       {37, 0, 129, 1, 300, 64},
       8,
       0,
       264,
       520},
      {"contiguous_silu_f32out",
       f16,
       f32,
       Activation::kSiluAndMul,
       R::kContiguous,
       {200, 3, 0, 140},
       1,
       0,
       136,
       264},
      {"masked", bf, bf, Activation::kNone, R::kMasked, {65, 0, 130, 7}, 0, 130, 200, 136},
  };
  uint64_t seed = 2830;
  for (const Shape& s : shapes) check_shape(s, seed++);
}

}  // namespace
}  // namespace moekit
