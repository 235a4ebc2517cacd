// MoEPostPermuteFwd: validation, then one kernel launch (post_permute.cu).
#include <string>

#include "core/check.h"
#include "moekit/permute.h"
#include "permute/permute_kernels.h"
#include "permute/route_ids_check.h"

namespace moekit {

void moe_post_permute(const PostPermuteArgs& args, cudaStream_t stream) {
  detail::ArgCheck check("moe_post_permute");
  const int64_t H = detail::check_permute_rows(check, "expert_output", args.expert_output);
  const int64_t P = args.expert_output.size(0);
  check.tensor("topk_weights", args.topk_weights, {DType::kF32},
               {detail::kAnyDim, detail::kAnyDim});
  const int64_t T = args.topk_weights.size(0), K = args.topk_weights.size(1);
  MOEKIT_REQUIRE(check, K >= 1 && K <= INT32_MAX, "topk_weights",
                 "1 to 2^31-1 routes per token (dim 1)", args.topk_weights.describe());
  check.tensor("inverse_indices", args.inverse_indices, {DType::kI32}, {T * K});
  const DType in = args.expert_output.dtype;
  if (in == DType::kF32) {
    check.tensor("out", args.out, {DType::kF32}, {T, H}, 16);
  } else {
    check.tensor("out", args.out, {in, DType::kF32}, {T, H}, 16);
  }
  check.outputs_disjoint({{"out", args.out}}, {{"expert_output", args.expert_output},
                                               {"topk_weights", args.topk_weights},
                                               {"inverse_indices", args.inverse_indices}});
  if (T == 0) return;
  check.launch_target(stream, "out", args.out);

  detail::PostPermuteLaunch l;
  l.expert_output = args.expert_output.data;
  l.in_dtype = in;
  l.num_rows = P;
  l.hidden = H;
  l.topk_weights = args.topk_weights.ptr<const float>();
  l.inverse_indices = args.inverse_indices.ptr<const int32_t>();
  l.num_tokens = T;
  l.top_k = static_cast<int>(K);
  l.out = args.out.data;
  l.out_dtype = args.out.dtype;
  detail::launch_post_permute(l, stream);
}

}  // namespace moekit
