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

TmaDescArgs tma_rows_args(CUtensorMapDataType dtype, int elem_bytes, const void* base, int64_t rows,
                          int64_t cols, int64_t layers, int box_rows, int box_cols) {
  TmaDescArgs a;
  a.dtype = dtype;
  a.rank = 3;
  a.base = base;
  a.dims[0] = static_cast<cuuint64_t>(cols);
  a.dims[1] = static_cast<cuuint64_t>(rows);
  a.dims[2] = static_cast<cuuint64_t>(layers);
  a.strides[0] = static_cast<cuuint64_t>(cols) * elem_bytes;
  a.strides[1] = static_cast<cuuint64_t>(rows) * cols * elem_bytes;
  a.box[0] = static_cast<cuuint32_t>(box_cols);
  a.box[1] = static_cast<cuuint32_t>(box_rows);
  a.box[2] = 1;
  return a;
}

CUtensorMap encode_tma(const TmaDescArgs& a) {
  CUtensorMap map{};
  PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
  if (!encode) throw Error("moekit: cuTensorMapEncodeTiled is not available from the driver");
  // The driver takes non-const arrays; it does not write them.
  TmaDescArgs c = a;
  const CUresult r =
      encode(&map, c.dtype, static_cast<cuuint32_t>(c.rank), const_cast<void*>(c.base), c.dims,
             c.strides, c.box, c.elem_strides, c.interleave, c.swizzle, c.l2_promotion, c.oob_fill);
  if (r != CUDA_SUCCESS) {
    std::string dims;
    for (int i = c.rank - 1; i >= 0; --i) dims += std::to_string(c.dims[i]) + (i ? " x " : "");
    throw Error("moekit: cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                ") for a [" + dims + "] tensor, box " + std::to_string(c.box[1]) + " x " +
                std::to_string(c.box[0]));
  }
  return map;
}

CUtensorMap make_tma_2d_b16(const void* base, int64_t rows, int64_t cols, int box_rows) {
  TmaDescArgs a =
      tma_rows_args(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, rows, cols, 1, box_rows, 64);
  a.rank = 2;
  return encode_tma(a);
}

}  // namespace moekit::detail
