// The GEMM planner: the rules that pick a grouped GEMM's kernel, tile, split and schedule
// (docs/gemm.md "The GEMM planner" has the measurements behind each rule), the candidates and
// their limits, and the expert-MLP GEMMs' chain rule.
#include "gemm/gemm_planner.h"

#include <climits>
#include <utility>

#include "gemm/sm90/tile_math.h"

namespace moekit::detail {
namespace {

constexpr int kSm90MaxGroups = 1024;  // the SM90 kernels' shared-memory group table
constexpr int kChainMaxGroups = 1024;

int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The SM count the rules go by (an H100 / H200's where unknown).
int rule_sms(const GemmDevice& d) {
  return d.props.sms > 0 ? d.props.sms : 132;
}

bool silu(const GroupedGemmProblem& p) {
  return p.activation == Activation::kSiluAndMul;
}

int64_t groups_of(const GroupedGemmProblem& p) {
  return p.rows == GemmRows::kDense || p.num_groups < 1 ? 1 : p.num_groups;
}

const int* splitk_clusters(const GemmDevice& d) {
  return d.splitk_clusters[kMaxSplitK] > 0 ? d.splitk_clusters.data() : nullptr;
}

// The decode split-K's split (1: the unsplit tiles fill the SMs).
int planned_split(const GroupedGemmProblem& p, const GemmDevice& d) {
  return choose_split_k(decode_tiles_upper(p), p.k, 2, rule_sms(d), splitk_clusters(d));
}

// Upper bound of an SM90 launch's 128-row tiles (as the launcher counts them).
int64_t sm90_tiles_upper(const GroupedGemmProblem& p, int tile_n) {
  const int64_t n_tiles = cdiv(p.n, silu(p) ? tile_n / 2 : tile_n);
  switch (p.rows) {
    case GemmRows::kContiguous:
      return (cdiv(p.m, 128) + p.num_groups) * n_tiles;
    case GemmRows::kMasked:
      return static_cast<int64_t>(p.num_groups) * cdiv(p.max_m, 128) * n_tiles;
    case GemmRows::kDense:
      return cdiv(p.m, 128) * n_tiles;
  }
  return 0;
}

// The SM90 kernels' schedule: dynamic (tiles claimed from the counter) on grouped rows,
// where the tiles that share an operand need no lockstep to find it in the L2; static on
// dense rows and where one wave holds every tile (nothing to balance, no zeroing to pay).
// docs/gemm.md "Persistent grid and dynamic schedule".
GemmSchedule sm90_schedule(const GroupedGemmProblem& p, const GemmDevice& d, int tile_n,
                           int cluster) {
  const bool one_wave = sm90_tiles_upper(p, tile_n) <= rule_sms(d) / cluster;
  if (!p.tile_counter || p.rows == GemmRows::kDense || one_wave) return GemmSchedule::kStatic;
  return GemmSchedule::kDynamic;
}

// kSm90's tile width: 256 on grouped rows; dense rows by wave quantization (tile_math.h;
// docs/gemm.md "Narrow widths").
int sm90_planned_tile_n(const GroupedGemmProblem& p, const GemmDevice& d) {
  if (p.rows != GemmRows::kDense) return 256;
  return gemm::sm90::dense_tile_n(p.m, p.n, silu(p), d.props.sms);
}

GemmPlan make(GemmKernel kernel, int tile_m, int tile_n, int split = 1,
              GemmSchedule schedule = GemmSchedule::kStatic) {
  GemmPlan g;
  g.kernel = kernel;
  g.tile_m = tile_m;
  g.tile_n = tile_n;
  g.split = split;
  g.schedule = schedule;
  return g;
}

GemmPlan sm90_plan(GemmKernel kernel, const GroupedGemmProblem& p, const GemmDevice& d) {
  const bool pairs = kernel == GemmKernel::kSm90Pairs;
  const int tile_n = pairs ? 256 : sm90_planned_tile_n(p, d);
  GemmPlan plan = make(kernel, 128, tile_n, 1, sm90_schedule(p, d, tile_n, pairs ? 2 : 1));
  // Tiles of <= 32 rows transposed (docs/gemm.md "Swapped tail tiles"); 256 wide only.
  plan.swap_tails = tile_n == 256;
  return plan;
}

// Why the SM90 kernels cannot take `p` (empty: they can).
std::string sm90_limits(const GroupedGemmProblem& p, const GemmDevice& d, int tile_n) {
  if (!d.props.sm90()) return "the SM90 kernels need an sm_90 device";
  if (p.k <= 0) return "the SM90 kernels need k > 0 (a TMA descriptor needs a k extent)";
  if (groups_of(p) > kSm90MaxGroups) return "the SM90 kernels take at most 1024 groups";
  const int64_t a_rows = p.rows == GemmRows::kMasked ? p.max_m : p.m;
  const int64_t a_l = p.rows == GemmRows::kMasked ? groups_of(p) : 1;
  const int64_t b_rows = silu(p) ? 2 * p.n : p.n;
  if (a_rows * a_l > INT_MAX || b_rows > INT_MAX || p.k > INT_MAX ||
      sm90_tiles_upper(p, tile_n) > INT_MAX) {
    return "the SM90 kernels hold extents and tile ids in 32 bits";
  }
  return {};
}

bool same_gemm_tiles(const GemmPlan& plan, int tile_m, int tile_n) {
  return plan.tile_m == tile_m && plan.tile_n == tile_n;
}

std::string expect_tiles(const GemmPlan& plan, int tile_m, int tile_n) {
  if (same_gemm_tiles(plan, tile_m, tile_n)) return {};
  return to_string(plan.kernel) + " runs " + std::to_string(tile_m) + "x" + std::to_string(tile_n) +
         " tiles";
}

}  // namespace

int64_t average_rows_per_group(const GroupedGemmProblem& p) {
  const int64_t groups = groups_of(p);
  switch (p.rows) {
    case GemmRows::kContiguous: {
      // P = routed rows + G*(alignment-1) alignment padding (permuted_rows): discount it.
      const int64_t padding = groups * (p.alignment > 1 ? p.alignment - 1 : 0);
      return (p.m > padding ? p.m - padding : 0) / groups;
    }
    case GemmRows::kMasked:
      return p.max_m;
    case GemmRows::kDense:
      return p.m;
  }
  return 0;
}

GemmPlan plan_gemm(const GroupedGemmProblem& p, const GemmDevice& d) {
  // Weight-only FP8: the one kernel that takes e4m3 weights with bf16 rows.
  if (p.b_scale != nullptr) return make(GemmKernel::kDecodePersistent, 32, 128);
  const int64_t groups = groups_of(p);
  const int64_t rows_per_group = average_rows_per_group(p);
  const int sms = rule_sms(d);
  // Few rows per group: the decode tiles (32 rows, the weights streamed once). Routed
  // counts (the fused layers) are ragged and skewed, so their groups outgrow the decode
  // tiles at a lower average (docs/gemm.md "The GEMM planner").
  const int64_t decode_max_rows = p.routed_counts ? 12 : 48;
  // Many rows: 128-row tiles, unless they would leave SMs without a tile.
  const int64_t wide_tiles = groups * cdiv(rows_per_group, 128) * cdiv(p.n, silu(p) ? 64 : 128);
  const bool many_rows = rows_per_group > decode_max_rows && wide_tiles >= sms;
  if (many_rows) {
    // Contiguous groups of >= 128 rows: the adaptive pairs, whose multicast cuts the
    // L2 -> SM traffic that bounds these GEMMs (docs/gemm.md "`sm90_pairs`:
    // adaptive pairs").
    const bool pairs = p.rows == GemmRows::kContiguous && groups > 1 && rows_per_group >= 128;
    const GemmPlan plan = sm90_plan(pairs ? GemmKernel::kSm90Pairs : GemmKernel::kSm90, p, d);
    if (sm90_limits(p, d, plan.tile_n).empty()) return plan;
  }
  if (!many_rows) {
    // Decode tiles too few for the SMs (a dense MLP at few tokens): split k over a cluster
    // (docs/gemm.md "Decode split-K"; measured on dense rows only).
    if (p.rows == GemmRows::kDense && rows_per_group <= 48 && p.k > 0) {
      const int split = planned_split(p, d);
      if (split > 1) return make(GemmKernel::kDecodeSplitK, 32, 128, split);
    }
    // Four or more waves of decode tiles: the 256-byte stream stages (fewer DRAM page
    // switches); the deep pipeline above k = 4096, the persistent grid for short-k grouped
    // GEMMs (docs/gemm.md "Decode tiles and stream tiles", "Persistent decode tiles").
    if (decode_tiles_upper(p) >= 4 * static_cast<int64_t>(sms) * kDecodeBlocksPerSm) {
      if (p.k > 4096) return make(GemmKernel::kDecodeStreamDeep, 32, 128);
      if (p.k > 0 && p.k <= 2048 && p.rows != GemmRows::kDense &&
          groups <= kGemmPersistentMaxGroups) {
        return make(GemmKernel::kDecodePersistent, 32, 128);
      }
      return make(GemmKernel::kDecodeStream, 32, 128);
    }
    // Fewer waves, standalone contiguous GEMMs at k <= 2048: the narrow stream tiles (twice
    // the tiles, two stages in flight per CTA; docs/gemm.md "Narrow stream tiles").
    if (p.rows == GemmRows::kContiguous && !p.routed_counts && p.k > 0 && p.k <= 2048) {
      return make(GemmKernel::kDecodeStreamNarrow, 32, 64);
    }
  }
  // Also k == 0 (c = 0 or silu(0) * 0) and devices without the SM90 kernels.
  return make(GemmKernel::kDecode, 32, 128);
}

namespace {

// Why the weight-only FP8 tiles cannot run p under `plan` (empty: they can, as far as this
// goes; decode_persistent's own limits follow).
std::string fp8_weights_rejection(const GemmPlan& plan, const GroupedGemmProblem& p) {
  if (plan.kernel != GemmKernel::kDecodePersistent)
    return "e4m3 weights with bf16 rows run on decode_persistent only";
  if (p.in_dtype != DType::kBF16 || p.out_dtype != DType::kBF16)
    return "e4m3 weights take bf16 rows and write bf16";
  if (p.b_scales == Fp8Scales::kBlock)
    return "e4m3 weights with bf16 rows take per-channel or per-tensor scales, not 128 x 128 "
           "blocks";
  if (p.k % 16 != 0)
    return "e4m3 weights with bf16 rows need k % 16 == 0, not " + std::to_string(p.k);
  return {};
}

}  // namespace

std::string gemm_plan_rejection(const GemmPlan& plan, const GroupedGemmProblem& p,
                                const GemmDevice& d) {
  if (p.in_dtype != DType::kBF16 && p.in_dtype != DType::kF16) {
    return "the grouped GEMM takes bf16 or f16 inputs";
  }
  if (p.b_scale != nullptr) {
    const std::string why = fp8_weights_rejection(plan, p);
    if (!why.empty()) return why;
  }
  if (plan.split != 1 && plan.kernel != GemmKernel::kDecodeSplitK) {
    return to_string(plan.kernel) + " does not split k";
  }
  const bool sm90 = plan.kernel == GemmKernel::kSm90 || plan.kernel == GemmKernel::kSm90Pairs;
  if (plan.swap_tails && !(sm90 && plan.tile_n == 256)) {
    return "swap_tails runs on sm90 / sm90_pairs 128x256 tiles only";
  }
  if (plan.schedule == GemmSchedule::kDynamic) {
    if (!sm90) return to_string(plan.kernel) + " has a static schedule only";
    if (!p.tile_counter) return "a dynamic schedule needs the workspace's tile counter";
  }
  switch (plan.kernel) {
    case GemmKernel::kDecode:
    case GemmKernel::kDecodeStream:
    case GemmKernel::kDecodeStreamDeep:
      return expect_tiles(plan, 32, 128);
    case GemmKernel::kDecodeStreamNarrow:
      return expect_tiles(plan, 32, 64);
    case GemmKernel::kDecodeSplitK:
      if (plan.split < 2 || plan.split > kMaxSplitK) return "decode_splitk takes splits 2..8";
      if (p.k <= 0) return "decode_splitk needs k > 0";
      return expect_tiles(plan, 32, 128);
    case GemmKernel::kDecodePersistent:
      if (p.k <= 0) return "decode_persistent needs k > 0";
      if (groups_of(p) > kGemmPersistentMaxGroups) {
        return "decode_persistent's group table holds at most 1024 groups";
      }
      // e4m3 weights: 32 x 256 tiles too (twice the weight bytes a tile).
      if (p.b_scale != nullptr && same_gemm_tiles(plan, 32, 256)) return {};
      return expect_tiles(plan, 32, 128);
    case GemmKernel::kSm90: {
      const bool width =
          plan.tile_n == 256 || plan.tile_n == 192 || (plan.tile_n == 224 && !silu(p));
      if (plan.tile_m != 128 || !width) {
        return "sm90 runs 128x256, 128x224 (no silu_and_mul) or 128x192 tiles";
      }
      return sm90_limits(p, d, plan.tile_n);
    }
    case GemmKernel::kSm90Pairs: {
      std::string why = expect_tiles(plan, 128, 256);
      return why.empty() ? sm90_limits(p, d, 256) : why;
    }
    case GemmKernel::kFp8Sm90:
      return "an FP8 kernel runs FP8 inputs only";
  }
  return "unknown kernel";
}

std::vector<GemmPlan> gemm_plan_candidates(const GroupedGemmProblem& p, const GemmDevice& d) {
  std::vector<GemmPlan> all = {
      make(GemmKernel::kDecode, 32, 128),           make(GemmKernel::kDecodeStream, 32, 128),
      make(GemmKernel::kDecodeStreamDeep, 32, 128), make(GemmKernel::kDecodeStreamNarrow, 32, 64),
      make(GemmKernel::kDecodePersistent, 32, 128), make(GemmKernel::kDecodePersistent, 32, 256)};
  for (int s = 2; s <= kMaxSplitK; ++s) all.push_back(make(GemmKernel::kDecodeSplitK, 32, 128, s));
  for (GemmSchedule schedule : {GemmSchedule::kStatic, GemmSchedule::kDynamic}) {
    for (int tile_n : {256, 224, 192}) {
      all.push_back(make(GemmKernel::kSm90, 128, tile_n, 1, schedule));
    }
    all.push_back(make(GemmKernel::kSm90Pairs, 128, 256, 1, schedule));
  }
  // Swapped tail tiles last (the other candidates keep their indices: --candidate I).
  for (GemmSchedule schedule : {GemmSchedule::kStatic, GemmSchedule::kDynamic}) {
    for (GemmKernel kernel : {GemmKernel::kSm90, GemmKernel::kSm90Pairs}) {
      GemmPlan swapped = make(kernel, 128, 256, 1, schedule);
      swapped.swap_tails = true;
      all.push_back(swapped);
    }
  }
  std::vector<GemmPlan> out;
  for (const GemmPlan& plan : all) {
    if (gemm_plan_rejection(plan, p, d).empty()) out.push_back(plan);
  }
  return out;
}

namespace {

// Upper bound of an fp8_sm90 launch's 128-row tiles (as its launchers count them; silu
// tiles hold tile_n / 2 output columns).
int64_t fp8_tiles_upper(const GroupedGemmFP8Problem& p, int tile_n) {
  const bool silu = p.activation == Activation::kSiluAndMul;
  const int64_t n_tiles = cdiv(p.n, silu ? tile_n / 2 : tile_n);
  const int64_t m_tiles =
      p.contiguous ? cdiv(p.m, 128) + p.num_groups : p.num_groups * cdiv(p.max_m, 128);
  return m_tiles * n_tiles;
}

// fp8_sm90's schedule, by sm90_schedule's rule: dynamic where a counter is given and the
// tiles take more than one wave (the m-tiles of a group that read the same weight tile then
// start together, whatever the earlier tiles' times), else static.
GemmPlan with_fp8_schedule(GemmPlan plan, const GroupedGemmFP8Problem& p, const GemmDevice& d) {
  const bool one_wave = fp8_tiles_upper(p, plan.tile_n) <= rule_sms(d);
  plan.schedule =
      p.tile_counter && p.k > 0 && !one_wave ? GemmSchedule::kDynamic : GemmSchedule::kStatic;
  return plan;
}

// Masked block-scaled groups where 128 x 256 tiles won on the H200 (kFp8BlockWideMaskedMinK):
// few rows a group, k long enough, and waves of 128 x 256 tiles (each twice a 128 x 128
// tile's work) at most 10% longer than 128 x 128's, which is about what the wider tile saves
// (Kimi-K2's down GEMM: 11 waves against 21, 0.90x; Qwen3-235B's gate/up at 3,072 columns
// and 16 groups: 2 waves against 3, 1.16x).
bool fp8_masked_block_wide(const GroupedGemmFP8Problem& p, const GemmDevice& d) {
  if (p.contiguous || p.scales != Fp8Scales::kBlock || p.k < kFp8BlockWideMaskedMinK ||
      p.max_m > kFp8BlockWideMaskedMaxRows) {
    return false;
  }
  const int sms = rule_sms(d);
  const int64_t waves_wide = 2 * cdiv(fp8_tiles_upper(p, 256), sms);
  const int64_t waves_narrow = cdiv(fp8_tiles_upper(p, 128), sms);
  return 10 * waves_wide <= 11 * waves_narrow;
}

}  // namespace

GemmPlan plan_gemm_fp8(const GroupedGemmFP8Problem& p, const GemmDevice& d) {
  // The SM90 FP8 kernel (docs/gemm.md "FP8 SM90"): 128 x 256 tiles where they run (a bf16
  // c) on contiguous groups of >= 256 rows on average with whole-k sums (per-tensor /
  // per-channel scales; H200, Qwen3-30B FP8 at 4,096 tokens: 0.81x / 0.85x of 128 x 128 per
  // channel / per tensor), of >= 80 with block scales promoted in 64-column chunks (H100,
  // the block layers at T = 4096: 0.90x-0.91x): the operand traffic of 256-wide tiles; else
  // 128 x 128; masked block-scaled groups of few rows at long k (fp8_masked_block_wide) on
  // 128 x 256 too. Where neither can run (off sm_90, past its limits, k > kFp8FastMaxK for
  // whole-k sums) gemm_fp8_plan_rejection says why.
  const GemmPlan fast = with_fp8_schedule(make(GemmKernel::kFp8Sm90, 128, 256), p, d);
  const int64_t wide_rows = p.scales == Fp8Scales::kBlock ? kFp8BlockWideMinRows : kFp8FastMinRows;
  // An e4m3 c with group scales (c_group_scales) is 128 x 256's alone.
  const bool wide =
      p.c_group_scales != nullptr ||
      (p.contiguous ? p.k > 0 && fp8_rows_per_group(p) >= wide_rows : fp8_masked_block_wide(p, d));
  if (wide && gemm_fp8_plan_rejection(fast, p, d).empty()) return fast;
  return with_fp8_schedule(make(GemmKernel::kFp8Sm90, 128, 128), p, d);
}

std::string gemm_fp8_plan_rejection(const GemmPlan& plan, const GroupedGemmFP8Problem& p,
                                    const GemmDevice& d) {
  if (plan.split != 1) return to_string(plan.kernel) + " does not split k";
  if (plan.swap_tails) return "swap_tails runs on the bf16 / f16 SM90 kernels only";
  if (plan.schedule == GemmSchedule::kDynamic) {
    if (plan.kernel != GemmKernel::kFp8Sm90)
      return to_string(plan.kernel) + " has a static schedule only";
    if (!p.tile_counter) return "a dynamic schedule needs the workspace's tile counter";
  }
  if (p.c_group_scales != nullptr) {
    if (p.activation != Activation::kSiluAndMul || p.c_scale != nullptr || p.c_amax != nullptr ||
        p.scales != Fp8Scales::kBlock || p.n % 128 != 0) {
      return "an e4m3 c quantized in groups of 128 (c_group_scales) needs silu_and_mul, block "
             "scales, n % 128 == 0 and no c_scale / c_amax";
    }
    if (p.k == 0 || plan.kernel != GemmKernel::kFp8Sm90 || !same_gemm_tiles(plan, 128, 256))
      return "only fp8_sm90 128x256 (k > 0) quantizes its output in groups of 128 (c_group_scales)";
  }
  switch (plan.kernel) {
    case GemmKernel::kFp8Sm90:
      if (!d.props.sm90()) return "fp8_sm90 needs an sm_90 device";
      // k == 0 reads no operand: run_grouped_gemm_fp8 fills the empty sums' value (act(0) =
      // 0, as bf16 or e4m3) in any scale mode, activation and output instead.
      if (p.k > 0 && !sm90_fp8_supports(p)) {
        return "fp8_sm90 needs at most 1024 groups and 32-bit extents";
      }
      // 128 x 256: the fast-accumulation form (whole-k sums scaled once in the epilogue);
      // with block scales, sums promoted every 128 k in 64-column chunks.
      if (same_gemm_tiles(plan, 128, 256)) {
        if (p.c_scale != nullptr) return "fp8_sm90 128x256 writes a bf16 c only (no c_scale)";
        if (p.scales == Fp8Scales::kBlock) {
          if (p.activation == Activation::kSiluAndMul && p.n % 128 != 0)
            return "fp8_sm90 128x256 with block scales and silu_and_mul needs n % 128 == 0";
          return {};
        }
        if (p.k > kFp8FastMaxK) {
          return "fp8_sm90 128x256 sums the whole k in the wgmma accumulator: k <= " +
                 std::to_string(kFp8FastMaxK) + " only";
        }
        return {};
      }
      return expect_tiles(plan, 128, 128);
    default:
      return to_string(plan.kernel) + " runs bf16 / f16 inputs only";
  }
}

std::vector<GemmPlan> gemm_fp8_plan_candidates(const GroupedGemmFP8Problem& p,
                                               const GemmDevice& d) {
  // The planner's plan first, then the tile shapes in both schedules (k == 0 runs the empty
  // sums' fill whatever the plan: no second candidate there).
  std::vector<GemmPlan> out;
  const GemmPlan plan = plan_gemm_fp8(p, d);
  if (gemm_fp8_plan_rejection(plan, p, d).empty()) out.push_back(plan);
  if (p.k <= 0) return out;
  for (const int tile_n : {128, 256}) {
    for (const GemmSchedule schedule : {GemmSchedule::kDynamic, GemmSchedule::kStatic}) {
      GemmPlan other = make(GemmKernel::kFp8Sm90, 128, tile_n);
      other.schedule = schedule;
      if (!(other == plan) && gemm_fp8_plan_rejection(other, p, d).empty()) out.push_back(other);
    }
  }
  return out;
}

namespace {

// Why (up, down) cannot run as one chained launch, whatever the tiles (empty: it can).
std::string chain_limits(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                         const GemmDevice& d) {
  if (!d.props.sm90()) return "the chain needs an sm_90 device";
  const bool dtype = (up.in_dtype == DType::kBF16 || up.in_dtype == DType::kF16) &&
                     up.out_dtype == up.in_dtype && down.in_dtype == up.in_dtype &&
                     down.out_dtype == up.in_dtype;
  if (!dtype) return "the chain takes bf16 or f16 in and out, one dtype";
  const bool shape = up.rows == GemmRows::kContiguous && down.rows == GemmRows::kContiguous &&
                     up.num_groups == down.num_groups && up.m == down.m &&
                     up.alignment == down.alignment && up.layout_metadata == down.layout_metadata &&
                     up.num_groups >= 1 && up.num_groups <= kChainMaxGroups &&
                     up.activation == Activation::kSiluAndMul &&
                     down.activation == Activation::kNone && down.a == up.c && up.k > 0 &&
                     down.k == up.n && grouped_gemm_launches(up) && grouped_gemm_launches(down);
  if (!shape) {
    return "the chain takes an expert MLP's GEMMs: contiguous rows, <= 1024 groups, k > 0";
  }
  // Tile ids (both GEMMs' upper bounds together) and TMA coordinates are 32-bit.
  const int64_t m_tiles = cdiv(up.m, 128) + up.num_groups;
  const int64_t tiles = m_tiles * (cdiv(up.n, 128) + cdiv(down.n, 256));
  if (tiles > INT_MAX || up.m > INT_MAX || 2 * up.n > INT_MAX || down.n > INT_MAX ||
      up.k > INT_MAX) {
    return "the chain holds extents and tile ids in 32 bits";
  }
  return {};
}

MlpPlan chain_plan(GemmKernel kernel, bool swap_tails = false) {
  MlpPlan m;
  m.path = MlpPath::kChain;
  m.gate_up = make(kernel, 128, 256, 1, GemmSchedule::kDynamic);
  m.gate_up.swap_tails = swap_tails;
  m.down = m.gate_up;
  return m;
}

bool is_chain_plan(const MlpPlan& plan) {
  for (GemmKernel kernel : {GemmKernel::kSm90, GemmKernel::kSm90Pairs})
    for (bool swap : {false, true})
      if (plan == chain_plan(kernel, swap)) return true;
  return false;
}

}  // namespace

MlpPlan plan_mlp_gemms(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                       const GemmDevice& d) {
  MlpPlan m;
  m.gate_up = plan_gemm(up, d);
  m.down = plan_gemm(down, d);
  // Both GEMMs on 256-wide SM90 tiles of one kind: one chained launch, each down tile
  // starting once its group's gate_up tiles are stored (docs/gemm.md "The SM90 expert-MLP
  // chain"; on the pair tiles where both take them).
  const bool same_sm90 =
      m.gate_up.kernel == m.down.kernel && m.gate_up.tile_n == 256 && m.down.tile_n == 256 &&
      (m.gate_up.kernel == GemmKernel::kSm90 || m.gate_up.kernel == GemmKernel::kSm90Pairs);
  if (same_sm90 && chain_limits(up, down, d).empty()) {
    return chain_plan(m.gate_up.kernel, m.gate_up.swap_tails && m.down.swap_tails);
  }
  return m;
}

std::string mlp_gemms_plan_rejection(const MlpPlan& plan, const GroupedGemmProblem& up,
                                     const GroupedGemmProblem& down, const GemmDevice& d) {
  if (plan.split_gate_up != 0 || plan.split_down != 0) {
    return "the GEMM paths have no dense-MLP splits";
  }
  if (plan.path == MlpPath::kTwoGemms) {
    std::string why = gemm_plan_rejection(plan.gate_up, up, d);
    if (!why.empty()) return "gate_up: " + why;
    why = gemm_plan_rejection(plan.down, down, d);
    return why.empty() ? why : "down: " + why;
  }
  if (plan.path != MlpPath::kChain) return "not a GEMM path of an MLP";
  if (!is_chain_plan(plan)) {
    return "the chain runs both GEMMs on sm90 or sm90_pairs 128x256 tiles, dynamic (both with "
           "or both without swap_tails)";
  }
  return chain_limits(up, down, d);
}

std::vector<MlpPlan> mlp_gemms_plan_candidates(const GroupedGemmProblem& up,
                                               const GroupedGemmProblem& down,
                                               const GemmDevice& d) {
  // The chains, the planner's pair of GEMM plans, then each GEMM's other candidates with
  // the other GEMM as planned: linear in the GEMMs' candidates, not their product (the
  // layer's candidates multiply again by the shared expert's).
  std::vector<MlpPlan> out;
  const auto add = [&out](const MlpPlan& m) {
    for (const MlpPlan& o : out)
      if (o == m) return;
    out.push_back(m);
  };
  const bool chains = chain_limits(up, down, d).empty();
  for (GemmKernel kernel : {GemmKernel::kSm90, GemmKernel::kSm90Pairs}) {
    if (chains) add(chain_plan(kernel));
  }
  MlpPlan planned;
  planned.gate_up = plan_gemm(up, d);
  planned.down = plan_gemm(down, d);
  add(planned);
  for (const GemmPlan& u : gemm_plan_candidates(up, d)) {
    MlpPlan m = planned;
    m.gate_up = u;
    add(m);
  }
  for (const GemmPlan& w : gemm_plan_candidates(down, d)) {
    MlpPlan m = planned;
    m.down = w;
    add(m);
  }
  // Last, as in the GEMM candidates: the plain and swapped chains (the planner's is one).
  for (bool swap : {false, true}) {
    for (GemmKernel kernel : {GemmKernel::kSm90, GemmKernel::kSm90Pairs}) {
      if (chains) add(chain_plan(kernel, swap));
    }
  }
  return out;
}

}  // namespace moekit::detail
