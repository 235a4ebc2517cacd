// Host side of the GEMM engine's cluster launches (split-K clusters, the SM90 pairs).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moekit::detail::gemm {

// A launch of `blocks` blocks of `threads` threads with `smem` bytes of dynamic shared memory
// on `stream`, in clusters of `cluster` blocks along x. `attr` (the cluster dimension) must
// outlive the launch (cudaLaunchKernelEx, cudaOccupancyMaxActiveClusters).
inline cudaLaunchConfig_t cluster_launch_config(int64_t blocks, int threads, size_t smem,
                                                int cluster, cudaStream_t stream,
                                                cudaLaunchAttribute (&attr)[1]) {
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

}  // namespace moekit::detail::gemm
