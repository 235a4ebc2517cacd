// CPU tests of the MoE ops: references on hand-computed cases, validation errors,
// workspace sizes.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/host_dtype.h"
#include "mlp/streamk_mlp.h"
#include "moe/moe_internal.h"
#include "moekit/error.h"
#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/host_tensor.h"

namespace moekit {
namespace {

// ---- references on hand-computed cases ----
//
// H = F = 8. Every expert's gate and up blocks are the identity, so gate = up = x and
// the activation is act(x)_n = round(silu(x_n) * x_n); w_down[e] = (e+1) * I, so
// MLP_e(x) = (e+1) * act(x).

constexpr int64_t kH = 8, kF = 8;

double act_of(double x, DType dt) {
  return host::round_to(dt, x / (1.0 + std::exp(-x)) * x);
}

const double kX[kH] = {0.0, 1.0, -1.0, 2.0, 0.5, -2.0, 3.0, 4.0};

// x row t = kX * (1 + t/2), exactly representable in bf16 and f16.
HostTensor hand_hidden(DType dt, int64_t T) {
  HostTensor x(dt, {T, kH});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < kH; ++h) x.set(t * kH + h, kX[h] * (1.0 + 0.5 * t));
  return x;
}

HostTensor hand_gate_up(DType dt, int64_t E) {
  HostTensor w(dt, {E, 2 * kF, kH});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < kF; ++n) {
      w.set((e * 2 * kF + n) * kH + n, 1.0);       // gate row n = e_n
      w.set((e * 2 * kF + kF + n) * kH + n, 1.0);  // up row n = e_n
    }
  return w;
}

HostTensor hand_down(DType dt, int64_t E) {
  HostTensor w(dt, {E, kH, kF});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t h = 0; h < kH; ++h) w.set((e * kH + h) * kF + h, static_cast<double>(e + 1));
  return w;
}

class MoERefTest : public ::testing::TestWithParam<DType> {};

TEST_P(MoERefTest, FusedMoEExpertsHandComputed) {
  const DType dt = GetParam();
  const int64_t T = 5, K = 2, E = 2;
  HostTensor x = hand_hidden(dt, T), wgu = hand_gate_up(dt, E), wd = hand_down(dt, E);
  HostTensor ids(DType::kI32, {T, K}), w(DType::kF32, {T, K});
  const int32_t id_vals[T * K] = {0, 1, -1, 1, -1, 7, 1, 1, 0, -5};
  const double w_vals[T * K] = {0.5, 0.25, 9.0, 1.0, 2.0, 3.0, 1.0, 0.5, 0.75, 4.0};
  // MLP_0 = act, MLP_1 = 2 act: t0 0.5 + 0.5; t1 2; t2 none (7 out of range);
  // t3 duplicate id 1: 2 + 1; t4 0.75 (-5 skipped).
  const double coef[T] = {1.0, 2.0, 0.0, 3.0, 0.75};
  for (int i = 0; i < T * K; ++i) {
    ids.as<int32_t>()[i] = id_vals[i];
    w.set(i, w_vals[i]);
  }
  HostTensor out(dt, {T, kH});
  out.fill_bytes(0x7b);
  FusedMoEExpertsArgs a;
  a.hidden_states = x.view();
  a.w_gate_up = wgu.view();
  a.w_down = wd.view();
  a.topk_weights = w.view();
  a.topk_ids = ids.view();
  a.output = out.view();
  reference::fused_moe_experts(a);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < kH; ++h) {
      const double want = host::round_to(dt, coef[t] * act_of(x.at(t * kH + h), dt));
      EXPECT_EQ(out.at(t * kH + h), want) << "t=" << t << " h=" << h;
    }
  HostTensor out2(dt, {T, kH});
  a.output = out2.view();
  reference::indexed_expert_mlp(a);
  EXPECT_EQ(std::memcmp(out.data(), out2.data(), out.nbytes()), 0);
}

TEST_P(MoERefTest, ExpertMLPHandComputedLeavesPaddingUntouched) {
  const DType dt = GetParam();
  const int64_t E = 2, P = 8;
  // alignment 4, counts {2, 3}: expert 0 rows [0, 2), padding 2..3, expert 1 rows [4, 7),
  // row 7 past the last block.
  HostTensor x = hand_hidden(dt, P), wgu = hand_gate_up(dt, E), wd = hand_down(dt, E);
  HostTensor meta(DType::kI32, {E});
  meta.as<int32_t>()[0] = 2;
  meta.as<int32_t>()[1] = 7;
  HostTensor out(dt, {P, kH});
  for (int64_t i = 0; i < P * kH; ++i) out.set(i, 123.0);
  ExpertMLPArgs a;
  a.expert_input = x.view();
  a.layout_metadata = meta.view();
  a.layout = PermutedLayout::contiguous(4);
  a.w_gate_up = wgu.view();
  a.w_down = wd.view();
  a.expert_output = out.view();
  reference::moe_expert_mlp(a);
  const int expert_of_row[P] = {0, 0, -1, -1, 1, 1, 1, -1};
  for (int64_t r = 0; r < P; ++r)
    for (int64_t h = 0; h < kH; ++h) {
      const int e = expert_of_row[r];
      const double want = e < 0 ? 123.0 : (e + 1) * act_of(x.at(r * kH + h), dt);
      EXPECT_EQ(out.at(r * kH + h), host::round_to(dt, want)) << "r=" << r << " h=" << h;
    }
}

// Shared expert: identity gate/up, w_down = 3 I: SharedMLP(x) = 3 act(x).
TEST_P(MoERefTest, SharedAndLayerHandComputed) {
  const DType dt = GetParam();
  const int64_t T = 2, E = 2;
  HostTensor x = hand_hidden(dt, T);
  HostTensor sgu(dt, {2 * kF, kH}), sd(dt, {kH, kF});
  for (int64_t n = 0; n < kF; ++n) {
    sgu.set(n * kH + n, 1.0);
    sgu.set((kF + n) * kH + n, 1.0);
    sd.set(n * kF + n, 3.0);
  }
  HostTensor out(dt, {T, kH});
  SharedExpertMLPArgs s;
  s.hidden_states = x.view();
  s.w_gate_up = sgu.view();
  s.w_down = sd.view();
  s.output = out.view();
  reference::shared_expert_mlp(s);
  for (int64_t i = 0; i < T * kH; ++i)
    EXPECT_EQ(out.at(i), host::round_to(dt, 3 * act_of(x.at(i), dt))) << i;

  // Layer: top-1 softmax with renormalize -> weight 1. Token 0 picks expert 0 (x1),
  // token 1 expert 1 (x2); plus the shared expert (x3): 4 act and 5 act.
  HostTensor wgu = hand_gate_up(dt, E), wd = hand_down(dt, E);
  HostTensor logits(DType::kF32, {T, E});
  logits.set(0, 1.0);
  logits.set(1, 0.0);
  logits.set(2, 0.0);
  logits.set(3, 2.0);
  FusedMoESharedExpertArgs l;
  l.moe.hidden_states = x.view();
  l.moe.gating_output = logits.view();
  l.moe.params.top_k = 1;
  l.moe.params.renormalize = true;
  l.moe.w_gate_up = wgu.view();
  l.moe.w_down = wd.view();
  l.moe.output = out.view();
  l.shared_w_gate_up = sgu.view();
  l.shared_w_down = sd.view();
  reference::fused_moe_shared_expert(l);
  const double coef_shared[T] = {4.0, 5.0};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < kH; ++h)
      EXPECT_EQ(out.at(t * kH + h),
                host::round_to(dt, coef_shared[t] * act_of(x.at(t * kH + h), dt)))
          << t << "," << h;
  reference::fused_moe(l.moe);
  const double coef[T] = {1.0, 2.0};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < kH; ++h)
      EXPECT_EQ(out.at(t * kH + h), host::round_to(dt, coef[t] * act_of(x.at(t * kH + h), dt)))
          << t << "," << h;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MoERefTest, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- validation ----
//
// Views over one aligned host buffer, each at its own offset (so that no case is met by the
// overlap check instead of the check it names): validation never reads the data, and every
// case below fails before anything is launched. The workspace lies past the views, so a
// big one overlaps none of them.

struct FakeMemory {
  alignas(256) uint8_t views[size_t{4} << 20];
  alignas(256) uint8_t workspace[256];
};
FakeMemory g_mem;

// `bytes` of the views buffer, 256-byte aligned, past the last ones given; it wraps
// around, far past what one call's views take.
void* fake_ptr(size_t bytes) {
  static size_t next = 0;
  bytes = (bytes + 255) / 256 * 256;
  if (next + bytes > sizeof g_mem.views) next = 0;
  void* p = g_mem.views + next;
  next += bytes;
  return p;
}

TensorView v(DType dt, std::initializer_list<int64_t> shape) {
  const TensorView t = make_view(nullptr, dt, shape);
  return make_view(fake_ptr(t.nbytes()), dt, shape);
}

Workspace big_ws() {
  return Workspace{g_mem.workspace, size_t{1} << 40};
}

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

// fn throws an Error of `op` naming argument `arg` and saying `what` (the check meant, where
// another check of the same argument could fire first).
void expect_op_error(const std::function<void()>& fn, const std::string& op, const std::string& arg,
                     const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming '" << arg << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("moekit::" + op + ": argument '" + arg + "': ", 0), 0u) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

// Without a CUDA device a valid call passes every check and stops at the launch target
// (with one, the fake pointers would be launched on).
bool no_cuda_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return n == 0;
}

void expect_valid(const std::function<void()>& fn) {
  expect_arg_error(fn, "stream", "expected a CUDA device to launch on");
}

constexpr DType kBF = DType::kBF16;
constexpr int64_t T = 4, H = 16, E = 4, F = 8, K = 2, S = 16;

FusedMoEExpertsArgs valid_experts() {
  FusedMoEExpertsArgs a;
  a.hidden_states = v(kBF, {T, H});
  a.w_gate_up = v(kBF, {E, 2 * F, H});
  a.w_down = v(kBF, {E, H, F});
  a.topk_weights = v(DType::kF32, {T, K});
  a.topk_ids = v(DType::kI32, {T, K});
  a.output = v(kBF, {T, H});
  a.workspace = big_ws();
  return a;
}

TEST(MoEValidation, FusedMoEExperts) {
  using Mut = std::function<void(FusedMoEExpertsArgs&)>;
  struct Case {
    Mut mut;
    const char* arg;
    const char* what;  // a fragment of the message: the check meant
  };
  const std::vector<Case> cases = {
      {[](auto& a) {
         a.hidden_states = v(DType::kF32, {T, H});
       },
       "hidden_states", "expected dtype bf16 or f16"},
      {[](auto& a) { a.hidden_states = TensorView{}; }, "hidden_states", "got an undefined tensor"},
      {[](auto& a) {
         a.hidden_states = make_view(nullptr, kBF, {T, H});
       },
       "hidden_states", "a non-null data pointer"},
      {[](auto& a) {
         a.hidden_states = make_view(static_cast<char*>(fake_ptr(T * H * 2)) + 2, kBF,
                                     {T, H});  // not 16-B aligned
       },
       "hidden_states", "data aligned to 16 bytes"},
      {[](auto& a) {
         a.hidden_states = v(kBF, {T, 12});
         a.output = v(kBF, {T, 12});
       },
       "hidden_states", "a positive multiple of 8"},
      {[](auto& a) {
         a.w_gate_up = v(DType::kF16, {E, 2 * F, H});
       },
       "w_gate_up", "expected dtype bf16 (that of 'hidden_states')"},
      {[](auto& a) {
         a.w_gate_up = v(kBF, {E, 2 * F, H + 8});
       },
       "w_gate_up", "expected shape [*, *, 16]"},
      {[](auto& a) {
         a.w_gate_up = v(kBF, {E, 2 * F + 2, H});
       },
       "w_gate_up", "2*F gate+up rows with F a positive multiple of 8"},
      {[](auto& a) {
         a.w_gate_up = v(kBF, {2 * F, H});
       },
       "w_gate_up", "expected shape [*, *, 16]"},
      {[](auto& a) {
         a.w_down = v(kBF, {E + 1, H, F});
       },
       "w_down", "expected shape [4, 16, 8]"},
      {[](auto& a) {
         a.w_down = v(kBF, {E, F, H});
       },
       "w_down", "expected shape [4, 16, 8]"},
      {[](auto& a) {
         a.w_down = v(DType::kF16, {E, H, F});
       },
       "w_down", "expected dtype bf16 (that of 'hidden_states')"},
      {[](auto& a) {
         a.topk_ids = v(DType::kF32, {T, K});
       },
       "topk_ids", "expected dtype i32 or i64"},
      {[](auto& a) {
         a.topk_ids = v(DType::kI32, {T + 1, K});
       },
       "topk_ids", "expected shape [4, *]"},
      {[](auto& a) {
         a.topk_ids = v(DType::kI32, {T, 0});
       },
       "topk_ids", "top_k (dim 1) >= 1"},
      {[](auto& a) {
         a.topk_weights = v(DType::kF32, {T, K + 1});
       },
       "topk_weights", "expected shape [4, 2]"},
      {[](auto& a) {
         a.topk_weights = v(kBF, {T, K});
       },
       "topk_weights", "expected dtype f32"},
      {[](auto& a) {
         a.output = v(DType::kF16, {T, H});
       },
       "output", "expected dtype bf16 (that of 'hidden_states')"},
      {[](auto& a) {
         a.output = v(kBF, {T, H + 8});
       },
       "output", "expected shape [4, 16]"},
      {[](auto& a) {
         a.output = v(DType::kF32, {T, H});
       },
       "output", "expected dtype bf16 or f16"},
      {[](auto& a) { a.workspace = Workspace{}; }, "workspace", "got no workspace"},
      {[](auto& a) {
         a.workspace = Workspace{g_mem.workspace, 16};
       },
       "workspace", "got 16 bytes"},
  };
  if (no_cuda_device()) {
    expect_valid([] { fused_moe_experts(valid_experts(), nullptr); });
    expect_valid([] { indexed_expert_mlp(valid_experts(), nullptr); });
  }
  for (const Case& c : cases) {
    FusedMoEExpertsArgs a = valid_experts();
    c.mut(a);
    SCOPED_TRACE(c.arg);
    expect_op_error([&] { fused_moe_experts(a, nullptr); }, "fused_moe_experts", c.arg, c.what);
    expect_op_error([&] { indexed_expert_mlp(a, nullptr); }, "indexed_expert_mlp", c.arg, c.what);
  }
  // The sorted path takes at most 1024 experts (the direct path of indexed_expert_mlp more).
  FusedMoEExpertsArgs many = valid_experts();
  many.w_gate_up = v(kBF, {1025, 2 * F, H});
  many.w_down = v(kBF, {1025, H, F});
  expect_arg_error([&] { fused_moe_experts(many, nullptr); }, "w_gate_up", "at most 1024 experts");
  many.hidden_states = v(kBF, {65, H});
  many.output = v(kBF, {65, H});
  many.topk_ids = v(DType::kI32, {65, K});
  many.topk_weights = v(DType::kF32, {65, K});
  expect_arg_error([&] { indexed_expert_mlp(many, nullptr); }, "w_gate_up", "at most 1024 experts");
  // The error names the op too.
  FusedMoEExpertsArgs a = valid_experts();
  a.topk_ids = v(DType::kF32, {T, K});
  expect_arg_error([&] { indexed_expert_mlp(a, nullptr); }, "topk_ids",
                   "moekit::indexed_expert_mlp");
}

TEST(MoEValidation, ExpertMLP) {
  const int64_t P = 12;
  auto valid = [&] {
    ExpertMLPArgs a;
    a.expert_input = v(kBF, {P, H});
    a.layout_metadata = v(DType::kI32, {E});
    a.layout = PermutedLayout::contiguous(1);
    a.w_gate_up = v(kBF, {E, 2 * F, H});
    a.w_down = v(kBF, {E, H, F});
    a.expert_output = v(kBF, {P, H});
    a.workspace = big_ws();
    return a;
  };
  using Mut = std::function<void(ExpertMLPArgs&)>;
  struct Case {
    Mut mut;
    const char* arg;
    const char* what;
  };
  const std::vector<Case> cases = {
      {[](auto& a) {
         a.expert_input = v(DType::kI32, {P, H});
       },
       "expert_input", "expected dtype bf16 or f16"},
      {[](auto& a) {
         a.expert_input = v(kBF, {P, H, 1});
       },
       "expert_input", "expected shape [*, *]"},
      {[](auto& a) { a.layout_metadata = v(DType::kI32, {E + 1}); }, "layout_metadata",
       "expected shape [4]"},
      {[](auto& a) { a.layout_metadata = v(DType::kF32, {E}); }, "layout_metadata",
       "expected dtype i32"},
      {[](auto& a) { a.layout = PermutedLayout::masked(4); }, "layout",
       "a contiguous(alignment) layout"},
      {[](auto& a) { a.layout = PermutedLayout::contiguous(0); }, "layout", "alignment >= 1"},
      {[](auto& a) {
         a.w_gate_up = v(kBF, {E, 2 * F, 8});
       },
       "w_gate_up", "expected shape [*, *, 16]"},
      {[](auto& a) {
         a.w_gate_up = v(kBF, {0, 2 * F, H});
       },
       "w_gate_up", "at least one expert"},
      {[](auto& a) {
         a.w_gate_up = v(kBF, {E, 12, H});
       },
       "w_gate_up", "F a positive multiple of 8"},  // F = 6
      {[](auto& a) {
         a.w_down = v(kBF, {E, H, F + 8});
       },
       "w_down", "expected shape [4, 16, 8]"},
      {[](auto& a) {
         a.expert_output = v(kBF, {P - 1, H});
       },
       "expert_output", "expected shape [12, 16]"},
      {[](auto& a) {
         a.expert_output = v(DType::kF16, {P, H});
       },
       "expert_output", "expected dtype bf16 (that of 'expert_input')"},
      {[](auto& a) { a.workspace = Workspace{}; }, "workspace", "got no workspace"},
      {[](auto& a) {
         a.workspace = Workspace{g_mem.workspace + 16, size_t{1} << 40};
       },
       "workspace", "data aligned to 256 bytes"},
  };
  if (no_cuda_device()) expect_valid([&] { moe_expert_mlp(valid(), nullptr); });
  for (const auto& c : cases) {
    ExpertMLPArgs a = valid();
    c.mut(a);
    SCOPED_TRACE(c.arg);
    expect_op_error([&] { moe_expert_mlp(a, nullptr); }, "moe_expert_mlp", c.arg, c.what);
  }
}

FusedMoEArgs valid_layer() {
  FusedMoEArgs a;
  a.hidden_states = v(kBF, {T, H});
  a.gating_output = v(DType::kF32, {T, E});
  a.params.top_k = K;
  a.w_gate_up = v(kBF, {E, 2 * F, H});
  a.w_down = v(kBF, {E, H, F});
  a.output = v(kBF, {T, H});
  a.workspace = big_ws();
  return a;
}

FusedMoESharedExpertArgs valid_shared_layer() {
  FusedMoESharedExpertArgs s;
  s.moe = valid_layer();
  s.shared_w_gate_up = v(kBF, {2 * S, H});
  s.shared_w_down = v(kBF, {H, S});
  return s;
}

TEST(MoEValidation, FusedMoEAndSharedExpert) {
  using Mut = std::function<void(FusedMoEArgs&)>;
  struct Case {
    Mut mut;
    const char* arg;
    const char* what;
  };
  const std::vector<Case> cases = {
      {[](auto& a) {
         a.gating_output = v(DType::kF32, {T, E + 1});
       },
       "gating_output", "expected shape [4, 4]"},
      {[](auto& a) {
         a.gating_output = v(DType::kI32, {T, E});
       },
       "gating_output", "dtype bf16 or f16 or f32"},
      {[](auto& a) { a.gating_output = TensorView{}; }, "gating_output", "got an undefined tensor"},
      {[](auto& a) { a.correction_bias = v(DType::kF32, {E + 1}); }, "correction_bias",
       "expected shape [4]"},
      {[](auto& a) { a.correction_bias = v(kBF, {E}); }, "correction_bias", "expected dtype f32"},
      {[](auto& a) { a.params.top_k = 0; }, "top_k", "1 to min(16, num_experts=4), got 0"},
      {[](auto& a) { a.params.top_k = E + 1; }, "top_k", "1 to min(16, num_experts=4), got 5"},
      // Routing parameters are checked under the layer op's name, before any launch.
      {[](auto& a) {
         a.params.num_expert_group = 3;
         a.params.topk_group = 1;
       },
       "num_expert_group", "0 or a positive divisor of num_experts=4"},
      {[](auto& a) {
         a.params.num_expert_group = 2;
         a.params.topk_group = 3;
       },
       "topk_group", "1 to num_expert_group=2"},
      {[](auto& a) { a.params.routed_scaling_factor = NAN; }, "routed_scaling_factor",
       "a finite value"},
      {[](auto& a) {
         a.hidden_states = v(kBF, {T + 1, H});
       },
       "gating_output", "expected shape [5, 4]"},
      {[](auto& a) {
         a.w_down = v(kBF, {E, H, 2 * F});
       },
       "w_down", "expected shape [4, 16, 8]"},
      {[](auto& a) {
         a.output = v(kBF, {T - 1, H});
       },
       "output", "expected shape [4, 16]"},
      {[](auto& a) {
         a.workspace = Workspace{g_mem.workspace, 255};
       },
       "workspace", "got 255 bytes"},
  };
  if (no_cuda_device()) {
    expect_valid([] { fused_moe(valid_layer(), nullptr); });
    expect_valid([] { fused_moe_shared_expert(valid_shared_layer(), nullptr); });
  }
  for (const auto& c : cases) {
    FusedMoEArgs a = valid_layer();
    c.mut(a);
    SCOPED_TRACE(c.arg);
    expect_op_error([&] { fused_moe(a, nullptr); }, "fused_moe", c.arg, c.what);
    FusedMoESharedExpertArgs s;
    s.moe = a;
    s.shared_w_gate_up = v(kBF, {2 * S, H});
    s.shared_w_down = v(kBF, {H, S});
    expect_op_error([&] { fused_moe_shared_expert(s, nullptr); }, "fused_moe_shared_expert", c.arg,
                    c.what);
  }
  using SMut = std::function<void(FusedMoESharedExpertArgs&)>;
  struct SCase {
    SMut mut;
    const char* arg;
    const char* what;
  };
  const std::vector<SCase> shared_cases = {
      {[](auto& a) {
         a.shared_w_gate_up = v(kBF, {2 * S, H + 8});
       },
       "shared_w_gate_up", "expected shape [*, 16]"},
      {[](auto& a) {
         a.shared_w_gate_up = v(kBF, {2 * S + 4, H});
       },
       "shared_w_gate_up", "2*S gate+up rows with S a positive multiple of 8"},
      {[](auto& a) { a.shared_w_gate_up = TensorView{}; }, "shared_w_gate_up",
       "got an undefined tensor"},
      {[](auto& a) { a.shared_w_down = TensorView{}; }, "shared_w_down", "got an undefined tensor"},
      {[](auto& a) {
         a.shared_w_gate_up = v(DType::kF16, {2 * S, H});
       },
       "shared_w_gate_up", "expected dtype bf16 (that of 'hidden_states')"},
      {[](auto& a) {
         a.shared_w_down = v(kBF, {H, S + 8});
       },
       "shared_w_down", "expected shape [16, 16]"},
      {[](auto& a) {
         a.shared_w_down = v(kBF, {H + 8, S});
       },
       "shared_w_down", "expected shape [16, 16]"},
  };
  for (const auto& c : shared_cases) {
    FusedMoESharedExpertArgs s = valid_shared_layer();
    c.mut(s);
    SCOPED_TRACE(c.arg);
    expect_op_error([&] { fused_moe_shared_expert(s, nullptr); }, "fused_moe_shared_expert", c.arg,
                    c.what);
  }
}

TEST(MoEValidation, SharedExpertMLP) {
  auto valid = [] {
    SharedExpertMLPArgs a;
    a.hidden_states = v(kBF, {T, H});
    a.w_gate_up = v(kBF, {2 * S, H});
    a.w_down = v(kBF, {H, S});
    a.output = v(kBF, {T, H});
    a.workspace = big_ws();
    return a;
  };
  using Mut = std::function<void(SharedExpertMLPArgs&)>;
  struct Case {
    Mut mut;
    const char* arg;
    const char* what;
  };
  const std::vector<Case> cases = {
      {[](auto& a) {
         a.hidden_states = v(DType::kF32, {T, H});
       },
       "hidden_states", "expected dtype bf16 or f16"},
      {[](auto& a) {
         a.w_gate_up = v(kBF, {E, 2 * S, H});
       },
       "w_gate_up", "expected shape [*, 16]"},
      {[](auto& a) {
         a.w_gate_up = v(kBF, {2 * S + 2, H});
       },
       "w_gate_up", "S a positive multiple of 8"},
      {[](auto& a) {
         a.w_down = v(kBF, {H, S - 8});
       },
       "w_down", "expected shape [16, 16]"},
      {[](auto& a) {
         a.output = v(kBF, {T, H - 8});
       },
       "output", "expected shape [4, 16]"},
      {[](auto& a) {
         a.output = v(DType::kF16, {T, H});
       },
       "output", "expected dtype bf16 (that of 'hidden_states')"},
      {[](auto& a) { a.workspace = Workspace{}; }, "workspace", "got no workspace"},
  };
  if (no_cuda_device()) expect_valid([&] { shared_expert_mlp(valid(), nullptr); });
  for (const auto& c : cases) {
    SharedExpertMLPArgs a = valid();
    c.mut(a);
    SCOPED_TRACE(c.arg);
    expect_op_error([&] { shared_expert_mlp(a, nullptr); }, "shared_expert_mlp", c.arg, c.what);
  }
}

// ---- workspace sizes ----

TEST(MoEWorkspace, SizesDependOnShapesOnly) {
  auto null_view = [](DType dt, std::initializer_list<int64_t> s) {
    return make_view(nullptr, dt, s);
  };
  FusedMoEExpertsArgs a;
  a.hidden_states = null_view(kBF, {1, 7168});
  a.w_gate_up = null_view(kBF, {256, 4096, 7168});
  a.w_down = null_view(kBF, {256, 7168, 2048});
  a.topk_weights = null_view(DType::kF32, {1, 8});
  a.topk_ids = null_view(DType::kI32, {1, 8});
  a.output = null_view(kBF, {1, 7168});
  // Direct path at T = 1: act [8, 2048] bf16 + down [8, 7168] f32, 256-byte aligned.
  EXPECT_EQ(indexed_expert_mlp_workspace_size(a), size_t{8 * 2048 * 2 + 8 * 7168 * 4});
  const size_t fused = fused_moe_experts_workspace_size(a);
  EXPECT_GE(fused, size_t{8 * 7168 * 2 + 8 * 2048 * 2});  // permuted [P, H] + act [P, F]
  EXPECT_EQ(fused % 256, 0u);
  // T > 64: indexed falls back to the permuted path and its workspace.
  a.hidden_states = null_view(kBF, {65, 7168});
  a.topk_weights = null_view(DType::kF32, {65, 8});
  a.topk_ids = null_view(DType::kI32, {65, 8});
  EXPECT_EQ(indexed_expert_mlp_workspace_size(a), fused_moe_experts_workspace_size(a));
  // Nothing to do, nothing needed.
  a.hidden_states = null_view(kBF, {0, 7168});
  a.topk_weights = null_view(DType::kF32, {0, 8});
  a.topk_ids = null_view(DType::kI32, {0, 8});
  EXPECT_EQ(indexed_expert_mlp_workspace_size(a), 0u);
  EXPECT_EQ(fused_moe_experts_workspace_size(a), 0u);

  ExpertMLPArgs m;
  m.expert_input = null_view(kBF, {100, 64});
  m.w_gate_up = null_view(kBF, {4, 64, 64});
  // act [P, F], then the two GEMMs' tile counters (the dynamic schedule).
  EXPECT_EQ(expert_mlp_workspace_size(m),
            size_t{(100 * 32 * 2 + 255) / 256 * 256} + detail::kExpertMlpCounterBytes);

  SharedExpertMLPArgs s;
  s.hidden_states = null_view(kBF, {3, 64});
  s.w_gate_up = null_view(kBF, {256, 64});
  // act [3, 128] bf16 + the stream-K MLP's scratch where that kernel can run (an sm_90
  // GPU is present; 0 on a CPU-only machine).
  const size_t sk = detail::streamk_mlp_scratch_bytes(kBF, 3, 64, 128, detail::device_props());
  EXPECT_EQ(shared_expert_mlp_workspace_size(s), size_t{(3 * 128 * 2 + 255) / 256 * 256} + sk);

  FusedMoEArgs l;
  l.hidden_states = null_view(kBF, {1, 7168});
  l.gating_output = null_view(DType::kF32, {1, 256});
  l.params.top_k = 8;
  l.w_gate_up = a.w_gate_up;
  l.w_down = a.w_down;
  // topk weights + ids (256 B each) + the direct routed buffers.
  EXPECT_EQ(fused_moe_workspace_size(l), size_t{512 + 8 * 2048 * 2 + 8 * 7168 * 4});
  FusedMoESharedExpertArgs ls;
  ls.moe = l;
  ls.shared_w_gate_up = null_view(kBF, {4096, 7168});
  // + shared act [1, 2048] bf16 + shared out [1, 7168] f32 (+ stream-K scratch, above).
  EXPECT_EQ(fused_moe_shared_expert_workspace_size(ls),
            fused_moe_workspace_size(l) + 4096 + 7168 * 4 +
                detail::streamk_mlp_scratch_bytes(kBF, 1, 7168, 2048, detail::device_props()));
}

}  // namespace
}  // namespace moekit
