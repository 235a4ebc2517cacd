// The bad-input table of docs/bad-inputs.md, on the CPU: per op, valid arguments over
// fake device addresses (distinct, aligned, never dereferenced), one thing broken per
// row, and the exact error: "moekit::<op>: argument '<name>': expected <...>, got <...>".
// Every row fails in validation, before any launch (and before the launch-target check,
// so these run on a GPU machine too). Also: the workspace-size queries, views, the
// layer's own name in errors from its inner steps.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bad_inputs_table.h"
#include "core/check.h"
#include "moekit/moekit.h"

namespace moekit {
namespace {

// Which categories of docs/bad-inputs.md a table covers.
template <class Args>
std::vector<std::string> categories(const std::vector<Row<Args>>& rows) {
  std::vector<std::string> c;
  for (const auto& r : rows) c.push_back(r.category);
  return c;
}

bool has(const std::vector<std::string>& c, const char* what) {
  for (const auto& s : c) {
    if (s == what) return true;
  }
  return false;
}

// ---- fused_topk ----

FusedTopKArgs topk_valid() {
  FusedTopKArgs a;
  a.gating_output = fake(kF32, {4, 8});
  a.correction_bias = fake(kF32, {8});
  a.params.top_k = 2;
  a.topk_weights = fake(kF32, {4, 2});
  a.topk_ids = fake(kI32, {4, 2});
  return a;
}

std::vector<Row<FusedTopKArgs>> topk_rows() {
  return {
      {"experts",
       [](auto& a) {
         a.gating_output = fake(kF32, {4, 1025});
       },
       "gating_output", "1 to 1024 experts (dim 1)", "f32[4, 1025]"},
      {"dtype", [](auto& a) { a.gating_output.dtype = kI32; }, "gating_output",
       "dtype bf16 or f16 or f32", "i32[4, 8]"},
      {"rank", [](auto& a) { a.gating_output = fake(kF32, {32}); }, "gating_output", "shape [*, *]",
       "f32[32]"},
      {"ndim", [](auto& a) { a.gating_output = with_ndim(a.gating_output, 5); }, "gating_output",
       "0 to 4 dimensions", "f32 with ndim 5 (not 0..4)"},
      {"shape",
       [](auto& a) {
         a.topk_weights = fake(kF32, {4, 3});
       },
       "topk_weights", "shape [4, 2]", "f32[4, 3]"},
      {"shape", [](auto& a) { a.correction_bias = fake(kF32, {7}); }, "correction_bias",
       "shape [8]", "f32[7]"},
      {"negative size", [](auto& a) { a.gating_output = with_dim(a.gating_output, 0, -4); },
       "gating_output", "non-negative sizes", "f32[-4, 8]"},
      {"top_k", [](auto& a) { a.params.top_k = 0; }, "top_k", "1 to min(16, num_experts=8)", "0"},
      {"top_k", [](auto& a) { a.params.top_k = 9; }, "top_k", "1 to min(16, num_experts=8)", "9"},
      {"groups",
       [](auto& a) {
         a.params.num_expert_group = 3;
         a.params.topk_group = 1;
       },
       "num_expert_group", "0 or a positive divisor of num_experts=8", "3"},
      {"groups",
       [](auto& a) {
         a.params.num_expert_group = 2;
         a.params.topk_group = 3;
       },
       "topk_group", "1 to num_expert_group=2", "3"},
      {"groups", [](auto& a) { a.params.topk_group = 1; }, "topk_group",
       "0 when num_expert_group is 0", "1"},
      {"groups",
       [](auto& a) {
         a.params.num_expert_group = 4;
         a.params.topk_group = 1;
         a.params.top_k = 3;
       },
       "top_k", "at most topk_group * num_experts / num_expert_group = 2", "3"},
      {"scalar", [](auto& a) { a.params.routed_scaling_factor = NAN; }, "routed_scaling_factor",
       "a finite value", "nan"},
      {"scalar", [](auto& a) { a.params.scoring_func = static_cast<ScoringFunc>(7); },
       "scoring_func", "softmax or sigmoid", "7"},
      {"32-bit",
       [](auto& a) {
         a.gating_output = fake(kF32, {kBig, 8});
       },
       "gating_output", "at most 2^31-1 tokens", "f32[2147483648, 8]"},
      {"size",
       [](auto& a) {
         a.gating_output = fake(kF32, {int64_t{1} << 46, 8});
       },
       "gating_output", "at most 2^48 bytes", "f32[70368744177664, 8]"},
      {"null", [](auto& a) { a.topk_ids.data = nullptr; }, "topk_ids", "a non-null data pointer",
       "nullptr"},
      {"undefined", [](auto& a) { a.topk_weights = TensorView{}; }, "topk_weights",
       "f32 tensor of shape [4, 2]", "an undefined tensor"},
      {"misaligned", [](auto& a) { a.topk_weights = shifted(a.topk_weights, 2); }, "topk_weights",
       "data aligned to 4 bytes", "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.gating_output = non_contiguous(a.gating_output); },
       "gating_output", "a contiguous row-major tensor", "strides that are not"},
      {"overlap", [](auto& a) { a.topk_ids = at(a.topk_ids, a.gating_output.data); }, "topk_ids",
       "memory disjoint from 'gating_output'", "sharing 32 bytes with 'gating_output'"},
      {"overlap", [](auto& a) { a.topk_ids = at(a.topk_ids, a.topk_weights.data); }, "topk_ids",
       "memory disjoint from 'topk_weights'", "sharing 32 bytes"},
  };
}

TEST(BadInputs, FusedTopK) {
  run_table<FusedTopKArgs>(
      "fused_topk", topk_valid, [](const FusedTopKArgs& a) { fused_topk(a, nullptr); },
      topk_rows());
}

// ---- moe_permute_align ----

PermuteAlignArgs align_valid() {
  PermuteAlignArgs a;
  a.topk_ids = fake(kI32, {4, 2});
  a.num_experts = 8;
  a.block_size = 16;
  a.sorted_token_ids = fake(kI32, {8 + 8 * 15});
  a.expert_ids = fake(kI32, {8});
  a.num_tokens_post_padded = fake(kI32, {1});
  return a;
}

// T*K = 65536 routes: the multi-kernel path, which needs a workspace.
void align_many_routes(PermuteAlignArgs& a) {
  a.topk_ids = fake(kI32, {32768, 2});
  a.sorted_token_ids = fake(kI32, {65536 + 8 * 15});
  a.expert_ids = fake(kI32, {(65536 + 8 * 15 + 15) / 16});
}

std::vector<Row<PermuteAlignArgs>> align_rows() {
  return {
      {"32-bit",
       [](auto& a) {
         a.topk_ids = fake(kI32, {1, 2147475455});
         a.num_experts = 512;
         a.block_size = 256;
       },
       "topk_ids", "T*K + num_experts*(block_size-1) below 2^31 (i32 positions)",
       "i32[1, 2147475455]"},
      {"dtype", [](auto& a) { a.topk_ids.dtype = kF32; }, "topk_ids", "dtype i32 or i64",
       "f32[4, 2]"},
      {"rank", [](auto& a) { a.topk_ids = fake(kI32, {8}); }, "topk_ids", "shape [*, *]", "i32[8]"},
      {"engine", [](auto& a) { a.expert_map = fake(kI64, {16}); }, "expert_map", "dtype i32",
       "i64[16]"},
      {"engine",
       [](auto& a) {
         a.expert_map = fake(kI32, {2, 8});
       },
       "expert_map", "shape [*]", "i32[2, 8]"},
      {"engine", [](auto& a) { a.expert_map = fake(kI32, {0}); }, "expert_map",
       "1 to 2^31-1 entries (one per global expert)", "i32[0]"},
      {"engine",
       [](auto& a) {
         a.topk_ids = fake(kI64, {4, 2});
         a.workspace = fake_ws(16);  // the translated ids need 32 bytes (rounded to 256)
       },
       "workspace", "at least 256 bytes", "16 bytes"},
      {"overlap",
       [](auto& a) {
         a.expert_map = fake(kI32, {16});
         a.workspace = fake_ws(256);  // the translated ids' (a map needs them)
         a.sorted_token_ids = at(a.sorted_token_ids, a.expert_map.data);
       },
       "sorted_token_ids", "memory disjoint from 'expert_map'", "sharing 64 bytes"},
      {"shape", [](auto& a) { a.sorted_token_ids = fake(kI32, {127}); }, "sorted_token_ids",
       "shape [128]", "i32[127]"},
      {"shape", [](auto& a) { a.num_tokens_post_padded = fake(kI32, {2}); },
       "num_tokens_post_padded", "shape [1]", "i32[2]"},
      {"top_k",
       [](auto& a) {
         a.topk_ids = fake(kI32, {4, 0});
       },
       "topk_ids", "at least one route per token", "i32[4, 0]"},
      {"experts", [](auto& a) { a.num_experts = 0; }, "num_experts", "1 to 1024", "0"},
      {"experts", [](auto& a) { a.num_experts = 1025; }, "num_experts", "1 to 1024", "1025"},
      {"scalar", [](auto& a) { a.block_size = 48; }, "block_size", "a power of two from 16 to 256",
       "48"},
      {"32-bit",
       [](auto& a) {
         a.topk_ids = fake(kI32, {int64_t{1} << 28, 8});
       },
       "topk_ids", "at most 2^31-1-8192 routes (T*K)", "i32[268435456, 8]"},
      {"null", [](auto& a) { a.expert_ids.data = nullptr; }, "expert_ids",
       "a non-null data pointer", "nullptr"},
      {"misaligned", [](auto& a) { a.sorted_token_ids = shifted(a.sorted_token_ids, 1); },
       "sorted_token_ids", "data aligned to 4 bytes", "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.topk_ids = non_contiguous(a.topk_ids); }, "topk_ids",
       "a contiguous row-major tensor", "strides that are not"},
      {"workspace", [](auto& a) { align_many_routes(a); }, "workspace", "at least", "no workspace"},
      {"workspace",
       [](auto& a) {
         align_many_routes(a);
         a.workspace = fake_ws(16);
       },
       "workspace", "at least", "16 bytes"},
      {"overlap", [](auto& a) { a.expert_ids = at(a.expert_ids, a.sorted_token_ids.data); },
       "expert_ids", "memory disjoint from 'sorted_token_ids'", "sharing 32 bytes"},
      {"overlap",
       [](auto& a) {
         align_many_routes(a);
         a.workspace = Workspace{a.topk_ids.data, size_t{1} << 30};
       },
       "workspace", "memory disjoint from 'topk_ids'", "overlapping 'topk_ids'"},
  };
}

TEST(BadInputs, MoePermuteAlign) {
  run_table<PermuteAlignArgs>(
      "moe_permute_align", align_valid,
      [](const PermuteAlignArgs& a) { moe_permute_align(a, nullptr); }, align_rows());
}

// ---- moe_pre_permute ----

PrePermuteArgs pre_valid() {
  PrePermuteArgs a;
  a.hidden_states = fake(kBF, {4, 64});
  a.local_expert_ids = fake(kI32, {4, 2});
  a.num_local_experts = 8;
  a.layout = PermutedLayout::contiguous(1);
  a.permuted = fake(kBF, {8, 64});
  a.layout_metadata = fake(kI32, {8});
  a.inverse_indices = fake(kI32, {8});
  return a;
}

std::vector<Row<PrePermuteArgs>> pre_rows() {
  return {
      {"32-bit",
       [](auto& a) {
         a.hidden_states = fake(kBF, {1, 64});
         a.local_expert_ids = fake(kI32, {1, 2147475455});
         a.layout = PermutedLayout::contiguous(1 << 20);
       },
       "permuted", "T*K + num_local_experts*(alignment-1) below 2^31 rows (i32 indices)",
       "2155864055 rows"},
      {"dtype", [](auto& a) { a.hidden_states.dtype = kI32; }, "hidden_states",
       "dtype bf16 or f16 or f32", "i32[4, 64]"},
      {"dtype", [](auto& a) { a.permuted.dtype = kF16; }, "permuted", "dtype bf16", "f16[8, 64]"},
      {"rank", [](auto& a) { a.local_expert_ids = fake(kI32, {8}); }, "local_expert_ids",
       "shape [4, *]", "i32[8]"},
      {"engine", [](auto& a) { a.local_expert_ids.dtype = kF32; }, "local_expert_ids",
       "dtype i32 or i64", "f32[4, 2]"},
      {"engine",
       [](auto& a) {
         a.local_expert_ids = fake(kI64, {4, 2});
         a.workspace = fake_ws(8);
       },
       "workspace", "at least 256 bytes", "8 bytes"},
      {"shape",
       [](auto& a) {
         a.permuted = fake(kBF, {9, 64});
       },
       "permuted", "shape [8, 64]", "bf16[9, 64]"},
      {"shape",
       [](auto& a) {
         a.hidden_states = fake(kBF, {4, 12});
       },
       "hidden_states", "a hidden size that is a multiple of 8", "bf16[4, 12]"},
      {"experts", [](auto& a) { a.num_local_experts = 0; }, "num_local_experts", "1 to 1024", "0"},
      {"experts", [](auto& a) { a.num_local_experts = 1025; }, "num_local_experts", "1 to 1024",
       "1025"},
      {"layout", [](auto& a) { a.layout = PermutedLayout::masked(4); }, "layout",
       "a contiguous(alignment) layout", "a masked layout"},
      {"layout", [](auto& a) { a.layout = PermutedLayout::contiguous(0); }, "layout.alignment",
       ">= 1", "0"},
      {"32-bit",
       [](auto& a) {
         a.hidden_states = fake(kBF, {4, int64_t{1} << 28});
       },
       "hidden_states", "rows of less than 2^29 bytes", "bf16[4, 268435456]"},
      {"32-bit",
       [](auto& a) {
         a.hidden_states = fake(kBF, {int64_t{1} << 28, 64});
         a.local_expert_ids = fake(kI32, {int64_t{1} << 28, 8});
       },
       "local_expert_ids", "at most 2^31-1-8192 routes (T*K)", "i32[268435456, 8]"},
      {"null", [](auto& a) { a.inverse_indices.data = nullptr; }, "inverse_indices",
       "a non-null data pointer", "nullptr"},
      {"misaligned", [](auto& a) { a.permuted = shifted(a.permuted, 8); }, "permuted",
       "data aligned to 16 bytes", "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.hidden_states = non_contiguous(a.hidden_states); },
       "hidden_states", "a contiguous row-major tensor", "strides that are not"},
      {"workspace",
       [](auto& a) {
         a.hidden_states = fake(kBF, {2048, 64});
         a.local_expert_ids = fake(kI32, {2048, 4});
         a.permuted = fake(kBF, {8192, 64});
         a.inverse_indices = fake(kI32, {8192});
         a.workspace = fake_ws(100);
       },
       "workspace", "at least", "100 bytes"},
      {"overlap", [](auto& a) { a.permuted = at(a.permuted, a.hidden_states.data); }, "permuted",
       "memory disjoint from 'hidden_states'", "sharing 512 bytes"},
  };
}

TEST(BadInputs, MoePrePermute) {
  run_table<PrePermuteArgs>(
      "moe_pre_permute", pre_valid, [](const PrePermuteArgs& a) { moe_pre_permute(a, nullptr); },
      pre_rows());
}

// ---- moe_post_permute ----

PostPermuteArgs post_valid() {
  PostPermuteArgs a;
  a.expert_output = fake(kBF, {8, 64});
  a.topk_weights = fake(kF32, {4, 2});
  a.inverse_indices = fake(kI32, {8});
  a.out = fake(kBF, {4, 64});
  return a;
}

std::vector<Row<PostPermuteArgs>> post_rows() {
  return {
      {"dtype", [](auto& a) { a.out.dtype = kF16; }, "out", "dtype bf16 or f32", "f16[4, 64]"},
      {"dtype", [](auto& a) { a.inverse_indices.dtype = kF32; }, "inverse_indices", "dtype i32",
       "f32[8]"},
      {"rank", [](auto& a) { a.topk_weights = fake(kF32, {8}); }, "topk_weights", "shape [*, *]",
       "f32[8]"},
      {"shape", [](auto& a) { a.inverse_indices = fake(kI32, {7}); }, "inverse_indices",
       "shape [8]", "i32[7]"},
      {"shape",
       [](auto& a) {
         a.expert_output = fake(kBF, {8, 12});
       },
       "expert_output", "a hidden size that is a multiple of 8", "bf16[8, 12]"},
      {"top_k",
       [](auto& a) {
         a.topk_weights = fake(kF32, {4, 0});
         a.inverse_indices = fake(kI32, {0});
       },
       "topk_weights", "1 to 2^31-1 routes per token (dim 1)", "f32[4, 0]"},
      {"null", [](auto& a) { a.out.data = nullptr; }, "out", "a non-null data pointer", "nullptr"},
      {"misaligned", [](auto& a) { a.expert_output = shifted(a.expert_output, 2); },
       "expert_output", "data aligned to 16 bytes", "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.out = non_contiguous(a.out); }, "out",
       "a contiguous row-major tensor", "strides that are not"},
      {"overlap", [](auto& a) { a.out = at(a.out, a.expert_output.data); }, "out",
       "memory disjoint from 'expert_output'", "sharing 512 bytes"},
  };
}

TEST(BadInputs, MoePostPermute) {
  run_table<PostPermuteArgs>(
      "moe_post_permute", post_valid,
      [](const PostPermuteArgs& a) { moe_post_permute(a, nullptr); }, post_rows());
}

// ---- moe_grouped_gemm ----

GroupedGemmArgs gemm_valid() {
  GroupedGemmArgs a;
  a.a = fake(kBF, {32, 64});
  a.b = fake(kBF, {4, 128, 64});
  a.layout_metadata = fake(kI32, {4});
  a.layout = PermutedLayout::contiguous(1);
  a.activation = Activation::kSiluAndMul;
  a.c = fake(kBF, {32, 64});
  return a;
}

void gemm_masked(GroupedGemmArgs& a, int64_t E, int64_t max_m) {
  a.layout = PermutedLayout::masked(max_m);
  a.a = fake(kBF, {E, max_m, 64});
  a.b = fake(kBF, {E, 128, 64});
  a.layout_metadata = fake(kI32, {E});
  a.c = fake(kBF, {E, max_m, 64});
}

std::vector<Row<GroupedGemmArgs>> gemm_rows() {
  return {
      {"layout", [](auto& a) { a.layout.kind = static_cast<PermutedLayout::Kind>(5); },
       "layout.kind", "kContiguous or kMasked", "value 5"},
      {"layout",
       [](auto& a) {
         gemm_masked(a, 4, 16);
         a.layout.max_m = -1;
       },
       "layout.max_m", "max_m >= 0", "-1"},
      {"shape",
       [](auto& a) {
         gemm_masked(a, 4, 16);
         a.a = fake(kBF, {3, 16, 64});
       },
       "a", "dim 0 = E = 4 (b's dim 0)", "bf16[3, 16, 64]"},
      {"shape",
       [](auto& a) {
         a.a = fake(kBF, {32, 60});
         a.b = fake(kBF, {4, 128, 60});
       },
       "b", "Kd (dim 2) a multiple of 8", "bf16[4, 128, 60]"},
      {"dtype", [](auto& a) { a.a.dtype = kF32; }, "a", "dtype bf16 or f16", "f32[32, 64]"},
      {"dtype", [](auto& a) { a.b.dtype = kF16; }, "b", "dtype bf16 (that of 'a')",
       "f16[4, 128, 64]"},
      {"dtype", [](auto& a) { a.c.dtype = kI32; }, "c", "dtype bf16 or f32", "i32[32, 64]"},
      {"rank",
       [](auto& a) {
         a.b = fake(kBF, {128, 64});
       },
       "b", "shape [*, *, *]", "bf16[128, 64]"},
      {"shape",
       [](auto& a) {
         a.c = fake(kBF, {32, 32});
       },
       "c", "shape [32, 64]", "bf16[32, 32]"},
      {"shape",
       [](auto& a) {
         a.a = fake(kBF, {32, 72});
       },
       "a", "Kd = 64 columns (b's dim 2)", "bf16[32, 72]"},
      {"shape",
       [](auto& a) {
         a.b = fake(kBF, {4, 130, 64});
       },
       "b", "dim 1 = 2N with N a multiple of 8", "bf16[4, 130, 64]"},
      {"shape", [](auto& a) { a.layout_metadata = fake(kI32, {5}); }, "layout_metadata",
       "shape [4]", "i32[5]"},
      {"scalar", [](auto& a) { a.activation = static_cast<Activation>(7); }, "activation",
       "Activation::kNone or Activation::kSiluAndMul", "value 7"},
      {"layout", [](auto& a) { a.layout = PermutedLayout::contiguous(0); }, "layout.alignment",
       "alignment >= 1", "0"},
      {"experts",
       [](auto& a) {
         a.b = fake(kBF, {1025, 128, 64});
         a.layout_metadata = fake(kI32, {1025});
       },
       "b", "at most 1024 experts (dim 0)", "bf16[1025, 128, 64]"},
      {"32-bit",
       [](auto& a) {
         a.a = fake(kBF, {kBig, 64});
         a.c = fake(kBF, {kBig, 64});
       },
       "a", "at most 2^31-1 rows (dim 0)", "bf16[2147483648, 64]"},
      {"32-bit", [](auto& a) { gemm_masked(a, 8, int64_t{1} << 28); }, "a",
       "at most 2^31-1 rows in all (E*max_m)", "bf16[8, 268435456, 64]"},
      {"32-bit",
       [](auto& a) {
         a.a = fake(kBF, {32, kBig + 8});
         a.b = fake(kBF, {1, 16, kBig + 8});
         a.layout_metadata = fake(kI32, {1});
         a.c = fake(kBF, {32, 8});
       },
       "b", "at most 2^31-1 columns Kd (dim 2)", "bf16[1, 16, 2147483656]"},
      {"null", [](auto& a) { a.c.data = nullptr; }, "c", "a non-null data pointer", "nullptr"},
      {"misaligned", [](auto& a) { a.a = shifted(a.a, 2); }, "a", "data aligned to 16 bytes",
       "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.b = non_contiguous(a.b); }, "b",
       "a contiguous row-major tensor", "strides that are not"},
      {"workspace", [](auto& a) { a.workspace = fake_ws(8); }, "workspace", "at least 256 bytes",
       "8 bytes"},
      {"workspace",
       [](auto& a) {
         a.workspace = Workspace{slot(50, 64), 4096};
       },
       "workspace", "data aligned to 256 bytes", "pointer 0x"},
      {"overlap", [](auto& a) { a.c = at(a.c, a.a.data); }, "c", "memory disjoint from 'a'",
       "sharing 4096 bytes"},
      {"overlap",
       [](auto& a) {
         a.workspace = Workspace{a.c.data, 256};
       },
       "workspace", "memory disjoint from 'c'", "overlapping 'c'"},
  };
}

TEST(BadInputs, MoeGroupedGemm) {
  run_table<GroupedGemmArgs>(
      "moe_grouped_gemm", gemm_valid,
      [](const GroupedGemmArgs& a) { moe_grouped_gemm(a, nullptr); }, gemm_rows());
}

// ---- moe_grouped_gemm_fp8 ----

GroupedGemmFP8Args fp8_valid() {
  GroupedGemmFP8Args a;
  a.a = fake(kFP8, {2, 64, 256});
  a.a_scale = fake(kF32, {2, 64, 2});
  a.b = fake(kFP8, {2, 128, 256});
  a.b_scale = fake(kF32, {2, 1, 2});
  a.layout_metadata = fake(kI32, {2});
  a.c = fake(kBF, {2, 64, 128});
  return a;
}

std::vector<Row<GroupedGemmFP8Args>> fp8_rows() {
  return {
      {"shape",
       [](auto& a) {
         a.b = fake(kFP8, {2, 124, 256});
         a.c = fake(kBF, {2, 64, 124});
       },
       "b", "N (dim 1) a multiple of 8", "fp8e4m3[2, 124, 256]"},
      {"dtype", [](auto& a) { a.a.dtype = kBF; }, "a", "dtype fp8e4m3", "bf16[2, 64, 256]"},
      {"dtype", [](auto& a) { a.c.dtype = kF32; }, "c", "dtype bf16", "f32[2, 64, 128]"},
      {"rank",
       [](auto& a) {
         a.a_scale = fake(kF32, {2, 128});
       },
       "a_scale", "shape [2, 64, 2]", "f32[2, 128]"},
      {"shape",
       [](auto& a) {
         a.b_scale = fake(kF32, {2, 2, 2});
       },
       "b_scale", "shape [2, 1, 2]", "f32[2, 2, 2]"},
      {"shape",
       [](auto& a) {
         a.a = fake(kFP8, {2, 64, 24});
       },
       "a", "Kd (dim 2) a multiple of 16", "fp8e4m3[2, 64, 24]"},
      {"experts",
       [](auto& a) {
         a.a = fake(kFP8, {1025, 64, 256});
       },
       "a", "at most 1024 experts (dim 0)", "fp8e4m3[1025, 64, 256]"},
      {"experts",
       [](auto& a) {
         a.layout = PermutedLayout::contiguous(1);
         a.a = fake(kFP8, {64, 256});
         a.b = fake(kFP8, {1025, 128, 256});
       },
       "b", "at most 1024 experts (dim 0)", "fp8e4m3[1025, 128, 256]"},
      {"32-bit",
       [](auto& a) {
         a.layout = PermutedLayout::contiguous(1);
         a.a = fake(kFP8, {kBig, 256});
       },
       "a", "at most 2^31-1 rows (dim 0)", "fp8e4m3[2147483648, 256]"},
      {"32-bit",
       [](auto& a) {
         a.a = fake(kFP8, {8, int64_t{1} << 28, 256});
       },
       "a", "at most 2^31-1 rows in all (E*max_m)", "fp8e4m3[8, 268435456, 256]"},
      {"32-bit",
       [](auto& a) {
         a.b = fake(kFP8, {2, kBig, 256});
       },
       "b", "at most 2^31-1 rows per expert (dim 1)", "fp8e4m3[2, 2147483648, 256]"},
      {"null", [](auto& a) { a.b_scale.data = nullptr; }, "b_scale", "a non-null data pointer",
       "nullptr"},
      {"misaligned", [](auto& a) { a.b = shifted(a.b, 8); }, "b", "data aligned to 16 bytes",
       "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.a = non_contiguous(a.a); }, "a",
       "a contiguous row-major tensor", "strides that are not"},
      {"overlap", [](auto& a) { a.c = at(a.c, a.b_scale.data); }, "c",
       "memory disjoint from 'b_scale'", "sharing 16 bytes"},
  };
}

TEST(BadInputs, MoeGroupedGemmFp8) {
  run_table<GroupedGemmFP8Args>(
      "moe_grouped_gemm_fp8", fp8_valid,
      [](const GroupedGemmFP8Args& a) { moe_grouped_gemm_fp8(a, nullptr); }, fp8_rows());
}

// ---- moe_expert_mlp ----

ExpertMLPArgs mlp_valid() {
  ExpertMLPArgs a;
  a.expert_input = fake(kBF, {32, 64});
  a.layout_metadata = fake(kI32, {8});
  a.layout = PermutedLayout::contiguous(1);
  a.w_gate_up = fake(kBF, {8, 64, 64});
  a.w_down = fake(kBF, {8, 64, 32});
  a.expert_output = fake(kBF, {32, 64});
  a.workspace = fake_ws();
  return a;
}

std::vector<Row<ExpertMLPArgs>> mlp_rows() {
  return {
      {"dtype", [](auto& a) { a.expert_input.dtype = kF32; }, "expert_input", "dtype bf16 or f16",
       "f32[32, 64]"},
      {"dtype", [](auto& a) { a.w_down.dtype = kF16; }, "w_down",
       "dtype bf16 (that of 'expert_input')", "f16[8, 64, 32]"},
      {"rank",
       [](auto& a) {
         a.w_down = fake(kBF, {64, 32});
       },
       "w_down", "shape [8, 64, 32]", "bf16[64, 32]"},
      {"shape",
       [](auto& a) {
         a.w_gate_up = fake(kBF, {8, 60, 64});
       },
       "w_gate_up", "2*F gate+up rows with F a positive multiple of 8", "bf16[8, 60, 64]"},
      {"shape",
       [](auto& a) {
         a.expert_output = fake(kBF, {31, 64});
       },
       "expert_output", "shape [32, 64]", "bf16[31, 64]"},
      {"layout", [](auto& a) { a.layout = PermutedLayout::masked(4); }, "layout",
       "a contiguous(alignment) layout", "masked"},
      {"experts",
       [](auto& a) {
         a.w_gate_up = fake(kBF, {1025, 64, 64});
         a.w_down = fake(kBF, {1025, 64, 32});
         a.layout_metadata = fake(kI32, {1025});
       },
       "w_gate_up", "at most 1024 experts (dim 0)", "bf16[1025, 64, 64]"},
      {"32-bit",
       [](auto& a) {
         a.expert_input = fake(kBF, {kBig, 64});
         a.expert_output = fake(kBF, {kBig, 64});
       },
       "expert_input", "at most 2^31-1 rows (dim 0)", "bf16[2147483648, 64]"},
      {"32-bit",
       [](auto& a) {
         a.w_gate_up = fake(kBF, {1, kBig + 16, 64});
       },
       "w_gate_up", "at most 2^31-1 gate+up rows per expert (dim 1)", "bf16[1, 2147483664, 64]"},
      {"null", [](auto& a) { a.w_gate_up.data = nullptr; }, "w_gate_up", "a non-null data pointer",
       "nullptr"},
      {"misaligned", [](auto& a) { a.expert_output = shifted(a.expert_output, 4); },
       "expert_output", "data aligned to 16 bytes", "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.w_down = non_contiguous(a.w_down); }, "w_down",
       "a contiguous row-major tensor", "strides that are not"},
      {"workspace", [](auto& a) { a.workspace = Workspace{}; }, "workspace", "at least",
       "no workspace"},
      {"workspace",
       [](auto& a) {
         a.workspace = Workspace{slot(50, 16), size_t{1} << 30};
       },
       "workspace", "data aligned to 256 bytes", "pointer 0x"},
      {"overlap",
       [](auto& a) { a.expert_output = shifted(at(a.expert_output, a.expert_input.data), 128); },
       "expert_output", "memory disjoint from 'expert_input' or 'expert_input' itself (in place)",
       "sharing 3968 bytes"},
      {"overlap", [](auto& a) { a.expert_output = at(a.expert_output, a.w_down.data); },
       "expert_output", "memory disjoint from 'w_down'", "sharing 4096 bytes"},
  };
}

TEST(BadInputs, MoeExpertMlp) {
  run_table<ExpertMLPArgs>(
      "moe_expert_mlp", mlp_valid, [](const ExpertMLPArgs& a) { moe_expert_mlp(a, nullptr); },
      mlp_rows());
}

// ---- fused_moe_experts / indexed_expert_mlp ----

FusedMoEExpertsArgs experts_valid() {
  FusedMoEExpertsArgs a;
  a.hidden_states = fake(kBF, {4, 64});
  a.w_gate_up = fake(kBF, {8, 64, 64});
  a.w_down = fake(kBF, {8, 64, 32});
  a.topk_weights = fake(kF32, {4, 2});
  a.topk_ids = fake(kI32, {4, 2});
  a.output = fake(kBF, {4, 64});
  a.workspace = fake_ws();
  return a;
}

void experts_with(FusedMoEExpertsArgs& a, int64_t T, int64_t E) {
  a.hidden_states = fake(kBF, {T, 64});
  a.w_gate_up = fake(kBF, {E, 64, 64});
  a.w_down = fake(kBF, {E, 64, 32});
  a.topk_weights = fake(kF32, {T, 2});
  a.topk_ids = fake(kI32, {T, 2});
  a.output = fake(kBF, {T, 64});
}

// The rows both ops share.
std::vector<Row<FusedMoEExpertsArgs>> experts_rows() {
  return {
      {"dtype", [](auto& a) { a.hidden_states.dtype = kF32; }, "hidden_states", "dtype bf16 or f16",
       "f32[4, 64]"},
      {"dtype", [](auto& a) { a.output.dtype = kF16; }, "output",
       "dtype bf16 (that of 'hidden_states')", "f16[4, 64]"},
      {"dtype", [](auto& a) { a.topk_weights.dtype = kBF; }, "topk_weights", "dtype f32",
       "bf16[4, 2]"},
      {"rank",
       [](auto& a) {
         a.w_gate_up = fake(kBF, {64, 64});
       },
       "w_gate_up", "shape [*, *, 64]", "bf16[64, 64]"},
      {"shape",
       [](auto& a) {
         a.w_down = fake(kBF, {8, 32, 64});
       },
       "w_down", "shape [8, 64, 32]", "bf16[8, 32, 64]"},
      {"shape",
       [](auto& a) {
         a.topk_ids = fake(kI32, {5, 2});
       },
       "topk_ids", "shape [4, *]", "i32[5, 2]"},
      {"shape",
       [](auto& a) {
         a.hidden_states = fake(kBF, {4, 12});
       },
       "hidden_states", "a hidden size (dim 1) that is a positive multiple of 8", "bf16[4, 12]"},
      {"top_k",
       [](auto& a) {
         a.topk_ids = fake(kI32, {4, 0});
       },
       "topk_ids", "top_k (dim 1) >= 1", "i32[4, 0]"},
      {"engine", [](auto& a) { a.topk_ids.dtype = kF32; }, "topk_ids", "dtype i32 or i64",
       "f32[4, 2]"},
      {"engine", [](auto& a) { a.expert_map = fake(kF32, {16}); }, "expert_map", "dtype i32",
       "f32[16]"},
      {"engine",
       [](auto& a) {
         a.expert_map = fake(kI32, {4, 4});
       },
       "expert_map", "shape [*]", "i32[4, 4]"},
      {"engine", [](auto& a) { a.expert_map = fake(kI32, {0}); }, "expert_map",
       "1 to 2^31-1 entries (one per global expert)", "i32[0]"},
      {"engine", [](auto& a) { a.apply_router_weight_on_input = true; },
       "apply_router_weight_on_input", "top_k 1", "true with top_k 2"},
      {"overlap",
       [](auto& a) {
         a.expert_map = fake(kI32, {16});
         a.output = at(a.output, a.expert_map.data);
       },
       "output", "memory disjoint from 'expert_map'", "sharing 64 bytes"},
      {"32-bit",
       [](auto& a) {
         a.hidden_states = fake(kBF, {int64_t{1} << 20, 64});
         a.topk_ids = fake(kI32, {int64_t{1} << 20, 2048});
       },
       "topk_ids", "at most 2^31-1 routes (T*K)", "i32[1048576, 2048]"},
      {"null", [](auto& a) { a.topk_ids.data = nullptr; }, "topk_ids", "a non-null data pointer",
       "nullptr"},
      {"misaligned", [](auto& a) { a.w_gate_up = shifted(a.w_gate_up, 8); }, "w_gate_up",
       "data aligned to 16 bytes", "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.hidden_states = non_contiguous(a.hidden_states); },
       "hidden_states", "a contiguous row-major tensor", "strides that are not"},
      {"workspace", [](auto& a) { a.workspace = fake_ws(100); }, "workspace", "at least",
       "100 bytes"},
      {"overlap", [](auto& a) { a.output = shifted(at(a.output, a.hidden_states.data), 16); },
       "output", "memory disjoint from 'hidden_states' or 'hidden_states' itself (in place)",
       "sharing 496 bytes"},
      {"overlap", [](auto& a) { a.output = at(a.output, a.topk_ids.data); }, "output",
       "memory disjoint from 'topk_ids'", "sharing"},
      {"overlap",
       [](auto& a) {
         a.workspace = Workspace{a.output.data, size_t{1} << 20};
       },
       "workspace", "memory disjoint from 'output'", "overlapping 'output'"},
  };
}

TEST(BadInputs, FusedMoeExperts) {
  auto rows = experts_rows();
  rows.push_back({"experts", [](auto& a) { experts_with(a, 4, 1025); }, "w_gate_up",
                  "at most 1024 experts (dim 0)", "bf16[1025, 64, 64]"});
  run_table<FusedMoEExpertsArgs>(
      "fused_moe_experts", experts_valid,
      [](const FusedMoEExpertsArgs& a) { fused_moe_experts(a, nullptr); }, rows);
}

TEST(BadInputs, IndexedExpertMlp) {
  auto rows = experts_rows();
  // E = 1000 takes the direct path at T = 4 (no error there); E = 5000 no path takes.
  rows.push_back({"experts", [](auto& a) { experts_with(a, 4, 5000); }, "w_gate_up",
                  "at most 4096 experts (dim 0)", "bf16[5000, 64, 64]"});
  rows.push_back({"experts", [](auto& a) { experts_with(a, 65, 1025); }, "w_gate_up",
                  "at most 1024 experts (dim 0) on the sorted path, which this call takes because "
                  "T = 65 > 64 (the direct path takes up to 4096 experts",
                  "bf16[1025, 64, 64]"});
  run_table<FusedMoEExpertsArgs>(
      "indexed_expert_mlp", experts_valid,
      [](const IndexedExpertMLPArgs& a) { indexed_expert_mlp(a, nullptr); }, rows);
}

// ---- fused_moe / fused_moe_shared_expert ----

FusedMoEArgs layer_valid() {
  FusedMoEArgs a;
  a.hidden_states = fake(kBF, {4, 64});
  a.gating_output = fake(kF32, {4, 8});
  a.params.top_k = 2;
  a.w_gate_up = fake(kBF, {8, 64, 64});
  a.w_down = fake(kBF, {8, 64, 32});
  a.output = fake(kBF, {4, 64});
  a.workspace = fake_ws();
  return a;
}

std::vector<Row<FusedMoEArgs>> layer_rows() {
  return {
      {"dtype", [](auto& a) { a.gating_output.dtype = kI32; }, "gating_output",
       "dtype bf16 or f16 or f32", "i32[4, 8]"},
      {"dtype", [](auto& a) { a.w_gate_up.dtype = kF16; }, "w_gate_up",
       "dtype bf16 (that of 'hidden_states')", "f16[8, 64, 64]"},
      {"rank",
       [](auto& a) {
         a.hidden_states = fake(kBF, {4, 64, 1});
       },
       "hidden_states", "shape [*, *]", "bf16[4, 64, 1]"},
      {"shape",
       [](auto& a) {
         a.gating_output = fake(kF32, {4, 9});
       },
       "gating_output", "shape [4, 8]", "f32[4, 9]"},
      {"shape", [](auto& a) { a.correction_bias = fake(kF32, {9}); }, "correction_bias",
       "shape [8]", "f32[9]"},
      {"shape",
       [](auto& a) {
         a.output = fake(kBF, {3, 64});
       },
       "output", "shape [4, 64]", "bf16[3, 64]"},
      {"top_k", [](auto& a) { a.params.top_k = 0; }, "top_k", "1 to min(16, num_experts=8)", "0"},
      {"top_k", [](auto& a) { a.params.top_k = 9; }, "top_k", "1 to min(16, num_experts=8)", "9"},
      {"engine", [](auto& a) { a.expert_map = fake(kI64, {8}); }, "expert_map", "dtype i32",
       "i64[8]"},
      {"engine", [](auto& a) { a.expert_map = fake(kI32, {16}); }, "gating_output",
       "one column per global expert (expert_map has 16 entries)", "f32[4, 8]"},
      {"engine",
       [](auto& a) {
         a.expert_map = fake(kI32, {16});
         a.gating_output = fake(kF32, {4, 16});
         a.params.top_k = 17;
       },
       "top_k", "1 to min(16, num_experts=16)", "17"},
      {"engine",
       [](auto& a) {
         a.expert_map = fake(kI32, {16});
         a.gating_output = fake(kF32, {4, 16});
         a.correction_bias = fake(kF32, {8});
       },
       "correction_bias", "shape [16]", "f32[8]"},
      {"engine", [](auto& a) { a.apply_router_weight_on_input = true; },
       "apply_router_weight_on_input", "top_k 1", "true with top_k 2"},
      {"overlap",
       [](auto& a) {
         a.expert_map = fake(kI32, {8});
         a.output = at(a.output, a.expert_map.data);
       },
       "output", "memory disjoint from 'expert_map'", "sharing 32 bytes"},
      {"groups",
       [](auto& a) {
         a.params.num_expert_group = 3;
         a.params.topk_group = 1;
       },
       "num_expert_group", "0 or a positive divisor of num_experts=8", "3"},
      {"groups",
       [](auto& a) {
         a.params.num_expert_group = 2;
         a.params.topk_group = 0;
       },
       "topk_group", "1 to num_expert_group=2", "0"},
      {"experts",
       [](auto& a) {
         a.w_gate_up = fake(kBF, {1025, 64, 64});
         a.w_down = fake(kBF, {1025, 64, 32});
         a.gating_output = fake(kF32, {4, 1025});
       },
       "w_gate_up", "at most 1024 experts (dim 0; the routing's limit)", "bf16[1025, 64, 64]"},
      {"32-bit",
       [](auto& a) {
         a.hidden_states = fake(kBF, {kBig, 64});
         a.gating_output = fake(kF32, {kBig, 8});
         a.output = fake(kBF, {kBig, 64});
       },
       "hidden_states", "at most 2^31-1 rows (dim 0)", "bf16[2147483648, 64]"},
      {"32-bit",
       [](auto& a) {
         a.hidden_states = fake(kBF, {int64_t{1} << 28, 64});
         a.params.top_k = 8;
       },
       "hidden_states", "at most 2^31-1 routes (T*top_k)", "bf16[268435456, 64]"},
      {"null", [](auto& a) { a.gating_output.data = nullptr; }, "gating_output",
       "a non-null data pointer", "nullptr"},
      {"misaligned", [](auto& a) { a.hidden_states = shifted(a.hidden_states, 2); },
       "hidden_states", "data aligned to 16 bytes", "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.w_down = non_contiguous(a.w_down); }, "w_down",
       "a contiguous row-major tensor", "strides that are not"},
      {"workspace", [](auto& a) { a.workspace = fake_ws(255); }, "workspace", "at least",
       "255 bytes"},
      {"overlap", [](auto& a) { a.output = at(a.output, a.gating_output.data); }, "output",
       "memory disjoint from 'gating_output'", "sharing 128 bytes"},
      {"overlap", [](auto& a) { a.output = shifted(at(a.output, a.hidden_states.data), 128); },
       "output", "memory disjoint from 'hidden_states' or 'hidden_states' itself (in place)",
       "sharing 384 bytes"},
  };
}

TEST(BadInputs, FusedMoe) {
  run_table<FusedMoEArgs>(
      "fused_moe", layer_valid, [](const FusedMoEArgs& a) { fused_moe(a, nullptr); }, layer_rows());
}

FusedMoESharedExpertArgs shared_layer_valid() {
  FusedMoESharedExpertArgs a;
  a.moe = layer_valid();
  a.shared_w_gate_up = fake(kBF, {64, 64});
  a.shared_w_down = fake(kBF, {64, 32});
  return a;
}

TEST(BadInputs, FusedMoeSharedExpert) {
  std::vector<Row<FusedMoESharedExpertArgs>> rows;
  for (const auto& r : layer_rows()) {  // the routed layer's rows, through args.moe
    auto mutate = r.mutate;
    rows.push_back({r.category, [mutate](auto& a) { mutate(a.moe); }, r.arg, r.expected, r.got});
  }
  const std::vector<Row<FusedMoESharedExpertArgs>> shared = {
      {"dtype", [](auto& a) { a.shared_w_gate_up.dtype = kF16; }, "shared_w_gate_up",
       "dtype bf16 (that of 'hidden_states')", "f16[64, 64]"},
      {"shape",
       [](auto& a) {
         a.shared_w_down = fake(kBF, {64, 40});
       },
       "shared_w_down", "shape [64, 32]", "bf16[64, 40]"},
      {"undefined", [](auto& a) { a.shared_w_down = TensorView{}; }, "shared_w_down",
       "tensor of shape [64, 32]", "an undefined tensor"},
      {"32-bit",
       [](auto& a) {
         a.shared_w_gate_up = fake(kBF, {kBig + 16, 64});
       },
       "shared_w_gate_up", "at most 2^31-1 gate+up rows (dim 0)", "bf16[2147483664, 64]"},
      {"overlap", [](auto& a) { a.moe.output = at(a.moe.output, a.shared_w_down.data); }, "output",
       "memory disjoint from 'shared_w_down'", "sharing 512 bytes"},
  };
  rows.insert(rows.end(), shared.begin(), shared.end());
  run_table<FusedMoESharedExpertArgs>(
      "fused_moe_shared_expert", shared_layer_valid,
      [](const FusedMoESharedExpertArgs& a) { fused_moe_shared_expert(a, nullptr); }, rows);
}

// ---- shared_expert_mlp ----

SharedExpertMLPArgs shared_valid() {
  SharedExpertMLPArgs a;
  a.hidden_states = fake(kBF, {4, 64});
  a.w_gate_up = fake(kBF, {64, 64});
  a.w_down = fake(kBF, {64, 32});
  a.output = fake(kBF, {4, 64});
  a.workspace = fake_ws();
  return a;
}

std::vector<Row<SharedExpertMLPArgs>> shared_rows() {
  return {
      {"dtype", [](auto& a) { a.output.dtype = kF32; }, "output", "dtype bf16 or f16",
       "f32[4, 64]"},
      {"rank",
       [](auto& a) {
         a.w_gate_up = fake(kBF, {8, 64, 64});
       },
       "w_gate_up", "shape [*, 64]", "bf16[8, 64, 64]"},
      {"shape",
       [](auto& a) {
         a.w_down = fake(kBF, {64, 24});
       },
       "w_down", "shape [64, 32]", "bf16[64, 24]"},
      {"shape",
       [](auto& a) {
         a.w_gate_up = fake(kBF, {66, 64});
       },
       "w_gate_up", "2*S gate+up rows with S a positive multiple of 8", "bf16[66, 64]"},
      {"32-bit",
       [](auto& a) {
         a.hidden_states = fake(kBF, {kBig, 64});
         a.output = fake(kBF, {kBig, 64});
       },
       "hidden_states", "at most 2^31-1 rows (dim 0)", "bf16[2147483648, 64]"},
      {"null", [](auto& a) { a.w_down.data = nullptr; }, "w_down", "a non-null data pointer",
       "nullptr"},
      {"misaligned", [](auto& a) { a.output = shifted(a.output, 8); }, "output",
       "data aligned to 16 bytes", "pointer 0x"},
      {"non-contiguous", [](auto& a) { a.output = non_contiguous(a.output); }, "output",
       "a contiguous row-major tensor", "strides that are not"},
      {"workspace", [](auto& a) { a.workspace = Workspace{}; }, "workspace", "at least",
       "no workspace"},
      {"overlap", [](auto& a) { a.output = at(a.output, a.hidden_states.data); }, "output",
       "memory disjoint from 'hidden_states'", "sharing 512 bytes"},
  };
}

TEST(BadInputs, SharedExpertMlp) {
  run_table<SharedExpertMLPArgs>(
      "shared_expert_mlp", shared_valid,
      [](const SharedExpertMLPArgs& a) { shared_expert_mlp(a, nullptr); }, shared_rows());
}

// Every op's table covers the categories of docs/bad-inputs.md that apply to it.
TEST(BadInputs, EveryOpCoversItsCategories) {
  const char* common[] = {"dtype",      "rank",           "shape",  "null",
                          "misaligned", "non-contiguous", "overlap"};
  auto check = [&](const char* op, const std::vector<std::string>& c,
                   std::initializer_list<const char*> more) {
    for (const char* k : common) EXPECT_TRUE(has(c, k)) << op << " lacks " << k;
    for (const char* k : more) EXPECT_TRUE(has(c, k)) << op << " lacks " << k;
  };
  check("fused_topk", categories(topk_rows()), {"top_k", "groups", "32-bit"});
  check("moe_permute_align", categories(align_rows()), {"top_k", "32-bit", "workspace", "engine"});
  check("moe_pre_permute", categories(pre_rows()), {"32-bit", "workspace", "engine"});
  check("moe_post_permute", categories(post_rows()), {"top_k"});
  check("moe_grouped_gemm", categories(gemm_rows()), {"experts", "32-bit", "workspace"});
  check("moe_grouped_gemm_fp8", categories(fp8_rows()), {"experts"});
  check("moe_expert_mlp", categories(mlp_rows()), {"experts", "32-bit", "workspace"});
  check("fused_moe_experts", categories(experts_rows()),
        {"top_k", "32-bit", "workspace", "engine"});
  check("fused_moe", categories(layer_rows()),
        {"top_k", "groups", "experts", "32-bit", "workspace", "engine"});
  check("shared_expert_mlp", categories(shared_rows()), {"32-bit", "workspace"});
}

// ---- activations and biases (docs/moe.md "Activations") ----

// The rows every MLP op shares for its activation and biases: `acts`, `bias`, `dbias` and
// `gu` name the op's fields; w_gate_up [8, 64, 64] (F = 32) and H = 64 as in mlp_valid,
// experts_valid and layer_valid.
template <class Args>
std::vector<Row<Args>> activation_rows(Activation Args::*act, TensorView Args::*bias,
                                       TensorView Args::*dbias, TensorView Args::*gu) {
  return {
      {"scalar", [=](Args& a) { a.*act = Activation::kNone; }, "activation",
       "an MLP activation: kSiluAndMul, kGeluTanhAndMul, kGeluAndMul, kRelu2 or kSwigluOai",
       "none (value 0)"},
      {"scalar", [=](Args& a) { a.*act = static_cast<Activation>(42); }, "activation",
       "an MLP activation", "unknown (value 42)"},
      {"shape",
       [=](Args& a) {
         a.*act = Activation::kRelu2;
         a.*gu = fake(kBF, {8, 12, 64});
       },
       "w_gate_up", "F rows (relu2 is not gated) with F a positive multiple of 8",
       "bf16[8, 12, 64]"},
      // relu2 reads F = 64 rows of [8, 64, 64]: w_down [8, 64, 32] no longer matches.
      {"shape", [=](Args& a) { a.*act = Activation::kRelu2; }, "w_down", "shape [8, 64, 64]",
       "bf16[8, 64, 32]"},
      {"shape",
       [=](Args& a) {
         a.*bias = fake(kF32, {8, 32});
       },
       "gate_up_bias", "shape [8, 64]", "f32[8, 32]"},
      {"shape",
       [=](Args& a) {
         a.*act = Activation::kRelu2;
         a.*gu = fake(kBF, {8, 32, 64});
         a.*bias = fake(kF32, {8, 64});
       },
       "gate_up_bias", "shape [8, 32]", "f32[8, 64]"},
      {"shape", [=](Args& a) { a.*dbias = fake(kBF, {64}); }, "down_bias", "shape [8, 64]",
       "bf16[64]"},
      {"dtype",
       [=](Args& a) {
         a.*bias = fake(kF16, {8, 64});
       },
       "gate_up_bias", "dtype f32 or bf16", "f16[8, 64]"},
      {"dtype",
       [=](Args& a) {
         a.*dbias = fake(kI32, {8, 64});
       },
       "down_bias", "dtype f32 or bf16", "i32[8, 64]"},
      {"misaligned",
       [=](Args& a) {
         a.*bias = shifted(fake(kF32, {8, 64}), 4);
       },
       "gate_up_bias", "data aligned to 16 bytes", "pointer 0x"},
      {"null",
       [=](Args& a) {
         a.*dbias = make_view(nullptr, kF32, {8, 64});
       },
       "down_bias", "a non-null data pointer", "nullptr"},
  };
}

// mlp_valid with swiglu_oai and a down bias (the general path).
ExpertMLPArgs mlp_oai_valid() {
  ExpertMLPArgs a = mlp_valid();
  a.activation = Activation::kSwigluOai;
  a.down_bias = fake(kF32, {8, 64});
  return a;
}

TEST(BadInputs, ActivationsAndBiasesMoeExpertMlp) {
  using A = ExpertMLPArgs;
  auto rows = activation_rows<A>(&A::activation, &A::gate_up_bias, &A::down_bias, &A::w_gate_up);
  rows.push_back({"overlap", [](A& a) { a.expert_output = at(a.expert_output, a.down_bias.data); },
                  "expert_output", "memory disjoint from 'down_bias'", "sharing"});
  run_table<A>(
      "moe_expert_mlp", mlp_oai_valid, [](const A& a) { moe_expert_mlp(a, nullptr); }, rows);
}

TEST(BadInputs, ActivationsAndBiasesFusedMoeExperts) {
  using A = FusedMoEExpertsArgs;
  const auto rows =
      activation_rows<A>(&A::activation, &A::gate_up_bias, &A::down_bias, &A::w_gate_up);
  for (const char* op : {"fused_moe_experts", "indexed_expert_mlp"}) {
    run_table<A>(
        op, experts_valid,
        [op](const A& a) {
          if (std::string(op) == "fused_moe_experts") {
            fused_moe_experts(a, nullptr);
          } else {
            indexed_expert_mlp(a, nullptr);
          }
        },
        rows);
  }
}

TEST(BadInputs, ActivationsAndBiasesFusedMoe) {
  using A = FusedMoEArgs;
  run_table<A>(
      "fused_moe", layer_valid, [](const A& a) { fused_moe(a, nullptr); },
      activation_rows<A>(&A::activation, &A::gate_up_bias, &A::down_bias, &A::w_gate_up));
  // The shared expert: its biases' shapes follow the routed activation; biases without its
  // weights are refused.
  using LS = FusedMoESharedExpertArgs;
  const std::vector<Row<LS>> shared = {
      {"shape", [](LS& a) { a.shared_gate_up_bias = fake(kF32, {32}); }, "shared_gate_up_bias",
       "shape [64]", "f32[32]"},
      {"shape",
       [](LS& a) {
         a.moe.activation = Activation::kRelu2;
         a.shared_w_down = fake(kBF, {64, 64});
         a.moe.w_down = fake(kBF, {8, 64, 64});
         a.shared_gate_up_bias = fake(kF32, {32});
       },
       "shared_gate_up_bias", "shape [64]", "f32[32]"},
      {"dtype", [](LS& a) { a.shared_down_bias = fake(kF16, {64}); }, "shared_down_bias",
       "dtype f32 or bf16", "f16[64]"},
      {"undefined",
       [](LS& a) {
         a.shared_w_gate_up = TensorView{};
         a.shared_w_down = TensorView{};
         a.shared_down_bias = fake(kF32, {64});
       },
       "shared_down_bias", "no shared-expert bias without the shared expert's weights", "a bias"},
      {"overlap",
       [](LS& a) {
         a.shared_down_bias = fake(kF32, {64});
         a.moe.output = at(a.moe.output, a.shared_down_bias.data);
       },
       "output", "memory disjoint from 'shared_down_bias'", "sharing"},
  };
  run_table<LS>(
      "fused_moe_shared_expert", shared_layer_valid,
      [](const LS& a) { fused_moe_shared_expert(a, nullptr); }, shared);
}

TEST(BadInputs, ActivationsAndBiasesSharedExpertMlp) {
  using A = SharedExpertMLPArgs;
  const std::vector<Row<A>> rows = {
      {"scalar", [](A& a) { a.activation = Activation::kNone; }, "activation", "an MLP activation",
       "none (value 0)"},
      {"shape",
       [](A& a) {
         a.activation = Activation::kRelu2;
         a.w_gate_up = fake(kBF, {36, 64});
       },
       "w_gate_up", "S rows (relu2 is not gated) with S a positive multiple of 8", "bf16[36, 64]"},
      {"shape",
       [](A& a) {
         a.gate_up_bias = fake(kF32, {8, 64});
       },
       "gate_up_bias", "shape [64]", "f32[8, 64]"},
      {"shape", [](A& a) { a.down_bias = fake(kF32, {32}); }, "down_bias", "shape [64]", "f32[32]"},
      {"overlap",
       [](A& a) {
         a.down_bias = fake(kF32, {64});
         a.output = at(a.output, a.down_bias.data);
       },
       "output", "memory disjoint from 'down_bias'", "sharing"},
  };
  run_table<A>(
      "shared_expert_mlp", shared_valid, [](const A& a) { shared_expert_mlp(a, nullptr); }, rows);
}

// A plan that cannot run the activation is refused with the reason, before any launch.
TEST(BadInputs, ForcedPlansRefuseActivationsTheyCannotRun) {
  LayerPlan direct;
  direct.routed = RoutedPath::kDirect;
  FusedMoEExpertsArgs e = experts_valid();
  e.activation = Activation::kGeluAndMul;
  e.plan = &direct;
  run_table<FusedMoEExpertsArgs>(
      "indexed_expert_mlp", [&] { return e; },
      [](const FusedMoEExpertsArgs& a) { indexed_expert_mlp(a, nullptr); },
      {{"plan", [](auto&) {}, "plan", "a plan that can run these arguments",
        "the direct path cannot run activation gelu_and_mul (the direct kernels run "
        "silu_and_mul without biases)"}});
  FusedMoEArgs l = layer_valid();
  l.down_bias = fake(kF32, {8, 64});  // silu_and_mul with a bias: the general path too
  l.plan = &direct;
  run_table<FusedMoEArgs>(
      "fused_moe", [&] { return l; }, [](const FusedMoEArgs& a) { fused_moe(a, nullptr); },
      {{"plan", [](auto&) {}, "plan", "a plan that can run these arguments",
        "activation silu_and_mul with biases"}});

  MlpPlan chain;
  chain.path = MlpPath::kChain;
  ExpertMLPArgs m = mlp_valid();
  m.activation = Activation::kSwigluOai;
  m.plan = &chain;
  run_table<ExpertMLPArgs>(
      "moe_expert_mlp", [&] { return m; },
      [](const ExpertMLPArgs& a) { moe_expert_mlp(a, nullptr); },
      {{"plan", [](auto&) {}, "plan", "a plan that can run these arguments",
        "the chain runs silu_and_mul without biases, not swiglu_oai"}});

  MlpPlan gemv;
  gemv.path = MlpPath::kGemv;
  SharedExpertMLPArgs d = shared_valid();
  d.activation = Activation::kGeluTanhAndMul;
  d.plan = &gemv;
  run_table<SharedExpertMLPArgs>(
      "shared_expert_mlp", [&] { return d; },
      [](const SharedExpertMLPArgs& a) { shared_expert_mlp(a, nullptr); },
      {{"plan", [](auto&) {}, "plan", "a plan that can run these arguments",
        "the dense MLP kernels run silu_and_mul without biases, not gelu_tanh_and_mul"}});

  // Without their plans the arguments are valid: the plan is the one thing refused.
  if (!cuda_device_present()) {
    e.plan = nullptr;
    expect_no_device("indexed_expert_mlp", [&] { indexed_expert_mlp(e, nullptr); });
    l.plan = nullptr;
    expect_no_device("fused_moe", [&] { fused_moe(l, nullptr); });
    m.plan = nullptr;
    expect_no_device("moe_expert_mlp", [&] { moe_expert_mlp(m, nullptr); });
    d.plan = nullptr;
    expect_no_device("shared_expert_mlp", [&] { shared_expert_mlp(d, nullptr); });
  }

  // The grouped GEMM's epilogue runs kNone and kSiluAndMul only.
  GroupedGemmArgs g = gemm_valid();
  g.activation = Activation::kRelu2;
  run_table<GroupedGemmArgs>(
      "moe_grouped_gemm", [&] { return g; },
      [](const GroupedGemmArgs& a) { moe_grouped_gemm(a, nullptr); },
      {{"scalar", [](auto&) {}, "activation", "Activation::kNone or Activation::kSiluAndMul",
        "value 4"}});
}

// The general path's workspace holds the f32 pre-activations on top of the silu path's, and
// the planners send every general layer down the sorted path, chain-free.
TEST(BadInputs, GeneralPathWorkspaceAndPlans) {
  FusedMoEExpertsArgs e = experts_valid();
  const size_t silu = fused_moe_experts_workspace_size(e);
  e.activation = Activation::kSwigluOai;
  const size_t oai = fused_moe_experts_workspace_size(e);
  // T*K = 8 rows of 2F = 64 f32 pre-activations.
  EXPECT_EQ(oai, silu + 8 * 64 * 4);
  e.down_bias = fake(kF32, {8, 64});  // H = 64 = 2F: the pre buffer keeps its width
  EXPECT_EQ(fused_moe_experts_workspace_size(e), oai);
  e.activation = Activation::kRelu2;  // F = 64 rows, w_down [8, 64, 64]: 64 columns still
  EXPECT_EQ(fused_moe_experts_workspace_size(e), oai + 8 * 32 * 2);  // act [8, 64] bf16
  FusedMoEArgs l = layer_valid();
  l.activation = Activation::kGeluAndMul;
  const LayerPlan plan = plan_fused_moe(l);
  EXPECT_EQ(plan.routed, RoutedPath::kSorted);
  EXPECT_NE(plan.experts.path, MlpPath::kChain);
  for (const LayerPlan& c : fused_moe_plan_candidates(l)) {
    EXPECT_EQ(c.routed, RoutedPath::kSorted) << to_string(c);
    EXPECT_NE(c.experts.path, MlpPath::kChain) << to_string(c);
  }
  SharedExpertMLPArgs d = shared_valid();
  d.activation = Activation::kRelu2;
  d.w_down = fake(kBF, {64, 64});
  for (const MlpPlan& c : shared_expert_mlp_plan_candidates(d))
    EXPECT_EQ(c.path, MlpPath::kTwoGemms) << to_string(c);
  EXPECT_GT(shared_expert_mlp_workspace_size(d), 0u);
}

// ---- workspace-size queries ----

// The query's error for `mutate`d arguments (empty: none).
template <class Args, class Query>
std::string query_error(Args a, const std::function<void(Args&)>& mutate, Query query) {
  mutate(a);
  try {
    query(a);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BadInputs, WorkspaceSizeQueriesValidateShapes) {
  using E = FusedMoEExpertsArgs;
  auto experts = [](const E& a) { return fused_moe_experts_workspace_size(a); };
  // T = -4 (used to wrap to 18446744073709546496) and T = 2^62 (used to wrap to 5120).
  EXPECT_EQ(query_error<E>(
                experts_valid(), [](E& a) { a.hidden_states = with_dim(a.hidden_states, 0, -4); },
                experts),
            "moekit::fused_moe_experts: argument 'hidden_states': expected non-negative sizes, "
            "got bf16[-4, 64]");
  EXPECT_EQ(query_error<E>(
                experts_valid(),
                [](E& a) {
                  a.hidden_states = fake(kBF, {int64_t{1} << 62, 64});
                },
                experts),
            "moekit::fused_moe_experts: argument 'hidden_states': expected sizes of at most 2^48, "
            "got "
            "bf16[4611686018427387904, 64]");
  // Every tensor within bounds, but the permuted buffer [T*K, H] past 2^48 bytes.
  const std::string too_big = query_error<E>(
      experts_valid(),
      [](E& a) {
        a.hidden_states = fake(kBF, {1, int64_t{1} << 30});
        a.w_gate_up = fake(kBF, {1, 16, int64_t{1} << 30});
        a.topk_ids = fake(kI32, {1, int64_t{1} << 20});
      },
      experts);
  EXPECT_EQ(too_big.rfind("moekit::fused_moe_experts: argument 'workspace': expected a size of at "
                          "most 2^48 bytes for these shapes, got ",
                          0),
            0u)
      << too_big;
  // Null pointers are fine; what the size does not depend on is not looked at.
  E null_args;
  null_args.hidden_states = make_view(nullptr, kBF, {4, 64});
  null_args.w_gate_up = make_view(nullptr, kBF, {8, 64, 64});
  null_args.topk_ids = make_view(nullptr, kI32, {4, 2});
  EXPECT_GT(fused_moe_experts_workspace_size(null_args), 0u);
  EXPECT_GT(indexed_expert_mlp_workspace_size(null_args), 0u);

  // Each query names its op and refuses what the op refuses.
  EXPECT_NE(query_error<E>(
                experts_valid(), [](E& a) { experts_with(a, 65, 1025); },
                [](const E& a) { return indexed_expert_mlp_workspace_size(a); })
                .find("moekit::indexed_expert_mlp: argument 'w_gate_up': expected at most 1024"),
            std::string::npos);
  using L = FusedMoEArgs;
  EXPECT_EQ(query_error<L>(
                layer_valid(), [](L& a) { a.params.top_k = 0; },
                [](const L& a) { return fused_moe_workspace_size(a); }),
            "moekit::fused_moe: argument 'top_k': expected 1 to min(16, num_experts=8), got 0");
  using LS = FusedMoESharedExpertArgs;
  EXPECT_EQ(query_error<LS>(
                shared_layer_valid(),
                [](LS& a) {
                  a.shared_w_gate_up = fake(kBF, {60, 64});
                },
                [](const LS& a) { return fused_moe_shared_expert_workspace_size(a); }),
            "moekit::fused_moe_shared_expert: argument 'shared_w_gate_up': expected 2*S gate+up "
            "rows with S a positive multiple of 8, got bf16[60, 64]");
  using M = ExpertMLPArgs;
  EXPECT_EQ(query_error<M>(
                mlp_valid(), [](M& a) { a.expert_input.dtype = kF32; },
                [](const M& a) { return expert_mlp_workspace_size(a); }),
            "moekit::moe_expert_mlp: argument 'expert_input': expected dtype bf16 or f16, got "
            "f32[32, 64]");
  using S = SharedExpertMLPArgs;
  EXPECT_EQ(query_error<S>(
                shared_valid(),
                [](S& a) {
                  a.w_gate_up = fake(kBF, {64, 72});
                },
                [](const S& a) { return shared_expert_mlp_workspace_size(a); }),
            "moekit::shared_expert_mlp: argument 'w_gate_up': expected shape [*, 64], got "
            "bf16[64, 72]");
  using A = PermuteAlignArgs;
  EXPECT_EQ(query_error<A>(
                align_valid(), [](A& a) { a.num_experts = -3; },
                [](const A& a) { return permute_align_workspace_size(a); }),
            "moekit::moe_permute_align: argument 'num_experts': expected 1 to 1024, got -3");
  using P = PrePermuteArgs;
  EXPECT_EQ(query_error<P>(
                pre_valid(), [](P& a) { a.local_expert_ids = with_dim(a.local_expert_ids, 1, -2); },
                [](const P& a) { return pre_permute_workspace_size(a); }),
            "moekit::moe_pre_permute: argument 'local_expert_ids': expected non-negative sizes, "
            "got i32[4, -2]");
}

// ---- views ----

TEST(BadInputs, ViewsRefuseBadDimsAndNeverPrintGarbage) {
  const int64_t five[5] = {1, 2, 3, 4, 5};
  try {
    make_view(slot(0), kBF, 5, five);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "moekit::make_view: argument 'ndim': expected 0..4, got 5");
  }
  try {
    make_view(slot(0), kBF, {2, -4});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "moekit::make_view: argument 'shape': expected non-negative sizes, got [2, -4]");
  }
  TensorView v = make_view(slot(0), kBF, {2, 3});
  v.ndim = 7;
  EXPECT_EQ(v.describe(), "bf16 with ndim 7 (not 0..4)");
  EXPECT_EQ(v.numel(), 6 * v.shape[2] * v.shape[3]);  // reads its 4 dims, never past them
  v.ndim = -1;
  EXPECT_EQ(v.describe(), "bf16 with ndim -1 (not 0..4)");
  v = make_view(slot(0), static_cast<DType>(42), {2});
  EXPECT_EQ(v.describe(), "dtype code 42[2]");
}

// ---- errors from a layer's inner steps name the layer ----

TEST(BadInputs, InnerErrorsNameTheOpCalled) {
  using detail::rename_error;
  EXPECT_EQ(rename_error("fused_moe", "moekit::fused_topk: CUDA launch failed: x"),
            "moekit::fused_moe: in fused_topk: CUDA launch failed: x");
  EXPECT_EQ(rename_error("fused_moe", "moekit: stream-K MLP launch failed: y"),
            "moekit::fused_moe: stream-K MLP launch failed: y");
  EXPECT_EQ(rename_error("fused_moe", "moekit::fused_moe: argument 'x': expected a, got b"),
            "moekit::fused_moe: argument 'x': expected a, got b");
  try {
    detail::run_composite("fused_moe_shared_expert", [] {
      throw Error("moekit::moe_grouped_gemm: problem too large for one launch (3 tiles)");
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "moekit::fused_moe_shared_expert: in moe_grouped_gemm: problem too large for "
                 "one launch (3 tiles)");
  }
}

// Without a GPU a valid call gets through every check and stops at the launch target,
// naming the op called (fused_moe, not fused_topk, its first step) and launching
// nothing; inside a composite op's launches that check is left to the outer op.
TEST(BadInputs, ValidCallWithoutAGpuStopsBeforeAnyLaunch) {
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is present: valid calls would launch";
  expect_no_device("fused_topk", [] { fused_topk(topk_valid(), nullptr); });
  expect_no_device("moe_permute_align", [] { moe_permute_align(align_valid(), nullptr); });
  expect_no_device("moe_pre_permute", [] { moe_pre_permute(pre_valid(), nullptr); });
  expect_no_device("moe_post_permute", [] { moe_post_permute(post_valid(), nullptr); });
  expect_no_device("moe_grouped_gemm", [] { moe_grouped_gemm(gemm_valid(), nullptr); });
  expect_no_device("moe_grouped_gemm_fp8", [] { moe_grouped_gemm_fp8(fp8_valid(), nullptr); });
  expect_no_device("moe_expert_mlp", [] { moe_expert_mlp(mlp_valid(), nullptr); });
  expect_no_device("fused_moe_experts", [] { fused_moe_experts(experts_valid(), nullptr); });
  expect_no_device("indexed_expert_mlp", [] { indexed_expert_mlp(experts_valid(), nullptr); });
  expect_no_device("fused_moe", [] { fused_moe(layer_valid(), nullptr); });
  expect_no_device("fused_moe_shared_expert",
                   [] { fused_moe_shared_expert(shared_layer_valid(), nullptr); });
  expect_no_device("shared_expert_mlp", [] { shared_expert_mlp(shared_valid(), nullptr); });
  expect_no_device("moe_expert_mlp", [] { moe_expert_mlp(mlp_oai_valid(), nullptr); });
  // A grouped GEMM of P*K = 2^32 (the SM90 config's shapes) says the same, and prints
  // nothing (no TMA descriptor is built).
  GroupedGemmArgs g = gemm_valid();
  g.a = fake(kBF, {int64_t{1} << 26, 64});
  g.c = fake(kBF, {int64_t{1} << 26, 64});
  ::testing::internal::CaptureStderr();
  expect_no_device("moe_grouped_gemm", [&] { moe_grouped_gemm(g, nullptr); });
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  // In place is valid: output == hidden_states gets to the launch target.
  FusedMoEArgs in_place = layer_valid();
  in_place.output = in_place.hidden_states;
  expect_no_device("fused_moe", [&] { fused_moe(in_place, nullptr); });
  ExpertMLPArgs mlp_in_place = mlp_valid();
  mlp_in_place.expert_output = mlp_in_place.expert_input;
  expect_no_device("moe_expert_mlp", [&] { moe_expert_mlp(mlp_in_place, nullptr); });
  // Nothing to launch (T = 0): no error at all.
  FusedMoEArgs empty = layer_valid();
  empty.hidden_states = fake(kBF, {0, 64});
  empty.gating_output = fake(kF32, {0, 8});
  empty.output = fake(kBF, {0, 64});
  EXPECT_NO_THROW(fused_moe(empty, nullptr));
  // Inside a composite op's launches the check is skipped.
  detail::ArgCheck check("fused_moe");
  EXPECT_THROW(check.launch_target(nullptr, "output", fake(kBF, {4, 64})), Error);
  {
    detail::CompositeScope scope;
    EXPECT_NO_THROW(check.launch_target(nullptr, "output", fake(kBF, {4, 64})));
  }
  EXPECT_THROW(check.launch_target(nullptr, "output", fake(kBF, {4, 64})), Error);
}

}  // namespace
}  // namespace moekit
