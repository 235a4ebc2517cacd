// The GEMM kernels' names in a plan's text: one table for to_string and parse_plan.
#pragma once

#include <iterator>

#include "moekit/plan.h"

namespace moekit::detail {

struct GemmKernelName {
  GemmKernel kernel;
  const char* name;
};

inline constexpr GemmKernelName kGemmKernelNames[] = {
    {GemmKernel::kDecode, "decode"},
    {GemmKernel::kDecodeSplitK, "decode_splitk"},
    {GemmKernel::kDecodeStream, "decode_stream"},
    {GemmKernel::kDecodeStreamDeep, "decode_stream_deep"},
    {GemmKernel::kDecodeStreamNarrow, "decode_stream_narrow"},
    {GemmKernel::kDecodePersistent, "decode_persistent"},
    {GemmKernel::kSm90, "sm90"},
    {GemmKernel::kSm90Pairs, "sm90_pairs"},
    {GemmKernel::kFp8Sm90, "fp8_sm90"},
};
static_assert(std::size(kGemmKernelNames) == static_cast<size_t>(GemmKernel::kFp8Sm90) + 1,
              "a name for every GemmKernel");

}  // namespace moekit::detail
