// Programmatic Dependent Launch (PDL) for latency-bound kernels.
//
// What it overlaps: a kernel launched with the programmatic-stream-serialization
// attribute may be scheduled while the previous kernel in the stream (or the previous
// kernel node of a CUDA graph) is still running, as soon as every CTA of that kernel
// has executed pdl_trigger() or exited. Its launch latency and prologue then hide
// under the previous kernel's tail (measured in docs/routing-permute.md, "PDL").
//
// The rule, for EVERY kernel launched through launch_pdl():
//  * pdl_wait() before the kernel's first global-memory read or write of anything
//    another kernel may produce or consume: inputs (RAW) and outputs (WAR / WAW).
//    It returns once the previous grid has completed and its writes are visible.
//    Put it first, before any early return: a grid none of whose threads waited
//    could complete before its predecessor, and its own dependent would then not
//    wait for that predecessor (the wait is not transitive through such a grid).
//    An L2 prefetch (cp.async.bulk.prefetch.L2) of inputs may come before it: it
//    brings no data into the SM, and the L2 is coherent, so the loads after the wait
//    still see the previous grid's writes.
//    An input complete before the previous kernel passed its own wait may be read
//    before it too: the previous kernel's CTAs trigger only after their wait, so this
//    kernel starts after that input's producer ended (the FP8 direct down kernel reads
//    topk_ids so, after the gate/up kernel that waited for them; moe/direct_tiles.cuh).
//  * pdl_trigger() after the CTA's main global loads, before its stores. It only
//    lets the next kernel be scheduled early (that kernel still waits for this one
//    to complete); a CTA that exits without it counts as triggered.
// MOEKIT_PDL=0 in the environment launches everything plainly (core/pdl.h).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/pdl.h"

namespace moekit::detail {

// griddepcontrol needs sm_90; below it both are no-ops (and PDL does not apply).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when
// pdl_enabled(). The kernel must follow the rule above. Launch errors are left for
// cudaGetLastError() (check_launch), as with <<<>>>.
template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  if (!pdl_enabled()) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace moekit::detail
