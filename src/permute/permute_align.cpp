// MoEPermuteAlignFwd: sizes, validation, then the kernel launch(es) (permute_align.cu).
#include <string>

#include "core/check.h"
#include "moekit/permute.h"
#include "permute/permute_kernels.h"
#include "permute/route_ids_check.h"

namespace moekit {

int64_t permute_align_sorted_size(int64_t num_routes, int num_experts, int block_size) {
  return num_routes + static_cast<int64_t>(num_experts) * (block_size - 1);
}

int64_t permute_align_num_blocks(int64_t num_routes, int num_experts, int block_size) {
  const int64_t s = permute_align_sorted_size(num_routes, num_experts, block_size);
  return block_size > 0 ? (s + block_size - 1) / block_size : 0;
}

namespace {

int64_t check_routes(const detail::ArgCheck& check, const PermuteAlignArgs& args) {
  const int64_t N = detail::check_route_ids(check, "topk_ids", args.topk_ids, detail::kAnyDim,
                                            "num_experts", args.num_experts);
  detail::check_expert_map(check, args.expert_map);
  return N;
}

// The chunked kernels' scratch, after the translated ids when the call has engine ids.
size_t workspace_bytes(const PermuteAlignArgs& args, int64_t routes) {
  const int E = args.num_experts;
  return detail::sort_workspace_bytes(args.topk_ids, args.expert_map, routes, E,
                                      detail::align_one_launch(routes, E));
}

}  // namespace

size_t permute_align_workspace_size(const PermuteAlignArgs& args) {
  detail::ArgCheck check("moe_permute_align", detail::ArgCheck::Mode::kShapesOnly);
  return workspace_bytes(args, check_routes(check, args));
}

void moe_permute_align(const PermuteAlignArgs& args, cudaStream_t stream) {
  detail::ArgCheck check("moe_permute_align");
  const int64_t N = check_routes(check, args);
  const int bs = args.block_size;
  MOEKIT_REQUIRE(check, bs >= 16 && bs <= 256 && (bs & (bs - 1)) == 0, "block_size",
                 "a power of two from 16 to 256", std::to_string(bs));
  const int64_t S = permute_align_sorted_size(N, args.num_experts, bs);
  MOEKIT_REQUIRE(check, S + bs <= INT32_MAX, "topk_ids",
                 "T*K + num_experts*(block_size-1) below 2^31 (i32 positions)",
                 args.topk_ids.describe());
  const int64_t NB = permute_align_num_blocks(N, args.num_experts, bs);
  check.tensor("sorted_token_ids", args.sorted_token_ids, {DType::kI32}, {S});
  check.tensor("expert_ids", args.expert_ids, {DType::kI32}, {NB});
  check.tensor("num_tokens_post_padded", args.num_tokens_post_padded, {DType::kI32}, {1});
  check.workspace(args.workspace, workspace_bytes(args, N));
  check.outputs_disjoint({{"sorted_token_ids", args.sorted_token_ids},
                          {"expert_ids", args.expert_ids},
                          {"num_tokens_post_padded", args.num_tokens_post_padded}},
                         {{"topk_ids", args.topk_ids}, {"expert_map", args.expert_map}},
                         args.workspace);
  check.launch_target(stream, "sorted_token_ids", args.sorted_token_ids);

  detail::AlignLaunch l;
  const detail::SortInputs in = detail::sort_inputs(args.topk_ids, args.expert_map,
                                                    args.num_experts, N, args.workspace, stream);
  l.topk_ids = in.ids;
  l.workspace = in.scratch;
  l.num_routes = static_cast<int>(N);
  l.num_experts = args.num_experts;
  l.block_size = bs;
  l.sorted_token_ids = args.sorted_token_ids.ptr<int32_t>();
  l.sorted_size = static_cast<int>(S);
  l.expert_ids = args.expert_ids.ptr<int32_t>();
  l.num_blocks = static_cast<int>(NB);
  l.num_tokens_post_padded = args.num_tokens_post_padded.ptr<int32_t>();
  detail::launch_permute_align(l, stream);
}

}  // namespace moekit
