#include "gemm/common/tma_desc.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

#include "moekit/error.h"

namespace moekit::detail {
namespace {

// The driver's encoder through the runtime (no -lcuda), looked up once.
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* pfn = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pfn, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      pfn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(pfn);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_tma_2d_b16(const void* base, int64_t rows, int64_t cols, int box_rows) {
  CUtensorMap map{};
  PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
  if (!encode) throw Error("moekit: cuTensorMapEncodeTiled is not available from the driver");
  cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw Error("moekit: cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                ") for a [" + std::to_string(rows) + ", " + std::to_string(cols) +
                "] tensor, box " + std::to_string(box_rows) + " x 64");
  }
  return map;
}

}  // namespace moekit::detail
