// Host side of the hand-written TMA kernels: 2D tensor-map descriptors.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace moekit::detail {

// A row-major [rows, cols] tensor of 2-byte elements (bf16 or f16: the copy does not
// look at the values) at `base`, loaded in boxes of box_rows x 64 elements (128-byte
// rows) with the 128-byte swizzle: 16-byte chunk c of box row r lands at chunk
// c ^ (r % 8) of that row, so a box must start on a 1024-byte boundary in shared memory.
// Elements outside the tensor read as zeros; L2 promotion 256 bytes. Needs
// base % 16 == 0 and cols % 8 == 0. Throws moekit::Error if the driver refuses.
CUtensorMap make_tma_2d_b16(const void* base, int64_t rows, int64_t cols, int box_rows);

}  // namespace moekit::detail
