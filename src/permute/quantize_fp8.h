// Internal: activation quantization to FP8 e4m3, the a operand (and a_scale) of the FP8
// grouped GEMMs (gemm.h GroupedGemmFP8Args), standalone or fused into the pre-permute.
//
// The formula (bit for bit what reference/fp8_quant_ref.h computes; DeepSeek-V3 / vLLM's
// per_token_group_quant_fp8 with eps = 1e-10):
//   amax  = max |x| over the group (x widened to f32 exactly; the group is 128 columns of a
//           row, the last one shorter when k % 128 != 0, or the whole row)
//   scale = max(amax, 1e-10f) / 448.f            (f32 division, rounded to nearest even)
//   q     = e4m3(x / scale)                      (f32 division rounded to nearest even, then
//           the nearest e4m3 value, ties to even, saturated at +-448)
// so that q * scale ~= x and the group's largest magnitude maps to 448. kPerTensor takes the
// scale as given (device f32 [1], e.g. a checkpoint's input_scale) and writes no scales;
// values past +-448 * scale saturate. NaN inputs give NaN codes (finite in, finite out).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/fp8_scale.h"
#include "moekit/tensor.h"
#include "permute/permute_kernels.h"

namespace moekit::detail {

enum class Fp8ActScales : uint8_t {
  kGroup128,   // one scale per row per 128 columns: scales [rows, ceil(k / 128)]
               // (Fp8Scales::kBlock's a_scale)
  kPerToken,   // one scale per row: scales [rows] (Fp8Scales::kPerChannel's a_scale)
  kPerTensor,  // the given scale (Fp8Scales::kPerTensor's a_scale [1]); no scales written
};

// Rows of x [src_rows, k] (bf16 or f16) -> q (e4m3) and scales. Source row r goes to the
// output rows dest[r * fanout + j] (j < fanout; skipped where < 0): quantized once, stored
// fanout times; dest == nullptr: row r to row r (fanout 1). Output rows no source row goes to
// are left untouched. Requirements (the caller validates): k % 16 == 0, x / q rows 16-byte
// aligned (k * 2 and k bytes apart), fanout >= 1, destinations inside q / scales.
struct QuantizeFp8Launch {
  const void* x = nullptr;  // device [src_rows, k]
  DType dtype = DType::kBF16;
  int64_t src_rows = 0;
  int64_t k = 0;
  Fp8ActScales mode = Fp8ActScales::kGroup128;
  const float* tensor_scale = nullptr;  // kPerTensor: device [1]
  const int32_t* dest = nullptr;        // device [src_rows * fanout], or nullptr
  int fanout = 1;
  void* q = nullptr;        // device e4m3 [out rows, k]
  float* scales = nullptr;  // device, kGroup128 [out rows, ceil(k/128)], kPerToken [out rows]
  // dest == nullptr only: the rows that hold data, those in the `groups` groups of a
  // contiguous(alignment) layout with inclusive ends `group_ends` (device); the others
  // (padding nothing wrote) are neither read nor stored. nullptr: every row.
  const int32_t* group_ends = nullptr;
  int64_t groups = 0;
  int alignment = 1;
};
void launch_quantize_fp8(const QuantizeFp8Launch& l, cudaStream_t stream);

// MoEPrePermuteFwd writing FP8 rows: layout_metadata and inverse_indices exactly as
// moe_pre_permute (routes.ids, num_routes, top_k, num_experts, alignment, workspace: see
// launch_pre_permute), and permuted row inverse[t * K + k] = the quantized row of token t
// (routes.hidden, dtype, H columns), with its scales at the same row of permuted_scales. Two
// launches: the routes (no row copy), then one pass that reads each token's row once,
// quantizes it and stores it (and its scales) to each of its routes' rows; padding rows of
// permuted / permuted_scales are left untouched. routes.row_bytes is ignored; routes.permuted
// is the e4m3 [P, H] output. H % 16 == 0; num_tokens = T (num_routes = T * top_k).
struct PrePermuteFp8Launch {
  PrePermuteLaunch routes;
  DType dtype = DType::kBF16;  // of routes.hidden
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;
  Fp8ActScales mode = Fp8ActScales::kGroup128;
  const float* tensor_scale = nullptr;  // kPerTensor: device [1]
  float* permuted_scales = nullptr;     // kGroup128 [P, ceil(H/128)], kPerToken [P]
};
void launch_pre_permute_fp8(const PrePermuteFp8Launch& l, cudaStream_t stream);

}  // namespace moekit::detail
