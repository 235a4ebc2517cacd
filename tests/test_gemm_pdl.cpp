// CPU tests of the MLP GEMMs' PDL chain switch and eligibility rule
// (run_grouped_gemm_pair; docs/gemm.md "PDL chain of an MLP's GEMMs"). The GPU tests of
// the chain are in tests/test_moe_gemm_pdl.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <utility>

#include "gemm/grouped_gemm.h"

namespace moekit {
namespace {

class GemmPdlOverride {
 public:
  explicit GemmPdlOverride(int v) : prev_(detail::gemm_pdl_override()) {
    detail::gemm_pdl_override() = v;
  }
  ~GemmPdlOverride() { detail::gemm_pdl_override() = prev_; }

 private:
  int prev_;
};

// The two GEMMs of a dense MLP (SharedExpertMLPFwd), as run_dense_mlp builds them.
struct MlpPair {
  detail::GroupedGemmProblem up, down;
};

// out: the down GEMM's output dtype (undefined: dt).
MlpPair dense_mlp(int64_t T, int64_t H, int64_t S, DType dt = DType::kBF16,
                  DType out = DType::kUndefined) {
  MlpPair p;
  p.up.in_dtype = p.up.out_dtype = dt;
  p.up.n = S;
  p.up.k = H;
  p.up.activation = Activation::kSiluAndMul;
  p.up.rows = detail::GemmRows::kDense;
  p.up.m = T;
  p.down = p.up;
  p.down.out_dtype = out == DType::kUndefined ? dt : out;
  p.down.n = H;
  p.down.k = S;
  p.down.activation = Activation::kNone;
  return p;
}

// No environment switch (MOEKIT_GEMM_PDL=1 was removed): on only with the override.
TEST(GemmPdl, OffByDefaultOnOnlyWithTheOverride) {
  {
    GemmPdlOverride on(1);
    EXPECT_TRUE(detail::gemm_pdl_enabled());
  }
  {
    GemmPdlOverride off(2);
    EXPECT_FALSE(detail::gemm_pdl_enabled());
  }
  EXPECT_EQ(detail::gemm_pdl_override(), 0);
  EXPECT_FALSE(detail::gemm_pdl_enabled());
  const MlpPair p = dense_mlp(32, 7168, 2048);
  EXPECT_FALSE(detail::gemm_pdl_chain(p.up, p.down));
}

TEST(GemmPdl, ChainsOnlyDecodeRegimeMmaSyncConfigs) {
  if (std::getenv("MOEKIT_GEMM_CONFIG") != nullptr) GTEST_SKIP() << "MOEKIT_GEMM_CONFIG is set";
  GemmPdlOverride on(1);
  // The issue-5 rows: split-K / stream tiles by the heuristic.
  for (const MlpPair& p : {dense_mlp(32, 7168, 2048), dense_mlp(32, 5120, 1536),
                           dense_mlp(1, 7168, 18432), dense_mlp(1, 1000, 328, DType::kF16)}) {
    EXPECT_TRUE(detail::gemm_pdl_chain(p.up, p.down));
  }
  // The fused layer's shared expert: the down GEMM's out is f32.
  MlpPair f32 = dense_mlp(32, 7168, 2048, DType::kBF16, DType::kF32);
  EXPECT_TRUE(detail::gemm_pdl_chain(f32.up, f32.down));
  std::swap(f32.up.out_dtype, f32.down.out_dtype);  // f32 out of the first GEMM: no variant
  EXPECT_FALSE(detail::gemm_pdl_chain(f32.up, f32.down));

  // Forced configs: 0, 3, 4, 5 chain, in any mix; 4 also split; 5 split, 1, 2, 6 do not.
  const struct {
    int up_config, up_split, down_config, down_split;
    bool chained;
  } forced[] = {
      {0, 0, 0, 0, true},  {3, 2, 3, 8, true},  {4, 0, 5, 0, true},  {5, 0, 3, 3, true},
      {4, 2, 0, 0, true},  {5, 2, 0, 0, false}, {0, 0, 5, 3, false}, {1, 0, 0, 0, false},
      {0, 0, 2, 0, false}, {6, 0, 3, 2, false},
  };
  for (const auto& f : forced) {
    MlpPair p = dense_mlp(7, 1000, 328);
    p.up.config = f.up_config;
    p.up.split_k = f.up_split;
    p.down.config = f.down_config;
    p.down.split_k = f.down_split;
    EXPECT_EQ(detail::gemm_pdl_chain(p.up, p.down), f.chained)
        << f.up_config << "/" << f.up_split << " " << f.down_config << "/" << f.down_split;
  }

  // Prefill-sized MLPs take the SM90 kernels: not chained.
  MlpPair prefill = dense_mlp(4096, 7168, 2048);
  EXPECT_FALSE(detail::gemm_pdl_chain(prefill.up, prefill.down));
  // Routed experts (contiguous): chained when both take the decode tiles; short-k
  // stream GEMMs take the persistent config 9, which has no PDL variant.
  MlpPair routed = dense_mlp(0, 2048, 768);
  for (detail::GroupedGemmProblem* q : {&routed.up, &routed.down}) {
    q->rows = detail::GemmRows::kContiguous;
    q->num_groups = 128;
    q->m = 128 * 4;
    q->alignment = 1;
    q->routed_counts = true;
  }
  EXPECT_EQ(detail::select_grouped_gemm_config(routed.up), detail::kGemmConfigDecodePersistent);
  EXPECT_FALSE(detail::gemm_pdl_chain(routed.up, routed.down));
  routed.up.config = routed.down.config = detail::kGemmConfigDecodeStream;
  EXPECT_TRUE(detail::gemm_pdl_chain(routed.up, routed.down));
  routed.up.config = routed.down.config = -1;

  // A GEMM that launches nothing: no chain (the second GEMM's pre-wait loads rely on
  // the first one being its stream predecessor).
  MlpPair empty = dense_mlp(0, 1000, 328);
  EXPECT_FALSE(detail::gemm_pdl_chain(empty.up, empty.down));
  MlpPair no_groups = routed;
  no_groups.up.num_groups = no_groups.down.num_groups = 0;
  EXPECT_FALSE(detail::gemm_pdl_chain(no_groups.up, no_groups.down));
  MlpPair n0 = dense_mlp(4, 1000, 328);
  n0.up.n = 0;
  EXPECT_FALSE(detail::gemm_pdl_chain(n0.up, n0.down));
  // fp8 / f32 inputs are not this engine's.
  MlpPair f32_in = dense_mlp(4, 1000, 328, DType::kF32, DType::kF32);
  f32_in.up.out_dtype = DType::kF32;
  EXPECT_FALSE(detail::gemm_pdl_chain(f32_in.up, f32_in.down));

  GemmPdlOverride off(2);
  const MlpPair p = dense_mlp(32, 7168, 2048);
  EXPECT_FALSE(detail::gemm_pdl_chain(p.up, p.down));
}

TEST(GemmPdl, MlpForceOverrideStartsUnset) {
  const detail::MlpGemmForce& f = detail::mlp_gemm_force_override();
  EXPECT_EQ(f.first_config, -1);
  EXPECT_EQ(f.second_config, -1);
  EXPECT_EQ(f.first_split, 0);
  EXPECT_EQ(f.second_split, 0);
}

}  // namespace
}  // namespace moekit
