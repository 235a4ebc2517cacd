// f16-input instantiation of the SM90 expert-MLP chain (both GEMMs of an expert MLP in one
// persistent launch of config 2's or config 11's tiles; sm90_mlp_chain.cuh). Its own .cu so it
// compiles in parallel with the other SM90 kernels.
#include "gemm/launch.h"
#include "gemm/sm90/mlp_chain.cuh"

namespace moekit::detail {

void launch_mlp_chain_sm90_f16(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                               void* scratch, bool pairs, cudaStream_t stream) {
  pairs ? gemm::sm90::launch_mlp_chain<cutlass::half_t, __half, gemm::sm90::kPairAuto>(
              up, down, scratch, stream, "moe_expert_mlp")
        : gemm::sm90::launch_mlp_chain<cutlass::half_t, __half, gemm::sm90::kPairNone>(
              up, down, scratch, stream, "moe_expert_mlp");
}

}  // namespace moekit::detail
