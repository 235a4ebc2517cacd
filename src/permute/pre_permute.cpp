// MoEPrePermuteFwd: validation, then the kernel launch(es) (pre_permute.cu).
#include <string>

#include "core/check.h"
#include "moekit/permute.h"
#include "permute/permute_kernels.h"
#include "permute/route_ids_check.h"

namespace moekit {

namespace {

// `T`: hidden_states' dim 0, or kAnyDim (the size query).
int64_t check_routes(const detail::ArgCheck& check, const PrePermuteArgs& args, int64_t T) {
  return detail::check_route_ids(check, "local_expert_ids", args.local_expert_ids, T,
                                 "num_local_experts", args.num_local_experts);
}

// The chunked kernels' scratch, after the translated ids when the ids are i64.
size_t workspace_bytes(const PrePermuteArgs& args, int64_t routes) {
  const int E = args.num_local_experts;
  return detail::sort_workspace_bytes(args.local_expert_ids, TensorView{}, routes, E,
                                      detail::pre_permute_one_launch(routes, E));
}

}  // namespace

size_t pre_permute_workspace_size(const PrePermuteArgs& args) {
  detail::ArgCheck check("moe_pre_permute", detail::ArgCheck::Mode::kShapesOnly);
  return workspace_bytes(args, check_routes(check, args, detail::kAnyDim));
}

void moe_pre_permute(const PrePermuteArgs& args, cudaStream_t stream) {
  detail::ArgCheck check("moe_pre_permute");
  const int64_t H = detail::check_permute_rows(check, "hidden_states", args.hidden_states);
  const int64_t T = args.hidden_states.size(0);
  const int64_t row_bytes = H * static_cast<int64_t>(dtype_size(args.hidden_states.dtype));
  MOEKIT_REQUIRE(check, row_bytes / 16 * 64 <= INT32_MAX, "hidden_states",
                 "rows of less than 2^29 bytes", args.hidden_states.describe());
  const int64_t N = check_routes(check, args, T);
  const int64_t K = args.local_expert_ids.size(1);
  const int E = args.num_local_experts;
  MOEKIT_REQUIRE(check, args.layout.kind == PermutedLayout::Kind::kContiguous, "layout",
                 "a contiguous(alignment) layout", "a masked layout");
  const int A = args.layout.alignment;
  MOEKIT_REQUIRE(check, A >= 1, "layout.alignment", ">= 1", std::to_string(A));
  const int64_t P = N + static_cast<int64_t>(E) * (A - 1);
  MOEKIT_REQUIRE(check, P < INT32_MAX, "permuted",
                 "T*K + num_local_experts*(alignment-1) below 2^31 rows (i32 indices)",
                 std::to_string(P) + " rows");
  check.tensor("permuted", args.permuted, {args.hidden_states.dtype}, {P, H}, 16);
  check.tensor("layout_metadata", args.layout_metadata, {DType::kI32}, {E});
  check.tensor("inverse_indices", args.inverse_indices, {DType::kI32}, {N});
  check.workspace(args.workspace, workspace_bytes(args, N));
  check.outputs_disjoint(
      {{"permuted", args.permuted},
       {"layout_metadata", args.layout_metadata},
       {"inverse_indices", args.inverse_indices}},
      {{"hidden_states", args.hidden_states}, {"local_expert_ids", args.local_expert_ids}},
      args.workspace);
  // N == 0 still launches: the kernel writes the (all-zero) layout_metadata.
  check.launch_target(stream, "layout_metadata", args.layout_metadata);

  detail::PrePermuteLaunch l;
  l.hidden = args.hidden_states.data;
  l.row_bytes = row_bytes;
  const detail::SortInputs in =  // i64 ids translated
      detail::sort_inputs(args.local_expert_ids, TensorView{}, E, N, args.workspace, stream);
  l.ids = in.ids;
  l.workspace = in.scratch;
  l.num_routes = static_cast<int>(N);
  l.top_k = static_cast<int>(K);
  l.num_experts = E;
  l.alignment = A;
  l.permuted = args.permuted.data;
  l.layout_metadata = args.layout_metadata.ptr<int32_t>();
  l.inverse_indices = args.inverse_indices.ptr<int32_t>();
  detail::launch_pre_permute(l, stream);
}

}  // namespace moekit
