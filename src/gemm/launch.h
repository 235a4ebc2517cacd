// Per-input-dtype launchers of the grouped-GEMM engine (one .cu each, so they compile in
// parallel). Each runs problem.plan, which run_grouped_gemm has checked
// (gemm_plan_rejection).
#pragma once

#include <cuda_runtime_api.h>

#include "gemm/grouped_gemm.h"

namespace moekit::detail {

// The mma.sync kernels: kDecode, kDecodeSplitK, kDecodeStream, kDecodeStreamDeep,
// kDecodeStreamNarrow, kDecodePersistent.
void launch_grouped_gemm_bf16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_f16(const GroupedGemmProblem& problem, cudaStream_t stream);
// kDecodePersistent with e4m3 b (problem.b_scale; gemm/mma/fp8_weight_tiles.cuh).
void launch_grouped_gemm_fp8_weights(const GroupedGemmProblem& problem, cudaStream_t stream);
// kSm90 (TMA + wgmma; k > 0) at plan.tile_n 256, and the 192- / 224-wide units it calls.
void launch_grouped_gemm_sm90_bf16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_f16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_n192_bf16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_n192_f16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_n224_bf16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_n224_f16(const GroupedGemmProblem& problem, cudaStream_t stream);
// kSm90Pairs: the adaptive pairs on 2-CTA clusters (multicast); k > 0.
void launch_grouped_gemm_sm90_pair_bf16(const GroupedGemmProblem& problem, cudaStream_t stream);
void launch_grouped_gemm_sm90_pair_f16(const GroupedGemmProblem& problem, cudaStream_t stream);
// Both GEMMs of an expert MLP in one persistent SM90 launch (sm90/mlp_chain.cuh);
// scratch: kSm90MlpChainScratchBytes of device memory; pairs: sm90_pairs tiles, else sm90's.
void launch_mlp_chain_sm90_bf16(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                                void* scratch, bool pairs, cudaStream_t stream);
void launch_mlp_chain_sm90_f16(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                               void* scratch, bool pairs, cudaStream_t stream);
// Co-resident clusters of `split` CTAs of the decode split-K kernel on the current device
// (cudaOccupancyMaxActiveClusters; 0 when unknown). current_gemm_device() caches it.
int splitk_co_resident_clusters(int split);

}  // namespace moekit::detail
