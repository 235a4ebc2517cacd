// The FP8 grouped GEMM's rows as its kernels' tile schedules and the empty-sum fill read
// them (fp8_grouped_gemm.cu, fp8_fast_gemm.cu).
#pragma once

#include "gemm/grouped_gemm_fp8.h"
#include "gemm/mma/tile_scheduler.cuh"

namespace moekit::detail::gemm {

// Masked counts (a slab of max_m rows per group) or contiguous(alignment) ends over m rows.
RowsDesc fp8_rows(const GroupedGemmFP8Problem& prob);

}  // namespace moekit::detail::gemm
