// CPU tests of the TMA descriptor settings the SM90 GEMMs and the stream-K MLP load with
// (gemm/common/tma_desc.h): the kernels' box addressing and swizzled shared layouts
// assume exactly these. The values are CuTe's make_tma_copy settings for the same
// tensors (checked argument by argument when the SM90 kernels moved to this encoder),
// with the 256-byte L2 promotion.
#include <gtest/gtest.h>

#include <cstdint>

#include "gemm/common/tma_desc.h"

namespace moekit {
namespace {

using detail::tma_rows_args;
using detail::TmaDescArgs;

void expect_common_settings(const TmaDescArgs& a) {
  EXPECT_EQ(a.rank, 3);
  EXPECT_EQ(a.interleave, CU_TENSOR_MAP_INTERLEAVE_NONE);
  EXPECT_EQ(a.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  EXPECT_EQ(a.l2_promotion, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  EXPECT_EQ(a.oob_fill, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.elem_strides[i], 1u) << i;
}

// bf16 a of a masked GEMM: (max_m 33, k 136, 3 groups), 64-row boxes of 64 k.
TEST(TmaDesc, SixteenBitRowsAreKMajorBoxesOfOneLayer) {
  const void* base = reinterpret_cast<const void*>(uintptr_t{0x7f0000001000});
  const TmaDescArgs a =
      tma_rows_args(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, 33, 136, 3, 64, 64);
  expect_common_settings(a);
  EXPECT_EQ(a.dtype, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  EXPECT_EQ(a.base, base);
  EXPECT_EQ(a.dims[0], 136u);  // k, contiguous
  EXPECT_EQ(a.dims[1], 33u);   // rows
  EXPECT_EQ(a.dims[2], 3u);    // layers (groups)
  EXPECT_EQ(a.strides[0], 136u * 2);
  EXPECT_EQ(a.strides[1], 33u * 136 * 2);
  EXPECT_EQ(a.box[0], 64u);
  EXPECT_EQ(a.box[1], 64u);
  EXPECT_EQ(a.box[2], 1u);
}

// fp8 b: (n 4096, k 7168, 256 groups) as bytes, 128-row boxes of 128 k (128 bytes).
TEST(TmaDesc, Fp8TravelsAsBytes) {
  const TmaDescArgs a =
      tma_rows_args(CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, nullptr, 4096, 7168, 256, 128, 128);
  expect_common_settings(a);
  EXPECT_EQ(a.dtype, CU_TENSOR_MAP_DATA_TYPE_UINT8);
  EXPECT_EQ(a.dims[0], 7168u);
  EXPECT_EQ(a.dims[1], 4096u);
  EXPECT_EQ(a.dims[2], 256u);
  EXPECT_EQ(a.strides[0], 7168u);
  EXPECT_EQ(a.strides[1], uint64_t{4096} * 7168);  // > 2^32: 64-bit strides
  EXPECT_EQ(a.box[0], 128u);
  EXPECT_EQ(a.box[1], 128u);
}

}  // namespace
}  // namespace moekit
