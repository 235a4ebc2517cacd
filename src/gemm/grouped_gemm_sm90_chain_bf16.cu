// bf16-input instantiation of the SM90 expert-MLP chain (both GEMMs of an expert MLP in one
// persistent launch of config 2's tiles; sm90_mlp_chain.cuh). Its own .cu so it compiles in
// parallel with the other SM90 kernels.
#include "gemm/launch.h"
#include "gemm/sm90_mlp_chain.cuh"

namespace moekit::detail {

void launch_mlp_chain_sm90_bf16(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                                void* scratch, cudaStream_t stream) {
  gemm::sm90::launch_mlp_chain<cutlass::bfloat16_t, __nv_bfloat16>(up, down, scratch, stream,
                                                                   "moe_expert_mlp");
}

}  // namespace moekit::detail
