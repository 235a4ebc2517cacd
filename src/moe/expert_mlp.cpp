// MoEExpertMLPFwd: two grouped GEMMs (gate/up with the
// silu_and_mul epilogue into a workspace activation buffer, then down), run by
// run_grouped_gemm_pair (a PDL chain where gemm_pdl_override() turns it on and both take a
// decode config).
#include "gemm/grouped_gemm.h"
#include "gemm/sm90/device.h"
#include "moe/moe_internal.h"
#include "moe/moe_validate.h"
#include "moekit/moe.h"

namespace moekit {
namespace detail {

void run_expert_mlp_gemms(DType dtype, const void* in, int64_t P, const int32_t* layout_metadata,
                          int alignment, int64_t E, int64_t H, int64_t F, const void* w_gate_up,
                          const void* w_down, void* act, void* out, bool routed_counts,
                          void* tile_counters, cudaStream_t stream) {
  static_assert(kExpertMlpCounterBytes == 2 * kTileCounterBytes + kSm90MlpChainScratchBytes,
                "one counter per GEMM, then the chain's scratch");
  void* chain_scratch =
      tile_counters ? static_cast<char*>(tile_counters) + 2 * kTileCounterBytes : nullptr;
  GroupedGemmProblem up;
  up.in_dtype = dtype;
  up.out_dtype = dtype;  // the activation is rounded to the op's dtype (SPEC)
  up.a = in;
  up.b = w_gate_up;
  up.c = act;
  up.num_groups = static_cast<int>(E);
  up.n = F;
  up.k = H;
  up.activation = Activation::kSiluAndMul;
  up.rows = GemmRows::kContiguous;
  up.layout_metadata = layout_metadata;
  up.alignment = alignment;
  up.m = P;
  up.routed_counts = routed_counts;
  if (!sm90_dynamic_mlp()) tile_counters = nullptr;  // MOEKIT_SM90_DYNAMIC_MLP=0: static
  up.tile_counter = static_cast<unsigned*>(tile_counters);

  GroupedGemmProblem down = up;
  down.a = act;
  down.b = w_down;
  down.c = out;
  down.n = H;
  down.k = F;
  down.activation = Activation::kNone;
  down.tile_counter =
      tile_counters
          ? reinterpret_cast<unsigned*>(static_cast<char*>(tile_counters) + kTileCounterBytes)
          : nullptr;
  // Both GEMMs in one SM90 launch where both run config 2 (docs/gemm.md "SM90 expert-MLP
  // chain"); else two launches, a PDL chain with gemm_pdl_override() on: up writes only act.
  if (run_sm90_mlp_chain(up, down, chain_scratch, stream)) return;
  run_grouped_gemm_pair(up, down, stream);
}

}  // namespace detail

namespace {

// The grouped GEMMs' limit on groups (the SM90 kernels' group table; moe_grouped_gemm's).
constexpr int64_t kExpertMlpMaxExperts = 1024;

// expert_input [P, H] and w_gate_up [E, 2F, H]: what the workspace size depends on.
detail::MoEShapes check_expert_mlp_shapes(const detail::ArgCheck& c, const ExpertMLPArgs& a) {
  detail::MoEShapes s = detail::check_hidden(c, "expert_input", a.expert_input);
  detail::check_gate_up(c, s, "w_gate_up", a.w_gate_up, "expert_input", a.expert_input,
                        /*experts=*/true);
  MOEKIT_REQUIRE(c, s.E <= kExpertMlpMaxExperts, "w_gate_up",
                 "at most " + detail::str(kExpertMlpMaxExperts) + " experts (dim 0)",
                 a.w_gate_up.describe());
  return s;
}

// act [P, F] in the dtype (P = s.T), then the GEMMs' tile counters.
size_t expert_mlp_bytes(const detail::MoEShapes& s) {
  if (s.T == 0) return 0;
  detail::WorkspaceCarver ws(nullptr);
  ws.take(static_cast<size_t>(s.T * s.F) * dtype_size(s.dtype));
  ws.take(detail::kExpertMlpCounterBytes);
  return ws.bytes();
}

}  // namespace

size_t expert_mlp_workspace_size(const ExpertMLPArgs& args) {
  return detail::workspace_query("moe_expert_mlp", [&](const detail::ArgCheck& c) {
    return expert_mlp_bytes(check_expert_mlp_shapes(c, args));
  });
}

void moe_expert_mlp(const ExpertMLPArgs& args, cudaStream_t stream) {
  detail::ArgCheck c("moe_expert_mlp");
  detail::MoEShapes s = check_expert_mlp_shapes(c, args);
  const int64_t P = s.T;
  detail::check_down(c, s, "w_down", args.w_down, "expert_input", args.expert_input,
                     /*experts=*/true);
  c.tensor("layout_metadata", args.layout_metadata, {DType::kI32}, {s.E});
  MOEKIT_REQUIRE(c, args.layout.kind == PermutedLayout::Kind::kContiguous, "layout",
                 "a contiguous(alignment) layout", "masked");
  MOEKIT_REQUIRE(c, args.layout.alignment >= 1, "layout", "alignment >= 1",
                 "alignment " + detail::str(args.layout.alignment));
  c.tensor("expert_output", args.expert_output, {DType::kBF16, DType::kF16}, {P, s.H}, 16);
  c.same_dtype("expert_output", args.expert_output, "expert_input", args.expert_input);
  const size_t needed = expert_mlp_bytes(s);
  c.workspace(args.workspace, needed);
  // In place (expert_output == expert_input) works: a group's input rows are dead once
  // its gate/up GEMM tiles have run, before any down tile of the group stores.
  const detail::ArgCheck::Arg out{"expert_output", args.expert_output};
  const detail::ArgCheck::Arg in{"expert_input", args.expert_input};
  c.outputs_disjoint({out},
                     {in,
                      {"layout_metadata", args.layout_metadata},
                      {"w_gate_up", args.w_gate_up},
                      {"w_down", args.w_down}},
                     args.workspace, &out, &in);
  if (P == 0) return;
  c.launch_target(stream, "expert_output", args.expert_output);

  detail::WorkspaceCarver ws(args.workspace.data);
  void* act = ws.take(static_cast<size_t>(P * s.F) * dtype_size(s.dtype));
  void* counters = ws.take(detail::kExpertMlpCounterBytes);
  detail::run_composite("moe_expert_mlp", [&] {
    detail::run_expert_mlp_gemms(s.dtype, args.expert_input.data, P,
                                 static_cast<const int32_t*>(args.layout_metadata.data),
                                 args.layout.alignment, s.E, s.H, s.F, args.w_gate_up.data,
                                 args.w_down.data, act, args.expert_output.data,
                                 /*routed_counts=*/false, counters, stream);
  });
}

}  // namespace moekit
