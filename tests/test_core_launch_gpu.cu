// GPU tests of the launch caches (core/kernel_launch.h): the raised shared-memory limit, the
// occupancy and cluster queries against the driver's own answers, and a launch through
// LaunchConfig with clusters and PDL.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "core/kernel_launch.h"
#include "support/gpu.h"

namespace moekit {
namespace {

constexpr int kThreads = 128;
constexpr int kBigSmem = 100 * 1024;  // over the 48 KiB default

// out[block] = the block's rank in its cluster + 1 (0 where the kernel did not run).
__global__ void rank_kernel(int* out) {
  extern __shared__ int scratch[];
  unsigned rank = 0;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  scratch[threadIdx.x] = static_cast<int>(rank) + 1;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = scratch[0];
}

int max_dynamic_smem() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, rank_kernel) != cudaSuccess) return -1;
  return attr.maxDynamicSharedSizeBytes;
}

TEST(KernelLaunchGpu, RaisesTheSmemLimitOnlyUpward) {
  MOEKIT_REQUIRE_GPU();
  ASSERT_EQ(detail::raise_smem_limit<rank_kernel>(kBigSmem), cudaSuccess);
  EXPECT_GE(max_dynamic_smem(), kBigSmem);
  ASSERT_EQ(detail::raise_smem_limit<rank_kernel>(1024), cudaSuccess);
  EXPECT_GE(max_dynamic_smem(), kBigSmem);  // a smaller ask leaves the limit as it is
  EXPECT_NE(detail::raise_smem_limit<rank_kernel>(1 << 30), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the refusal is not left behind
}

TEST(KernelLaunchGpu, QueriesMatchTheDriver) {
  MOEKIT_REQUIRE_GPU();
  ASSERT_EQ(detail::raise_smem_limit<rank_kernel>(kBigSmem), cudaSuccess);
  const void* kernel = reinterpret_cast<const void*>(rank_kernel);
  int per_sm = 0;
  MOEKIT_CUDA_OK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rank_kernel, kThreads, kBigSmem));
  ASSERT_GE(per_sm, 1);
  EXPECT_EQ(detail::blocks_per_sm(kernel, kThreads, kBigSmem), per_sm);
  EXPECT_EQ(detail::blocks_per_sm(kernel, kThreads, kBigSmem), per_sm);  // cached
  EXPECT_GE(detail::blocks_per_sm(kernel, kThreads, 0), per_sm);

  detail::LaunchConfig query(dim3(2), dim3(kThreads), kBigSmem, nullptr);
  const cudaLaunchConfig_t config = query.cluster(2).config();
  int clusters = 0;
  MOEKIT_CUDA_OK(cudaOccupancyMaxActiveClusters(&clusters, rank_kernel, &config));
  ASSERT_GE(clusters, 1);
  EXPECT_EQ(detail::co_resident_clusters(kernel, 2, kThreads, kBigSmem), clusters);
  EXPECT_EQ(detail::co_resident_clusters(kernel, 2, kThreads, kBigSmem), clusters);
}

TEST(KernelLaunchGpu, LaunchesClustersWithPdl) {
  MOEKIT_REQUIRE_GPU();
  ASSERT_EQ(detail::raise_smem_limit<rank_kernel>(kBigSmem), cudaSuccess);
  constexpr int kBlocks = 8;
  int* out = nullptr;
  MOEKIT_CUDA_OK(cudaMalloc(&out, kBlocks * sizeof(int)));
  MOEKIT_CUDA_OK(cudaMemset(out, 0, kBlocks * sizeof(int)));
  detail::LaunchConfig launch(dim3(kBlocks), dim3(kThreads), kBigSmem, nullptr);
  const cudaLaunchConfig_t config = launch.cluster(4).pdl().config();
  EXPECT_EQ(cudaLaunchKernelEx(&config, rank_kernel, out), cudaSuccess);
  MOEKIT_CUDA_OK(cudaDeviceSynchronize());
  int host[kBlocks] = {};
  MOEKIT_CUDA_OK(cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost));
  for (int b = 0; b < kBlocks; ++b) EXPECT_EQ(host[b], b % 4 + 1) << "block " << b;
  cudaFree(out);
}

}  // namespace
}  // namespace moekit
