// CPU tests of the core: views, host dtype conversions, validation messages, accuracy.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/host_dtype.h"
#include "reference/accuracy.h"
#include "reference/host_tensor.h"

namespace moekit {
namespace {

TEST(TensorView, ContiguousViewHasRowMajorStrides) {
  float buf[24];
  TensorView v = make_view(buf, DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride[0], 12);
  EXPECT_EQ(v.stride[2], 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.describe(), "f32[2, 3, 4]");
  v.stride[2] = 2;
  EXPECT_FALSE(v.is_contiguous());
}

TEST(TensorView, PermutedRowsMatchesSpec) {
  EXPECT_EQ(permuted_rows(100, 8, 32, 1), 800);
  EXPECT_EQ(permuted_rows(100, 8, 32, 128), 800 + 32 * 127);
}

TEST(HostDtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(host::float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(host::float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(host::float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_FLOAT_EQ(host::bf16_to_float(0xc040), -3.0f);
}

TEST(HostDtype, F16RoundTripsAndRounds) {
  EXPECT_EQ(host::float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(host::float_to_f16(-2.0f), 0xc000);
  EXPECT_FLOAT_EQ(host::f16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(host::float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(host::float_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(host::float_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  for (int b = 0; b < 0x7c00; b += 7) {
    float f = host::f16_to_float(static_cast<uint16_t>(b));
    EXPECT_EQ(host::float_to_f16(f), b);
  }
}

TEST(HostDtype, Fp8E4M3CoversItsRange) {
  EXPECT_FLOAT_EQ(host::fp8e4m3_to_float(0x7e), 448.0f);
  EXPECT_FLOAT_EQ(host::fp8e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(host::fp8e4m3_to_float(0x7f)));
  EXPECT_EQ(host::float_to_fp8e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(host::float_to_fp8e4m3(-1.0f), 0xb8);
  for (int b = 0; b < 0x7f; ++b) {
    EXPECT_EQ(host::float_to_fp8e4m3(host::fp8e4m3_to_float(static_cast<uint8_t>(b))), b);
  }
  // Against an exhaustive nearest-value search (ties to the even code) on random inputs
  // and on every midpoint between neighbouring codes.
  auto brute = [](float v) {
    uint8_t best = 0;
    float best_err = std::fabs(v);
    for (int c = 1; c <= 0x7e; ++c) {
      float err = std::fabs(host::fp8e4m3_to_float(static_cast<uint8_t>(c)) - std::fabs(v));
      if (err < best_err || (err == best_err && (c & 1) == 0)) {
        best = static_cast<uint8_t>(c);
        best_err = err;
      }
    }
    return static_cast<uint8_t>((std::signbit(v) ? 0x80 : 0) | best);
  };
  std::mt19937_64 rng(7);
  std::normal_distribution<float> dist(0.0f, 30.0f);
  for (int i = 0; i < 20000; ++i) {
    float v = dist(rng) * (i % 3 == 0 ? 1e-3f : 1.0f);
    ASSERT_EQ(host::float_to_fp8e4m3(v), brute(v)) << v;
  }
  for (int c = 0; c < 0x7e; ++c) {
    float mid = 0.5f * (host::fp8e4m3_to_float(static_cast<uint8_t>(c)) +
                        host::fp8e4m3_to_float(static_cast<uint8_t>(c + 1)));
    ASSERT_EQ(host::float_to_fp8e4m3(mid), brute(mid)) << mid;
  }
}

TEST(ArgCheck, NamesArgumentExpectationAndValue) {
  detail::ArgCheck check("fused_topk");
  float buf[8];
  TensorView ids = make_view(buf, DType::kF32, {2, 4});
  try {
    check.tensor("topk_ids", ids, {DType::kI32}, {2, 4});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "moekit::fused_topk: argument 'topk_ids': expected dtype i32, got f32[2, 4]");
  }
  TensorView w = make_view(buf, DType::kF32, {2, 3});
  EXPECT_THROW(check.tensor("topk_weights", w, {DType::kF32}, {2, 4}), Error);
  EXPECT_NO_THROW(check.tensor("topk_weights", w, {DType::kF32}, {2, detail::kAnyDim}));
  EXPECT_THROW(check.tensor("bias", TensorView{}, {DType::kF32}, {4}), Error);
  EXPECT_NO_THROW(check.optional_tensor("bias", TensorView{}, {DType::kF32}, {4}));
  TensorView null_view = make_view(nullptr, DType::kF32, {2, 3});
  EXPECT_THROW(check.tensor("x", null_view, {DType::kF32}, {2, 3}), Error);
  TensorView empty_null = make_view(nullptr, DType::kF32, {0, 3});
  EXPECT_NO_THROW(check.tensor("x", empty_null, {DType::kF32}, {0, 3}));
  TensorView misaligned = make_view(reinterpret_cast<char*>(buf) + 2, DType::kF32, {1});
  EXPECT_THROW(check.tensor("x", misaligned, {DType::kF32}, {1}), Error);
  EXPECT_THROW(check.workspace(Workspace{}, 16), Error);
}

// The message of the overlap outputs_disjoint reports ("" when none).
template <class Inputs>
std::string overlap_error(const detail::ArgCheck::Arg& out, const Inputs& inputs,
                          const detail::ArgCheck::Arg* in_place_in = nullptr) {
  try {
    detail::ArgCheck("op").outputs_disjoint({out}, inputs, Workspace{},
                                            in_place_in ? &out : nullptr, in_place_in);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ArgCheck, OutputsDisjointJoinsPartsInOrder) {
  using Arg = detail::ArgCheck::Arg;
  float buf[16];
  const TensorView a = make_view(buf, DType::kF32, {4}), b = make_view(buf + 2, DType::kF32, {4});
  const TensorView c = make_view(buf + 8, DType::kF32, {4});
  const TensorView out = make_view(buf + 3, DType::kF32, {1});  // overlaps a and b
  const Arg o{"out", out}, ia{"a", a}, ib{"b", b}, ic{"c", c};
  const std::array<Arg, 2> bc{{ib, ic}};
  const auto ab_c = detail::ArgCheck::join(ia, bc);
  ASSERT_EQ(ab_c.size(), 3u);
  EXPECT_STREQ(ab_c[1].name, "b");
  EXPECT_EQ(&ab_c[1].t, &b);  // the Args still name the caller's views
  EXPECT_NE(overlap_error(o, ab_c).find("memory disjoint from 'a'"), std::string::npos);
  EXPECT_NE(overlap_error(o, detail::ArgCheck::join(bc, ia)).find("memory disjoint from 'b'"),
            std::string::npos);
  // In place through a joined list: the output may be the input itself, not a part of it.
  const Arg c_out{"c_out", c}, c_in{"c", c};
  EXPECT_EQ(overlap_error(c_out, detail::ArgCheck::join(ia, c_in), &c_in), "");
  const TensorView part = make_view(buf + 9, DType::kF32, {1});
  const Arg c_part{"c_part", part};
  EXPECT_NE(overlap_error(c_part, detail::ArgCheck::join(ia, c_in), &c_in)
                .find("memory disjoint from 'c' or 'c' itself (in place)"),
            std::string::npos);
}

TEST(ArgCheck, OutputsDisjointChecksEveryInputOfALongList) {
  using Arg = detail::ArgCheck::Arg;
  // 40 one-float inputs (past the stack ranges), the output on the last one only.
  float buf[48];
  std::vector<TensorView> views;
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) {
    views.push_back(make_view(buf + i, DType::kF32, {1}));
    names.push_back("in" + std::to_string(i));
  }
  const TensorView out = make_view(buf + 39, DType::kF32, {1});
  std::vector<Arg> in;
  for (int i = 0; i < 40; ++i) in.push_back({names[i].c_str(), views[i]});
  const std::array<Arg, 4> tail{{in[36], in[37], in[38], in[39]}};
  const auto inputs =
      detail::ArgCheck::join(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], in[9],
                             in[10], in[11], in[12], in[13], in[14], in[15], in[16], in[17], in[18],
                             in[19], in[20], in[21], in[22], in[23], in[24], in[25], in[26], in[27],
                             in[28], in[29], in[30], in[31], in[32], in[33], in[34], in[35], tail);
  ASSERT_EQ(inputs.size(), 40u);
  EXPECT_NE(overlap_error(Arg{"out", out}, inputs).find("memory disjoint from 'in39'"),
            std::string::npos);
  // 17 inputs (one past the old fixed limit of 16), the output on the 17th.
  const TensorView out16 = make_view(buf + 16, DType::kF32, {1});
  const auto first17 =
      detail::ArgCheck::join(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], in[9],
                             in[10], in[11], in[12], in[13], in[14], in[15], in[16]);
  EXPECT_NE(overlap_error(Arg{"out", out16}, first17).find("memory disjoint from 'in16'"),
            std::string::npos);
}

TEST(Accuracy, FlagsErrorsAndNonFinite) {
  HostTensor ref(DType::kF32, {4}), out(DType::kF32, {4});
  for (int i = 0; i < 4; ++i) {
    ref.set(i, 1.0 + i);
    out.set(i, 1.0 + i);
  }
  Tolerance tol = tolerance_for(DType::kBF16);
  EXPECT_TRUE(compare(out.view(), ref.view(), tol).pass(tol));
  out.set(2, 3.5);
  Accuracy a = compare(out.view(), ref.view(), tol);
  EXPECT_DOUBLE_EQ(a.err_ratio, 0.25);
  EXPECT_FALSE(a.pass(tol));
  out.set(2, NAN);
  EXPECT_EQ(compare(out.view(), ref.view(), tol).nonfinite, 1);
}

}  // namespace
}  // namespace moekit
