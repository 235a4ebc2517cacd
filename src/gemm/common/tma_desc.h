// Host side of moekit's TMA loads: tensor-map descriptors of row-major tensors, for the
// stream-K MLP and the SM90 GEMMs.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace moekit::detail {

// The settings of one cuTensorMapEncodeTiled call: what a descriptor holds.
struct TmaDescArgs {
  CUtensorMapDataType dtype = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  int rank = 3;
  const void* base = nullptr;
  cuuint64_t dims[3] = {1, 1, 1};  // elements: inner (cols), rows, layers
  cuuint64_t strides[2] = {0, 0};  // bytes: of a row, of a layer
  cuuint32_t box[3] = {1, 1, 1};   // elements: box cols, box rows, 1
  cuuint32_t elem_strides[3] = {1, 1, 1};
  CUtensorMapInterleave interleave = CU_TENSOR_MAP_INTERLEAVE_NONE;
  CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  CUtensorMapL2promotion l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  CUtensorMapFloatOOBfill oob_fill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
};

// A row-major (layers, rows, cols) tensor of elem_bytes-byte elements at `base`, loaded in
// boxes of box_rows x box_cols elements (box_cols * elem_bytes = 128: one swizzle row) of one
// layer, with the 128-byte swizzle: 16-byte chunk c of box row r lands at chunk c ^ (r % 8)
// of that row, so a box must start on a 1024-byte boundary in shared memory. Elements
// outside the tensor read as zeros (and still count as bytes); L2 promotion 256 bytes
// (the weights stream from DRAM two 64-k stages at a time). Rank 3; a TMA load's
// coordinates are (col, row, layer). Pure: CPU-testable.
TmaDescArgs tma_rows_args(CUtensorMapDataType dtype, int elem_bytes, const void* base, int64_t rows,
                          int64_t cols, int64_t layers, int box_rows, int box_cols);

// Encodes `args` (the driver's cuTensorMapEncodeTiled, looked up through the runtime).
// Throws moekit::Error if the driver refuses.
CUtensorMap encode_tma(const TmaDescArgs& args);

// A row-major [rows, cols] 16-bit tensor (bf16 or f16: the copy does not look at the
// values) as tma_rows_args describes, rank 2, boxes of box_rows x 64 elements. Needs
// base % 16 == 0 and cols % 8 == 0.
CUtensorMap make_tma_2d_b16(const void* base, int64_t rows, int64_t cols, int box_rows);

}  // namespace moekit::detail
