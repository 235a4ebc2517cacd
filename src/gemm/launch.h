// Per-input-dtype launchers of the bf16/f16 engine (one .cu each, so they compile in
// parallel). `config` is a GemmConfig value.
#pragma once

#include <cuda_runtime_api.h>

#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"

namespace moekit::detail {

void launch_grouped_gemm_bf16(const GroupedGemmProblem& problem, int config, cudaStream_t stream);
void launch_grouped_gemm_f16(const GroupedGemmProblem& problem, int config, cudaStream_t stream);
// The SM90 (TMA + wgmma) config, kGemmConfigSm90; k > 0.
void launch_grouped_gemm_sm90_bf16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_f16(const GroupedGemmProblem& problem, cudaStream_t stream);
// Config 2 with 192- / 224-row b tiles (the launchers above call them where sm90_tile_n
// says; 224: no silu).
void launch_grouped_gemm_sm90_n192_bf16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_n192_f16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_n224_bf16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_n224_f16(const GroupedGemmProblem& problem, cudaStream_t stream);
// Its ping-pong variant, kGemmConfigSm90Pingpong; k > 0.
void launch_grouped_gemm_sm90_pingpong_bf16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_pingpong_f16(const GroupedGemmProblem& problem, cudaStream_t stream);
// The paired SM90 configs (2-CTA clusters, multicast): kGemmConfigSm90PairN,
// kGemmConfigSm90PingpongPairM, kGemmConfigSm90PairM or kGemmConfigSm90PairAuto; k > 0.
void launch_grouped_gemm_sm90_pair_bf16(const GroupedGemmProblem& problem, int config,
                                        cudaStream_t stream);
void launch_grouped_gemm_sm90_pair_f16(const GroupedGemmProblem& problem, int config,
                                       cudaStream_t stream);
// Both GEMMs of an expert MLP in one persistent SM90 launch (sm90_mlp_chain.cuh);
// scratch: kSm90MlpChainScratchBytes of device memory; pairs: config 11's pair tiles, else
// config 2's tiles. run_sm90_mlp_chain checks first.
void launch_mlp_chain_sm90_bf16(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                                void* scratch, bool pairs, cudaStream_t stream);
void launch_mlp_chain_sm90_f16(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                               void* scratch, bool pairs, cudaStream_t stream);
void launch_grouped_gemm_fp8(const GroupedGemmFP8Problem& problem, int config, cudaStream_t stream);

}  // namespace moekit::detail
