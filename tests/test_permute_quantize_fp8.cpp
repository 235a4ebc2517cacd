// The activation quantization (permute/quantize_fp8.h), standalone and fused into the
// pre-permute, against the CPU reference bit for bit: every mode, bf16 and f16, k off the
// 128-column groups, zero rows, rows of extreme magnitude, saturation at a given scale, and
// (pre-permute) the routes of moe_pre_permute's reference with padding rows untouched; rows
// outside a contiguous layout's groups skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moekit/error.h"
#include "moekit/permute.h"
#include "moekit/reference.h"
#include "permute/permute_kernels.h"
#include "permute/quantize_fp8.h"
#include "reference/fp8_quant_ref.h"
#include "support/gpu.h"

namespace moekit {
namespace {

using detail::Fp8ActScales;
using testing::DeviceTensor;
using testing::DeviceWorkspace;

std::mt19937_64& rng() {
  static std::mt19937_64 r(20261204);
  return r;
}

const char* mode_name(Fp8ActScales m) {
  return m == Fp8ActScales::kGroup128   ? "group128"
         : m == Fp8ActScales::kPerToken ? "per_token"
                                        : "per_tensor";
}

// Rows of varied magnitude: N(0, 1) times 10^u (u in [-4, 3]) per row; row 1 all zeros, row 2
// one large value in a field of small ones (one group's max far above its neighbours).
HostTensor activations(DType dtype, int64_t rows, int64_t k) {
  HostTensor x(dtype, {rows, k});
  std::normal_distribution<double> d(0.0, 1.0);
  std::uniform_real_distribution<double> u(-4.0, 3.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double mag = std::pow(10.0, u(rng()));
    for (int64_t c = 0; c < k; ++c) {
      double v = d(rng()) * mag;
      if (r == 1) v = 0.0;
      if (r == 2) v = c == k / 2 ? 3000.0 : 1e-3 * d(rng());
      x.set(r * k + c, v);
    }
  }
  return x;
}

int64_t scale_count(Fp8ActScales mode, int64_t rows, int64_t k) {
  return mode == Fp8ActScales::kGroup128   ? rows * ((k + 127) / 128)
         : mode == Fp8ActScales::kPerToken ? rows
                                           : 0;
}

constexpr float kTensorScale = 0.05f;  // values past 448 * 0.05 = 22.4 saturate

// The standalone launch of x [rows, k] into q / scales (kPerTensor: tensor_scale's value).
detail::QuantizeFp8Launch standalone(const DeviceTensor& x, DType dtype, int64_t rows, int64_t k,
                                     Fp8ActScales mode, const DeviceTensor& tensor_scale,
                                     const DeviceTensor& q, const DeviceTensor& scales) {
  detail::QuantizeFp8Launch l;
  l.x = x.data();
  l.dtype = dtype;
  l.src_rows = rows;
  l.k = k;
  l.mode = mode;
  l.tensor_scale = static_cast<const float*>(tensor_scale.data());
  l.q = q.data();
  l.scales = static_cast<float*>(scales.data());
  return l;
}

TEST(QuantizeFp8Gpu, MatchesReferenceBitExactly) {
  MOEKIT_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kF16})
    for (Fp8ActScales mode :
         {Fp8ActScales::kGroup128, Fp8ActScales::kPerToken, Fp8ActScales::kPerTensor})
      for (auto [rows, k] : std::vector<std::pair<int64_t, int64_t>>{
               {1, 16}, {3, 16}, {37, 144}, {9, 400}, {64, 7168}, {130, 2048}, {0, 256}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + mode_name(mode) +
                     " rows=" + std::to_string(rows) + " k=" + std::to_string(k));
        HostTensor x = activations(dtype, rows, k);
        const int64_t ns = scale_count(mode, rows, k);
        std::vector<uint8_t> q_ref(static_cast<size_t>(rows * k));
        std::vector<float> s_ref(static_cast<size_t>(ns));
        reference::quantize_fp8_rows(x.view(), mode, kTensorScale, q_ref.data(), s_ref.data());
        HostTensor ts(DType::kF32, {1});
        ts.set(0, kTensorScale);
        DeviceTensor x_d(x), ts_d(ts);
        DeviceTensor q_d(DType::kFP8E4M3, {rows, k}, 0xEE);
        DeviceTensor s_d(DType::kF32, {std::max<int64_t>(ns, 1)}, 0xEE);
        detail::launch_quantize_fp8(standalone(x_d, dtype, rows, k, mode, ts_d, q_d, s_d), nullptr);
        MOEKIT_CUDA_OK(cudaDeviceSynchronize());
        HostTensor q = q_d.download(), s = s_d.download();
        int64_t q_diff = 0, s_diff = 0, nonfinite = 0;
        for (int64_t i = 0; i < rows * k; ++i) {
          const uint8_t got = q.as<uint8_t>()[i];
          q_diff += got != q_ref[i];
          nonfinite += (got & 0x7f) == 0x7f;  // e4m3 NaN
        }
        for (int64_t i = 0; i < ns; ++i) {
          s_diff += std::memcmp(&s.as<float>()[i], &s_ref[i], 4) != 0;
          nonfinite += !std::isfinite(s.as<float>()[i]);
        }
        EXPECT_EQ(q_diff, 0) << "e4m3 codes differ from the reference";
        EXPECT_EQ(s_diff, 0) << "scales differ from the reference";
        EXPECT_EQ(nonfinite, 0);
        if (mode == Fp8ActScales::kPerTensor && ns == 0) {
          EXPECT_EQ(s.as<uint8_t>()[0], 0xEE) << "per-tensor wrote scales";
        }
        // Each group's (row's) largest magnitude maps to +-448 (0x7e / 0xfe) unless all zero.
        if (mode == Fp8ActScales::kPerToken && rows > 2) {
          bool has448 = false;
          for (int64_t c = 0; c < k; ++c) has448 |= (q.as<uint8_t>()[2 * k + c] & 0x7f) == 0x7e;
          EXPECT_TRUE(has448);
        }
      }
}

// The FP8 pre-permute: layout_metadata and inverse_indices as moe_pre_permute's reference,
// permuted row inverse[t*K+k] = token t quantized (with its scales), padding rows untouched.
// Route counts on both sides of the one-launch limit (kPrePermuteFusedMaxRoutes).
TEST(QuantizeFp8Gpu, PrePermuteFp8MatchesPrePermuteAndReference) {
  MOEKIT_REQUIRE_GPU();
  struct Shape {
    int64_t T;
    int K, E, A;
    int64_t H;
  };
  for (const Shape& sh : std::vector<Shape>{{1, 1, 4, 1, 16},
                                            {7, 2, 5, 16, 144},
                                            {64, 8, 32, 4, 512},
                                            {700, 8, 64, 8, 256},
                                            {0, 4, 8, 1, 128}})
    for (Fp8ActScales mode :
         {Fp8ActScales::kGroup128, Fp8ActScales::kPerToken, Fp8ActScales::kPerTensor}) {
      SCOPED_TRACE(std::string(mode_name(mode)) + " T=" + std::to_string(sh.T) +
                   " K=" + std::to_string(sh.K) + " E=" + std::to_string(sh.E) +
                   " A=" + std::to_string(sh.A) + " H=" + std::to_string(sh.H));
      const int64_t N = sh.T * sh.K, P = permuted_rows(sh.T, sh.K, sh.E, sh.A);
      HostTensor x = activations(DType::kBF16, sh.T, sh.H);
      HostTensor ids(DType::kI32, {sh.T, sh.K});
      std::uniform_int_distribution<int> pick(-1, sh.E - 1);  // -1: no route
      for (int64_t i = 0; i < N; ++i) ids.as<int32_t>()[i] = pick(rng());
      // The reference routes (rows in bf16, unused here).
      HostTensor perm_ref(DType::kBF16, {P, sh.H}), meta_ref(DType::kI32, {sh.E}),
          inv_ref(DType::kI32, {N});
      PrePermuteArgs ra;
      ra.hidden_states = x.view();
      ra.local_expert_ids = ids.view();
      ra.num_local_experts = sh.E;
      ra.layout = PermutedLayout::contiguous(sh.A);
      ra.permuted = perm_ref.view();
      ra.layout_metadata = meta_ref.view();
      ra.inverse_indices = inv_ref.view();
      reference::moe_pre_permute(ra);
      const int64_t groups = (sh.H + 127) / 128;
      const int64_t per_row = mode == Fp8ActScales::kGroup128   ? groups
                              : mode == Fp8ActScales::kPerToken ? 1
                                                                : 0;
      std::vector<uint8_t> q_tok(static_cast<size_t>(sh.T * sh.H));
      std::vector<float> s_tok(static_cast<size_t>(sh.T * per_row));
      reference::quantize_fp8_rows(x.view(), mode, kTensorScale, q_tok.data(), s_tok.data());

      HostTensor ts(DType::kF32, {1});
      ts.set(0, kTensorScale);
      DeviceTensor x_d(x), ids_d(ids), ts_d(ts);
      DeviceTensor q_d(DType::kFP8E4M3, {P, sh.H}, 0xEE);
      DeviceTensor s_d(DType::kF32, {std::max<int64_t>(P * per_row, 1)}, 0xEE);
      DeviceTensor meta_d(DType::kI32, {sh.E}, 0xEE), inv_d(DType::kI32, {std::max<int64_t>(N, 1)});
      const size_t ws = detail::pre_permute_one_launch(N, sh.E)
                            ? 0
                            : detail::route_chunk_workspace_bytes(N, sh.E);
      DeviceWorkspace work(std::max<size_t>(ws, 256));
      detail::PrePermuteFp8Launch l;
      l.routes.hidden = x_d.data();
      l.routes.ids = static_cast<const int32_t*>(ids_d.data());
      l.routes.num_routes = static_cast<int>(N);
      l.routes.top_k = sh.K;
      l.routes.num_experts = sh.E;
      l.routes.alignment = sh.A;
      l.routes.permuted = q_d.data();
      l.routes.layout_metadata = static_cast<int32_t*>(meta_d.data());
      l.routes.inverse_indices = static_cast<int32_t*>(inv_d.data());
      l.routes.workspace = work.get().data;
      l.dtype = DType::kBF16;
      l.num_tokens = sh.T;
      l.hidden_size = sh.H;
      l.mode = mode;
      l.tensor_scale = static_cast<const float*>(ts_d.data());
      l.permuted_scales = static_cast<float*>(s_d.data());
      detail::launch_pre_permute_fp8(l, nullptr);
      MOEKIT_CUDA_OK(cudaDeviceSynchronize());
      HostTensor meta = meta_d.download(), inv = inv_d.download(), q = q_d.download(),
                 s = s_d.download();
      EXPECT_EQ(std::memcmp(meta.data(), meta_ref.data(), meta_ref.nbytes()), 0);
      EXPECT_EQ(std::memcmp(inv.data(), inv_ref.data(), inv_ref.nbytes()), 0);
      std::vector<int64_t> src(static_cast<size_t>(P), -1);  // token of each permuted row
      for (int64_t i = 0; i < N; ++i) {
        const int32_t p = inv_ref.as<int32_t>()[i];
        if (p >= 0) src[p] = i / sh.K;
      }
      int64_t bad_rows = 0, touched_padding = 0;
      for (int64_t p = 0; p < P; ++p) {
        const uint8_t* qr = q.as<uint8_t>() + p * sh.H;
        const uint8_t* sr = s.as<uint8_t>() + p * per_row * 4;
        if (src[p] < 0) {
          for (int64_t c = 0; c < sh.H; ++c) touched_padding += qr[c] != 0xEE;
          for (int64_t c = 0; c < per_row * 4; ++c) touched_padding += sr[c] != 0xEE;
          continue;
        }
        const int64_t t = src[p];
        bad_rows += std::memcmp(qr, q_tok.data() + t * sh.H, sh.H) != 0 ||
                    std::memcmp(sr, s_tok.data() + t * per_row, per_row * 4) != 0;
      }
      EXPECT_EQ(bad_rows, 0) << "permuted rows that are not their token's quantized row";
      EXPECT_EQ(touched_padding, 0) << "bytes written to padding rows";
    }
}

// Rows outside the groups of a contiguous layout (padding nothing wrote: NaN here) are
// neither read nor stored; the groups' rows match the reference bit for bit. Groups of
// alignment 8 with an empty one and rows past the last end.
TEST(QuantizeFp8Gpu, SkipsRowsOutsideTheGroups) {
  MOEKIT_REQUIRE_GPU();
  const std::vector<int32_t> ends = {5, 19, 19, 33};
  constexpr int kAlignment = 8;
  constexpr int64_t kRows = 40;
  const auto in_groups = [&](int64_t r) {
    int64_t prev = 0;
    for (const int32_t e : ends) {
      const int64_t start = (prev + kAlignment - 1) / kAlignment * kAlignment;
      if (r >= start && r < e) return true;
      prev = e;
    }
    return false;
  };
  for (DType dtype : {DType::kBF16, DType::kF16})
    for (Fp8ActScales mode :
         {Fp8ActScales::kGroup128, Fp8ActScales::kPerToken, Fp8ActScales::kPerTensor})
      for (int64_t k : {16, 400}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + mode_name(mode) +
                     " k=" + std::to_string(k));
        HostTensor x = activations(dtype, kRows, k);
        for (int64_t r = 0; r < kRows; ++r)
          if (!in_groups(r))
            for (int64_t c = 0; c < k; ++c) x.set(r * k + c, std::nan(""));
        const int64_t per_row = scale_count(mode, 1, k);
        std::vector<uint8_t> q_ref(static_cast<size_t>(kRows * k));
        std::vector<float> s_ref(static_cast<size_t>(kRows * per_row));
        reference::quantize_fp8_rows(x.view(), mode, kTensorScale, q_ref.data(), s_ref.data());
        HostTensor ts(DType::kF32, {1}), ends_h(DType::kI32, {static_cast<int64_t>(ends.size())});
        ts.set(0, kTensorScale);
        std::memcpy(ends_h.data(), ends.data(), ends.size() * 4);
        DeviceTensor x_d(x), ts_d(ts), ends_d(ends_h);
        DeviceTensor q_d(DType::kFP8E4M3, {kRows, k}, 0xEE);
        DeviceTensor s_d(DType::kF32, {std::max<int64_t>(kRows * per_row, 1)}, 0xEE);
        detail::QuantizeFp8Launch l = standalone(x_d, dtype, kRows, k, mode, ts_d, q_d, s_d);
        l.group_ends = static_cast<const int32_t*>(ends_d.data());
        l.groups = static_cast<int64_t>(ends.size());
        l.alignment = kAlignment;
        detail::launch_quantize_fp8(l, nullptr);
        MOEKIT_CUDA_OK(cudaDeviceSynchronize());
        HostTensor q = q_d.download(), s = s_d.download();
        int64_t bad_rows = 0, touched_padding = 0, valid_rows = 0;
        for (int64_t r = 0; r < kRows; ++r) {
          const uint8_t* qr = q.as<uint8_t>() + r * k;
          const uint8_t* sr = s.as<uint8_t>() + r * per_row * 4;
          if (!in_groups(r)) {
            for (int64_t c = 0; c < k; ++c) touched_padding += qr[c] != 0xEE;
            for (int64_t c = 0; c < per_row * 4; ++c) touched_padding += sr[c] != 0xEE;
            continue;
          }
          ++valid_rows;
          bad_rows += std::memcmp(qr, q_ref.data() + r * k, k) != 0 ||
                      std::memcmp(sr, s_ref.data() + r * per_row, per_row * 4) != 0;
        }
        EXPECT_EQ(valid_rows, 5 + 11 + 9);
        EXPECT_EQ(bad_rows, 0) << "group rows that are not their quantized row";
        EXPECT_EQ(touched_padding, 0) << "bytes written to rows outside the groups";
      }
}

// Groups filter source rows with dest == nullptr only (the pre-permute's fan-out has none).
TEST(QuantizeFp8, GroupsWithDestinationsAreOutsideTheContract) {
  static const int32_t ends = 1, dest = 0;
  float scale = 1.f;
  detail::QuantizeFp8Launch l;
  l.src_rows = 1;
  l.k = 16;
  l.mode = Fp8ActScales::kPerTensor;
  l.tensor_scale = &scale;
  l.group_ends = &ends;
  l.groups = 1;
  const auto error = [&] {
    try {
      detail::launch_quantize_fp8(l, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string refused = "launch_quantize_fp8 got arguments outside its contract";
  // Within the contract (no dest): without a GPU the launch itself fails, past the check.
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    EXPECT_EQ(error().rfind("moekit::quantize_fp8: CUDA launch failed", 0), 0u) << error();
  }
  l.dest = &dest;
  EXPECT_NE(error().find(refused), std::string::npos) << error();
  l.dest = nullptr;
  l.groups = 0;
  EXPECT_NE(error().find(refused), std::string::npos) << error();
  l.groups = 1;
  l.alignment = 0;
  EXPECT_NE(error().find(refused), std::string::npos) << error();
}

}  // namespace
}  // namespace moekit
