// GPU tests of the grouped GEMMs against the CPU reference on fresh random inputs:
// every plan the planner offers (gemm_plan_candidates), every row layout, both activations, every
// output dtype, edge shapes, poisoned outputs (rows outside every expert keep the
// poison; every valid element is written), run-to-run determinism, and clamping
// of out-of-range device metadata.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/host_dtype.h"
#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/sm90/device.h"
#include "moekit/gemm.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "reference/gpu_reference.h"
#include "support/gpu.h"

namespace moekit {
namespace {

using testing::DeviceTensor;

std::mt19937_64& rng() {
  static std::mt19937_64 r(20240601);
  return r;
}

HostTensor i32_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::kI32, {static_cast<int64_t>(values.size())});
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * 4);
  return t;
}

std::vector<int> random_counts(int groups, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int> c(groups);
  for (int& x : c) x = d(rng());
  return c;
}

struct GemmCase {
  std::string name;
  DType in = DType::kBF16;
  DType out = DType::kBF16;
  Activation act = Activation::kNone;
  detail::GemmRows rows = detail::GemmRows::kContiguous;
  int alignment = 1;
  std::vector<int> counts;  // rows per group (kDense: one entry, m)
  int64_t max_m = 0;        // kMasked
  int64_t n = 0, k = 0;
  bool gpu_ref = false;     // the f32 GPU reference (large random draws), else the CPU one
  bool nan_padding = true;  // rows outside every group hold NaN (else random values)
};

std::string describe(const GemmCase& c, const GemmPlan* plan) {
  return c.name + " [" + (plan ? to_string(*plan) : std::string("planner")) + ", " +
         dtype_name(c.in) + "->" + dtype_name(c.out) +
         (c.act == Activation::kSiluAndMul ? ", silu" : "") + ", n=" + std::to_string(c.n) +
         ", k=" + std::to_string(c.k) + "]";
}

// Bytes of `out` (rows of row_bytes) that no longer hold the 0xFF poison in rows whose
// row_valid byte is 0 (rows outside every group: must stay untouched).
int64_t poison_bytes_touched(const HostTensor& out, const std::vector<uint8_t>& row_valid,
                             size_t row_bytes) {
  int64_t touched = 0;
  for (size_t r = 0; r < row_valid.size(); ++r) {
    if (row_valid[r]) continue;
    const uint8_t* p = static_cast<const uint8_t*>(out.data()) + r * row_bytes;
    for (size_t i = 0; i < row_bytes; ++i) touched += p[i] != 0xFF;
  }
  return touched;
}

std::string counts_str(const std::vector<int>& counts) {
  std::string s;
  for (int x : counts) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "counts {" + s + "}";
}

// cudaDeviceSynchronize with a deadline (MOEKIT_TEST_HANG_S seconds, default 120): a hung
// kernel ends the process naming `what` (the case and its row counts), where the shard
// would otherwise run into its runner's timeout with nothing said.
cudaError_t sync_or_die(const std::string& what) {
  static const double limit = [] {
    const char* v = std::getenv("MOEKIT_TEST_HANG_S");
    return v ? std::atof(v) : 120.0;
  }();
  const auto start = std::chrono::steady_clock::now();
  while (cudaStreamQuery(nullptr) == cudaErrorNotReady) {
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > limit) {
      std::fprintf(stderr, "HANG: %s still running after %.0f s\n", what.c_str(), limit);
      std::fflush(stderr);
      std::_Exit(124);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return cudaDeviceSynchronize();
}

// The running test's name, for sync_or_die outside run_case.
std::string current_test() {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  return t ? std::string(t->test_suite_name()) + "." + t->name() : "?";
}

// Runs one case through the engine (plan given: forced) or, without one, the public op
// (dense cases: the engine with the planner's plan), and checks it against the reference.
// dynamic_second: the first run takes the SM90 kernels' static tile walk, the second gets
// a tile counter (a forced sm90 plan: dynamic; the public op: its planner's schedule),
// which must give the same bytes.
void run_case(const GemmCase& cs, const GemmPlan* plan, bool dynamic_second = false) {
  SCOPED_TRACE(describe(cs, plan) + (dynamic_second ? " static, then dynamic" : ""));
  // MOEKIT_TEST_VERBOSE=1: each case on stderr as it starts (which one a hung run was in).
  static const bool verbose = std::getenv("MOEKIT_TEST_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "case %s %s\n", describe(cs, plan).c_str(), counts_str(cs.counts).c_str());
  }
  const bool silu = cs.act == Activation::kSiluAndMul;
  const int G = static_cast<int>(cs.counts.size());
  const int64_t b_rows = silu ? 2 * cs.n : cs.n;

  // Row structure: the rows each group owns and the metadata.
  std::vector<int32_t> meta;
  std::vector<int64_t> a_shape, c_shape;
  int64_t total_rows = 0;
  std::vector<uint8_t> row_valid;
  if (cs.rows == detail::GemmRows::kContiguous) {
    int64_t end = 0;
    for (int g = 0; g < G; ++g) {
      const int64_t start = (end + cs.alignment - 1) / cs.alignment * cs.alignment;
      end = start + cs.counts[g];
      meta.push_back(static_cast<int32_t>(end));
    }
    int64_t routed = 0;
    for (int x : cs.counts) routed += x;
    total_rows = routed + static_cast<int64_t>(G) * (cs.alignment - 1);  // permuted_rows
    row_valid.assign(total_rows, 0);
    end = 0;
    for (int g = 0; g < G; ++g) {
      const int64_t start = (end + cs.alignment - 1) / cs.alignment * cs.alignment;
      for (int64_t r = start; r < meta[g]; ++r) row_valid[r] = 1;
      end = meta[g];
    }
    a_shape = {total_rows, cs.k};
    c_shape = {total_rows, cs.n};
  } else if (cs.rows == detail::GemmRows::kMasked) {
    total_rows = G * cs.max_m;
    row_valid.assign(total_rows, 0);
    for (int g = 0; g < G; ++g) {
      meta.push_back(cs.counts[g]);
      for (int r = 0; r < cs.counts[g]; ++r) row_valid[g * cs.max_m + r] = 1;
    }
    a_shape = {G, cs.max_m, cs.k};
    c_shape = {G, cs.max_m, cs.n};
  } else {
    total_rows = cs.counts.at(0);
    meta.push_back(static_cast<int32_t>(total_rows));  // the reference's view: one group
    row_valid.assign(total_rows, 1);
    a_shape = {total_rows, cs.k};
    c_shape = {total_rows, cs.n};
  }

  // Inputs ~ N(0,1), weights ~ N(0, 1/k); rows outside every group are NaN, so any
  // read of them as data would show.
  HostTensor a(cs.in, a_shape), b(cs.in, {G, b_rows, cs.k});
  a.fill_normal(rng(), 1.0);
  b.fill_normal(rng(), 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(cs.k, 1))));
  for (int64_t r = 0; r < total_rows; ++r)
    if (!row_valid[r] && cs.nan_padding)
      for (int64_t j = 0; j < cs.k; ++j) a.set(r * cs.k + j, NAN);
  HostTensor meta_h = i32_tensor(meta);

  HostTensor ref(cs.out, c_shape);
  ref.fill_bytes(0xFF);
  GroupedGemmArgs ha;
  ha.a = a.view();
  ha.b = b.view();
  ha.layout_metadata = meta_h.view();
  ha.layout = cs.rows == detail::GemmRows::kMasked ? PermutedLayout::masked(cs.max_m)
                                                   : PermutedLayout::contiguous(cs.alignment);
  ha.activation = cs.act;
  ha.c = ref.view();
  if (cs.rows == detail::GemmRows::kDense) {
    ha.a = make_view(a.data(), cs.in, {total_rows, cs.k});
    ha.c = make_view(ref.data(), cs.out, {total_rows, cs.n});
  }
  if (!cs.gpu_ref) reference::moe_grouped_gemm(ha);

  DeviceTensor a_d(a), b_d(b), meta_d(meta_h);
  const std::string what = describe(cs, plan) + " " + counts_str(cs.counts);
  if (cs.gpu_ref) {
    DeviceTensor ref_d(ref);  // poisoned like ref: rows outside every group stay so
    GroupedGemmArgs ga = ha;
    ga.a = make_view(a_d.data(), cs.in, static_cast<int>(a_shape.size()), a_shape.data());
    ga.b = b_d.view();
    ga.layout_metadata = meta_d.view();
    ga.c = make_view(ref_d.data(), cs.out, static_cast<int>(c_shape.size()), c_shape.data());
    testing::DeviceWorkspace scratch(gpu_reference::grouped_gemm_scratch_bytes(ga));
    gpu_reference::moe_grouped_gemm(ga, scratch.get(), nullptr);
    ASSERT_EQ(sync_or_die("the GPU reference of " + what), cudaSuccess);
    ref = ref_d.download();
  }
  HostTensor first;
  DeviceTensor counter(DType::kI32, {static_cast<int64_t>(detail::kTileCounterBytes / 4)}, 0xFF);
  const bool sm90 =
      plan && (plan->kernel == GemmKernel::kSm90 || plan->kernel == GemmKernel::kSm90Pairs);
  for (int rep = 0; rep < 2; ++rep) {
    // A forced plan runs as given (with the counter when dynamic), or with dynamic_second
    // static, then dynamic; the public op gets the counter on the second run.
    GemmPlan run_plan = plan ? *plan : GemmPlan{};
    if (dynamic_second && sm90) {
      run_plan.schedule = rep == 0 ? GemmSchedule::kStatic : GemmSchedule::kDynamic;
    }
    const bool counter_given =
        plan ? run_plan.schedule == GemmSchedule::kDynamic : dynamic_second && rep == 1;
    DeviceTensor c_d(cs.out, c_shape, 0xFF);
    if (!plan && cs.rows != detail::GemmRows::kDense) {
      GroupedGemmArgs da = ha;
      da.a = a_d.view();
      da.b = b_d.view();
      da.layout_metadata = meta_d.view();
      da.c = c_d.view();
      if (counter_given) da.workspace = {counter.data(), detail::kTileCounterBytes};
      moe_grouped_gemm(da, nullptr);
    } else {
      detail::GroupedGemmProblem p;
      p.in_dtype = cs.in;
      p.out_dtype = cs.out;
      p.a = a_d.data();
      p.b = b_d.data();
      p.c = c_d.data();
      p.num_groups = G;
      p.n = cs.n;
      p.k = cs.k;
      p.activation = cs.act;
      p.rows = cs.rows;
      p.layout_metadata = static_cast<const int32_t*>(meta_d.data());
      p.alignment = cs.alignment;
      p.max_m = cs.max_m;
      p.m = total_rows;
      if (counter_given) p.tile_counter = static_cast<unsigned*>(counter.data());
      p.plan = plan ? run_plan : detail::plan_gemm(p, detail::current_gemm_device());
      detail::run_grouped_gemm(p, nullptr);
    }
    ASSERT_EQ(sync_or_die(what), cudaSuccess);
    HostTensor out = c_d.download();
    if (rep == 1) {
      EXPECT_EQ(std::memcmp(out.data(), first.data(), out.nbytes()), 0) << "not deterministic";
      break;
    }
    // Valid rows match the reference ...
    const Tolerance tol = tolerance_for(cs.out);
    Accuracy acc = compare(out.view(), ref.view(), tol, row_valid.data());
    EXPECT_TRUE(acc.pass(tol)) << acc.str() << " over " << acc.count << " elements";
    // ... and every other row still holds the poison.
    EXPECT_EQ(poison_bytes_touched(out, row_valid, static_cast<size_t>(cs.n) * dtype_size(cs.out)),
              0)
        << "bytes written outside every group's rows";
    first = std::move(out);
  }
}

std::vector<GemmCase> cases() {
  using R = detail::GemmRows;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const Activation none = Activation::kNone, silu = Activation::kSiluAndMul;
  std::vector<GemmCase> v;
  v.push_back({"contiguous_a1_ragged", bf, bf, none, R::kContiguous, 1, random_counts(8, 0, 100), 0,
               256, 512});
  v.push_back({"contiguous_a128_silu_f32out_edges",
               bf,
               f32,
               silu,
               R::kContiguous,
               128,
               {37, 0, 129, 1, 300},
               0,
               200,
               264});
  v.push_back({"masked_f16", f16, f16, none, R::kMasked, 1, {0, 1, 100, 37}, 100, 136, 128});
  v.push_back({"masked_silu_bf16", bf, bf, silu, R::kMasked, 1, {300, 129, 0}, 300, 64, 520});
  v.push_back(
      {"masked_f16_f32out_odd", f16, f32, none, R::kMasked, 1, {33, 7, 0, 65}, 65, 72, 264});
  v.push_back({"dense_f16_silu_f32out", f16, f32, silu, R::kDense, 1, {77}, 0, 64, 1032});
  v.push_back({"dense_bf16", bf, bf, none, R::kDense, 1, {300}, 0, 200, 264});
  v.push_back(
      {"all_rows_one_expert", bf, bf, none, R::kContiguous, 1, {0, 0, 0, 517, 0, 0}, 0, 264, 200});
  v.push_back({"single_row", f16, f16, none, R::kContiguous, 1, {1}, 0, 8, 8});
  v.push_back({"single_row_silu_f32", bf, f32, silu, R::kContiguous, 1, {1}, 0, 8, 16});
  v.push_back({"512_experts_a16_silu", bf, bf, silu, R::kContiguous, 16, random_counts(512, 0, 6),
               0, 64, 64});
  v.push_back({"ragged_f16_f32out", f16, f32, none, R::kContiguous, 1, random_counts(16, 0, 300), 0,
               384, 256});
  v.push_back(
      {"prefill_like_silu", bf, bf, silu, R::kContiguous, 1, {130, 260, 7, 384}, 0, 512, 384});
  v.push_back(
      {"decode_like", bf, bf, none, R::kContiguous, 1, random_counts(64, 0, 30), 0, 256, 1024});
  v.push_back({"decode_like_f16_silu_a128", f16, f16, silu, R::kContiguous, 128,
               random_counts(32, 0, 20), 0, 128, 512});
  v.push_back({"k_zero", bf, bf, silu, R::kContiguous, 1, {3, 0, 5}, 0, 16, 0});
  v.push_back({"all_experts_empty", bf, bf, none, R::kContiguous, 4, {0, 0, 0, 0}, 0, 64, 64});
  v.push_back({"masked_all_empty", f16, f16, silu, R::kMasked, 1, {0, 0}, 48, 64, 64});
  v.push_back({"no_rows", bf, bf, none, R::kContiguous, 1, {0, 0, 0}, 0, 64, 64});
  v.push_back({"dense_no_rows", bf, f32, none, R::kDense, 1, {0}, 0, 64, 64});
  v.push_back({"masked_max_m_zero", bf, bf, none, R::kMasked, 1, {0, 0}, 0, 64, 64});
  return v;
}

// The engine's problem of a case (device pointers unset; a tile counter marked given, so
// the dynamic schedules are among the candidates).
detail::GroupedGemmProblem problem_of(const GemmCase& c) {
  static unsigned counter_stand_in;
  detail::GroupedGemmProblem p;
  p.in_dtype = c.in;
  p.out_dtype = c.out;
  p.num_groups = static_cast<int>(c.counts.size());
  p.n = c.n;
  p.k = c.k;
  p.activation = c.act;
  p.rows = c.rows;
  p.alignment = c.alignment;
  p.max_m = c.max_m;
  int64_t rows = 0;
  for (int x : c.counts) rows += x;
  p.m = c.rows == detail::GemmRows::kDense ? c.counts.at(0)
                                           : rows + int64_t{p.num_groups} * (c.alignment - 1);
  p.tile_counter = &counter_stand_in;
  return p;
}

// Every candidate plan of `kernel` for each case.
void run_candidates(const std::vector<GemmCase>& v, GemmKernel kernel) {
  for (const GemmCase& c : v) {
    for (const GemmPlan& plan :
         detail::gemm_plan_candidates(problem_of(c), detail::current_gemm_device())) {
      if (plan.kernel == kernel) run_case(c, &plan);
    }
  }
}

// Every candidate on every case, one test per kernel (so they can run as parallel
// processes: --gtest_filter='EveryKernel/GemmGpuKernel.*/3').
class GemmGpuKernel : public ::testing::TestWithParam<int> {};

TEST_P(GemmGpuKernel, EveryCandidateMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  run_candidates(cases(), static_cast<GemmKernel>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(EveryKernel, GemmGpuKernel,
                         ::testing::Range(0, static_cast<int>(GemmKernel::kSm90Pairs) + 1));

TEST(GemmGpu, PublicOpWithPlannerMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  for (const GemmCase& c : cases()) run_case(c, nullptr);
}

// Extra shapes for the SM90 (TMA + wgmma) kernels (EveryKernel/GemmGpuKernel and
// ClampsOutOfRangeMetadata run them too): many tiles per SM (the persistent loop and the
// pipeline phases carried across tiles), tiles straddling group boundaries, n not a
// multiple of the 256 / 128 tile width, the 1024-group maximum.
std::vector<GemmCase> sm90_cases() {
  using R = detail::GemmRows;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const Activation none = Activation::kNone, silu = Activation::kSiluAndMul;
  std::vector<GemmCase> v;
  v.push_back({"sm90_ragged_many_tiles", bf, bf, none, R::kContiguous, 1, random_counts(24, 0, 700),
               0, 1000, 1024});
  v.push_back({"sm90_ragged_silu_a8", bf, bf, silu, R::kContiguous, 8, random_counts(24, 0, 400), 0,
               392, 776});
  v.push_back({"sm90_masked_silu_f16_f32out",
               f16,
               f32,
               silu,
               R::kMasked,
               1,
               {0, 129, 256, 255, 1, 300},
               300,
               264,
               512});
  v.push_back({"sm90_dense_f16", f16, f16, none, R::kDense, 1, {1000}, 0, 520, 2056});
  v.push_back({"sm90_1024_experts", bf, f32, silu, R::kContiguous, 1, random_counts(1024, 0, 3), 0,
               136, 64});
  return v;
}

// sm90 at every tile width and schedule.
TEST(GemmGpu, Sm90MatchesReference) {
  MOEKIT_REQUIRE_GPU();
  run_candidates(sm90_cases(), GemmKernel::kSm90);
}

// The public op with its optional workspace (the dynamic schedule where the rule takes
// it: sm90 / sm90_pairs on grouped rows) gives the bytes it gives without one.
TEST(GemmGpu, PublicOpWithWorkspaceMatchesWithout) {
  MOEKIT_REQUIRE_GPU();
  for (const GemmCase& c : cases()) run_case(c, nullptr, true);
  for (const GemmCase& c : sm90_cases()) run_case(c, nullptr, true);
}

// Extra shapes for the SM90 kernels (on top of sm90_cases; written for the ping-pong kernel
// the planner no longer has): k-tile
// counts below, at and above its 5 stages (each consumer warpgroup skips the other's
// k_tiles stages, so the pipeline phases it carries depend on k_tiles), blocks with 1, 2
// and 3 tiles (the second consumer idle, even and odd splits), 64-row tiles straddling
// groups, masked and dense rows, silu, f32 output.
std::vector<GemmCase> stage_cases() {
  using R = detail::GemmRows;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const Activation none = Activation::kNone, silu = Activation::kSiluAndMul;
  std::vector<GemmCase> v = sm90_cases();
  // 4483 rows = 71 m-tiles x 4 n-tiles = 284 tiles: 2 or 3 per block; 3 k-tiles.
  v.push_back({"pingpong_dense_k3_odd_tiles", bf, bf, none, R::kDense, 1, {4483}, 0, 1000, 136});
  // 5 k-tiles (= stages), ragged groups with 64-row tiles straddling them.
  v.push_back({"pingpong_k5_silu_f16_f32out", f16, f32, silu, R::kContiguous, 1,
               random_counts(16, 0, 300), 0, 264, 320});
  // 8 k-tiles, the last one partial; masked slabs not a multiple of 64 rows.
  v.push_back({"pingpong_k8_masked_silu",
               bf,
               bf,
               silu,
               R::kMasked,
               1,
               {65, 0, 200, 64, 1, 130},
               200,
               392,
               456});
  // 1 k-tile, 2 tiles per block on every block (264 tiles) and the grid at 132.
  v.push_back(
      {"pingpong_k1_two_tiles_per_block", bf, f32, none, R::kDense, 1, {64 * 264}, 0, 256, 64});
  return v;
}

// sm90 with 192- and 224-row b tiles (96- / 112-row boxes, 5 stages; the dense wave
// rule's picks, forced here on every row layout): the stage shapes (k-tiles below, at and
// above the stage count, ragged / masked / dense rows, silu, f32 output) plus output
// widths off the narrower tiles. 224 takes no silu: those cases run at 192 only.
TEST(GemmGpu, Sm90NarrowTilesMatchReference) {
  MOEKIT_REQUIRE_GPU();
  using R = detail::GemmRows;
  std::vector<GemmCase> v = stage_cases();
  v.push_back({"narrow_dense_silu_off_96",
               DType::kBF16,
               DType::kBF16,
               Activation::kSiluAndMul,
               R::kDense,
               1,
               {300},
               0,
               1000,
               520});
  v.push_back({"narrow_dense_f16_off_224",
               DType::kF16,
               DType::kF16,
               Activation::kNone,
               R::kDense,
               1,
               {129},
               0,
               584,
               704});
  v.push_back({"narrow_masked_k7",
               DType::kBF16,
               DType::kBF16,
               Activation::kNone,
               R::kMasked,
               1,
               {65, 0, 200, 64, 1, 130},
               200,
               456,
               392});
  for (const GemmCase& c : v) {
    detail::GroupedGemmProblem p = problem_of(c);
    for (const GemmPlan& plan : detail::gemm_plan_candidates(p, detail::current_gemm_device())) {
      if (plan.kernel == GemmKernel::kSm90 && plan.tile_n < 256 &&
          plan.schedule == GemmSchedule::kStatic) {
        run_case(c, &plan);
      }
    }
  }
}

// The dynamic tile schedule (a tile counter) of sm90 (at 256 and 192 b rows) and
// sm90_pairs: bit-identical to the static walk (each tile is still computed
// whole, in k order, by one consumer). Only shapes of more than one wave (the launch
// takes the counter only there): many tiles per block (the channel's ring of 4 ids wraps
// many times; 1 k-tile lets the producer run ahead of the consumers), ragged groups with
// silu, 2-3 tiles per block, k-tiles below / at the stage count.
TEST(GemmGpu, Sm90DynamicScheduleMatchesStatic) {
  MOEKIT_REQUIRE_GPU();
  using R = detail::GemmRows;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const Activation none = Activation::kNone, silu = Activation::kSiluAndMul;
  std::vector<GemmCase> v;
  v.push_back(
      {"dyn_dense_k1_many_tiles", bf, bf, none, R::kDense, 1, {64 * 132 * 9 + 17}, 0, 256, 64});
  v.push_back({"dyn_ragged_silu_many_tiles", f16, f16, silu, R::kContiguous, 1,
               random_counts(64, 0, 1500), 0, 384, 200});
  v.push_back({"dyn_dense_k3_odd_tiles", bf, bf, none, R::kDense, 1, {4483}, 0, 1000, 136});
  v.push_back({"dyn_masked_k5_f32out",
               bf,
               f32,
               none,
               R::kMasked,
               1,
               {300, 129, 0, 257, 64, 1},
               300,
               1032,
               320});
  for (const GemmCase& c : v) {
    // The cooperative pairs: rank 0 claims, rank 1 receives the pair ids.
    // Swapped tail tiles (<= 32 rows) on the 256-wide tiles too.
    for (const GemmPlan& plan :
         {GemmPlan{GemmKernel::kSm90, 128, 256}, GemmPlan{GemmKernel::kSm90, 128, 192},
          GemmPlan{GemmKernel::kSm90Pairs, 128, 256},
          GemmPlan{GemmKernel::kSm90, 128, 256, 1, GemmSchedule::kStatic, true},
          GemmPlan{GemmKernel::kSm90Pairs, 128, 256, 1, GemmSchedule::kStatic, true}}) {
      run_case(c, &plan, true);
    }
  }
}

// Many back-to-back launches of sm90 and sm90_pairs, static and dynamic, on shapes with few
// and many tiles per block (blocks without a tile, the last tile alone, the channel ring
// wrapping): every output equals the first bit for bit. A race in the tile hand-off
// would show as a mismatch, a lost id as a hang (the test runner's timeout).
TEST(GemmGpu, Sm90ScheduleStress) {
  MOEKIT_REQUIRE_GPU();
  const int64_t k = 64, n = 512;
  const std::vector<std::vector<int>> shapes = {
      random_counts(48, 0, 700), {1, 0, 129, 63}, random_counts(200, 0, 40)};
  std::vector<int32_t> meta;
  for (const auto& counts : shapes) {
    meta.clear();
    int64_t rows = 0;
    for (int x : counts) meta.push_back(static_cast<int32_t>(rows += x));
    HostTensor a(DType::kBF16, {std::max<int64_t>(rows, 1), k}),
        b(DType::kBF16, {static_cast<int64_t>(counts.size()), n, k});
    a.fill_normal(rng(), 1.0);
    b.fill_normal(rng(), 0.125);
    HostTensor meta_h = i32_tensor(meta);
    DeviceTensor a_d(a), b_d(b), meta_d(meta_h), c_d(DType::kBF16, {std::max<int64_t>(rows, 1), n});
    DeviceTensor counter(DType::kI32, {static_cast<int64_t>(detail::kTileCounterBytes / 4)});
    for (GemmKernel kernel : {GemmKernel::kSm90, GemmKernel::kSm90Pairs}) {
      for (bool swap_tails : {false, true}) {  // the shapes have many tiles of <= 32 rows
        HostTensor first;
        for (int it = 0; it < 100; ++it) {
          // Alternately dynamic and static.
          const GemmPlan plan{
              kernel,    128, 256, 1, it % 2 ? GemmSchedule::kStatic : GemmSchedule::kDynamic,
              swap_tails};
          SCOPED_TRACE(to_string(plan) + ", launch " + std::to_string(it) + ", rows " +
                       std::to_string(rows));
          detail::GroupedGemmProblem p;
          p.a = a_d.data();
          p.b = b_d.data();
          p.c = c_d.data();
          p.num_groups = static_cast<int>(counts.size());
          p.n = n;
          p.k = k;
          p.rows = detail::GemmRows::kContiguous;
          p.layout_metadata = static_cast<const int32_t*>(meta_d.data());
          p.m = rows;
          p.plan = plan;
          p.tile_counter = static_cast<unsigned*>(counter.data());
          const bool compare = it % 10 == 9;
          // Poison the output of each compared launch: a tile it lost would keep the bytes.
          const size_t c_bytes = static_cast<size_t>(std::max<int64_t>(rows, 1) * n) * 2;
          if (compare) ASSERT_EQ(cudaMemset(c_d.data(), 0xFF, c_bytes), cudaSuccess);
          detail::run_grouped_gemm(p, nullptr);
          if (!compare) continue;
          ASSERT_EQ(sync_or_die(current_test()), cudaSuccess);
          HostTensor out = c_d.download();
          if (first.nbytes() == 0) {
            first = std::move(out);
          } else {
            ASSERT_EQ(std::memcmp(out.data(), first.data(), out.nbytes()), 0) << "outputs differ";
          }
        }
      }
    }
  }
}

// The paired kernels (2-CTA clusters, the shared operand multicast) on their pairs'
// edges: an odd number of n-tiles (7: the second CTA of the last pair has no columns,
// with and without silu), groups with an odd number of 64-row m-tiles and groups of one
// m-tile (8: the second CTA has no rows), a single pair tile in all, many pair tiles per
// cluster, masked and dense rows. Passed on the H200 (2026-12-02, with the shapes below).
std::vector<GemmCase> pair_edge_cases() {
  using R = detail::GemmRows;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const Activation none = Activation::kNone, silu = Activation::kSiluAndMul;
  std::vector<GemmCase> v;
  v.push_back(
      {"pair_odd_n_tiles", bf, bf, none, R::kContiguous, 1, {130, 0, 7, 300}, 0, 3 * 256 - 8, 200});
  v.push_back({"pair_odd_n_tiles_silu_f32out",
               f16,
               f32,
               silu,
               R::kContiguous,
               1,
               {1, 129, 64, 65},
               0,
               3 * 128,
               136});
  v.push_back({"pair_one_tile", bf, bf, none, R::kDense, 1, {5}, 0, 64, 64});
  v.push_back(
      {"pair_masked_odd_m", bf, bf, silu, R::kMasked, 1, {64, 1, 0, 193, 128}, 200, 256, 264});
  v.push_back(
      {"pair_many_tiles", bf, bf, none, R::kContiguous, 1, random_counts(40, 0, 900), 0, 512, 200});
  v.push_back({"pair_dense_odd_rows_k_long", f16, f16, none, R::kDense, 1, {321}, 0, 264, 1032});
  return v;
}

// Fresh draws of sm90_ragged_silu_a8's shape (24 experts of 0-400 rows starting on 8-row
// boundaries, silu, n 392, k 776: two pruned pair kernels hung on it on the H200, in test
// shards running side by side) through sm90 and sm90_pairs, static and dynamic. Its own seed
// (MOEKIT_TEST_SEED) and draw count (MOEKIT_TEST_DRAWS, default 2), so that processes run
// side by side hunt different draws; the f32 GPU reference keeps a draw cheap. A hang ends
// the process naming the plan and the draw's counts (sync_or_die).
TEST(GemmGpu, Sm90KernelsFinishOnFreshRaggedDraws) {
  MOEKIT_REQUIRE_GPU();
  // Knobs for narrowing a hang down: the draw count and seed, the alignment, NaN padding
  // rows, silu and k.
  const auto env = [](const char* name, long long fallback) {
    const char* v = std::getenv(name);
    return v ? std::strtoll(v, nullptr, 10) : fallback;
  };
  std::mt19937_64 r(static_cast<uint64_t>(env("MOEKIT_TEST_SEED", 7)));
  const int draws = static_cast<int>(env("MOEKIT_TEST_DRAWS", 2));
  std::uniform_int_distribution<int> rows(0, 400);
  for (int i = 0; i < draws; ++i) {
    GemmCase c{"draw_" + std::to_string(i),
               DType::kBF16,
               DType::kBF16,
               env("MOEKIT_TEST_SILU", 1) ? Activation::kSiluAndMul : Activation::kNone,
               detail::GemmRows::kContiguous,
               static_cast<int>(env("MOEKIT_TEST_ALIGN", 8)),
               std::vector<int>(24),
               0,
               392,
               env("MOEKIT_TEST_K", 776)};
    for (int& x : c.counts) x = rows(r);
    c.gpu_ref = true;
    c.nan_padding = env("MOEKIT_TEST_NAN", 1) != 0;
    for (const GemmPlan& plan :
         detail::gemm_plan_candidates(problem_of(c), detail::current_gemm_device())) {
      if (plan.kernel != GemmKernel::kSm90 && plan.kernel != GemmKernel::kSm90Pairs) continue;
      run_case(c, &plan);
      if (HasFatalFailure()) return;
    }
  }
}

// sm90_pairs (adaptive pairs: m-tile pairs, an odd last m-tile's n-tiles paired) at both
// schedules on sm90's shapes, the pair edges and groups of every m-tile parity next to each other
// (one m-tile: all n-pairs; two: all m-pairs; three: both kinds in one group), with an odd n-tile
// count (the last n-pair's second tile past n).
TEST(GemmGpu, Sm90PairAutoMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  using R = detail::GemmRows;
  std::vector<GemmCase> v = sm90_cases(), edges = pair_edge_cases();
  v.insert(v.end(), edges.begin(), edges.end());
  v.push_back({"auto_parities",
               DType::kBF16,
               DType::kBF16,
               Activation::kNone,
               R::kContiguous,
               1,
               {128, 256, 300, 0, 65, 129, 512, 1},
               0,
               3 * 256 - 8,
               200});
  v.push_back({"auto_parities_silu",
               DType::kF16,
               DType::kF16,
               Activation::kSiluAndMul,
               R::kContiguous,
               1,
               {257, 64, 384, 0, 200, 128},
               0,
               5 * 128,
               264});
  run_candidates(v, GemmKernel::kSm90Pairs);
}

// decode_splitk at every split: k slices not a multiple of the split (and
// fewer slices than CTAs, so some ranks only add zeros), one row, empty and ragged
// groups, masked and dense rows, silu_and_mul, f32 output, k == 0.
// Extra shapes for decode_persistent: CTAs with many tiles each (the
// pipeline streams across tile boundaries, the next tile's loads under the current
// tile's epilogue), tiles of 1-32 rows, empty groups between full ones, k off the
// 128-element stage, silu, masked and dense rows, f32 output, and more groups than the
// shared table holds (1500: not a candidate; the stream tiles run it).
std::vector<GemmCase> persistent_cases() {
  using R = detail::GemmRows;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const Activation none = Activation::kNone, silu = Activation::kSiluAndMul;
  std::vector<GemmCase> v;
  v.push_back({"persistent_many_tiles", bf, bf, none, R::kContiguous, 1, random_counts(256, 0, 40),
               0, 2048, 520});
  v.push_back({"persistent_silu_f32out", f16, f32, silu, R::kContiguous, 1,
               random_counts(96, 0, 70), 0, 1000, 392});
  v.push_back(
      {"persistent_masked", bf, bf, silu, R::kMasked, 1, {16, 0, 32, 1, 0, 33, 31}, 40, 1536, 264});
  v.push_back({"persistent_dense_one_tile_per_cta", bf, bf, none, R::kDense, 1, {19}, 0, 264, 136});
  v.push_back({"persistent_1500_groups", bf, bf, none, R::kContiguous, 1, random_counts(1500, 0, 2),
               0, 136, 64});
  return v;
}

TEST(GemmGpu, DecodePersistentMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  run_candidates(persistent_cases(), GemmKernel::kDecodePersistent);
  // The stream tiles the planner gives what the persistent grid does not take (1500 groups).
  run_candidates(persistent_cases(), GemmKernel::kDecodeStream);
}

TEST(GemmGpu, SplitKMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  using R = detail::GemmRows;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const Activation none = Activation::kNone, silu = Activation::kSiluAndMul;
  std::vector<GemmCase> v;
  v.push_back({"splitk_dense_one_row", bf, bf, none, R::kDense, 1, {1}, 0, 264, 1000});
  v.push_back({"splitk_dense_t32_silu", bf, bf, silu, R::kDense, 1, {32}, 0, 200, 2056});
  v.push_back({"splitk_dense_t33_f16_f32out", f16, f32, none, R::kDense, 1, {33}, 0, 136, 712});
  v.push_back({"splitk_k_short", bf, bf, silu, R::kDense, 1, {5}, 0, 64, 72});
  v.push_back({"splitk_ragged_empty",
               bf,
               f32,
               silu,
               R::kContiguous,
               8,
               {0, 17, 1, 0, 70, 0},
               0,
               128,
               1288});
  v.push_back(
      {"splitk_masked_f16", f16, f16, none, R::kMasked, 1, {0, 1, 40, 0, 33}, 40, 264, 520});
  v.push_back({"splitk_k_zero", bf, bf, silu, R::kContiguous, 1, {3, 0, 5}, 0, 16, 0});
  for (const GemmCase& c : v) {
    // Every candidate split (2..8; k == 0 has none: the decode tiles run it).
    run_candidates({c}, GemmKernel::kDecodeSplitK);
  }
}

// Out-of-range metadata (only visible on the device) is clamped: nothing is read or
// written past the P rows (contiguous) or past max_m (masked).
TEST(GemmGpu, ClampsOutOfRangeMetadata) {
  MOEKIT_REQUIRE_GPU();
  const int64_t P = 40, n = 64, k = 64, guard = 64;
  for (int masked = 0; masked < 2; ++masked) {
    unsigned stand_in = 0;
    detail::GroupedGemmProblem shape;
    shape.num_groups = 3;
    shape.n = n;
    shape.k = k;
    shape.rows = masked ? detail::GemmRows::kMasked : detail::GemmRows::kContiguous;
    shape.alignment = 8;
    shape.max_m = 16;
    shape.m = P;
    shape.tile_counter = &stand_in;
    for (const GemmPlan& plan :
         detail::gemm_plan_candidates(shape, detail::current_gemm_device())) {
      SCOPED_TRACE(to_string(plan) + (masked ? " masked" : " contiguous"));
      const int G = 3, max_m = 16;
      const int64_t rows = masked ? G * max_m : P;
      HostTensor a(DType::kBF16, {rows + guard, k}), b(DType::kBF16, {G, n, k});
      a.fill_normal(rng());
      b.fill_normal(rng(), 0.125);
      HostTensor meta = masked ? i32_tensor({-5, 1000, max_m}) : i32_tensor({50, 10, 1 << 30});
      DeviceTensor a_d(a), b_d(b), meta_d(meta);
      DeviceTensor c_d(DType::kBF16, {rows + guard, n}, 0xFF);
      detail::GroupedGemmProblem p;
      p.a = a_d.data();
      p.b = b_d.data();
      p.c = c_d.data();
      p.num_groups = G;
      p.n = n;
      p.k = k;
      p.rows = masked ? detail::GemmRows::kMasked : detail::GemmRows::kContiguous;
      p.layout_metadata = static_cast<const int32_t*>(meta_d.data());
      p.alignment = 8;
      p.max_m = max_m;
      p.m = P;
      p.plan = plan;
      DeviceTensor counter(DType::kI32, {static_cast<int64_t>(detail::kTileCounterBytes / 4)});
      p.tile_counter = static_cast<unsigned*>(counter.data());
      detail::run_grouped_gemm(p, nullptr);
      ASSERT_EQ(sync_or_die(current_test()), cudaSuccess);
      HostTensor out = c_d.download();
      const uint8_t* bytes = static_cast<const uint8_t*>(out.data());
      int64_t touched = 0;
      for (int64_t i = rows * n * 2; i < (rows + guard) * n * 2; ++i) touched += bytes[i] != 0xFF;
      EXPECT_EQ(touched, 0) << "wrote past the buffer's rows";
    }
  }
}

// ---------------------------------------------------------------------------
// FP8

// Nearest e4m3 code (ties to the even code) by table search: the core's brute-force
// host conversion is too slow for the millions of elements these tests draw.
uint8_t quantize_fp8(float x) {
  static const std::vector<float> mags = [] {
    std::vector<float> m;
    for (int c = 0; c <= 0x7e; ++c) m.push_back(host::fp8e4m3_to_float(static_cast<uint8_t>(c)));
    return m;
  }();
  const float a = std::fabs(x);
  int c = static_cast<int>(std::lower_bound(mags.begin(), mags.end(), a) - mags.begin());
  if (c > 0x7e) {
    c = 0x7e;
  } else if (c > 0) {
    const float lo = a - mags[c - 1], hi = mags[c] - a;
    if (lo < hi || (lo == hi && (c - 1) % 2 == 0)) c = c - 1;
  }
  return static_cast<uint8_t>(c | (std::signbit(x) ? 0x80 : 0));
}

void fill_fp8_normal(HostTensor& t) {
  std::normal_distribution<float> d(0.f, 1.f);
  uint8_t* p = t.as<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = quantize_fp8(d(rng()));
}

TEST(GemmGpuSupport, FastFp8QuantizerMatchesHostConversion) {
  std::normal_distribution<float> d(0.f, 3.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = i < 256 ? host::fp8e4m3_to_float(static_cast<uint8_t>(i)) * 1.03f : d(rng());
    if (std::isnan(x)) continue;
    ASSERT_EQ(quantize_fp8(x), host::float_to_fp8e4m3(x)) << x;
  }
}

// ---------------------------------------------------------------------------
// FP8: every layout, scale mode and activation (gemm.h Fp8Scales)

struct Fp8ModeCase {
  std::string name;
  bool contiguous = true;
  int alignment = 1;        // contiguous
  std::vector<int> counts;  // rows per expert (masked: clamped to max_m by the kernels)
  int64_t max_m = 0;        // masked
  int64_t tail = 0;         // contiguous: padding rows past the last expert's end
  int64_t n = 0, k = 0;
  double a_mag = 1.0, b_mag = 1.0;  // scale magnitudes (extreme-scale cases)
};

const char* scales_name(Fp8Scales s) {
  return s == Fp8Scales::kBlock ? "block" : s == Fp8Scales::kPerChannel ? "channel" : "tensor";
}

// One case in one scale mode and activation: fresh inputs, the CPU reference on the same
// (dequantized-exact) operands, then the planner's plan and every candidate, twice each
// (determinism). Rows outside every expert hold NaN data and NaN scales and keep c's poison.
void run_fp8_mode_case(const Fp8ModeCase& cs, Fp8Scales scales, Activation act,
                       bool fp8_out = false) {
  const bool silu = act == Activation::kSiluAndMul;
  // Block scales with silu_and_mul take N % 64 == 0 (gemm.h): the case's n rounded up.
  const int64_t n = silu && scales == Fp8Scales::kBlock ? (cs.n + 63) / 64 * 64 : cs.n;
  SCOPED_TRACE(cs.name + " [" + scales_name(scales) + (silu ? ", silu" : "") +
               (fp8_out ? ", fp8 out" : "") + ", n=" + std::to_string(n) +
               ", k=" + std::to_string(cs.k) + "]");
  const int64_t E = static_cast<int64_t>(cs.counts.size());
  const int64_t b_rows = silu ? 2 * n : n, KB = (cs.k + 127) / 128;
  std::vector<int32_t> meta, meta_ref;
  std::vector<uint8_t> row_valid;
  int64_t rows = 0;  // rows of a and c in all
  if (cs.contiguous) {
    int64_t end = 0;
    for (int c : cs.counts) {
      const int64_t start = (end + cs.alignment - 1) / cs.alignment * cs.alignment;
      end = start + c;
      meta.push_back(static_cast<int32_t>(end));
    }
    meta_ref = meta;
    rows = end + cs.tail;
    row_valid.assign(rows, 0);
    int64_t prev = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t start = (prev + cs.alignment - 1) / cs.alignment * cs.alignment;
      for (int64_t r = start; r < meta[e]; ++r) row_valid[r] = 1;
      prev = meta[e];
    }
  } else {
    rows = E * cs.max_m;
    row_valid.assign(rows, 0);
    for (int64_t e = 0; e < E; ++e) {
      const int valid = static_cast<int>(std::clamp<int64_t>(cs.counts[e], 0, cs.max_m));
      meta.push_back(cs.counts[e]);
      meta_ref.push_back(valid);
      for (int r = 0; r < valid; ++r) row_valid[e * cs.max_m + r] = 1;
    }
  }
  const auto rows_shape = [&](std::vector<int64_t> last) {
    std::vector<int64_t> sh =
        cs.contiguous ? std::vector<int64_t>{rows} : std::vector<int64_t>{E, cs.max_m};
    sh.insert(sh.end(), last.begin(), last.end());
    return sh;
  };
  HostTensor a(DType::kFP8E4M3, rows_shape({cs.k})), b(DType::kFP8E4M3, {E, b_rows, cs.k});
  HostTensor as, bs;
  switch (scales) {
    case Fp8Scales::kBlock:
      as = HostTensor(DType::kF32, rows_shape({KB}));
      bs = HostTensor(DType::kF32, {E, (b_rows + 127) / 128, KB});
      break;
    case Fp8Scales::kPerChannel:
      as = HostTensor(DType::kF32, rows_shape({}));
      bs = HostTensor(DType::kF32, {E, b_rows});
      break;
    case Fp8Scales::kPerTensor:
      as = HostTensor(DType::kF32, {1});
      bs = HostTensor(DType::kF32, {E});
      break;
  }
  fill_fp8_normal(a);
  fill_fp8_normal(b);
  std::uniform_real_distribution<double> u(0.25, 2.0);
  const double k_root = std::sqrt(static_cast<double>(std::max<int64_t>(cs.k, 1)));
  for (int64_t i = 0; i < as.numel(); ++i) as.set(i, cs.a_mag * u(rng()) / k_root);
  for (int64_t i = 0; i < bs.numel(); ++i) bs.set(i, cs.b_mag * u(rng()));
  // Rows outside every expert: NaN data and (per-row modes) NaN scales, never read.
  const int64_t as_per_row =
      scales == Fp8Scales::kPerTensor ? 0 : (scales == Fp8Scales::kBlock ? KB : 1);
  for (int64_t r = 0; r < rows; ++r) {
    if (row_valid[r]) continue;
    std::memset(a.as<uint8_t>() + r * cs.k, 0x7f, static_cast<size_t>(cs.k));
    for (int64_t j = 0; j < as_per_row; ++j) as.set(r * as_per_row + j, NAN);
  }
  HostTensor meta_h = i32_tensor(meta), meta_r = i32_tensor(meta_ref);
  const std::vector<int64_t> c_shape = rows_shape({n});
  const DType c_dtype = fp8_out ? DType::kFP8E4M3 : DType::kBF16;
  HostTensor ref(c_dtype, c_shape), c_scale(DType::kF32, {1});
  ref.fill_bytes(0xFF);
  // Outputs are O(m = a_mag * b_mag), with silu_and_mul O(m^2) (silu(g) ~ g / 2 for small g):
  // a scale that maps most of them into e4m3's normal range (the tails saturate, in the
  // reference too).
  const double m = cs.a_mag * cs.b_mag;
  c_scale.set(0, silu ? m * m / 16.0 : m / 64.0);
  GroupedGemmFP8Args ha;
  ha.a = a.view();
  ha.a_scale = as.view();
  ha.b = b.view();
  ha.b_scale = bs.view();
  ha.layout_metadata = meta_r.view();
  ha.layout = cs.contiguous ? PermutedLayout::contiguous(cs.alignment) : PermutedLayout::masked(0);
  ha.scales = scales;
  ha.activation = act;
  ha.c = ref.view();
  if (fp8_out) ha.c_scale = c_scale.view();
  reference::moe_grouped_gemm_fp8(ha);

  DeviceTensor a_d(a), b_d(b), as_d(as), bs_d(bs), meta_d(meta_h), cs_d(c_scale);
  GroupedGemmFP8Args da = ha;
  if (fp8_out) da.c_scale = cs_d.view();
  da.a = a_d.view();
  da.a_scale = as_d.view();
  da.b = b_d.view();
  da.b_scale = bs_d.view();
  da.layout_metadata = meta_d.view();
  // The optional workspace: the candidates (both schedules) run with it, the planner's
  // plan without it (the static walk).
  DeviceTensor counter(DType::kI32, {static_cast<int64_t>(detail::kTileCounterBytes / 4)}, 0xFF);
  da.workspace = {counter.data(), grouped_gemm_fp8_workspace_size(da)};
  std::vector<GemmPlan> plans = grouped_gemm_fp8_plan_candidates(da);
  EXPECT_FALSE(plans.empty());
  // k == 0 included (no operand or scale read): the plan's run fills the empty sums.
  EXPECT_EQ(plan_grouped_gemm_fp8(da).kernel, GemmKernel::kFp8Sm90);
  plans.push_back(GemmPlan{});  // marker: the planner's (args.plan = nullptr)
  for (size_t pi = 0; pi < plans.size(); ++pi) {
    const bool planner = pi + 1 == plans.size();
    SCOPED_TRACE(planner ? std::string("planner") : to_string(plans[pi]));
    HostTensor first;
    for (int rep = 0; rep < 2; ++rep) {
      DeviceTensor c_d(c_dtype, c_shape, 0xFF);
      da.c = c_d.view();
      da.plan = planner ? nullptr : &plans[pi];
      da.workspace = planner ? Workspace{} : Workspace{counter.data(), detail::kTileCounterBytes};
      moe_grouped_gemm_fp8(da, nullptr);
      ASSERT_EQ(sync_or_die(current_test()), cudaSuccess);
      HostTensor out = c_d.download();
      if (rep == 1) {
        EXPECT_EQ(std::memcmp(out.data(), first.data(), out.nbytes()), 0) << "not deterministic";
        break;
      }
      // Same rounded inputs: f32 vs f64 accumulation and the bf16 rounding (the bf16 limit,
      // stricter than the SPEC's fp8 3e-2). compare() fails any NaN / Inf in a valid row.
      // An e4m3 c: the SPEC's fp8 limit (one e4m3 rounding of the same value).
      const Tolerance tol = tolerance_for(c_dtype);
      if (rows > 0) {
        Accuracy acc = compare(out.view(), ref.view(), tol, row_valid.data());
        EXPECT_TRUE(acc.pass(tol)) << acc.str() << " over " << acc.count << " elements";
        EXPECT_EQ(acc.nonfinite, 0);
      }
      EXPECT_EQ(poison_bytes_touched(out, row_valid, static_cast<size_t>(n) * dtype_size(c_dtype)),
                0)
          << "bytes written outside every expert's rows";
      first = std::move(out);
    }
    if (fp8_out || planner) continue;
    // Block scales with silu_and_mul on 128 x 256 tiles: the e4m3 c quantized per row in
    // groups of 128 by the epilogue (c_group_scales, the FP8 MLP's block-scaled act), against
    // this plan's bf16 c (`first`): each group's scale is max |c| / 448 of the group (f32
    // values, so within the bf16 rounding of the max), each value c within one e4m3 rounding
    // (2^-4 relative, 2^-10 of the scale below e4m3's normal range) plus c's bf16 rounding;
    // rows outside every expert untouched; deterministic.
    if (scales == Fp8Scales::kBlock && silu && n % 128 == 0 && cs.k > 0 &&
        plans[pi].tile_m == 128 && plans[pi].tile_n == 256) {
      bool launches = false;
      detail::GroupedGemmFP8Problem prob = detail::fp8_problem_of(da, &launches);
      prob.plan = plans[pi];
      const int64_t groups = n / 128;
      HostTensor q_first, s_first;
      for (int rep = 0; rep < 2; ++rep) {
        DeviceTensor q_d(DType::kFP8E4M3, c_shape, 0xFF),
            s_d(DType::kF32, rows_shape({groups}), 0xFF);
        prob.c = q_d.data();
        prob.c_group_scales = static_cast<float*>(s_d.data());
        if (launches) detail::run_grouped_gemm_fp8(prob, nullptr);
        ASSERT_EQ(sync_or_die(current_test()), cudaSuccess);
        HostTensor q_h = q_d.download(), s_h = s_d.download();
        if (rep == 1) {
          EXPECT_EQ(std::memcmp(q_h.data(), q_first.data(), q_h.nbytes()), 0)
              << "not deterministic";
          EXPECT_EQ(std::memcmp(s_h.data(), s_first.data(), s_h.nbytes()), 0)
              << "not deterministic";
          break;
        }
        EXPECT_EQ(poison_bytes_touched(q_h, row_valid, static_cast<size_t>(n)), 0);
        EXPECT_EQ(poison_bytes_touched(s_h, row_valid, static_cast<size_t>(groups) * 4), 0);
        int64_t bad_scales = 0, bad_values = 0;
        for (int64_t r = 0; r < rows; ++r) {
          if (!row_valid[r]) continue;
          for (int64_t g = 0; g < groups; ++g) {
            double amax = 0.0;
            for (int64_t j = 0; j < 128; ++j)
              amax = std::max(amax, std::fabs(first.at(r * n + 128 * g + j)));
            const double want = std::max(amax, 1e-10) / 448.0, got = s_h.at(r * groups + g);
            if (!(std::fabs(got - want) <= 1e-2 * want)) ++bad_scales;
            for (int64_t j = 0; j < 128; ++j) {
              const double v = first.at(r * n + 128 * g + j);
              const double deq = q_h.at(r * n + 128 * g + j) * got;
              if (!(std::fabs(deq - v) <= std::fabs(v) * (0.0625 + 0.008) + got * 0x1p-10))
                ++bad_values;
            }
          }
        }
        EXPECT_EQ(bad_scales, 0) << "group scales off max |c| / 448";
        EXPECT_EQ(bad_values, 0) << "e4m3 values off c by more than one rounding";
        q_first = std::move(q_h);
        s_first = std::move(s_h);
      }
    }
    // A bf16 c's max |c| gathered by the epilogue (c_amax, the FP8 MLP's per-tensor scale):
    // bit for bit the max over the valid rows' stored values (NaN ignored, as the amax pass).
    bool launches = false;
    detail::GroupedGemmFP8Problem prob = detail::fp8_problem_of(da, &launches);
    DeviceTensor c_d(c_dtype, c_shape, 0xFF), amax_d(DType::kI32, {1}, 0x00);
    prob.c = c_d.data();
    prob.c_amax = static_cast<uint32_t*>(amax_d.data());
    prob.plan = plans[pi];
    if (launches) detail::run_grouped_gemm_fp8(prob, nullptr);
    ASSERT_EQ(sync_or_die(current_test()), cudaSuccess);
    const HostTensor out = c_d.download();
    float want = 0.f;
    for (int64_t r = 0; r < rows; ++r) {
      if (!row_valid[r]) continue;
      for (int64_t j = 0; j < n; ++j)
        want = std::fmax(want, std::fabs(static_cast<float>(out.at(r * n + j))));
    }
    uint32_t want_bits = 0;
    std::memcpy(&want_bits, &want, sizeof want);
    const HostTensor got = amax_d.download();
    EXPECT_EQ(static_cast<uint32_t>(got.at(0)), want_bits)
        << "c_amax " << got.at(0) << " vs max |c| " << want;
  }
}

std::vector<Fp8ModeCase> fp8_mode_cases() {
  std::vector<Fp8ModeCase> v;
  const auto contig = [&](std::string name, int alignment, std::vector<int> counts, int64_t tail,
                          int64_t n, int64_t k) {
    Fp8ModeCase c;
    c.name = std::move(name);
    c.alignment = alignment;
    c.counts = std::move(counts);
    c.tail = tail;
    c.n = n;
    c.k = k;
    v.push_back(c);
    return &v.back();
  };
  // Alignment padding between experts and after the last (poisoned, untouched), empty
  // experts, groups of <= 64 and > 64 rows, groups that start mid-tile.
  contig("contig_a16_mixed", 16, {0, 70, 1, 200, 0, 33}, 15, 256, 512);
  // n and k off the tiles (n % 128 = 8, k = 128 + 16).
  contig("contig_odd_nk", 1, {5, 130, 9}, 0, 136, 144);
  contig("contig_p0", 1, {0, 0, 0}, 0, 128, 256);
  contig("contig_p1", 1, {0, 1, 0}, 0, 64, 128);
  contig("contig_p1_padding", 8, {0, 0, 1}, 7, 8, 16);
  // One expert with every row, more k blocks than pipeline stages.
  contig("contig_one_expert_all_rows", 4, {0, 300, 0}, 3, 256, 1024);
  // Many experts, more tiles than SMs (the persistent walk across tiles).
  contig("contig_many_experts", 8, random_counts(40, 0, 100), 0, 512, 256);
  // More 128 x 256 tiles than SMs too (~250: each block runs several, so whatever a kernel
  // keeps in shared memory across tiles, e.g. a tile's staged scales, is reused), groups of
  // up to two m-tiles.
  contig("contig_many_wide_tiles", 1, random_counts(48, 0, 200), 0, 1024, 128);
  // Long k (56 k blocks, DeepSeek-V3's hidden size).
  contig("contig_long_k7168", 1, {3, 70}, 0, 256, 7168);
  // The longest k of fp8_sm90 128x256's whole-k sums (kFp8FastMaxK), >= 256 rows a group on
  // average: the planner's pick in the per-tensor / per-channel modes, at the bf16 tolerance.
  contig("contig_fast_k4096", 1, {250, 300}, 0, 256, 4096);
  // Scales of extreme magnitude.
  contig("contig_scales_tiny", 4, {17, 90}, 2, 128, 256)->a_mag = 1e-6;
  v.back().b_mag = 1e-6;
  contig("contig_scales_huge", 4, {17, 90}, 2, 128, 256)->a_mag = 1e4;
  v.back().b_mag = 1e4;
  contig("contig_scales_mixed", 4, {17, 90}, 2, 128, 256)->a_mag = 1e-6;
  v.back().b_mag = 1e4;
  // Huge a scales beside tiny b scales (2^20 / 2^-20: rows of huge activations quantized
  // against tiny weight scales), outputs ~1; the masked case below, the reverse.
  contig("contig_scales_2p20_2m20", 4, {17, 90}, 2, 128, 256)->a_mag = 0x1p20;
  v.back().b_mag = 0x1p-20;
  // The masked layout in every mode (counts past max_m and negative are clamped).
  Fp8ModeCase m;
  m.name = "masked_edges";
  m.contiguous = false;
  m.counts = {0, 70, 1, 33, 100, -3};
  m.max_m = 72;
  m.n = 200;
  m.k = 400;
  v.push_back(m);
  m.name = "masked_scales_2m20_2p20";
  m.a_mag = 0x1p-20;
  m.b_mag = 0x1p20;
  v.push_back(m);
  // Every masked group empty, in every mode (the block-scaled form: fp8_masked_cases).
  m = Fp8ModeCase{};
  m.name = "masked_all_empty_every_mode";
  m.contiguous = false;
  m.counts = {0, 0, 0};
  m.max_m = 32;
  m.n = 128;
  m.k = 256;
  v.push_back(m);
  return v;
}

// The masked layout with block scales (DeepGEMM's contract) on the edges of the SM90 config
// (128 x 128 x 128 tiles, 6 stages, a as two 64-row boxes).
std::vector<Fp8ModeCase> fp8_masked_cases() {
  struct M {
    const char* name;
    std::vector<int> counts;
    int64_t max_m, n, k;
  };
  const std::vector<M> ms = {
      {"n200_k400_edges", {0, 70, 1, 33}, 70, 200, 400},
      {"n256_k512", {130, 64, 5}, 130, 256, 512},
      {"n136_k144_tails", {17, 2}, 17, 136, 144},
      {"decode_like", random_counts(32, 0, 4), 64, 512, 1024},
      {"all_empty", {0, 0, 0}, 32, 128, 256},
      {"max_m_zero", {0, 0}, 0, 128, 256},
      {"k16", {5, 9}, 9, 8, 16},
      // one group with count = max_m over two m-tiles and more k blocks than stages;
      {"one_group_full_k1024", {256}, 256, 384, 1024},
      // counts past max_m / negative (clamped), n and k off the tile (264 = 2 tiles + 8,
      // 272 = 2 k blocks + 16), max_m off the a box (rows 72..127 of a tile zero-filled);
      {"clamped_counts_tails", {100, 500, -3, 65}, 72, 264, 272},
      // many groups, more tiles than SMs (persistent walk, pipeline phases across tiles),
      // tiles with <= 64 and > 64 valid rows;
      {"many_groups_persistent", random_counts(40, 0, 100), 100, 512, 256},
      // long k (56 k blocks, as ds-v3's up projection).
      {"long_k7168", {3, 70}, 80, 256, 7168},
  };
  std::vector<Fp8ModeCase> v;
  for (const M& m : ms) {
    Fp8ModeCase c;
    c.name = m.name;
    c.contiguous = false;
    c.counts = m.counts;
    c.max_m = m.max_m;
    c.n = m.n;
    c.k = m.k;
    v.push_back(c);
  }
  return v;
}

// The a boxes' boundaries (fp8_grouped_gemm.cu): a tile of <= 48 valid rows loads 1..3
// 16-row boxes, of 49..64 one 64-row box, of more two; a stage's rows no box writes hold an
// earlier stage's bytes. Groups on both sides of each boundary: masked with max_m 49 (48
// rows: 3 small boxes; 49: the 64-row box, its last 15 rows past the slab), 5 (one small
// box, 11 rows past the slab) and 72 (no count clamped), and contiguous groups that all
// start at rows = 15 mod 16 (boxes straddle into the next group; fillers realign), NaN
// padding rows after the last.
std::vector<Fp8ModeCase> fp8_small_box_cases() {
  const std::vector<int> counts = {15, 16, 17, 32, 47, 48, 49, 63, 64, 65};
  std::vector<Fp8ModeCase> v;
  for (const int64_t max_m : {49, 5, 72}) {
    Fp8ModeCase c;
    c.name = "masked_boxes_max_m" + std::to_string(max_m);
    c.contiguous = false;
    c.counts = counts;
    c.max_m = max_m;
    c.n = 256;
    c.k = 384;
    v.push_back(c);
  }
  Fp8ModeCase c;
  c.name = "contig_starts_15_mod_16";
  c.counts = {15};  // the first boundary group starts at row 15
  for (const int count : counts) {
    c.counts.push_back(count);
    c.counts.push_back((16 - count % 16) % 16);  // the next one starts at 15 mod 16 again
  }
  c.tail = 15;
  c.n = 256;
  c.k = 384;
  v.push_back(c);
  return v;
}

TEST(GemmGpu, Fp8SmallBoxBoundariesMatchReference) {
  MOEKIT_REQUIRE_GPU();
  for (const Fp8ModeCase& c : fp8_small_box_cases())
    for (Fp8Scales s : {Fp8Scales::kBlock, Fp8Scales::kPerChannel, Fp8Scales::kPerTensor})
      for (Activation act : {Activation::kNone, Activation::kSiluAndMul}) {
        run_fp8_mode_case(c, s, act);
      }
}

// Stale stage rows under NaN poison: 80 masked groups alternating 17, 5, 40 and 1 valid
// rows (2, 1, 3 and 1 small boxes) of max_m 64, n 256 (2 n-tiles): 160 tiles, more than an
// H200's 132 SMs, so CTAs reuse stages across tiles and a stage's rows past its boxes hold
// an earlier tile's bytes, NaN padding rows (data and scales) among them. The valid rows
// must stay finite and match the reference; the padding rows' outputs keep their poison.
TEST(GemmGpu, Fp8StaleStageRowsUnderNanPoisonMatchReference) {
  MOEKIT_REQUIRE_GPU();
  Fp8ModeCase c;
  c.name = "masked_stale_rows_nan_padding";
  c.contiguous = false;
  const int pattern[] = {17, 5, 40, 1};
  for (int e = 0; e < 80; ++e) c.counts.push_back(pattern[e % 4]);
  c.max_m = 64;
  c.n = 256;
  c.k = 512;
  for (Fp8Scales s : {Fp8Scales::kBlock, Fp8Scales::kPerChannel, Fp8Scales::kPerTensor})
    for (Activation act : {Activation::kNone, Activation::kSiluAndMul}) {
      run_fp8_mode_case(c, s, act);
    }
}

TEST(GemmGpu, Fp8EveryCandidateMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  for (const Fp8ModeCase& c : fp8_masked_cases()) {
    run_fp8_mode_case(c, Fp8Scales::kBlock, Activation::kNone);
  }
}

TEST(GemmGpu, Fp8EveryLayoutScaleModeAndActivationMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  for (const Fp8ModeCase& c : fp8_mode_cases())
    for (Fp8Scales s : {Fp8Scales::kBlock, Fp8Scales::kPerChannel, Fp8Scales::kPerTensor})
      for (Activation act : {Activation::kNone, Activation::kSiluAndMul}) {
        run_fp8_mode_case(c, s, act);
      }
}

// An e4m3 c with its given scale (the down GEMM's FP8 input written by gate_up directly).
TEST(GemmGpu, Fp8OutputWithAGivenScaleMatchesReference) {
  MOEKIT_REQUIRE_GPU();
  for (const Fp8ModeCase& c : fp8_mode_cases()) {
    if (c.name != "contig_a16_mixed" && c.name != "contig_odd_nk" && c.name != "contig_p0" &&
        c.name != "contig_p1" && c.name != "contig_scales_mixed" &&
        c.name != "contig_scales_2p20_2m20" && c.name != "masked_edges" &&
        c.name != "masked_scales_2m20_2p20" && c.name != "masked_all_empty_every_mode") {
      continue;
    }
    for (Fp8Scales s : {Fp8Scales::kBlock, Fp8Scales::kPerChannel, Fp8Scales::kPerTensor})
      for (Activation act : {Activation::kNone, Activation::kSiluAndMul}) {
        run_fp8_mode_case(c, s, act, /*fp8_out=*/true);
      }
  }
}

// k == 0: every valid row is act(0) = 0, as bf16 or e4m3 (0 / c_scale), in every scale mode,
// layout and activation; padding rows keep their poison (the fill run_grouped_gemm_fp8 runs
// for k == 0, under the planner's plan and each candidate).
TEST(GemmGpu, Fp8EmptySumsAreZeroInEveryModeAndOutput) {
  MOEKIT_REQUIRE_GPU();
  std::vector<Fp8ModeCase> cases;
  Fp8ModeCase c;
  c.name = "contig_k0";
  c.alignment = 8;
  c.counts = {0, 70, 1, 200, 0, 33};
  c.tail = 5;
  c.n = 128;
  cases.push_back(c);
  c = Fp8ModeCase{};
  c.name = "masked_k0";
  c.contiguous = false;
  c.counts = {0, 70, 1, 100, -3};
  c.max_m = 72;
  c.n = 64;
  cases.push_back(c);
  for (const Fp8ModeCase& k0 : cases)
    for (Fp8Scales s : {Fp8Scales::kBlock, Fp8Scales::kPerChannel, Fp8Scales::kPerTensor})
      for (Activation act : {Activation::kNone, Activation::kSiluAndMul})
        for (bool fp8_out : {false, true}) run_fp8_mode_case(k0, s, act, fp8_out);
}

}  // namespace
}  // namespace moekit
