// MoEGroupedGemmFwd and MoEGroupedGemmFP8Fwd: validation, then the engine.
#include <string>

#include "core/check.h"
#include "core/plan_log.h"
#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"
#include "moekit/gemm.h"

namespace moekit {
namespace {

using detail::kAnyDim;

// The scheduler scans every group's metadata in every block: keep E bounded.
constexpr int64_t kMaxExperts = 1024;

std::string str(int64_t v) {
  return std::to_string(v);
}

}  // namespace

size_t grouped_gemm_workspace_size(const GroupedGemmArgs&) {
  return detail::kTileCounterBytes;
}

size_t grouped_gemm_fp8_workspace_size(const GroupedGemmFP8Args&) {
  return detail::kTileCounterBytes;
}

namespace {

// The activation and the layout's own fields (both GEMM ops); returns whether it is masked.
bool check_activation_and_layout(const detail::ArgCheck& check, Activation activation,
                                 const PermutedLayout& layout) {
  check.require(activation == Activation::kNone || activation == Activation::kSiluAndMul,
                "activation", "Activation::kNone or Activation::kSiluAndMul",
                "value " + str(static_cast<int>(activation)));
  const bool masked = layout.kind == PermutedLayout::Kind::kMasked;
  check.require(masked || layout.kind == PermutedLayout::Kind::kContiguous, "layout.kind",
                "kContiguous or kMasked", "value " + str(static_cast<int>(layout.kind)));
  if (masked) {
    check.require(layout.max_m >= 0, "layout.max_m", "max_m >= 0", str(layout.max_m));
  } else {
    check.require(layout.alignment >= 1, "layout.alignment", "alignment >= 1",
                  str(layout.alignment));
  }
  return masked;
}

// Validates `args` (throws moekit::Error naming the argument) and returns the engine's
// problem, its plan not yet set; *launches: whether there is anything to run.
detail::GroupedGemmProblem checked_problem(const GroupedGemmArgs& args, bool* launches) {
  detail::ArgCheck check("moe_grouped_gemm");
  const bool silu = args.activation == Activation::kSiluAndMul;
  const bool masked = check_activation_and_layout(check, args.activation, args.layout);

  // b [E, N or 2N, Kd] fixes E, N and Kd; a's dtype is the input dtype.
  if (masked) {
    check.tensor("a", args.a, {DType::kBF16, DType::kF16}, {kAnyDim, args.layout.max_m, kAnyDim},
                 16);
  } else {
    check.tensor("a", args.a, {DType::kBF16, DType::kF16}, {kAnyDim, kAnyDim}, 16);
  }
  check.tensor("b", args.b, {DType::kBF16, DType::kF16}, {kAnyDim, kAnyDim, kAnyDim}, 16);
  check.same_dtype("b", args.b, "a", args.a);
  const int64_t E = args.b.shape[0], b_rows = args.b.shape[1], Kd = args.b.shape[2];
  MOEKIT_REQUIRE(check, E <= kMaxExperts, "b", "at most " + str(kMaxExperts) + " experts (dim 0)",
                 args.b.describe());
  // The SM90 kernels (the planner's pick wherever these pass 2^31) hold b rows, Kd and
  // the rows of a in 32-bit TMA coordinates and kernel parameters.
  check.fits_i32(b_rows, "b", "rows per expert (dim 1)", args.b);
  check.fits_i32(Kd, "b", "columns Kd (dim 2)", args.b);
  check.require(Kd % 8 == 0, "b", "Kd (dim 2) a multiple of 8", args.b.describe());
  if (silu) {
    check.require(b_rows % 2 == 0, "b",
                  "2N rows per expert (gate then up) with silu_and_mul, an even dim 1",
                  args.b.describe());
  }
  const int64_t N = silu ? b_rows / 2 : b_rows;
  check.require(N % 8 == 0, "b",
                std::string(silu ? "dim 1 = 2N" : "dim 1 = N") + " with N a multiple of 8",
                args.b.describe());
  const int64_t a_k = args.a.shape[args.a.ndim - 1];
  check.require(a_k == Kd, "a", "Kd = " + str(Kd) + " columns (b's dim 2)", args.a.describe());
  if (masked) {
    check.require(args.a.shape[0] == E, "a", "dim 0 = E = " + str(E) + " (b's dim 0)",
                  args.a.describe());
  }
  // Contiguous: P rows; masked: E slabs of max_m rows, one TMA tensor of E*max_m rows.
  check.fits_i32(masked ? E * args.layout.max_m : args.a.shape[0], "a",
                 masked ? "rows in all (E*max_m)" : "rows (dim 0)", args.a);
  check.tensor("layout_metadata", args.layout_metadata, {DType::kI32}, {E});
  const int64_t rows = masked ? args.layout.max_m : args.a.shape[0];
  if (masked) {
    check.tensor("c", args.c, {args.a.dtype, DType::kF32}, {E, rows, N}, 16);
  } else {
    check.tensor("c", args.c, {args.a.dtype, DType::kF32}, {rows, N}, 16);
  }

  // The workspace is optional; one that is given must be valid.
  if (args.workspace.data != nullptr || args.workspace.bytes != 0) {
    check.workspace(args.workspace, grouped_gemm_workspace_size(args));
  }
  check.outputs_disjoint({{"c", args.c}},
                         {{"a", args.a}, {"b", args.b}, {"layout_metadata", args.layout_metadata}},
                         args.workspace);
  *launches = !(rows == 0 || N == 0 || E == 0);

  detail::GroupedGemmProblem p;
  p.in_dtype = args.a.dtype;
  p.out_dtype = args.c.dtype;
  p.a = args.a.data;
  p.b = args.b.data;
  p.c = args.c.data;
  p.tile_counter = static_cast<unsigned*>(args.workspace.data);
  p.num_groups = static_cast<int>(E);
  p.n = N;
  p.k = Kd;
  p.activation = args.activation;
  p.layout_metadata = static_cast<const int32_t*>(args.layout_metadata.data);
  if (masked) {
    p.rows = detail::GemmRows::kMasked;
    p.max_m = args.layout.max_m;
  } else {
    p.rows = detail::GemmRows::kContiguous;
    p.alignment = args.layout.alignment;
    p.m = rows;
  }
  return p;
}

}  // namespace

GemmPlan plan_grouped_gemm(const GroupedGemmArgs& args) {
  bool launches = false;
  return detail::plan_gemm(checked_problem(args, &launches), detail::current_gemm_device());
}

std::vector<GemmPlan> grouped_gemm_plan_candidates(const GroupedGemmArgs& args) {
  bool launches = false;
  return detail::gemm_plan_candidates(checked_problem(args, &launches),
                                      detail::current_gemm_device());
}

namespace {

// The plan log's key of a grouped GEMM: what the planner reads.
std::string problem_key(const detail::GroupedGemmProblem& p) {
  const char* rows = p.rows == detail::GemmRows::kMasked ? "masked" : "contiguous";
  return std::string(dtype_name(p.in_dtype)) + " " + rows + " E=" + std::to_string(p.num_groups) +
         " rows=" + std::to_string(p.rows == detail::GemmRows::kMasked ? p.max_m : p.m) +
         " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) +
         (p.activation == Activation::kSiluAndMul ? " silu" : "");
}

}  // namespace

void moe_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream) {
  bool launches = false;
  detail::GroupedGemmProblem p = checked_problem(args, &launches);
  if (!launches) return;
  detail::ArgCheck("moe_grouped_gemm").launch_target(stream, "c", args.c);
  p.plan = args.plan ? *args.plan : detail::plan_gemm(p, detail::current_gemm_device());
  if (detail::plan_log_enabled()) {
    detail::log_plan("moe_grouped_gemm", problem_key(p), to_string(p.plan));
  }
  detail::run_grouped_gemm(p, stream);
}

namespace {

// The scale tensors' shapes of `scales` (gemm.h Fp8Scales): a's rows as a_rows_shape
// ([E, max_m] masked, [P] contiguous), b rows per expert b_rows, KB k blocks.
void check_fp8_scales(const detail::ArgCheck& check, const GroupedGemmFP8Args& args, bool masked,
                      int64_t E, int64_t rows, int64_t b_rows, int64_t KB) {
  switch (args.scales) {
    case Fp8Scales::kBlock:
      if (masked) {
        check.tensor("a_scale", args.a_scale, {DType::kF32}, {E, rows, KB});
      } else {
        check.tensor("a_scale", args.a_scale, {DType::kF32}, {rows, KB});
      }
      check.tensor("b_scale", args.b_scale, {DType::kF32}, {E, (b_rows + 127) / 128, KB});
      return;
    case Fp8Scales::kPerChannel:
      if (masked) {
        check.tensor("a_scale", args.a_scale, {DType::kF32}, {E, rows});
      } else {
        check.tensor("a_scale", args.a_scale, {DType::kF32}, {rows});
      }
      check.tensor("b_scale", args.b_scale, {DType::kF32}, {E, b_rows});
      return;
    case Fp8Scales::kPerTensor:
      check.tensor("a_scale", args.a_scale, {DType::kF32}, {1});
      check.tensor("b_scale", args.b_scale, {DType::kF32}, {E});
      return;
  }
  check.fail("scales", "Fp8Scales::kBlock, kPerChannel or kPerTensor",
             "value " + str(static_cast<int>(args.scales)));
}

detail::GroupedGemmFP8Problem checked_fp8_problem(const GroupedGemmFP8Args& args, bool* launches) {
  detail::ArgCheck check("moe_grouped_gemm_fp8");
  const bool silu = args.activation == Activation::kSiluAndMul;
  const bool masked = check_activation_and_layout(check, args.activation, args.layout);

  // a fixes Kd (and, masked, E and max_m); contiguous: b fixes E.
  int64_t rows = 0;  // masked: max_m; contiguous: P
  if (masked) {
    check.tensor("a", args.a, {DType::kFP8E4M3}, {kAnyDim, kAnyDim, kAnyDim}, 16);
    rows = args.a.shape[1];
  } else {
    check.tensor("a", args.a, {DType::kFP8E4M3}, {kAnyDim, kAnyDim}, 16);
    rows = args.a.shape[0];
  }
  const int64_t Kd = args.a.shape[args.a.ndim - 1];
  MOEKIT_REQUIRE(check, Kd % 16 == 0, "a", "Kd (dim " + str(args.a.ndim - 1) + ") a multiple of 16",
                 args.a.describe());
  // The SM90 kernel holds Kd, b rows and the rows of a in 32-bit TMA coordinates and kernel
  // parameters (as moe_grouped_gemm's SM90 kernels).
  check.fits_i32(Kd, "a", masked ? "columns Kd (dim 2)" : "columns Kd (dim 1)", args.a);
  if (masked) {
    MOEKIT_REQUIRE(check, args.a.shape[0] <= kMaxExperts, "a",
                   "at most " + str(kMaxExperts) + " experts (dim 0)", args.a.describe());
    MOEKIT_REQUIRE(check, args.layout.max_m == 0 || args.layout.max_m == rows, "layout.max_m",
                   "0 (a's dim 1) or a's dim 1 = " + str(rows), str(args.layout.max_m));
    check.fits_i32(args.a.shape[0] * rows, "a", "rows in all (E*max_m)", args.a);
  } else {
    check.fits_i32(rows, "a", "rows (dim 0)", args.a);
  }
  check.tensor("b", args.b, {DType::kFP8E4M3}, {masked ? args.a.shape[0] : kAnyDim, kAnyDim, Kd},
               16);
  const int64_t E = args.b.shape[0], b_rows = args.b.shape[1];
  MOEKIT_REQUIRE(check, E <= kMaxExperts, "b", "at most " + str(kMaxExperts) + " experts (dim 0)",
                 args.b.describe());
  check.fits_i32(b_rows, "b", "rows per expert (dim 1)", args.b);
  if (silu) {
    MOEKIT_REQUIRE(check, b_rows % 2 == 0, "b",
                   "2N rows per expert (gate then up) with silu_and_mul, an even dim 1",
                   args.b.describe());
  }
  const int64_t N = silu ? b_rows / 2 : b_rows;
  MOEKIT_REQUIRE(check, N % 8 == 0, "b",
                 silu ? "dim 1 = 2N with N a multiple of 8" : "N (dim 1) a multiple of 8",
                 args.b.describe());
  // Block scales with silu_and_mul: each 64-row b box of the SM90 kernel (gate rows, or the
  // up rows N + ...) must lie in one 128-row scale block.
  MOEKIT_REQUIRE(check, !(silu && args.scales == Fp8Scales::kBlock) || N % 64 == 0, "b",
                 "dim 1 = 2N with N a multiple of 64 (silu_and_mul with block scales)",
                 args.b.describe());
  const int64_t KB = (Kd + 127) / 128;
  check_fp8_scales(check, args, masked, E, rows, b_rows, KB);
  check.tensor("layout_metadata", args.layout_metadata, {DType::kI32}, {E});
  if (masked) {
    check.tensor("c", args.c, {DType::kBF16, DType::kFP8E4M3}, {E, rows, N}, 16);
  } else {
    check.tensor("c", args.c, {DType::kBF16, DType::kFP8E4M3}, {rows, N}, 16);
  }
  const bool fp8_out = args.c.dtype == DType::kFP8E4M3;
  if (fp8_out) {
    check.tensor("c_scale", args.c_scale, {DType::kF32}, {1});
  } else {
    MOEKIT_REQUIRE(check, !args.c_scale.defined(), "c_scale",
                   "undefined with a bf16 c (the scale of an fp8e4m3 c)", args.c_scale.describe());
  }
  // The workspace is optional; one that is given must be valid.
  if (args.workspace.data != nullptr || args.workspace.bytes != 0) {
    check.workspace(args.workspace, grouped_gemm_fp8_workspace_size(args));
  }
  check.outputs_disjoint({{"c", args.c}},
                         {{"a", args.a},
                          {"a_scale", args.a_scale},
                          {"b", args.b},
                          {"b_scale", args.b_scale},
                          {"layout_metadata", args.layout_metadata},
                          {"c_scale", args.c_scale}},
                         args.workspace);
  *launches = !(rows == 0 || N == 0 || E == 0);

  detail::GroupedGemmFP8Problem p;
  p.a = args.a.data;
  p.a_scale = static_cast<const float*>(args.a_scale.data);
  p.b = args.b.data;
  p.b_scale = static_cast<const float*>(args.b_scale.data);
  p.c = args.c.data;
  p.c_scale = fp8_out ? static_cast<const float*>(args.c_scale.data) : nullptr;
  p.tile_counter = static_cast<unsigned*>(args.workspace.data);
  p.layout_metadata = static_cast<const int32_t*>(args.layout_metadata.data);
  p.contiguous = !masked;
  p.alignment = masked ? 1 : args.layout.alignment;
  p.num_groups = static_cast<int>(E);
  p.max_m = masked ? rows : 0;
  p.m = masked ? 0 : rows;
  p.n = N;
  p.k = Kd;
  p.scales = args.scales;
  p.activation = args.activation;
  return p;
}

// The plan log's key of an FP8 GEMM: what the planner reads.
std::string fp8_problem_key(const detail::GroupedGemmFP8Problem& p) {
  static const char* kScales[] = {"block", "channel", "tensor"};
  return std::string(p.contiguous ? "contiguous" : "masked") + " " +
         kScales[static_cast<int>(p.scales)] + " E=" + std::to_string(p.num_groups) +
         (p.contiguous ? " P=" + std::to_string(p.m) : " max_m=" + std::to_string(p.max_m)) +
         " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) +
         (p.activation == Activation::kSiluAndMul ? " silu" : "") + (p.c_scale ? " fp8_out" : "");
}

}  // namespace

GemmPlan plan_grouped_gemm_fp8(const GroupedGemmFP8Args& args) {
  bool launches = false;
  return detail::plan_gemm_fp8(checked_fp8_problem(args, &launches), detail::current_gemm_device());
}

std::vector<GemmPlan> grouped_gemm_fp8_plan_candidates(const GroupedGemmFP8Args& args) {
  bool launches = false;
  return detail::gemm_fp8_plan_candidates(checked_fp8_problem(args, &launches),
                                          detail::current_gemm_device());
}

void moe_grouped_gemm_fp8(const GroupedGemmFP8Args& args, cudaStream_t stream) {
  bool launches = false;
  detail::GroupedGemmFP8Problem p = checked_fp8_problem(args, &launches);
  if (!launches) return;
  detail::ArgCheck("moe_grouped_gemm_fp8").launch_target(stream, "c", args.c);
  p.plan = args.plan ? *args.plan : detail::plan_gemm_fp8(p, detail::current_gemm_device());
  if (detail::plan_log_enabled()) {
    detail::log_plan("moe_grouped_gemm_fp8", fp8_problem_key(p), to_string(p.plan));
  }
  detail::run_grouped_gemm_fp8(p, stream);
}

namespace detail {
GroupedGemmFP8Problem fp8_problem_of(const GroupedGemmFP8Args& args, bool* launches) {
  return checked_fp8_problem(args, launches);
}
}  // namespace detail

}  // namespace moekit
