// GPU tests of what docs/bad-inputs.md says needs a device: the launch-target check
// (host memory, another device's stream or memory, its host cost, stream capture), the
// in-place calls the ops accept, and sizes past 32-bit element offsets (T*H, E*2F*H,
// P*K >= 2^31) against the references on sampled rows.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "moekit/moekit.h"
#include "moekit/reference.h"
#include "reference/accuracy.h"
#include "support/gpu.h"
#include "test_moe_common.h"

namespace moekit {
namespace {

using testing::DeviceTensor;
using testing::DeviceWorkspace;

constexpr DType kBF = DType::kBF16;

void sync_ok() {
  const cudaError_t err = cudaDeviceSynchronize();
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A moe_post_permute call: every inverse index -1 (no route), so out = 0.
struct PostPermuteCall {
  DeviceTensor expert_output{kBF, {8, 64}};
  DeviceTensor weights{DType::kF32, {4, 2}};
  DeviceTensor inverse{DType::kI32, {8}, 0xFF};  // -1
  PostPermuteArgs args(void* out) const {
    PostPermuteArgs a;
    a.expert_output = expert_output.view();
    a.topk_weights = weights.view();
    a.inverse_indices = inverse.view();
    a.out = make_view(out, kBF, {4, 64});
    return a;
  }
};

// ---- the launch target ----

TEST(LaunchTargetGpu, RefusesPageableHostMemoryAndTakesPinned) {
  MOEKIT_REQUIRE_GPU();
  int dev = 0, pageable = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev);
  PostPermuteCall call;
  // Pinned host memory: kernels write it through the unified address space.
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 4 * 64 * 2), cudaSuccess);
  std::memset(pinned, 0x7b, 4 * 64 * 2);
  EXPECT_EQ(error_of([&] { moe_post_permute(call.args(pinned), nullptr); }), "");
  sync_ok();
  const uint16_t* p = static_cast<const uint16_t*>(pinned);
  for (int i = 0; i < 4 * 64; ++i) ASSERT_EQ(p[i], 0) << i;
  cudaFreeHost(pinned);
  if (pageable) {
    GTEST_SKIP() << "this device accesses pageable host memory: nothing to refuse there";
  }
  std::vector<uint8_t> host(4 * 64 * 2 + 256);
  void* aligned =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(host.data()) + 255) / 256 * 256);
  const std::string msg = error_of([&] { moe_post_permute(call.args(aligned), nullptr); });
  EXPECT_EQ(msg.rfind("moekit::moe_post_permute: argument 'out': expected device memory (or "
                      "managed or pinned host memory), got host memory CUDA did not allocate at ",
                      0),
            0u)
      << msg;
}

TEST(LaunchTargetGpu, RefusesAnotherDevicesStreamAndMemory) {
  MOEKIT_REQUIRE_GPU();
  int n = 0;
  cudaGetDeviceCount(&n);
  if (n < 2) GTEST_SKIP() << "one CUDA device: no other device's stream or memory to pass";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t other_stream = nullptr;
  void* other_out = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other_stream), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&other_out, 4 * 64 * 2), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  {
    PostPermuteCall call;
    DeviceTensor out(kBF, {4, 64});
    EXPECT_EQ(error_of([&] { moe_post_permute(call.args(out.data()), other_stream); }),
              "moekit::moe_post_permute: argument 'stream': expected a stream of the current "
              "device cuda:0, got a stream of cuda:1");
    EXPECT_EQ(error_of([&] { moe_post_permute(call.args(other_out), nullptr); }),
              "moekit::moe_post_permute: argument 'out': expected memory on the current device "
              "cuda:0, where the kernels run, got memory on cuda:1");
    sync_ok();
  }
  cudaSetDevice(1);
  cudaFree(other_out);
  cudaStreamDestroy(other_stream);
  cudaSetDevice(0);
}

// The check's host cost: a steady-state call (stream and output seen before) makes no
// CUDA query; a call with a new stream and output makes two.
TEST(LaunchTargetGpu, HostCostPerCall) {
  MOEKIT_REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::vector<DeviceTensor> outs;
  for (int i = 0; i < 16; ++i) outs.emplace_back(kBF, std::vector<int64_t>{4, 64});
  detail::ArgCheck check("fused_moe");
  auto ns_per_call = [](int n, const std::function<void(int)>& f) {
    for (int i = 0; i < 100; ++i) f(i);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f(i);
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
           n;
  };
  const TensorView same = outs[0].view();
  const double hit = ns_per_call(200000, [&](int) { check.launch_target(stream, "output", same); });
  // 16 outputs round-robin through an 8-entry cache: every call asks CUDA.
  const double miss = ns_per_call(
      20000, [&](int i) { check.launch_target(stream, "output", outs[i % 16].view()); });
  cudaPointerAttributes attr;
  const double query =
      ns_per_call(20000, [&](int i) { cudaPointerGetAttributes(&attr, outs[i % 16].data()); });
  int sdev = 0;
  const double stream_query = ns_per_call(20000, [&](int) { cudaStreamGetDevice(stream, &sdev); });
  std::printf(
      "launch_target host cost: %.1f ns cached, %.1f ns uncached (cudaPointerGetAttributes "
      "%.1f ns, cudaStreamGetDevice %.1f ns)\n",
      hit, miss, query, stream_query);
  EXPECT_LT(hit, 1000.0);
  EXPECT_LT(miss, 5000.0);
  cudaStreamDestroy(stream);
}

// A call on a stream being captured (global mode), with a new stream and a new output:
// the launch-target queries, which would invalidate the capture, are skipped there; the
// capture ends cleanly and the graph replays what an eager call computes.
TEST(LaunchTargetGpu, ChecksRunUnderStreamCapture) {
  MOEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(5);
  const int64_t T = 4, H = 64, K = 2;
  HostTensor eo = moetest::normal(rng, kBF, {8, H}, 1.0);
  HostTensor w = moetest::make_topk_weights(rng, T, K);
  HostTensor inv(DType::kI32, {T * K});
  for (int i = 0; i < T * K; ++i) inv.as<int32_t>()[i] = (i * 3) % 8;
  DeviceTensor deo(eo), dw(w), dinv(inv);
  DeviceTensor eager(kBF, {T, H}), graphed(kBF, {T, H});
  PostPermuteArgs a;
  a.expert_output = deo.view();
  a.topk_weights = dw.view();
  a.inverse_indices = dinv.view();
  a.out = eager.view();
  moe_post_permute(a, nullptr);
  sync_ok();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  a.out = graphed.view();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const std::string msg = error_of([&] { moe_post_permute(a, stream); });
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << msg;
  ASSERT_EQ(msg, "");
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  HostTensor e = eager.download(), g = graphed.download();
  EXPECT_EQ(std::memcmp(e.data(), g.data(), e.nbytes()), 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- in place ----

// Runs `op` twice on the same inputs: into a fresh output, and in place (the output
// buffer holds a copy of the input and is passed as both). The bytes must match.
template <class Args>
void set_workspace(Args& a, Workspace w) {
  a.workspace = w;
}
void set_workspace(FusedMoESharedExpertArgs& a, Workspace w) {
  a.moe.workspace = w;
}

// `input` and `output` are members of `a`.
template <class Args>
void expect_in_place_matches(const char* what, Args& a, TensorView& input, TensorView& output,
                             const std::function<size_t(const Args&)>& size,
                             const std::function<void(const Args&)>& op,
                             const std::vector<int64_t>& rows_to_compare) {
  SCOPED_TRACE(what);
  DeviceWorkspace ws(size(a));
  set_workspace(a, ws.get());
  op(a);
  sync_ok();
  const size_t row_bytes = static_cast<size_t>(output.shape[1]) * dtype_size(output.dtype);
  std::vector<uint8_t> out_of_place(output.nbytes()), in_place(output.nbytes());
  ASSERT_EQ(cudaMemcpy(out_of_place.data(), output.data, output.nbytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(output.data, input.data, input.nbytes(), cudaMemcpyDeviceToDevice),
            cudaSuccess);
  input.data = output.data;  // a's view of the input now points at the output buffer
  op(a);
  sync_ok();
  ASSERT_EQ(cudaMemcpy(in_place.data(), output.data, output.nbytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int64_t r : rows_to_compare) {
    ASSERT_EQ(std::memcmp(out_of_place.data() + r * row_bytes, in_place.data() + r * row_bytes,
                          row_bytes),
              0)
        << "row " << r;
  }
}

std::vector<int64_t> all_rows(int64_t n) {
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

FusedMoEExpertsArgs experts_args(const DeviceTensor& x, const DeviceTensor& wgu,
                                 const DeviceTensor& wd, const DeviceTensor& w,
                                 const DeviceTensor& ids, const DeviceTensor& out) {
  FusedMoEExpertsArgs e;
  e.hidden_states = x.view();
  e.w_gate_up = wgu.view();
  e.w_down = wd.view();
  e.topk_weights = w.view();
  e.topk_ids = ids.view();
  e.output = out.view();
  return e;
}

// A layer with softmax top-K renormalized and a shared expert (sgu, sd).
FusedMoESharedExpertArgs layer_args(const DeviceTensor& x, const DeviceTensor& logits,
                                    const DeviceTensor& wgu, const DeviceTensor& wd,
                                    const DeviceTensor& sgu, const DeviceTensor& sd,
                                    const DeviceTensor& out, int K) {
  FusedMoESharedExpertArgs l;
  l.moe.hidden_states = x.view();
  l.moe.gating_output = logits.view();
  l.moe.params.top_k = K;
  l.moe.params.renormalize = true;
  l.moe.w_gate_up = wgu.view();
  l.moe.w_down = wd.view();
  l.moe.output = out.view();
  l.shared_w_gate_up = sgu.view();
  l.shared_w_down = sd.view();
  return l;
}

TEST(InPlaceGpu, RoutedOpsAndLayersMatchOutOfPlace) {
  MOEKIT_REQUIRE_GPU();
  const int64_t H = 256, E = 8, F = 128, K = 2, S = 128;
  std::mt19937_64 rng(17);
  HostTensor wgu = moetest::normal(rng, kBF, {E, 2 * F, H}, 1.0 / std::sqrt(double(H)));
  HostTensor wd = moetest::normal(rng, kBF, {E, H, F}, 1.0 / std::sqrt(double(F)));
  HostTensor sgu = moetest::normal(rng, kBF, {2 * S, H}, 1.0 / std::sqrt(double(H)));
  HostTensor sd = moetest::normal(rng, kBF, {H, S}, 1.0 / std::sqrt(double(S)));
  DeviceTensor dwgu(wgu), dwd(wd), dsgu(sgu), dsd(sd);
  // T = 16: the direct path (indexed_expert_mlp, the layers); 300: the sorted path.
  for (int64_t T : {16, 300}) {
    HostTensor x = moetest::normal(rng, kBF, {T, H}, 1.0);
    HostTensor w = moetest::make_topk_weights(rng, T, K);
    HostTensor ids = moetest::make_ids(rng, T, K, E, moetest::Ids::kMixed);
    HostTensor logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
    DeviceTensor dx(x), dw(w), dids(ids), dlogits(logits);
    DeviceTensor out(kBF, {T, H});
    const std::string t = " T=" + std::to_string(T);
    const FusedMoEExpertsArgs e = experts_args(dx, dwgu, dwd, dw, dids, out);
    for (bool indexed : {false, true}) {
      FusedMoEExpertsArgs a = e;
      expect_in_place_matches<FusedMoEExpertsArgs>(
          ((indexed ? "indexed_expert_mlp" : "fused_moe_experts") + t).c_str(), a, a.hidden_states,
          a.output,
          [&](const FusedMoEExpertsArgs& v) {
            return indexed ? indexed_expert_mlp_workspace_size(v)
                           : fused_moe_experts_workspace_size(v);
          },
          [&](const FusedMoEExpertsArgs& v) {
            indexed ? indexed_expert_mlp(v, nullptr) : fused_moe_experts(v, nullptr);
          },
          all_rows(T));
    }
    const FusedMoESharedExpertArgs l =
        layer_args(dx, dlogits, dwgu, dwd, dsgu, dsd, out, static_cast<int>(K));
    {
      FusedMoEArgs a = l.moe;
      expect_in_place_matches<FusedMoEArgs>(
          ("fused_moe" + t).c_str(), a, a.hidden_states, a.output,
          [](const FusedMoEArgs& v) { return fused_moe_workspace_size(v); },
          [](const FusedMoEArgs& v) { fused_moe(v, nullptr); }, all_rows(T));
    }
    {
      FusedMoESharedExpertArgs a = l;
      expect_in_place_matches<FusedMoESharedExpertArgs>(
          ("fused_moe_shared_expert" + t).c_str(), a, a.moe.hidden_states, a.moe.output,
          [](const FusedMoESharedExpertArgs& v) {
            return fused_moe_shared_expert_workspace_size(v);
          },
          [](const FusedMoESharedExpertArgs& v) { fused_moe_shared_expert(v, nullptr); },
          all_rows(T));
    }
  }
}

TEST(InPlaceGpu, ExpertMlpMatchesOutOfPlace) {
  MOEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(23);
  // Few rows per expert (decode tiles) and many (the SM90 tiles, the MLP chain).
  for (int64_t rows_per_expert : {5, 1500}) {
    const int64_t H = 512, E = 8, F = 256;
    auto layout = moetest::ragged_rows(E, 1, [&](int64_t e) { return rows_per_expert + e % 3; });
    HostTensor x = moetest::normal(rng, kBF, {layout.P, H}, 1.0);
    HostTensor wgu = moetest::normal(rng, kBF, {E, 2 * F, H}, 1.0 / std::sqrt(double(H)));
    HostTensor wd = moetest::normal(rng, kBF, {E, H, F}, 1.0 / std::sqrt(double(F)));
    DeviceTensor dx(x), dwgu(wgu), dwd(wd), dmeta(layout.meta);
    DeviceTensor out(kBF, {layout.P, H});
    ExpertMLPArgs a;
    a.expert_input = dx.view();
    a.layout_metadata = dmeta.view();
    a.layout = PermutedLayout::contiguous(1);
    a.w_gate_up = dwgu.view();
    a.w_down = dwd.view();
    a.expert_output = out.view();
    std::vector<int64_t> routed;  // padding rows keep what the output buffer held
    for (int64_t r = 0; r < layout.P; ++r) {
      if (layout.expert_of_row[static_cast<size_t>(r)] >= 0) routed.push_back(r);
    }
    expect_in_place_matches<ExpertMLPArgs>(
        ("moe_expert_mlp rows/expert=" + std::to_string(rows_per_expert)).c_str(), a,
        a.expert_input, a.expert_output,
        [](const ExpertMLPArgs& v) { return expert_mlp_workspace_size(v); },
        [](const ExpertMLPArgs& v) { moe_expert_mlp(v, nullptr); }, routed);
  }
}

// ---- sizes past 32-bit element offsets ----

// A device [rows, cols] buffer whose row r is block row r % block.rows: big inputs
// without drawing billions of random numbers.
void fill_by_block(void* dst, const HostTensor& block, int64_t rows) {
  const int64_t bl = block.shape()[0];
  const size_t row_bytes = block.nbytes() / static_cast<size_t>(bl);
  for (int64_t r = 0; r < rows; r += bl) {
    const int64_t n = std::min(bl, rows - r);
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(dst) + r * row_bytes, block.data(), n * row_bytes,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
}

// Rows `rows` of a host [*, cols] tensor (or of a device buffer when `device`).
HostTensor gather_rows(const void* src, DType dt, int64_t cols, const std::vector<int64_t>& rows,
                       bool device, int64_t src_rows_mod = 0) {
  HostTensor h(dt, {static_cast<int64_t>(rows.size()), cols});
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(dt);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = src_rows_mod ? rows[i] % src_rows_mod : rows[i];
    const char* from = static_cast<const char*>(src) + r * row_bytes;
    char* to = static_cast<char*>(h.data()) + i * row_bytes;
    if (device) {
      EXPECT_EQ(cudaMemcpy(to, from, row_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      std::memcpy(to, from, row_bytes);
    }
  }
  return h;
}

void expect_close(const HostTensor& out, const HostTensor& ref, const std::string& what) {
  const Tolerance tol = tolerance_for(out.dtype());
  const Accuracy acc = compare(out.view(), ref.view(), tol);
  EXPECT_TRUE(acc.pass(tol)) << what << ": " << acc.str() << " over " << acc.count;
}

// T*H = 2^31 + 2^20 elements of hidden states and output (and T*K*H in the sorted path's
// workspace, T*H f32 in the shared expert's): the routed ops, the layer and the layer with
// a shared expert, checked on the tokens past element 2^31 and a few first ones.
TEST(LargeIndexGpu, TokensTimesHiddenPastTwoTo31) {
  MOEKIT_REQUIRE_GPU();
  const int64_t H = 16384, T = (int64_t{1} << 31) / H + 64, E = 4, F = 64, K = 2, S = 64;
  std::mt19937_64 rng(31);
  HostTensor block = moetest::normal(rng, kBF, {1024, H}, 1.0);
  HostTensor wgu = moetest::normal(rng, kBF, {E, 2 * F, H}, 1.0 / std::sqrt(double(H)));
  HostTensor wd = moetest::normal(rng, kBF, {E, H, F}, 1.0 / std::sqrt(double(F)));
  HostTensor sgu = moetest::normal(rng, kBF, {2 * S, H}, 1.0 / std::sqrt(double(H)));
  HostTensor sd = moetest::normal(rng, kBF, {H, S}, 1.0 / std::sqrt(double(S)));
  HostTensor w = moetest::make_topk_weights(rng, T, K);
  HostTensor ids = moetest::make_ids(rng, T, K, E, moetest::Ids::kDistinct);
  HostTensor logits = moetest::normal(rng, DType::kF32, {T, E}, 1.0);
  DeviceTensor dx(kBF, {T, H}), out(kBF, {T, H});
  fill_by_block(dx.data(), block, T);
  DeviceTensor dwgu(wgu), dwd(wd), dsgu(sgu), dsd(sd), dw(w), dids(ids), dlogits(logits);

  std::vector<int64_t> sampled = {0, 1, 2, 3};
  for (int64_t t = (int64_t{1} << 31) / H; t < T; ++t) sampled.push_back(t);  // past 2^31
  const int64_t n = static_cast<int64_t>(sampled.size());
  HostTensor xs = gather_rows(block.data(), kBF, H, sampled, false, 1024);
  HostTensor ws_ = gather_rows(w.data(), DType::kF32, K, sampled, false);
  HostTensor ids_s = gather_rows(ids.data(), DType::kI32, K, sampled, false);
  HostTensor logits_s = gather_rows(logits.data(), DType::kF32, E, sampled, false);

  FusedMoEExpertsArgs e = experts_args(dx, dwgu, dwd, dw, dids, out);
  FusedMoESharedExpertArgs l =
      layer_args(dx, dlogits, dwgu, dwd, dsgu, dsd, out, static_cast<int>(K));
  DeviceWorkspace ws(
      std::max(fused_moe_experts_workspace_size(e), fused_moe_shared_expert_workspace_size(l)));
  e.workspace = ws.get();
  l.moe.workspace = ws.get();

  // The references on the sampled tokens (each token's output depends on its row only).
  FusedMoEExpertsArgs re = e;
  HostTensor ref_experts(kBF, {n, H}), ref_layer(kBF, {n, H}), ref_shared(kBF, {n, H});
  re.hidden_states = xs.view();
  re.w_gate_up = wgu.view();
  re.w_down = wd.view();
  re.topk_weights = ws_.view();
  re.topk_ids = ids_s.view();
  re.output = ref_experts.view();
  reference::fused_moe_experts(re);
  FusedMoESharedExpertArgs rl = l;
  rl.moe.hidden_states = xs.view();
  rl.moe.gating_output = logits_s.view();
  rl.moe.w_gate_up = wgu.view();
  rl.moe.w_down = wd.view();
  rl.moe.output = ref_layer.view();
  rl.shared_w_gate_up = sgu.view();
  rl.shared_w_down = sd.view();
  reference::fused_moe(rl.moe);
  rl.moe.output = ref_shared.view();
  reference::fused_moe_shared_expert(rl);

  fused_moe_experts(e, nullptr);
  sync_ok();
  expect_close(gather_rows(out.data(), kBF, H, sampled, true), ref_experts, "fused_moe_experts");
  fused_moe(l.moe, nullptr);
  sync_ok();
  expect_close(gather_rows(out.data(), kBF, H, sampled, true), ref_layer, "fused_moe");
  fused_moe_shared_expert(l, nullptr);
  sync_ok();
  expect_close(gather_rows(out.data(), kBF, H, sampled, true), ref_shared,
               "fused_moe_shared_expert");
}

// E*2F*H = 72 * 4096 * 7168 > 2^31 weight elements (DeepSeek-V3's H and F): tokens routed to
// experts 0, 70 and 71, whose weights start past element 2^31 (70 and 71). Only those three
// experts' weights are uploaded (the others are never read); the references run on them as
// experts 0, 1, 2.
TEST(LargeIndexGpu, ExpertWeightsPastTwoTo31) {
  MOEKIT_REQUIRE_GPU();
  const int64_t H = 7168, F = 2048, E = 72, K = 2, T = 16;
  const int32_t used[3] = {0, 70, 71};
  std::mt19937_64 rng(37);
  HostTensor wgu3 = moetest::normal(rng, kBF, {3, 2 * F, H}, 1.0 / std::sqrt(double(H)));
  HostTensor wd3 = moetest::normal(rng, kBF, {3, H, F}, 1.0 / std::sqrt(double(F)));
  DeviceTensor dwgu(kBF, {E, 2 * F, H}), dwd(kBF, {E, H, F});
  const size_t gu_bytes = wgu3.nbytes() / 3, d_bytes = wd3.nbytes() / 3;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(dwgu.data()) + used[i] * gu_bytes,
                         static_cast<const char*>(wgu3.data()) + i * gu_bytes, gu_bytes,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(dwd.data()) + used[i] * d_bytes,
                         static_cast<const char*>(wd3.data()) + i * d_bytes, d_bytes,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  HostTensor x = moetest::normal(rng, kBF, {T, H}, 1.0);
  HostTensor w = moetest::make_topk_weights(rng, T, K);
  HostTensor ids3 = moetest::make_ids(rng, T, K, 3, moetest::Ids::kDistinct);  // 0..2
  HostTensor ids(DType::kI32, {T, K});
  for (int64_t i = 0; i < T * K; ++i) ids.as<int32_t>()[i] = used[ids3.as<int32_t>()[i]];
  DeviceTensor dx(x), dw(w), dids(ids), out(kBF, {T, H});

  HostTensor ref(kBF, {T, H});
  FusedMoEExpertsArgs r;
  r.hidden_states = x.view();
  r.w_gate_up = wgu3.view();
  r.w_down = wd3.view();
  r.topk_weights = w.view();
  r.topk_ids = ids3.view();
  r.output = ref.view();
  reference::fused_moe_experts(r);

  FusedMoEExpertsArgs a = experts_args(dx, dwgu, dwd, dw, dids, out);
  // indexed_expert_mlp at T = 16: the direct path; fused_moe_experts: the sorted path.
  for (bool indexed : {true, false}) {
    const size_t bytes =
        indexed ? indexed_expert_mlp_workspace_size(a) : fused_moe_experts_workspace_size(a);
    DeviceWorkspace ws(bytes);
    a.workspace = ws.get();
    indexed ? indexed_expert_mlp(a, nullptr) : fused_moe_experts(a, nullptr);
    sync_ok();
    expect_close(out.download(), ref, indexed ? "indexed_expert_mlp" : "fused_moe_experts");
  }

  // moe_expert_mlp: 16 rows each for experts 0, 70, 71 (the others empty).
  HostTensor meta(DType::kI32, {E}), meta3(DType::kI32, {3});
  for (int64_t e = 0; e < E; ++e) {
    meta.as<int32_t>()[e] = e < 70 ? 16 : e == 70 ? 32 : 48;
  }
  for (int i = 0; i < 3; ++i) meta3.as<int32_t>()[i] = 16 * (i + 1);
  HostTensor px = moetest::normal(rng, kBF, {48, H}, 1.0);
  HostTensor pref(kBF, {48, H});
  ExpertMLPArgs m;
  m.expert_input = px.view();
  m.layout_metadata = meta3.view();
  m.layout = PermutedLayout::contiguous(1);
  m.w_gate_up = wgu3.view();
  m.w_down = wd3.view();
  m.expert_output = pref.view();
  reference::moe_expert_mlp(m);
  DeviceTensor dpx(px), dmeta(meta), pout(kBF, {48, H});
  m.expert_input = dpx.view();
  m.layout_metadata = dmeta.view();
  m.w_gate_up = dwgu.view();
  m.w_down = dwd.view();
  m.expert_output = pout.view();
  DeviceWorkspace mws(expert_mlp_workspace_size(m));
  m.workspace = mws.get();
  moe_expert_mlp(m, nullptr);
  sync_ok();
  expect_close(pout.download(), pref, "moe_expert_mlp");
}

// A grouped GEMM whose a holds P*K = 2^32 + 2^20 elements (the SM90 config's shapes),
// checked on its last rows and a few first ones.
TEST(LargeIndexGpu, GroupedGemmPastTwoTo32Elements) {
  MOEKIT_REQUIRE_GPU();
  const int64_t Kd = 8192, P = (int64_t{1} << 32) / Kd + 128, E = 4, N = 64;
  std::mt19937_64 rng(41);
  HostTensor block = moetest::normal(rng, kBF, {256, Kd}, 1.0);
  HostTensor b = moetest::normal(rng, kBF, {E, N, Kd}, 1.0 / std::sqrt(double(Kd)));
  HostTensor meta(DType::kI32, {E});
  for (int64_t e = 0; e < E; ++e) meta.as<int32_t>()[e] = static_cast<int32_t>(P * (e + 1) / E);
  DeviceTensor da(kBF, {P, Kd}), db(b), dmeta(meta), dc(kBF, {P, N});
  fill_by_block(da.data(), block, P);
  GroupedGemmArgs g;
  g.a = da.view();
  g.b = db.view();
  g.layout_metadata = dmeta.view();
  g.layout = PermutedLayout::contiguous(1);
  g.c = dc.view();
  moe_grouped_gemm(g, nullptr);
  sync_ok();

  std::vector<int64_t> sampled = {0, 1, 2, 3};
  for (int64_t r = P - 128; r < P; ++r) sampled.push_back(r);  // past element 2^32
  // The reference on the sampled rows, all of the last group's (expert E-1) but the first
  // four (expert 0): a 2-group problem.
  HostTensor as = gather_rows(block.data(), kBF, Kd, sampled, false, 256);
  HostTensor bs(kBF, {2, N, Kd});
  std::memcpy(bs.data(), b.data(), bs.nbytes() / 2);
  std::memcpy(static_cast<char*>(bs.data()) + bs.nbytes() / 2,
              static_cast<const char*>(b.data()) + (E - 1) * (bs.nbytes() / 2), bs.nbytes() / 2);
  HostTensor ms(DType::kI32, {2});
  ms.as<int32_t>()[0] = 4;
  ms.as<int32_t>()[1] = static_cast<int32_t>(sampled.size());
  HostTensor ref(kBF, {static_cast<int64_t>(sampled.size()), N});
  GroupedGemmArgs r;
  r.a = as.view();
  r.b = bs.view();
  r.layout_metadata = ms.view();
  r.layout = PermutedLayout::contiguous(1);
  r.c = ref.view();
  reference::moe_grouped_gemm(r);
  expect_close(gather_rows(dc.data(), kBF, N, sampled, true), ref, "moe_grouped_gemm");
}

}  // namespace
}  // namespace moekit
