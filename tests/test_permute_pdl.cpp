// Programmatic Dependent Launch (core/pdl.cuh) on the routing / permute chain:
// fused_topk -> permute_align -> pre_permute -> post_permute, kRounds times in one
// stream over SHARED intermediate buffers (every step of round i+1 overwrites what
// round i's later kernels read: write-after-read hazards, as well as the
// read-after-write ones inside a round). Captured in a CUDA graph with PDL on, the
// replays must equal the same graph captured with PDL off bit for bit, on every
// path (fused and multi-kernel align / pre-permute, both post-permute kernels, FusedTopK
// grids with and without the early trigger).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/pdl.h"
#include "moekit/permute.h"
#include "moekit/routing.h"
#include "reference/host_tensor.h"
#include "support/gpu.h"

namespace moekit {
namespace {

using testing::ScopedPdl;

TEST(Pdl, OverrideAndEnvironment) {
  {
    ScopedPdl on(1);
    EXPECT_TRUE(detail::pdl_enabled());
  }
  {
    ScopedPdl off(2);
    EXPECT_FALSE(detail::pdl_enabled());
  }
  // Default: on unless MOEKIT_PDL=0.
  const char* env = std::getenv("MOEKIT_PDL");
  EXPECT_EQ(detail::pdl_enabled(), !(env != nullptr && env[0] == '0'));
}

struct ChainShape {
  int64_t T;
  int K, E;
  int groups, topk_group;  // 0, 0: no grouping (softmax); else sigmoid + bias (DeepSeek-V3)
  int block_size, alignment;
  int64_t H;
};

std::string shape_name(const ChainShape& c) {
  return "T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + " E=" + std::to_string(c.E) +
         " groups=" + std::to_string(c.groups) + " H=" + std::to_string(c.H);
}

constexpr int kRounds = 3;
constexpr uint8_t kPoison = 0x5A;

// The chain's buffers: per-round inputs and outputs, shared intermediates.
struct Chain {
  ChainShape c;
  int64_t S, NB, P;
  std::vector<testing::DeviceTensor> gating, hidden, out;  // [kRounds]
  testing::DeviceTensor bias, w, ids, sorted, eids, npp, permuted, meta, inv;
  std::unique_ptr<testing::DeviceWorkspace> align_ws, pre_ws;

  explicit Chain(const ChainShape& s)
      : c(s),
        S(permute_align_sorted_size(s.T * s.K, s.E, s.block_size)),
        NB(permute_align_num_blocks(s.T * s.K, s.E, s.block_size)),
        P(permuted_rows(s.T, s.K, s.E, s.alignment)),
        bias(DType::kF32, {s.E}, 0),
        w(DType::kF32, {s.T, s.K}),
        ids(DType::kI32, {s.T, s.K}),
        sorted(DType::kI32, {S}),
        eids(DType::kI32, {NB}),
        npp(DType::kI32, {1}),
        permuted(DType::kBF16, {P, s.H}),
        meta(DType::kI32, {s.E}),
        inv(DType::kI32, {s.T * s.K}) {
    for (int r = 0; r < kRounds; ++r) {
      gating.emplace_back(DType::kBF16, std::vector<int64_t>{c.T, c.E});
      hidden.emplace_back(DType::kBF16, std::vector<int64_t>{c.T, c.H});
      out.emplace_back(DType::kBF16, std::vector<int64_t>{c.T, c.H});
    }
    align_ws = std::make_unique<testing::DeviceWorkspace>(permute_align_workspace_size(align(0)));
    pre_ws = std::make_unique<testing::DeviceWorkspace>(pre_permute_workspace_size(pre(0)));
  }

  FusedTopKArgs topk(int r) const {
    FusedTopKArgs a;
    a.gating_output = gating[r].view();
    a.params.top_k = c.K;
    a.params.renormalize = true;
    if (c.groups > 0) {
      a.correction_bias = bias.view();
      a.params.scoring_func = ScoringFunc::kSigmoid;
      a.params.num_expert_group = c.groups;
      a.params.topk_group = c.topk_group;
      a.params.routed_scaling_factor = 2.5f;
    }
    a.topk_weights = w.view();
    a.topk_ids = ids.view();
    return a;
  }
  PermuteAlignArgs align(int) const {
    PermuteAlignArgs a;
    a.topk_ids = ids.view();
    a.num_experts = c.E;
    a.block_size = c.block_size;
    a.sorted_token_ids = sorted.view();
    a.expert_ids = eids.view();
    a.num_tokens_post_padded = npp.view();
    if (align_ws) a.workspace = align_ws->get();
    return a;
  }
  PrePermuteArgs pre(int r) const {
    PrePermuteArgs a;
    a.hidden_states = hidden[r].view();
    a.local_expert_ids = ids.view();
    a.num_local_experts = c.E;
    a.layout = PermutedLayout::contiguous(c.alignment);
    a.permuted = permuted.view();
    a.layout_metadata = meta.view();
    a.inverse_indices = inv.view();
    if (pre_ws) a.workspace = pre_ws->get();
    return a;
  }
  PostPermuteArgs post(int r) const {
    PostPermuteArgs a;
    a.expert_output = permuted.view();
    a.topk_weights = w.view();
    a.inverse_indices = inv.view();
    a.out = out[r].view();
    return a;
  }

  // Poisons every output (so unwritten bytes compare too), then the kRounds chains.
  void enqueue(cudaStream_t s) const {
    for (const testing::DeviceTensor* t : {&w, &ids, &sorted, &eids, &npp, &permuted, &meta, &inv})
      ASSERT_EQ(cudaMemsetAsync(t->data(), kPoison, t->view().nbytes(), s), cudaSuccess);
    for (const testing::DeviceTensor& t : out)
      ASSERT_EQ(cudaMemsetAsync(t.data(), kPoison, t.view().nbytes(), s), cudaSuccess);
    for (int r = 0; r < kRounds; ++r) {
      fused_topk(topk(r), s);
      moe_permute_align(align(r), s);
      moe_pre_permute(pre(r), s);
      moe_post_permute(post(r), s);
    }
  }

  void new_inputs(std::mt19937_64& rng) {
    for (int r = 0; r < kRounds; ++r) {
      HostTensor g(DType::kBF16, {c.T, c.E}), x(DType::kBF16, {c.T, c.H});
      g.fill_normal(rng);
      x.fill_normal(rng);
      gating[r].upload(g);
      hidden[r].upload(x);
    }
    HostTensor b(DType::kF32, {c.E});
    b.fill_normal(rng, 0.1);
    bias.upload(b);
  }

  // Every output, in a fixed order, with names for messages.
  std::vector<std::pair<std::string, HostTensor>> snapshot() const {
    std::vector<std::pair<std::string, HostTensor>> v = {{"topk_weights", w.download()},
                                                         {"topk_ids", ids.download()},
                                                         {"sorted_token_ids", sorted.download()},
                                                         {"expert_ids", eids.download()},
                                                         {"num_tokens_post_padded", npp.download()},
                                                         {"permuted", permuted.download()},
                                                         {"layout_metadata", meta.download()},
                                                         {"inverse_indices", inv.download()}};
    for (int r = 0; r < kRounds; ++r)
      v.push_back({"out[" + std::to_string(r) + "]", out[r].download()});
    return v;
  }
};

void expect_same(const std::vector<std::pair<std::string, HostTensor>>& got,
                 const std::vector<std::pair<std::string, HostTensor>>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const HostTensor &a = got[i].second, &b = want[i].second;
    bool same = a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
    int64_t at = -1;
    if (!same && a.nbytes() == b.nbytes()) {
      const auto* pa = static_cast<const uint8_t*>(a.data());
      const auto* pb = static_cast<const uint8_t*>(b.data());
      for (size_t j = 0; j < a.nbytes() && at < 0; ++j)
        if (pa[j] != pb[j]) at = static_cast<int64_t>(j);
    }
    EXPECT_TRUE(same) << what << ": " << got[i].first
                      << " differs from the PDL-off result first at byte " << at;
  }
}

// Kernel->kernel edges of a captured graph that are programmatic (PDL).
size_t programmatic_edges(cudaGraph_t g) {
  size_t n = 0;
  if (cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n) != cudaSuccess) return 0;
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n == 0 || cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n) != cudaSuccess)
    return 0;
  size_t prog = 0;
  for (const cudaGraphEdgeData& d : data) prog += d.type == cudaGraphDependencyTypeProgrammatic;
  return prog;
}

struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

void capture(const Chain& ch, cudaStream_t s, Graph& g) {
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ch.enqueue(s);
  ASSERT_EQ(cudaStreamEndCapture(s, &g.graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&g.exec, g.graph, 0), cudaSuccess);
}

void check_chain(const ChainShape& shape, uint64_t seed) {
  SCOPED_TRACE(shape_name(shape));
  cudaStream_t s;
  MOEKIT_CUDA_OK(cudaStreamCreate(&s));
  {
    Chain ch(shape);
    std::mt19937_64 rng(seed);
    ch.new_inputs(rng);
    // Eager first: the one-time shared-memory opt-ins happen outside any capture.
    ch.enqueue(s);
    MOEKIT_CUDA_OK(cudaStreamSynchronize(s));
    Graph plain, pdl;
    {
      ScopedPdl off(2);
      capture(ch, s, plain);
    }
    {
      ScopedPdl on(1);
      capture(ch, s, pdl);
    }
    EXPECT_EQ(programmatic_edges(plain.graph), 0u);
    // Every kernel after the first of a round follows a kernel: >= 4 per round on
    // the fused paths, more on the multi-kernel ones.
    EXPECT_GE(programmatic_edges(pdl.graph), static_cast<size_t>(4 * kRounds - 1));
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE("inputs " + std::to_string(round));
      if (round > 0) ch.new_inputs(rng);
      MOEKIT_CUDA_OK(cudaGraphLaunch(plain.exec, s));
      MOEKIT_CUDA_OK(cudaStreamSynchronize(s));
      const auto want = ch.snapshot();
      EXPECT_GT(want[4].second.as<int32_t>()[0], 0) << "num_tokens_post_padded";
      // Replays back to back (graph after graph), then one check.
      for (int rep = 0; rep < 3; ++rep) MOEKIT_CUDA_OK(cudaGraphLaunch(pdl.exec, s));
      MOEKIT_CUDA_OK(cudaStreamSynchronize(s));
      expect_same(ch.snapshot(), want, "PDL graph");
      // Eager launches with PDL on (stream serialization instead of graph edges).
      {
        ScopedPdl on(1);
        ch.enqueue(s);
      }
      MOEKIT_CUDA_OK(cudaStreamSynchronize(s));
      expect_same(ch.snapshot(), want, "PDL eager");
    }
  }
  MOEKIT_CUDA_OK(cudaStreamDestroy(s));
}

TEST(PdlGpu, ChainGraphMatchesPlainBitForBit) {
  MOEKIT_REQUIRE_GPU();
  const std::vector<ChainShape> shapes = {
      {32, 8, 256, 8, 4, 64, 1, 128},    // DeepSeek-V3 routing, fused align / pre-permute
      {300, 6, 64, 0, 0, 16, 8, 256},    // softmax, general shape, alignment 8
      {1024, 8, 128, 0, 0, 64, 16, 64},  // fused align, multi-kernel pre-permute
      {8192, 8, 160, 0, 0, 64, 1, 64},   // multi-kernel align and pre-permute
  };
  uint64_t seed = 7;
  for (const ChainShape& c : shapes) check_chain(c, seed++);
}

}  // namespace
}  // namespace moekit
