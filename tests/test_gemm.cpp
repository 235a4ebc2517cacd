// CPU tests of the grouped GEMMs: references on hand-computed cases, validation
// errors for each kind of bad input, and the planner's rules.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/host_dtype.h"
#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/mma/split_k.h"
#include "gemm/sm90/device.h"
#include "gemm/sm90/tile_math.h"
#include "moekit/error.h"
#include "moekit/gemm.h"
#include "moekit/reference.h"
#include "reference/host_tensor.h"

namespace moekit {
namespace {

HostTensor meta_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::kI32, {static_cast<int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * 4);
  return t;
}

double silu(double z) {
  return z / (1.0 + std::exp(-z));
}

// a: 5 rows x 8, contiguous alignment 2 over 2 experts: expert 0 rows [0, 1),
// padding row 1, expert 1 rows [2, 5). b[e] rows are scaled unit vectors.
TEST(GemmReference, ContiguousHandComputed) {
  HostTensor a(DType::kF32, {5, 8}), b(DType::kF32, {2, 8, 8}), c(DType::kF32, {5, 8});
  for (int r = 0; r < 5; ++r)
    for (int k = 0; k < 8; ++k) a.set(r * 8 + k, r + 0.5 * k);
  // b[0] = identity; b[1] = 2 * (row j picks column 7 - j).
  for (int j = 0; j < 8; ++j) {
    b.set(j * 8 + j, 1.0);
    b.set(64 + j * 8 + (7 - j), 2.0);
  }
  c.fill_bytes(0xFF);
  HostTensor meta = meta_tensor({1, 5});
  GroupedGemmArgs args;
  args.a = a.view();
  args.b = b.view();
  args.c = c.view();
  args.layout_metadata = meta.view();
  args.layout = PermutedLayout::contiguous(2);
  reference::moe_grouped_gemm(args);
  for (int j = 0; j < 8; ++j) {
    EXPECT_DOUBLE_EQ(c.at(j), 0 + 0.5 * j);  // row 0, expert 0
    EXPECT_TRUE(std::isnan(c.at(8 + j)));    // padding row untouched (0xFFFFFFFF = NaN)
    for (int r = 2; r < 5; ++r) EXPECT_DOUBLE_EQ(c.at(r * 8 + j), 2 * (r + 0.5 * (7 - j)));
  }
}

TEST(GemmReference, SiluAndMulRoundsOnceToOutput) {
  // One expert, one row a = [1, 0, ..], gate row 0 = 3*e0, up row 0 = 0.7*e0 (N = 8).
  HostTensor a(DType::kBF16, {1, 8}), b(DType::kBF16, {1, 16, 8}), c(DType::kBF16, {1, 8});
  a.set(0, 1.0);
  for (int j = 0; j < 8; ++j) {
    b.set(j * 8, 0.25 * (j + 1));        // gate_j = 0.25 (j+1)
    b.set((8 + j) * 8, -0.5 * (j + 1));  // up_j = -0.5 (j+1)
  }
  HostTensor meta = meta_tensor({1});
  GroupedGemmArgs args;
  args.a = a.view();
  args.b = b.view();
  args.c = c.view();
  args.layout_metadata = meta.view();
  args.activation = Activation::kSiluAndMul;
  reference::moe_grouped_gemm(args);
  for (int j = 0; j < 8; ++j) {
    const double want = host::round_to(DType::kBF16, silu(0.25 * (j + 1)) * (-0.5 * (j + 1)));
    EXPECT_DOUBLE_EQ(c.at(j), want);
  }
}

TEST(GemmReference, MaskedLeavesRowsPastCountUntouched) {
  HostTensor a(DType::kF16, {2, 3, 8}), b(DType::kF16, {2, 8, 8}), c(DType::kF32, {2, 3, 8});
  for (int i = 0; i < 48; ++i) a.set(i, 1.0);
  for (int i = 0; i < 128; ++i) b.set(i, i < 64 ? 0.5 : 0.25);
  c.fill_bytes(0xFF);
  HostTensor meta = meta_tensor({2, 0});
  GroupedGemmArgs args;
  args.a = a.view();
  args.b = b.view();
  args.c = c.view();
  args.layout_metadata = meta.view();
  args.layout = PermutedLayout::masked(3);
  reference::moe_grouped_gemm(args);
  for (int j = 0; j < 8; ++j) {
    EXPECT_DOUBLE_EQ(c.at(0 * 8 + j), 4.0);
    EXPECT_DOUBLE_EQ(c.at(1 * 8 + j), 4.0);
    EXPECT_TRUE(std::isnan(c.at(2 * 8 + j)));
    for (int r = 3; r < 6; ++r) EXPECT_TRUE(std::isnan(c.at(r * 8 + j)));
  }
}

TEST(GemmReference, Fp8AppliesScalesPerBlock) {
  // Kd = 144: two k blocks (128 + 16); N = 136: two n blocks (128 + 8).
  const int64_t Kd = 144, N = 136;
  HostTensor a(DType::kFP8E4M3, {1, 2, Kd}), b(DType::kFP8E4M3, {1, N, Kd});
  HostTensor as(DType::kF32, {1, 2, 2}), bs(DType::kF32, {1, 2, 2}), c(DType::kBF16, {1, 2, N});
  for (int k = 0; k < Kd; ++k) a.set(k, 1.0);  // row 0 all ones; row 1 (masked out) zeros
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < Kd; ++k) b.set(n * Kd + k, k < 128 ? 0.5 : 2.0);
  as.set(0, 2.0);   // row 0, kb 0
  as.set(1, 3.0);   // row 0, kb 1
  bs.set(0, 1.0);   // n block 0, kb 0
  bs.set(1, 0.5);   // n block 0, kb 1
  bs.set(2, 4.0);   // n block 1, kb 0
  bs.set(3, 0.25);  // n block 1, kb 1
  c.fill_bytes(0xFF);
  HostTensor meta = meta_tensor({1});
  GroupedGemmFP8Args args;
  args.a = a.view();
  args.a_scale = as.view();
  args.b = b.view();
  args.b_scale = bs.view();
  args.layout_metadata = meta.view();
  args.c = c.view();
  reference::moe_grouped_gemm_fp8(args);
  // block 0 partial = 128 * 0.5 = 64; block 1 partial = 16 * 2 = 32.
  EXPECT_DOUBLE_EQ(c.at(0), 2.0 * 1.0 * 64 + 3.0 * 0.5 * 32);     // 176
  EXPECT_DOUBLE_EQ(c.at(130), 2.0 * 4.0 * 64 + 3.0 * 0.25 * 32);  // 536
  EXPECT_TRUE(std::isnan(c.at(N + 5)));                           // row 1 untouched
}

// Contiguous (alignment 4) rows with per-channel, per-tensor and block scales, and
// silu_and_mul: hand-computed values, padding rows untouched.
TEST(GemmReference, Fp8ContiguousEveryScaleMode) {
  const int64_t Kd = 144, N = 8, P = 6;  // expert 0: row 0; padding 1..3; expert 1: rows 4, 5
  HostTensor a(DType::kFP8E4M3, {P, Kd}), b(DType::kFP8E4M3, {2, 2 * N, Kd});
  for (int64_t r = 0; r < P; ++r)
    for (int64_t k = 0; k < Kd; ++k) a.set(r * Kd + k, r == 5 ? 2.0 : 1.0);
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t j = 0; j < 2 * N; ++j)
      for (int64_t k = 0; k < Kd; ++k) b.set((e * 2 * N + j) * Kd + k, k < 128 ? 0.5 : 1.0);
  // a . b_j = 128 * 0.5 + 16 * 1 = 80 (row 5: 160); over the k blocks 64 | 16 (128 | 32).
  HostTensor meta = meta_tensor({1, 6});
  const auto run = [&](Fp8Scales scales, Activation act, const HostTensor& as,
                       const HostTensor& bs) {
    HostTensor c(DType::kBF16, {P, N});
    c.fill_bytes(0xFF);
    GroupedGemmFP8Args args;
    args.a = a.view();
    args.a_scale = as.view();
    args.b = b.view();
    args.b_scale = bs.view();
    if (act == Activation::kNone) args.b = make_view(b.data(), DType::kFP8E4M3, {2, N, Kd});
    args.layout_metadata = meta.view();
    args.layout = PermutedLayout::contiguous(4);
    args.scales = scales;
    args.activation = act;
    args.c = c.view();
    reference::moe_grouped_gemm_fp8(args);
    for (int64_t r = 1; r < 4; ++r) EXPECT_TRUE(std::isnan(c.at(r * N))) << "padding row " << r;
    return c;
  };
  {  // per-tensor: a_scale 0.5, b_scale {2, 3} per expert
    HostTensor as(DType::kF32, {1}), bs(DType::kF32, {2});
    as.set(0, 0.5);
    bs.set(0, 2.0);
    bs.set(1, 3.0);
    HostTensor c = run(Fp8Scales::kPerTensor, Activation::kNone, as, bs);
    EXPECT_DOUBLE_EQ(c.at(0), 80.0);           // 0.5 * 2 * 80
    EXPECT_DOUBLE_EQ(c.at(4 * N), 120.0);      // 0.5 * 3 * 80
    EXPECT_DOUBLE_EQ(c.at(5 * N + 7), 240.0);  // 0.5 * 3 * 160
  }
  {  // per-channel: a_scale per row, b_scale per (expert, b row)
    HostTensor as(DType::kF32, {P}), bs(DType::kF32, {2, N});
    for (int64_t r = 0; r < P; ++r) as.set(r, 0.25 * (r + 1));
    for (int64_t i = 0; i < 2 * N; ++i) bs.set(i, i < N ? 1.0 : 0.5 * (i - N + 1));
    HostTensor c = run(Fp8Scales::kPerChannel, Activation::kNone, as, bs);
    EXPECT_DOUBLE_EQ(c.at(3), 0.25 * 1.0 * 80);          // row 0, expert 0, column 3
    EXPECT_DOUBLE_EQ(c.at(4 * N + 2), 1.25 * 1.5 * 80);  // row 4, expert 1, column 2
    EXPECT_DOUBLE_EQ(c.at(5 * N + 7), 1.5 * 4.0 * 160);  // row 5, expert 1, column 7
  }
  {  // per-tensor into an e4m3 c with its scale: e4m3(80 / 0.5) = 160, e4m3(240 / 0.5) = 448
    // (480 saturated)
    HostTensor as(DType::kF32, {1}), bs(DType::kF32, {2}), cs(DType::kF32, {1});
    as.set(0, 0.5);
    bs.set(0, 2.0);
    bs.set(1, 3.0);
    cs.set(0, 0.5);
    HostTensor c(DType::kFP8E4M3, {P, N});
    c.fill_bytes(0xEE);
    GroupedGemmFP8Args args;
    args.a = a.view();
    args.a_scale = as.view();
    args.b = make_view(b.data(), DType::kFP8E4M3, {2, N, Kd});
    args.b_scale = bs.view();
    args.layout_metadata = meta.view();
    args.layout = PermutedLayout::contiguous(4);
    args.scales = Fp8Scales::kPerTensor;
    args.c = c.view();
    args.c_scale = cs.view();
    reference::moe_grouped_gemm_fp8(args);
    EXPECT_DOUBLE_EQ(c.at(0), 160.0);
    EXPECT_DOUBLE_EQ(c.at(5 * N + 7), 448.0);
    EXPECT_EQ(c.as<uint8_t>()[2 * N], 0xEE);  // padding row untouched
  }
  {  // block scales with silu_and_mul: b rows 0..7 gate, 8..15 up, one 128-row block
    HostTensor as(DType::kF32, {P, 2}), bs(DType::kF32, {2, 1, 2});
    for (int64_t i = 0; i < P * 2; ++i) as.set(i, i % 2 ? 0.5 : 1.0);  // kb 0: 1, kb 1: 0.5
    for (int64_t i = 0; i < 4; ++i) bs.set(i, 1.0 / (i + 1));          // e0: 1, 1/2; e1: 1/3, 1/4
    HostTensor c = run(Fp8Scales::kBlock, Activation::kSiluAndMul, as, bs);
    const double g0 = 1.0 * 1.0 * 64 + 0.5 * 0.5 * 16;  // 68 (gate = up)
    const double g1 = 1.0 / 3 * 64 + 0.5 * 0.25 * 16;   // row 4
    EXPECT_NEAR(c.at(0), host::round_to(DType::kBF16, silu(g0) * g0), 1e-9);
    EXPECT_NEAR(c.at(4 * N), host::round_to(DType::kBF16, silu(g1) * g1), 1e-9);
  }
}

// ---------------------------------------------------------------------------
// Validation: each bad input names its argument. Views point at a host buffer:
// validation throws before anything is launched.

alignas(256) static uint8_t g_buf[1 << 16];

TensorView view(DType dt, std::initializer_list<int64_t> shape, size_t offset = 0) {
  return make_view(g_buf + offset, dt, shape);
}

// fn throws an Error naming argument `arg` and, when given, saying `also` (the check meant, where
// another check of the same argument could fire first).
void expect_arg_error(const std::function<void()>& fn, const std::string& arg,
                      const std::string& also = "") {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming '" << arg << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("argument '" + arg + "'"), std::string::npos) << what;
    if (!also.empty()) EXPECT_NE(what.find(also), std::string::npos) << what;
  }
}

// Valid GEMMs, their views disjoint in g_buf (so that no check of c is met by the overlap
// check instead).
GroupedGemmArgs good_contiguous() {
  GroupedGemmArgs a;
  a.a = view(DType::kBF16, {10, 16});
  a.b = view(DType::kBF16, {2, 24, 16}, 512);
  a.layout_metadata = view(DType::kI32, {2}, 2304);
  a.layout = PermutedLayout::contiguous(1);
  a.c = view(DType::kBF16, {10, 24}, 2560);
  return a;
}

GroupedGemmArgs good_masked() {
  GroupedGemmArgs a;
  a.a = view(DType::kF16, {2, 5, 16});
  a.b = view(DType::kF16, {2, 32, 16}, 512);
  a.layout_metadata = view(DType::kI32, {2}, 2816);
  a.layout = PermutedLayout::masked(5);
  a.activation = Activation::kSiluAndMul;
  a.c = view(DType::kF32, {2, 5, 16}, 3072);
  return a;
}

TEST(GemmValidation, RejectsEachBadInput) {
  // The good args pass every check: without a GPU they stop at the launch target.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    for (auto make : {good_contiguous, good_masked}) {
      expect_arg_error([&] { moe_grouped_gemm(make(), nullptr); }, "stream",
                       "expected a CUDA device to launch on");
    }
  }
  using M = std::function<void(GroupedGemmArgs&)>;
  auto bad = [](GroupedGemmArgs args, const M& mutate, const std::string& arg) {
    mutate(args);
    expect_arg_error([&] { moe_grouped_gemm(args, nullptr); }, arg);
  };
  for (auto make : {good_contiguous, good_masked}) {
    bad(
        make(), [](auto& x) { x.a.dtype = DType::kF32; }, "a");
    bad(
        make(), [](auto& x) { x.b.dtype = x.a.dtype == DType::kBF16 ? DType::kF16 : DType::kBF16; },
        "b");
    bad(
        make(),
        [](auto& x) {
          x.b = view(x.a.dtype, {2, 24});
        },
        "b");
    bad(
        make(), [](auto& x) { x.layout_metadata = view(DType::kF32, {2}); }, "layout_metadata");
    bad(
        make(), [](auto& x) { x.layout_metadata = view(DType::kI32, {3}); }, "layout_metadata");
    bad(
        make(), [](auto& x) { x.c.dtype = DType::kI32; }, "c");
    bad(
        make(), [](auto& x) { x.c = TensorView{}; }, "c");
    bad(
        make(), [](auto& x) { x.a.data = g_buf + 2; }, "a");  // not 16-byte aligned
    bad(
        make(), [](auto& x) { x.b.data = nullptr; }, "b");
    bad(
        make(), [](auto& x) { x.a.stride[0] += 8; }, "a");  // not contiguous
    bad(
        make(), [](auto& x) { x.activation = static_cast<Activation>(7); }, "activation");
    // The optional workspace: given, it must be big enough and 256-byte aligned.
    const size_t ws = grouped_gemm_workspace_size(make());
    bad(
        make(),
        [&](auto& x) {
          x.workspace = {g_buf, ws - 1};
        },
        "workspace");
    bad(
        make(),
        [&](auto& x) {
          x.workspace = {nullptr, ws};
        },
        "workspace");
    bad(
        make(),
        [&](auto& x) {
          x.workspace = {g_buf + 16, ws};
        },
        "workspace");
  }
  // Contiguous specifics.
  bad(
      good_contiguous(),
      [](auto& x) {
        x.a = view(DType::kBF16, {10, 24});
      },
      "a");  // Kd
  bad(
      good_contiguous(),
      [](auto& x) {
        x.a = view(DType::kBF16, {2, 10, 16});
      },
      "a");
  bad(
      good_contiguous(),
      [](auto& x) {
        x.b = view(DType::kBF16, {2, 24, 12});
      },
      "b");  // Kd % 8
  bad(
      good_contiguous(),
      [](auto& x) {
        x.b = view(DType::kBF16, {2, 20, 16});
      },
      "b");  // N % 8
  {
    GroupedGemmArgs x = good_contiguous();
    x.b = view(DType::kBF16, {1025, 24, 16});
    expect_arg_error([&] { moe_grouped_gemm(x, nullptr); }, "b", "at most 1024 experts");
  }
  bad(
      good_contiguous(),
      [](auto& x) {
        x.c = view(DType::kBF16, {9, 24});
      },
      "c");
  bad(
      good_contiguous(),
      [](auto& x) {
        x.c = view(DType::kBF16, {10, 16});
      },
      "c");
  bad(
      good_contiguous(),
      [](auto& x) {
        x.c = view(DType::kF16, {10, 24});
      },
      "c");  // not a's
  bad(
      good_contiguous(), [](auto& x) { x.layout.alignment = 0; }, "layout.alignment");
  // silu_and_mul: b's 24 rows are 2N, N = 12 is not a multiple of 8.
  bad(
      good_contiguous(), [](auto& x) { x.activation = Activation::kSiluAndMul; }, "b");
  // Masked specifics.
  bad(
      good_masked(), [](auto& x) { x.layout.max_m = 6; }, "a");
  bad(
      good_masked(), [](auto& x) { x.layout.max_m = -1; }, "layout.max_m");
  bad(
      good_masked(),
      [](auto& x) {
        x.a = view(DType::kF16, {3, 5, 16});
      },
      "a");  // E
  bad(
      good_masked(),
      [](auto& x) {
        x.b = view(DType::kF16, {2, 24, 16});
      },
      "b");  // 2N, N=12
  bad(
      good_masked(),
      [](auto& x) {
        x.b = view(DType::kF16, {2, 34, 16});
      },
      "b");  // N = 17
  bad(
      good_masked(),
      [](auto& x) {
        x.c = view(DType::kF32, {2, 5, 32});
      },
      "c");  // N, not 2N
  bad(
      good_masked(),
      [](auto& x) {
        x.c = view(DType::kF32, {5, 16});
      },
      "c");
  bad(
      good_masked(), [](auto& x) { x.layout.kind = static_cast<PermutedLayout::Kind>(5); },
      "layout.kind");
}

// A valid masked FP8 GEMM (E = 2, max_m = 4, N = 136, Kd = 144), its views disjoint in g_buf
// (so that no check of c is met by the overlap check instead).
GroupedGemmFP8Args good_fp8() {
  GroupedGemmFP8Args a;
  a.a = view(DType::kFP8E4M3, {2, 4, 144});
  a.a_scale = view(DType::kF32, {2, 4, 2}, 1280);
  a.b = view(DType::kFP8E4M3, {2, 136, 144}, 1536);
  a.b_scale = view(DType::kF32, {2, 2, 2}, 40960);
  a.layout_metadata = view(DType::kI32, {2}, 41216);
  a.c = view(DType::kBF16, {2, 4, 136}, 41472);
  return a;
}

TEST(GemmValidation, Fp8RejectsEachBadInput) {
  // good_fp8() passes every check: without a GPU it stops at the launch target.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    expect_arg_error([] { moe_grouped_gemm_fp8(good_fp8(), nullptr); }, "stream",
                     "expected a CUDA device to launch on");
  }
  using M = std::function<void(GroupedGemmFP8Args&)>;
  auto bad = [](const M& mutate, const std::string& arg) {
    GroupedGemmFP8Args args = good_fp8();
    mutate(args);
    expect_arg_error([&] { moe_grouped_gemm_fp8(args, nullptr); }, arg);
  };
  bad([](auto& x) { x.a.dtype = DType::kBF16; }, "a");
  bad([](auto& x) { x.a = view(DType::kFP8E4M3, {2, 4, 136}); }, "a");  // Kd % 16
  {
    GroupedGemmFP8Args x = good_fp8();
    x.a = view(DType::kFP8E4M3, {1025, 4, 144});
    expect_arg_error([&] { moe_grouped_gemm_fp8(x, nullptr); }, "a", "at most 1024 experts");
  }
  bad([](auto& x) { x.b = view(DType::kFP8E4M3, {2, 136, 128}); }, "b");  // Kd mismatch
  bad([](auto& x) { x.b = view(DType::kFP8E4M3, {3, 136, 144}); }, "b");  // E mismatch
  bad([](auto& x) { x.b = view(DType::kFP8E4M3, {2, 132, 144}); }, "b");  // N % 8
  bad([](auto& x) { x.b.dtype = DType::kBF16; }, "b");
  bad([](auto& x) { x.a_scale = view(DType::kF32, {2, 4, 1}); }, "a_scale");  // floor, not ceil
  bad([](auto& x) { x.a_scale.dtype = DType::kBF16; }, "a_scale");
  bad([](auto& x) { x.b_scale = view(DType::kF32, {2, 1, 2}); }, "b_scale");
  bad([](auto& x) { x.b_scale = TensorView{}; }, "b_scale");
  bad([](auto& x) { x.layout_metadata = view(DType::kI32, {4}); }, "layout_metadata");
  bad([](auto& x) { x.c.dtype = DType::kF32; }, "c");
  bad([](auto& x) { x.c = view(DType::kBF16, {2, 5, 136}); }, "c");
  bad([](auto& x) { x.a.data = g_buf + 8; }, "a");
  // The optional workspace: given, it must be big enough and 256-byte aligned.
  const size_t ws = grouped_gemm_fp8_workspace_size(good_fp8());
  EXPECT_EQ(ws, detail::kTileCounterBytes);
  bad([&](auto& x) { x.workspace = {g_buf, ws - 1}; }, "workspace");
  bad([&](auto& x) { x.workspace = {nullptr, ws}; }, "workspace");
  bad([&](auto& x) { x.workspace = {g_buf + 16, ws}; }, "workspace");
}

// A valid contiguous FP8 GEMM (P = 40 rows, E = 2, N = 24, Kd = 256) of `scales`, its views
// disjoint in g_buf; rows = 0 makes it launch nothing (valid without a GPU).
GroupedGemmFP8Args good_fp8_contiguous(Fp8Scales scales, int64_t rows = 40) {
  GroupedGemmFP8Args a;
  a.layout = PermutedLayout::contiguous(4);
  a.scales = scales;
  a.a = view(DType::kFP8E4M3, {rows, 256}, 0);
  a.b = view(DType::kFP8E4M3, {2, 24, 256}, 12288);
  a.layout_metadata = view(DType::kI32, {2}, 24832);
  a.c = view(DType::kBF16, {rows, 24}, 25088);
  switch (scales) {
    case Fp8Scales::kBlock:
      a.a_scale = view(DType::kF32, {rows, 2}, 10240);
      a.b_scale = view(DType::kF32, {2, 1, 2}, 24576);
      break;
    case Fp8Scales::kPerChannel:
      a.a_scale = view(DType::kF32, {rows}, 10240);
      a.b_scale = view(DType::kF32, {2, 24}, 24576);
      break;
    case Fp8Scales::kPerTensor:
      a.a_scale = view(DType::kF32, {1}, 10240);
      a.b_scale = view(DType::kF32, {2}, 24576);
      break;
  }
  return a;
}

// Every contiguous / scale-mode / activation rejection names its argument.
TEST(GemmValidation, Fp8ContiguousRejectsEachBadInput) {
  // good_fp8_contiguous(s) passes every check: without a GPU it stops at the launch target.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    for (Fp8Scales s : {Fp8Scales::kBlock, Fp8Scales::kPerChannel, Fp8Scales::kPerTensor}) {
      expect_arg_error([&] { moe_grouped_gemm_fp8(good_fp8_contiguous(s), nullptr); }, "stream",
                       "expected a CUDA device to launch on");
    }
  }
  using M = std::function<void(GroupedGemmFP8Args&)>;
  auto bad = [](Fp8Scales scales, const M& mutate, const std::string& arg) {
    GroupedGemmFP8Args args = good_fp8_contiguous(scales);
    mutate(args);
    expect_arg_error([&] { moe_grouped_gemm_fp8(args, nullptr); }, arg);
  };
  const auto B = Fp8Scales::kBlock, C = Fp8Scales::kPerChannel, T = Fp8Scales::kPerTensor;
  for (Fp8Scales s : {B, C, T}) {
    bad(
        s,
        [](auto& x) {
          x.a = view(DType::kFP8E4M3, {2, 20, 256});
        },
        "a");  // masked rank
    bad(
        s,
        [](auto& x) {
          x.a = view(DType::kFP8E4M3, {40, 136});
        },
        "a");  // Kd % 16
    bad(
        s, [](auto& x) { x.a.dtype = DType::kBF16; }, "a");
    bad(
        s,
        [](auto& x) {
          x.b = view(DType::kFP8E4M3, {2, 24, 128}, 12288);
        },
        "b");  // Kd
    bad(
        s,
        [](auto& x) {
          x.b = view(DType::kFP8E4M3, {2, 20, 256}, 12288);
        },
        "b");  // N % 8
    {
      GroupedGemmFP8Args x = good_fp8_contiguous(s);
      x.b = view(DType::kFP8E4M3, {1025, 8, 256}, 12288);  // Kd as a's: the expert count alone
      expect_arg_error([&] { moe_grouped_gemm_fp8(x, nullptr); }, "b", "at most 1024 experts");
    }
    bad(
        s, [](auto& x) { x.a_scale.dtype = DType::kBF16; }, "a_scale");
    bad(
        s, [](auto& x) { x.b_scale = TensorView{}; }, "b_scale");
    bad(
        s, [](auto& x) { x.layout_metadata = view(DType::kI32, {3}, 24832); }, "layout_metadata");
    bad(
        s,
        [](auto& x) {
          x.c = view(DType::kBF16, {40, 16}, 25088);
        },
        "c");
    bad(
        s,
        [](auto& x) {
          x.c = view(DType::kBF16, {2, 20, 24}, 25088);
        },
        "c");
    bad(
        s, [](auto& x) { x.c.dtype = DType::kF32; }, "c");
    bad(
        s,
        [](auto& x) {
          x.c = view(DType::kBF16, {40, 24}, 0);
        },
        "c");  // overlaps a
    bad(
        s, [](auto& x) { x.layout.alignment = 0; }, "layout.alignment");
    bad(
        s, [](auto& x) { x.layout.kind = static_cast<PermutedLayout::Kind>(5); }, "layout.kind");
    bad(
        s, [](auto& x) { x.activation = static_cast<Activation>(9); }, "activation");
    // silu_and_mul: b holds 2N rows (24 = 2 x 12: N % 8 fails), an even count.
    bad(
        s, [](auto& x) { x.activation = Activation::kSiluAndMul; }, "b");
    bad(
        s,
        [](auto& x) {
          x.activation = Activation::kSiluAndMul;
          x.b = view(DType::kFP8E4M3, {2, 17, 256}, 12288);
        },
        "b");
  }
  // The scale tensors of each mode, and those of another mode.
  bad(
      B,
      [](auto& x) {
        x.a_scale = view(DType::kF32, {40, 1}, 10240);
      },
      "a_scale");
  bad(
      B, [](auto& x) { x.a_scale = view(DType::kF32, {40}, 10240); }, "a_scale");
  bad(
      B,
      [](auto& x) {
        x.a_scale = view(DType::kF32, {2, 20, 2}, 10240);
      },
      "a_scale");
  bad(
      B,
      [](auto& x) {
        x.b_scale = view(DType::kF32, {2, 2, 2}, 24576);
      },
      "b_scale");
  bad(
      B,
      [](auto& x) {
        x.b_scale = view(DType::kF32, {2, 24}, 24576);
      },
      "b_scale");
  bad(
      C,
      [](auto& x) {
        x.a_scale = view(DType::kF32, {40, 2}, 10240);
      },
      "a_scale");
  bad(
      C, [](auto& x) { x.a_scale = view(DType::kF32, {39}, 10240); }, "a_scale");
  bad(
      C,
      [](auto& x) {
        x.b_scale = view(DType::kF32, {2, 1, 2}, 24576);
      },
      "b_scale");
  bad(
      C,
      [](auto& x) {
        x.b_scale = view(DType::kF32, {2, 12}, 24576);
      },
      "b_scale");
  bad(
      T, [](auto& x) { x.a_scale = view(DType::kF32, {40}, 10240); }, "a_scale");
  bad(
      T, [](auto& x) { x.b_scale = view(DType::kF32, {1}, 24576); }, "b_scale");
  bad(
      T,
      [](auto& x) {
        x.b_scale = view(DType::kF32, {2, 24}, 24576);
      },
      "b_scale");
  bad(
      B, [](auto& x) { x.scales = static_cast<Fp8Scales>(7); }, "scales");
  // Block scales with silu_and_mul: N % 64 (b [2, 32, 256] = 2 x 16 rows).
  bad(
      B,
      [](auto& x) {
        x.activation = Activation::kSiluAndMul;
        x.b = view(DType::kFP8E4M3, {2, 32, 256}, 12288);
        x.c = view(DType::kBF16, {40, 16}, 25088);
      },
      "b");
  // An fp8e4m3 c takes its scale c_scale [1] f32; a bf16 c none.
  for (Fp8Scales s : {B, C, T}) {
    bad(
        s, [](auto& x) { x.c.dtype = DType::kFP8E4M3; }, "c_scale");
    bad(
        s,
        [](auto& x) {
          x.c.dtype = DType::kFP8E4M3;
          x.c_scale = view(DType::kF32, {2}, 30720);
        },
        "c_scale");
    bad(
        s,
        [](auto& x) {
          x.c.dtype = DType::kFP8E4M3;
          x.c_scale = view(DType::kBF16, {1}, 30720);
        },
        "c_scale");
    bad(
        s, [](auto& x) { x.c_scale = view(DType::kF32, {1}, 30720); }, "c_scale");
    bad(
        s, [](auto& x) { x.c.dtype = DType::kF16; }, "c");
  }
  // The masked layout's max_m: 0 or a's dim 1.
  GroupedGemmFP8Args masked = good_fp8();
  masked.layout = PermutedLayout::masked(5);
  expect_arg_error([&] { moe_grouped_gemm_fp8(masked, nullptr); }, "layout.max_m");
}

// Kd past 2^31 (the SM90 kernel's 32-bit TMA coordinates), as moe_grouped_gemm refuses it:
// an argument error naming a's dim, in both layouts.
TEST(GemmValidation, Fp8RejectsKdPast32Bits) {
  const int64_t kd = (int64_t{1} << 31) + 16;
  const auto error = [](const GroupedGemmFP8Args& args) -> std::string {
    try {
      moe_grouped_gemm_fp8(args, nullptr);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  GroupedGemmFP8Args masked = good_fp8();
  masked.a = view(DType::kFP8E4M3, {2, 4, kd});
  EXPECT_NE(error(masked).find("argument 'a': expected at most 2^31-1 columns Kd (dim 2)"),
            std::string::npos)
      << error(masked);
  GroupedGemmFP8Args contiguous = good_fp8_contiguous(Fp8Scales::kBlock);
  contiguous.a = view(DType::kFP8E4M3, {40, kd});
  EXPECT_NE(error(contiguous).find("argument 'a': expected at most 2^31-1 columns Kd (dim 1)"),
            std::string::npos)
      << error(contiguous);
}

// Valid FP8 arguments of every layout, scale mode and activation pass validation (no rows:
// nothing launches, so no GPU is needed).
TEST(GemmValidation, Fp8AcceptsEveryModeAndLayout) {
  for (Fp8Scales s : {Fp8Scales::kBlock, Fp8Scales::kPerChannel, Fp8Scales::kPerTensor}) {
    GroupedGemmFP8Args args = good_fp8_contiguous(s, 0);
    EXPECT_NO_THROW(moe_grouped_gemm_fp8(args, nullptr)) << static_cast<int>(s);
    // silu_and_mul: b [2, 2N = 24, 256] -> N = 12 fails; b [2, 16, 256] (N = 8) passes
    // per-channel / per-tensor, b [2, 128, 256] (N = 64) block scales.
    args.activation = Activation::kSiluAndMul;
    const int64_t b_rows = s == Fp8Scales::kBlock ? 128 : 16;
    args.b = view(DType::kFP8E4M3, {2, b_rows, 256}, 12288);
    args.c = view(DType::kBF16, {0, b_rows / 2}, 25088);
    if (s == Fp8Scales::kPerChannel) args.b_scale = view(DType::kF32, {2, b_rows}, 10240);
    if (s == Fp8Scales::kBlock) args.b_scale = view(DType::kF32, {2, 1, 2}, 10240);
    EXPECT_NO_THROW(moe_grouped_gemm_fp8(args, nullptr)) << static_cast<int>(s) << " silu";
    args.c.dtype = DType::kFP8E4M3;  // with its scale
    args.c_scale = view(DType::kF32, {1}, 30720);
    EXPECT_NO_THROW(moe_grouped_gemm_fp8(args, nullptr)) << static_cast<int>(s) << " fp8 c";
  }
  GroupedGemmFP8Args masked = good_fp8();
  masked.layout = PermutedLayout::masked(4);  // = a's dim 1
  masked.a = view(DType::kFP8E4M3, {2, 0, 144});
  masked.a_scale = view(DType::kF32, {2, 0, 2});
  masked.c = view(DType::kBF16, {2, 0, 136});
  masked.layout = PermutedLayout::masked(0);
  EXPECT_NO_THROW(moe_grouped_gemm_fp8(masked, nullptr));
}

TEST(GemmValidation, MessageSaysWhatWasExpectedAndWhatCame) {
  GroupedGemmArgs args = good_contiguous();
  args.b = view(DType::kBF16, {2, 24, 24});
  try {
    moe_grouped_gemm(args, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "moekit::moe_grouped_gemm: argument 'a': expected Kd = 24 columns (b's dim 2), got "
              "bf16[10, 16]");
  }
}

// ---------------------------------------------------------------------------
// The planner's rules (docs/gemm.md) on an H200 (tests/test_gemm_planner.cpp has the
// seed rows and the candidates).

GemmKernel kernel_of(const detail::GroupedGemmProblem& p) {
  return detail::plan_gemm(p, detail::h200_props()).kernel;
}
int split_of(const detail::GroupedGemmProblem& p) {
  return detail::plan_gemm(p, detail::h200_props()).split;
}

TEST(GemmPlannerRules, DecodeForFewRowsPerGroupSm90ForMany) {
  detail::GroupedGemmProblem p;
  p.rows = detail::GemmRows::kContiguous;
  p.num_groups = 256;
  p.n = 4096;
  p.k = 7168;
  p.m = 4096;  // 16 rows per expert: big, long k -> the deep stream tiles
  EXPECT_EQ(kernel_of(p), GemmKernel::kDecodeStreamDeep);
  p.m = 8192;  // 32 rows per expert
  EXPECT_EQ(kernel_of(p), GemmKernel::kDecodeStreamDeep);
  p.k = 2048;  // short k (ds-v3 down's): the stream tiles on the persistent grid
  EXPECT_EQ(kernel_of(p), GemmKernel::kDecodePersistent);
  p.num_groups = detail::kGemmPersistentMaxGroups + 1;  // past the kernel's group table
  p.m = 32 * p.num_groups;
  EXPECT_EQ(kernel_of(p), GemmKernel::kDecodeStream);
  p.num_groups = 256;
  p.m = 8192;
  p.k = 4096;  // qwen3-235b up: still the 2-stage tiles (deep from k > 4096)
  EXPECT_EQ(kernel_of(p), GemmKernel::kDecodeStream);
  p.k = 7168;
  p.routed_counts = true;  // counts from routing (fused layers): SM90 above 12 rows
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90);
  p.activation = Activation::kSiluAndMul;  // the cooperative kernel under 64 rows
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90);
  p.m = 256 * 63;
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90);
  p.m = 256 * 64;  // from 64 rows (ds-v3 + shared t2048): sm90 too
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90);
  p.m = 256 * 127;
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90);
  p.m = 256 * 128;  // routed prefill from 128 rows: the adaptive pairs
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90Pairs);
  p.activation = Activation::kNone;
  p.m = 8192;
  p.m = 256 * 12;  // 12 rows per expert on average: the decode tiles still
  EXPECT_EQ(kernel_of(p), GemmKernel::kDecodeStreamDeep);
  p.routed_counts = false;
  p.m = 8192;
  p.m = 16384;  // 64 rows per expert
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90);
  p.m = 32768;  // 128 rows per expert: the adaptive pairs
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90Pairs);
  // Epilogue-heavy standalone GEMMs: the pairs too.
  p.activation = Activation::kSiluAndMul;
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90Pairs);
  p.activation = Activation::kNone;
  p.k = 2048;  // short k (ds-v3 down)
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90Pairs);
  p.rows = detail::GemmRows::kMasked;  // masked slabs: sm90
  p.max_m = 128;
  EXPECT_EQ(kernel_of(p), GemmKernel::kSm90);
  p.rows = detail::GemmRows::kContiguous;
  p.k = 7168;
  p.alignment = 128;
  p.m = 4096 + 256 * 127;  // alignment padding is not counted as rows
  EXPECT_EQ(kernel_of(p), GemmKernel::kDecodeStreamDeep);
  p.m = 32768;
  p.alignment = 1;
  p.k = 0;  // no TMA descriptor for k == 0: the decode tiles write the zeros
  EXPECT_EQ(kernel_of(p), GemmKernel::kDecode);

  detail::GroupedGemmProblem dense;
  dense.rows = detail::GemmRows::kDense;
  dense.n = 512;
  dense.k = 512;
  dense.m = 256;  // 2 x 2 prefill tiles: too few for the GPU
  EXPECT_EQ(kernel_of(dense), GemmKernel::kDecode);
  dense.m = 8192;
  dense.n = 4096;
  EXPECT_EQ(kernel_of(dense), GemmKernel::kSm90);
  // A shared-expert MLP at 32 tokens (ds-v3 gate_up: 32 tiles of 32 x 64 outputs):
  // decode tiles split over k (split_k.h picks 8 here).
  dense.m = 32;
  dense.n = 2048;
  dense.k = 7168;
  dense.activation = Activation::kSiluAndMul;
  EXPECT_EQ(kernel_of(dense), GemmKernel::kDecodeSplitK);
  EXPECT_EQ(split_of(dense), 8);
  dense.activation = Activation::kNone;  // its down GEMM: 56 tiles of 32 x 128, k 2048
  dense.n = 7168;
  dense.k = 2048;
  EXPECT_EQ(split_of(dense), 4);
  dense.k = 512;  // 8 k slices of 128 bytes: too few to split
  EXPECT_EQ(kernel_of(dense), GemmKernel::kDecode);
  dense.k = 18432;  // kimi-k2 t1 down: 56 tiles, 288 k slices: 66 clusters of 4 fit
  EXPECT_EQ(split_of(dense), 4);
  dense.m = 1;  // kimi-k2 t1 gate_up: 288 tiles, more than any split holds at once
  dense.n = 18432;
  dense.k = 7168;
  dense.activation = Activation::kSiluAndMul;
  EXPECT_EQ(kernel_of(dense), GemmKernel::kDecodeSplitK);
  EXPECT_EQ(split_of(dense), 3);  // least waves x (slices + CTA cost)
  dense.n = 36864;                // 576 tiles, over two waves: no split
  EXPECT_EQ(kernel_of(dense), GemmKernel::kDecode);
  dense.activation = Activation::kNone;
  dense.k = 0;  // nothing to split
  EXPECT_EQ(kernel_of(dense), GemmKernel::kDecode);
  // With the co-resident clusters the H200 reports (cudaOccupancyMaxActiveClusters, 2
  // CTAs/SM; the engine passes them): the largest split whose clusters all fit at once
  // (the sweep: a few clusters spilling into a second wave cost up to 50%).
  {
    const int cap[detail::kMaxSplitK + 1] = {0, 264, 132, 79, 62, 47, 39, 32, 30};
    EXPECT_EQ(detail::choose_split_k(32, 7168, 2, 132, cap), 7);   // ds-v3 gate_up: 32 <= 32
    EXPECT_EQ(detail::choose_split_k(56, 2048, 2, 132, cap), 4);   // ds-v3 down: 56 <= 62
    EXPECT_EQ(detail::choose_split_k(24, 5120, 2, 132, cap), 8);   // glm45 gate_up
    EXPECT_EQ(detail::choose_split_k(40, 1536, 2, 132, cap), 4);   // glm45 down: >= 6 k slices
    EXPECT_EQ(detail::choose_split_k(56, 18432, 2, 132, cap), 4);  // kimi down
    EXPECT_EQ(detail::choose_split_k(288, 7168, 2, 132, cap), 3);  // kimi gate_up: 4 waves
    EXPECT_EQ(detail::choose_split_k(600, 7168, 2, 132, cap), 1);  // > 2 waves unsplit
  }
  // Long k slices per split CTA (kimi-k2-t1 down: 72) run the 256-byte stream stages.
  EXPECT_TRUE(detail::split_uses_stream_tiles(18432, 2, 4));
  EXPECT_FALSE(detail::split_uses_stream_tiles(7168, 2, 3));   // 37 slices
  EXPECT_FALSE(detail::split_uses_stream_tiles(18432, 2, 1));  // not split

  // Few experts, few rows (qwen3-30b ep8 decode: 204 tiles at most, under 4 waves, k
  // 2048): the narrow stream tiles (split-K is picked for dense rows only).
  detail::GroupedGemmProblem few;
  few.rows = detail::GemmRows::kContiguous;
  few.num_groups = 16;
  few.n = 1536;
  few.k = 2048;
  few.m = 8;
  EXPECT_EQ(kernel_of(few), GemmKernel::kDecodeStreamNarrow);
  // Every group holding rows (routed256: 16 rows per expert): the same.
  few.m = 256;
  EXPECT_EQ(kernel_of(few), GemmKernel::kDecodeStreamNarrow);
  few.routed_counts = true;  // the fused layers' counts: their own rule (SM90 from 12)
  EXPECT_EQ(kernel_of(few), GemmKernel::kSm90);
  few.routed_counts = false;
  few.k = 4096;  // measured at k 2048 only
  EXPECT_EQ(kernel_of(few), GemmKernel::kDecode);
  few.k = 2048;
  few.rows = detail::GemmRows::kDense;  // dense rows: not measured (split-K's rule first)
  few.m = 8;
  EXPECT_NE(kernel_of(few), GemmKernel::kDecodeStreamNarrow);

  detail::GroupedGemmFP8Problem f;
  f.num_groups = 32;
  f.max_m = 64;
  f.n = 4096;
  f.k = 7168;
  const detail::GemmDevice h200(detail::h200_props());
  EXPECT_EQ(detail::plan_gemm_fp8(f, h200).kernel, GemmKernel::kFp8Sm90);
  f.k = 0;  // no TMA descriptor: the same plan, which then fills the empty sums
  EXPECT_EQ(detail::plan_gemm_fp8(f, h200).kernel, GemmKernel::kFp8Sm90);
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(detail::plan_gemm_fp8(f, h200), f, h200), "");
  f.max_m = 512;
  EXPECT_EQ(detail::plan_gemm_fp8(f, h200).kernel, GemmKernel::kFp8Sm90);
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(detail::plan_gemm_fp8(f, h200), f, h200), "");
}

// Where the kernels read each mode's scales (gemm.h Fp8Scales as strides): b_rows 272
// (3 blocks of 128), k 400 (4 blocks of 128).
TEST(GemmSm90Fp8, ScaleIndexOfEachMode) {
  const detail::Fp8ScaleIndex blk = detail::fp8_scale_index(Fp8Scales::kBlock, 272, 400);
  EXPECT_EQ(blk.a_row, 4);
  EXPECT_EQ(blk.a_kb, 1);
  EXPECT_EQ(blk.b_group, 3 * 4);
  EXPECT_EQ(blk.b_row_div, 128);
  EXPECT_EQ(blk.b_row, 4);
  EXPECT_EQ(blk.b_kb, 1);
  const detail::Fp8ScaleIndex ch = detail::fp8_scale_index(Fp8Scales::kPerChannel, 272, 400);
  EXPECT_EQ(ch.a_row, 1);
  EXPECT_EQ(ch.a_kb, 0);
  EXPECT_EQ(ch.b_group, 272);
  EXPECT_EQ(ch.b_row_div, 1);
  EXPECT_EQ(ch.b_row, 1);
  EXPECT_EQ(ch.b_kb, 0);
  const detail::Fp8ScaleIndex te = detail::fp8_scale_index(Fp8Scales::kPerTensor, 272, 400);
  EXPECT_EQ(te.a_row, 0);
  EXPECT_EQ(te.a_kb, 0);
  EXPECT_EQ(te.b_group, 1);
  EXPECT_EQ(te.b_row, 0);
  EXPECT_EQ(te.b_kb, 0);
}

// The SM90 FP8 kernel's layout assumptions, checked on the CPU with CuTe's layouts: the
// a stage as two 64-row TMA boxes is the 128-row wgmma operand byte for byte, and the
// wgmma accumulator element -> (row, column) map the scale promotion and the epilogue use.
TEST(GemmSm90Fp8, LayoutsMatchTheKernelsAssumptions) {
  EXPECT_EQ(detail::sm90_fp8_layout_mismatch(), "");
}

// The FP8 planner: the SM90 kernel (k == 0: its fill of the empty sums); a plan that cannot
// run is refused before any launch.
TEST(GemmPlannerRules, Fp8PlansTheSm90KernelWhereItApplies) {
  const detail::GemmDevice h200(detail::h200_props());
  for (int groups : {1, 8, 32, 256, 1024, 1025})
    for (int64_t max_m : {1, 64, 65, 128, 1024, 8192})
      for (int64_t n : {8, 4096})
        for (int64_t k : {0, 128, 7168}) {
          detail::GroupedGemmFP8Problem f;
          f.num_groups = groups;
          f.max_m = max_m;
          f.n = n;
          f.k = k;
          const GemmPlan plan = detail::plan_gemm_fp8(f, h200);
          const bool sm90 = k > 0 && groups <= 1024;
          EXPECT_EQ(detail::sm90_fp8_supports(f), sm90) << groups << " " << max_m << " " << k;
          EXPECT_EQ(plan.kernel, GemmKernel::kFp8Sm90) << to_string(plan);
          // Runs where the kernel takes the problem, and at k == 0 (the fill).
          EXPECT_EQ(detail::gemm_fp8_plan_rejection(plan, f, h200).empty(), sm90 || k == 0)
              << groups << " " << max_m << " " << k;
        }
  detail::GroupedGemmFP8Problem f;
  f.num_groups = 1025;
  f.max_m = 128;
  f.n = 4096;
  f.k = 7168;
  f.plan = GemmPlan{GemmKernel::kFp8Sm90, 128, 128, 1, GemmSchedule::kStatic};
  const auto refusal = [&] {
    try {
      detail::run_grouped_gemm_fp8(f, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // 1025 groups: past the SM90 kernel (off sm_90 the device is refused first, whatever f).
  const bool sm90 = detail::current_gemm_device().props.sm90();
  EXPECT_NE(refusal().find(sm90 ? "fp8_sm90 needs at most 1024 groups"
                                : "fp8_sm90 needs an sm_90 device"),
            std::string::npos)
      << refusal();
  f.num_groups = 8;
  f.plan.kernel = GemmKernel::kDecode;
  EXPECT_NE(refusal().find("cannot run these arguments: decode runs bf16 / f16 inputs only"),
            std::string::npos)
      << refusal();
}

// Contiguous rows, per-channel / per-tensor scales and silu_and_mul: the SM90 kernel takes
// them all (off sm_90 no candidate: a run says why).
TEST(GemmPlannerRules, Fp8CoversEveryLayoutAndScaleMode) {
  const detail::GemmDevice h200(detail::h200_props());
  detail::DeviceProps old_props = detail::h200_props();
  old_props.arch = 80;
  const detail::GemmDevice a100(old_props);
  for (bool contiguous : {false, true})
    for (Fp8Scales s : {Fp8Scales::kBlock, Fp8Scales::kPerChannel, Fp8Scales::kPerTensor})
      for (Activation act : {Activation::kNone, Activation::kSiluAndMul}) {
        detail::GroupedGemmFP8Problem f;
        f.contiguous = contiguous;
        f.num_groups = 8;
        f.max_m = contiguous ? 0 : 64;
        f.m = contiguous ? 4096 : 0;
        f.alignment = 16;
        f.n = 2048;
        f.k = detail::kFp8FastMaxK;  // the fast form's longest k
        f.scales = s;
        f.activation = act;
        const std::string what = std::to_string(contiguous) + " " +
                                 std::to_string(static_cast<int>(s)) + " " +
                                 std::to_string(static_cast<int>(act));
        const GemmPlan plan = detail::plan_gemm_fp8(f, h200);
        EXPECT_EQ(plan.kernel, GemmKernel::kFp8Sm90) << what;
        EXPECT_EQ(detail::gemm_fp8_plan_rejection(plan, f, h200), "") << what;
        // A bf16 c takes 128 x 256 tiles on contiguous groups of >= 256 rows (here 512),
        // with block scales from 80; masked block-scaled rows where the wide tiles' waves are
        // not longer (here with silu_and_mul: 2 x 1 waves of 128 tiles against 2 of 256;
        // without it 2 x 1 against 1; gemm_planner.h kFp8BlockWideMaskedMinK).
        const bool masked_wide = s == Fp8Scales::kBlock && act == Activation::kSiluAndMul;
        EXPECT_EQ(plan.tile_n, contiguous || masked_wide ? 256 : 128) << what;
        // Block scales run 128 x 256 too (promoted in 64-column chunks): a candidate.
        const std::vector<GemmPlan> cands = detail::gemm_fp8_plan_candidates(f, h200);
        ASSERT_EQ(cands.size(), 2u) << what;
        EXPECT_EQ(cands[0], plan) << what;
        EXPECT_EQ(cands[1].tile_n, plan.tile_n == 256 ? 128 : 256) << what;
        const GemmPlan base{GemmKernel::kFp8Sm90, 128, 128, 1, GemmSchedule::kStatic};
        EXPECT_TRUE(detail::gemm_fp8_plan_candidates(f, a100).empty()) << what;
        EXPECT_EQ(detail::plan_gemm_fp8(f, a100), base) << what;
        EXPECT_EQ(detail::gemm_fp8_plan_rejection(base, f, a100), "fp8_sm90 needs an sm_90 device")
            << what;
        // An e4m3 c: 128 x 128 alone.
        f.c_scale = reinterpret_cast<const float*>(&f);
        EXPECT_EQ(detail::gemm_fp8_plan_candidates(f, h200).size(), 1u) << what;
        EXPECT_EQ(detail::plan_gemm_fp8(f, h200), base) << what;
        EXPECT_EQ(detail::gemm_fp8_plan_rejection(base, f, h200), "") << what;
        f.c_scale = nullptr;
        // A contiguous problem past 2^31 rows is the SM90 kernel's limit: refused.
        if (contiguous) {
          f.m = int64_t{1} << 31;
          EXPECT_FALSE(detail::sm90_fp8_supports(f)) << what;
          EXPECT_NE(detail::gemm_fp8_plan_rejection(plan, f, h200), "") << what;
          EXPECT_TRUE(detail::gemm_fp8_plan_candidates(f, h200).empty()) << what;
        }
      }
}

// fp8_sm90's schedule: dynamic where a tile counter is given and the tiles take more than
// one wave (the m-tiles that read one weight tile then start together), else static; a
// dynamic plan without a counter is refused; the candidates hold both schedules.
// An e4m3 c quantized per row in groups of 128 by the gate/up epilogue (c_group_scales): the
// planner and the candidates take 128 x 256 alone; every other tile, scale mode, activation,
// n or output form is refused with the reason.
TEST(GemmPlannerRules, Fp8GroupQuantizedOutputRunsOn128x256Only) {
  const detail::GemmDevice h200(detail::h200_props());
  detail::GroupedGemmFP8Problem f;
  f.contiguous = true;
  f.num_groups = 8;
  f.m = 64;  // few rows a group: without group scales the planner takes 128 x 128
  f.n = 2048;
  f.k = 7168;
  f.scales = Fp8Scales::kBlock;
  f.activation = Activation::kSiluAndMul;
  float scales = 0.f;
  f.c_group_scales = &scales;
  const GemmPlan plan = detail::plan_gemm_fp8(f, h200);
  EXPECT_EQ(plan.tile_n, 256);
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(plan, f, h200), "");
  for (const GemmPlan& c : detail::gemm_fp8_plan_candidates(f, h200)) EXPECT_EQ(c.tile_n, 256);
  const GemmPlan narrow{GemmKernel::kFp8Sm90, 128, 128, 1, GemmSchedule::kStatic};
  EXPECT_NE(detail::gemm_fp8_plan_rejection(narrow, f, h200).find("only fp8_sm90 128x256"),
            std::string::npos);
  const auto refused = [&](detail::GroupedGemmFP8Problem g) {
    return detail::gemm_fp8_plan_rejection(plan, g, h200).find("c_group_scales") !=
           std::string::npos;
  };
  detail::GroupedGemmFP8Problem g = f;
  g.activation = Activation::kNone;
  EXPECT_TRUE(refused(g));
  g = f;
  g.scales = Fp8Scales::kPerChannel;
  EXPECT_TRUE(refused(g));
  g = f;
  g.n = 2048 + 64;
  EXPECT_TRUE(refused(g));
  g = f;
  g.c_scale = &scales;
  EXPECT_TRUE(refused(g));
  g = f;
  g.k = 0;
  EXPECT_TRUE(refused(g));
}

TEST(GemmPlannerRules, Fp8ScheduleIsDynamicWithACounterPastOneWave) {
  const detail::GemmDevice h200(detail::h200_props());
  unsigned counter = 0;
  detail::GroupedGemmFP8Problem f;
  f.contiguous = true;
  f.num_groups = 256;
  f.m = 32768;
  f.alignment = 128;
  f.n = 2048;
  f.k = 7168;
  f.activation = Activation::kSiluAndMul;
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(f, h200)), "fp8_sm90 128x256");
  f.tile_counter = &counter;
  const GemmPlan plan = detail::plan_gemm_fp8(f, h200);
  EXPECT_EQ(to_string(plan), "fp8_sm90 128x256 dynamic");
  EXPECT_EQ(detail::gemm_fp8_plan_rejection(plan, f, h200), "");
  const std::vector<GemmPlan> cands = detail::gemm_fp8_plan_candidates(f, h200);
  ASSERT_EQ(cands.size(), 4u);  // block scales: 128 x 128 and 128 x 256, in both schedules
  EXPECT_EQ(cands[0], plan);
  EXPECT_EQ(to_string(cands[1]), "fp8_sm90 128x128 dynamic");
  EXPECT_EQ(to_string(cands[2]), "fp8_sm90 128x128");
  EXPECT_EQ(to_string(cands[3]), "fp8_sm90 128x256");
  // Fewer than 80 rows a group on average (64): 128 x 128.
  f.m = 256 * 64;
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(f, h200)), "fp8_sm90 128x128 dynamic");
  // One wave (1 group of 128 rows, n = 1024 silu: 16 tiles): static.
  f.num_groups = 1;
  f.m = 128;
  f.n = 1024;
  EXPECT_EQ(detail::plan_gemm_fp8(f, h200).schedule, GemmSchedule::kStatic);
  // Per-channel scales on 512 rows a group: 128 x 256, dynamic past one wave.
  f.num_groups = 64;
  f.m = 32768;
  f.scales = Fp8Scales::kPerChannel;
  f.k = 2048;
  EXPECT_EQ(to_string(detail::plan_gemm_fp8(f, h200)), "fp8_sm90 128x256 dynamic");
  EXPECT_EQ(detail::gemm_fp8_plan_candidates(f, h200).size(), 4u);
  // Without a counter a dynamic plan cannot run.
  f.tile_counter = nullptr;
  const std::string why = detail::gemm_fp8_plan_rejection(plan, f, h200);
  EXPECT_NE(why.find("tile counter"), std::string::npos) << why;
  EXPECT_EQ(detail::gemm_fp8_plan_candidates(f, h200).size(), 2u);
  GemmPlan decode{GemmKernel::kDecode, 32, 128, 1, GemmSchedule::kDynamic};
  f.tile_counter = &counter;
  EXPECT_NE(detail::gemm_fp8_plan_rejection(decode, f, h200).find("static schedule only"),
            std::string::npos);
}

// The adaptive pairs' (sm90_pairs) pair tiles per group: m-tiles two by two on every
// n-tile, an odd last m-tile's n-tiles two by two; never more than the unpaired tiles
// (the host's launch bound counts those) and never less than half of them.
TEST(GemmSm90Schedule, AdaptivePairTilesPerGroup) {
  using detail::gemm::sm90::pair_tiles_of_group;
  using detail::gemm::sm90::tiles_of_group;
  EXPECT_EQ(pair_tiles_of_group(0, 128, 16, 1000), 0);
  EXPECT_EQ(pair_tiles_of_group(1, 128, 16, 1000), 8);     // one m-tile: n-pairs
  EXPECT_EQ(pair_tiles_of_group(1, 128, 5, 1000), 3);      // the last n-pair half empty
  EXPECT_EQ(pair_tiles_of_group(256, 128, 16, 1000), 16);  // two m-tiles: m-pairs
  EXPECT_EQ(pair_tiles_of_group(257, 128, 5, 1000), 5 + 3);
  EXPECT_EQ(pair_tiles_of_group(int64_t{1} << 40, 128, 1 << 20, INT_MAX), INT_MAX);
  for (int64_t count = 0; count < 2000; count += 37) {
    for (int n_tiles : {1, 2, 5, 16}) {
      const int paired = pair_tiles_of_group(count, 128, n_tiles, INT_MAX);
      const int tiles = tiles_of_group(count, 128, n_tiles, INT_MAX);
      EXPECT_LE(paired, tiles);
      EXPECT_GE(2 * paired, tiles);
    }
  }
}

// The SM90 kernels' device-side tile schedule (sm90_grouped_gemm.cuh) sums per-group
// tile counts into 32-bit shared memory. Non-monotonic contiguous ends (allowed: only
// staying inside the buffers is promised) let every group span all P rows, so the sum
// can pass INT_MAX although the host's bound (<= INT_MAX, checked) does not: the
// kernel's chunked scan must saturate at the bound instead of wrapping negative.
TEST(GemmSm90Schedule, TileSumsSaturateAtTheHostBound) {
  using detail::gemm::sm90::tile_prefix;
  using detail::gemm::sm90::tiles_of_group;
  EXPECT_EQ(tiles_of_group(0, 128, 16, 1000), 0);
  EXPECT_EQ(tiles_of_group(1, 128, 16, 1000), 16);
  EXPECT_EQ(tiles_of_group(129, 128, 16, 1000), 32);
  EXPECT_EQ(tiles_of_group(int64_t{1} << 40, 128, 1 << 20, INT_MAX), INT_MAX);

  // 1024 groups, each P = 2^31 - 1 rows (overlapping), 64 n-tiles: every group alone has
  // 2^24 * 64 = 2^30 tiles, the host bound (P/128 + G) * 64 is just under INT_MAX, the
  // true sum is 2^40. Replays the kernel's scan: chunks of 32 groups, inclusive
  // in-chunk sums, a running total carried (and saturated) across chunks.
  const int G = 1024, bm = 128, n_tiles = 64;
  const int64_t P = INT_MAX;
  const int64_t bound64 = ((P + bm - 1) / bm + G) * n_tiles;
  ASSERT_LE(bound64, INT_MAX);
  const int bound = static_cast<int>(bound64);
  std::vector<int> start(G + 1, 0);
  int64_t running = 0;
  for (int base = 0; base < G; base += 32) {
    int64_t inclusive = 0;
    for (int lane = 0; lane < 32; ++lane) {
      inclusive += tiles_of_group(P, bm, n_tiles, bound);
      start[base + lane + 1] = tile_prefix(running, inclusive, bound);
    }
    running += inclusive;
    running = running < bound ? running : bound;
  }
  int32_t wrapped = 0;  // what a 32-bit sum would give (unsigned wrap, then reinterpret)
  for (int g = 0; g < G; ++g) {
    wrapped = static_cast<int32_t>(static_cast<uint32_t>(wrapped) +
                                   static_cast<uint32_t>(tiles_of_group(P, bm, n_tiles, bound)));
  }
  EXPECT_LE(wrapped, 0);  // the bug this guards against: the 32-bit total wraps
  for (int g = 0; g < G; ++g) {
    EXPECT_LE(start[g], start[g + 1]) << g;
    EXPECT_LE(start[g + 1], bound) << g;
  }
  EXPECT_EQ(start[1], tiles_of_group(P, bm, n_tiles, bound));
  EXPECT_EQ(start[G], bound);
}

// Streamed weights get the L2 evict-first hint in small decode GEMMs only (docs/gemm.md
// "L2 policy of streamed weights").
// sm90's dense tile width: the narrower width (224 without silu, 192) only where its
// waves cost >= 5% less (a wave's time ~ its tile width). kimi-k2's 512-token shared
// expert: gate_up (silu) 576 tiles of 256 = 5 waves on 132 SMs vs 768 of 192 = 6 (0.9x);
// down (n 7168) 112 tiles of 256 vs 128 of 224, one wave each (0.875x). ds-v3's
// 4096-token shared expert stays at 256.
TEST(GemmSm90TileN, DenseRuleTakesANarrowerTileWhereItsWavesCostLess) {
  using detail::gemm::sm90::dense_tile_n;
  EXPECT_EQ(dense_tile_n(512, 18432, true, 132), 192);
  EXPECT_EQ(dense_tile_n(512, 7168, false, 132), 224);
  EXPECT_EQ(dense_tile_n(4096, 2048, true, 132), 256);
  EXPECT_EQ(dense_tile_n(4096, 7168, false, 132), 256);  // 7 waves of 256 = 8 of 224
  EXPECT_EQ(dense_tile_n(0, 4096, false, 132), 256);
  EXPECT_EQ(dense_tile_n(512, 0, true, 132), 256);
  EXPECT_EQ(dense_tile_n(512, 18432, true, 0), 256);
  // The rule on a sweep, recomputed here from tile counts.
  for (int64_t m : {64, 128, 512, 1000, 4096})
    for (int64_t n : {1024, 4608, 7168, 18432})
      for (bool silu : {false, true}) {
        const auto cost = [&](int64_t bn) {
          const int64_t cols = silu ? bn / 2 : bn;
          const int64_t tiles = (m + 127) / 128 * ((n + cols - 1) / cols);
          return (tiles + 131) / 132 * bn;
        };
        int want = 256;
        int64_t best = cost(256);
        for (int bn : {224, 192}) {
          if ((bn != 224 || !silu) && cost(bn) < best) {
            best = cost(bn);
            want = bn;
          }
        }
        if (best * 100 > cost(256) * 95) want = 256;
        const int got = dense_tile_n(m, n, silu, 132);
        EXPECT_EQ(got, want) << m << " x " << n << (silu ? " silu" : "");
        EXPECT_FALSE(silu && got == 224);
      }
}

// The planner's sm90 tile width: the dense rule (wave quantization) on dense rows; grouped
// rows keep 256.
TEST(GemmSm90TileN, PlannerTakesTheDenseRuleAndKeepsGroupedRowsAt256) {
  const detail::GemmDevice h200(detail::h200_props());
  detail::GroupedGemmProblem p;
  p.rows = detail::GemmRows::kContiguous;
  p.num_groups = 4;
  p.m = 4 * 512;
  p.n = 18432;
  p.k = 7168;
  p.activation = Activation::kSiluAndMul;
  EXPECT_EQ(to_string(detail::plan_gemm(p, h200)), "sm90_pairs 128x256 swap_tails");
  p.rows = detail::GemmRows::kDense;
  p.num_groups = 1;
  p.m = 512;
  EXPECT_EQ(to_string(detail::plan_gemm(p, h200)), "sm90 128x192");
  p.activation = Activation::kNone;
  p.n = 7168;
  EXPECT_EQ(to_string(detail::plan_gemm(p, h200)), "sm90 128x224");
}

// The dynamic schedule (docs/gemm.md "Persistent grid and dynamic schedule"): planned for the SM90
// kernels on grouped rows past one wave when a counter is given; a static launch zeroes nothing.
TEST(GemmSm90Dynamic, PlannedOnGroupedRowsWithACounterOnly) {
  EXPECT_EQ(grouped_gemm_workspace_size(GroupedGemmArgs{}), detail::kTileCounterBytes);
  const detail::GemmDevice h200(detail::h200_props());
  unsigned counter = 0;
  detail::GroupedGemmProblem p;
  p.rows = detail::GemmRows::kContiguous;
  p.num_groups = 256;
  p.m = 256 * 64;
  p.n = 4096;
  p.k = 7168;
  EXPECT_EQ(to_string(detail::plan_gemm(p, h200)), "sm90 128x256 swap_tails");
  p.tile_counter = &counter;
  EXPECT_EQ(to_string(detail::plan_gemm(p, h200)), "sm90 128x256 dynamic swap_tails");
  p.rows = detail::GemmRows::kMasked;  // 80 tiles, one wave: nothing to balance
  p.num_groups = 5;
  p.max_m = 128;
  EXPECT_EQ(to_string(detail::plan_gemm(p, h200)), "sm90 128x256 swap_tails");
  p.rows = detail::GemmRows::kDense;
  p.num_groups = 1;
  p.m = 8192;
  EXPECT_EQ(to_string(detail::plan_gemm(p, h200)), "sm90 128x256 swap_tails");
  int waves = 0;
  EXPECT_EQ(detail::sm90_tile_counter(nullptr, nullptr, "test", &waves), nullptr);
  EXPECT_EQ(waves, -1);
}

TEST(GemmPlannerRules, EvictFirstHintOnlyForSmallWeightStreams) {
  EXPECT_TRUE(detail::gemm_b_evict_first(100 << 20));           // qwen3-30b routed256
  EXPECT_TRUE(detail::gemm_b_evict_first(int64_t{528} << 20));  // kimi-k2 shared gate_up
  EXPECT_FALSE(detail::gemm_b_evict_first(int64_t{15} << 30));  // ds-v3 decode up
  EXPECT_FALSE(detail::gemm_b_evict_first(int64_t{3} << 30));   // qwen3-235b decode up
}

}  // namespace
}  // namespace moekit
