// Host side of the grouped-GEMM engine: config selection and dispatch.
#include "gemm/grouped_gemm.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/launch.h"
#include "gemm/mma/split_k.h"
#include "gemm/sm90/device.h"
#include "gemm/sm90/tile_math.h"
#include "moekit/error.h"

namespace moekit::detail {
namespace {

// MOEKIT_GEMM_CONFIG = decode | prefill | <config number> forces a config (benchmarks,
// tuning); unset, or a value the engine does not have: -1 (heuristic).
int env_config(int count) {
  static const int value = [] {
    const char* s = std::getenv("MOEKIT_GEMM_CONFIG");
    if (!s || !*s) return -1;
    if (!std::strcmp(s, "decode")) return 0;
    if (!std::strcmp(s, "prefill")) return 1;
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    return (*end == 0 && v >= 0 && v < 64) ? static_cast<int>(v) : -1;
  }();
  return value < count ? value : -1;
}

int sm_count() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 132;  // an H100 / H200
  }
  return count;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Shared heuristic of both engines (measurements in docs/gemm.md): up to
// `decode_max_rows` rows per group -> the decode config (small m tiles, b streamed
// once); else the prefill config, unless its big tiles would not give every SM at
// least one tile (then the smaller decode tiles spread better).
int pick(int64_t rows_per_group, int64_t decode_max_rows, int64_t groups, int64_t prefill_bm,
         int64_t prefill_tiles_n) {
  if (rows_per_group <= decode_max_rows) return 0;
  const int64_t prefill_tiles = groups * ceil_div(rows_per_group, prefill_bm) * prefill_tiles_n;
  if (prefill_tiles < sm_count()) return 0;
  return 1;
}

// A heuristic rule's off switch: on unless the variable reads "0".
bool rule_on(const char* env) {
  const char* s = std::getenv(env);
  return !(s && std::strcmp(s, "0") == 0);
}
bool persistent_decode_enabled() {
  static const bool on = rule_on("MOEKIT_GEMM_PERSISTENT");
  return on;
}
// Where the ping-pong SM90 config replaces the cooperative one (select_grouped_gemm_config).
int pingpong_rule() {
  static const int rule = [] {
    const char* s = std::getenv("MOEKIT_GEMM_PINGPONG");
    if (!s || !*s) return 0;
    const int v = std::atoi(s);
    return v < 0 ? 0 : v > 2 ? 2 : v;
  }();
  return rule;
}
bool adaptive_pairs_enabled() {
  static const bool on = rule_on("MOEKIT_GEMM_PAIRS");
  return on;
}
bool small_stream_enabled() {
  static const bool on = rule_on("MOEKIT_GEMM_SMALL_STREAM");
  return on;
}

// Rows per group the heuristic goes by: contiguous, the rows without alignment padding
// over the groups; masked, max_m (an upper bound: the counts live on the device); dense, m.
int64_t average_rows_per_group(const GroupedGemmProblem& p) {
  const int64_t groups = p.rows == GemmRows::kDense || p.num_groups < 1 ? 1 : p.num_groups;
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

}  // namespace

int select_grouped_gemm_config(const GroupedGemmProblem& p) {
  if (p.config >= 0) return p.config;
  if (env_config(kGemmConfigCount) >= 0) return env_config(kGemmConfigCount);
  int64_t groups = p.rows == GemmRows::kDense ? 1 : p.num_groups;
  if (groups < 1) groups = 1;
  const int64_t rows_per_group = average_rows_per_group(p);
  // bf16 ds-v3 up-projection (n 4096, k 7168): decode wins at 32 rows per group
  // (4.0 vs 4.4 ms), prefill at 64 (5.5 vs 5.9-6.4 ms): switch at 48.
  const int64_t out_cols_per_tile = p.activation == Activation::kSiluAndMul ? 64 : 128;
  // Routed counts (fused layers): the SM90 tiles (128 rows: one pass over a group's
  // weights up to 128 rows) from 12 rows per group on average (H200, 83a8ebc, forced
  // config 2 vs the decode tiles: kimi-k2 decode, 16 rows on average, 4.27 -> 3.77 ms;
  // qwen3-235b decode, 32: 1.43 -> 1.23; kimi-k2 + shared t2048, 43: 13.2 -> 8.3;
  // at 4-6 rows the decode tiles stay ahead: ds-v3 t128 3.27 vs 3.42, glm45 t128).
  const int64_t decode_max_rows = p.routed_counts ? 12 : 48;
  const int config =
      pick(rows_per_group, decode_max_rows, groups, 128, ceil_div(p.n, out_cols_per_tile));
  // Many rows per group: the SM90 TMA + wgmma kernel beats the mma.sync prefill tiles on
  // every such bench row (H200, 2026-12-02: ds-v3 prefill up 4.42 vs 6.27 ms, dense
  // 4096 x 4096 x 7168 0.50 vs 1.01 ms); k == 0 has no TMA descriptor.
  if (config == kGemmConfigPrefill && p.k > 0) {
    // Grouped GEMMs whose epilogue is a large share of a tile (silu_and_mul, or k <=
    // 2048) took the ping-pong variant (one consumer's epilogue under the other's
    // mainloop; H200, a9ccd6e, against the static cooperative kernel: ds-v3 prefill
    // swiglu 4.39 -> 4.23 ms, down 2.19 -> 2.09, expert MLP 6.52 -> 6.25). Since the
    // cooperative kernel takes grouped tiles dynamically (session 9) it wins these rows
    // back (H200, session 10, interleaved, 2 reps: swiglu 3.94 / 3.96 vs 4.10 / 4.12 ms,
    // down 2.02 / 2.09 vs 2.08 / 2.14, expert MLP qwen3-235b-prefill bf16 2.10 / 2.20 vs
    // 2.15 / 2.26, ds-v3-prefill bf16 5.95 / 6.05 vs 6.14 / 6.29, f16 alike), and more so
    // on the fused layers' routed prefill GEMMs (ds-v3-grouped-prefill 7.60 / 7.88 vs
    // 8.64 / 8.80, kimi-k2-prefill 7.63 / 8.00 vs 8.65 / 8.85, kimi-k2 + shared t4096 13.52
    // / 13.73 vs 14.79 / 14.86; 13 fused rows 6.8% faster in the geometric mean). So the
    // heuristic no longer picks ping-pong; MOEKIT_GEMM_PINGPONG (pingpong_rule) restores
    // older rules: 2 = the rule before session 10 (standalone GEMMs, and routed counts
    // from 64 rows per group: 83a8ebc vs 43df3b0, against the static cooperative
    // kernel), 1 = its routed half only.
    const bool epilogue_heavy = p.activation == Activation::kSiluAndMul || p.k <= 2048;
    const int rule = pingpong_rule();
    const bool pingpong = p.routed_counts ? rule >= 1 && rows_per_group >= 64 : rule >= 2;
    if (p.rows != GemmRows::kDense && groups > 1 && epilogue_heavy && pingpong) {
      return kGemmConfigSm90Pingpong;
    }
    // Contiguous groups of >= 128 rows on average: the adaptive pairs (config 11; H200,
    // session 12, interleaved, 2 reps, forced against config 2: fused prefill layers 2-4%
    // faster, the standalone prefill GEMMs 0-3.5%). MOEKIT_GEMM_PAIRS=0 turns it off.
    if (p.rows == GemmRows::kContiguous && groups > 1 && groups <= 1024 && rows_per_group >= 128 &&
        adaptive_pairs_enabled()) {
      return kGemmConfigSm90PairAuto;
    }
    return kGemmConfigSm90;
  }
  // Decode tiles too few for the SMs (dense MLP at few tokens, few experts): split k
  // over a cluster (split_k.h). Only in the decode regime (more rows per group run
  // decode tiles only because the prefill tiles would be too few) and for k > 0.
  // Measured on dense layouts only (a shared-expert MLP): on the H200 routed256
  // (16 experts x 16 rows) ran slower split (0.040 -> 0.050 ms at split 2).
  if (config == kGemmConfigDecode && p.rows == GemmRows::kDense && rows_per_group <= 48 &&
      p.k > 0 && decode_split_k(p, sm_count(), splitk_cluster_capacity_table()) > 1) {
    return kGemmConfigDecodeSplitK;
  }
  // Big decode GEMMs (>= 4 waves of decode tiles): the 256-byte-per-row stream tiles,
  // with the deep pipeline for long k (H200: ds-v3 up 3.578 -> 3.400 ms, down 1.813 ->
  // 1.787 ms). Small ones keep the 4-stage 128-byte tiles (more bytes in flight per CTA).
  if (config == kGemmConfigDecode &&
      decode_tiles_upper(p) >= 4 * static_cast<int64_t>(sm_count()) * kDecodeBlocksPerSm) {
    // k == 4096 (qwen3-235b up) measured faster on the 2-stage tiles (expert MLP 1.156
    // vs 1.189 ms), so the deep pipeline starts above it.
    if (p.k > 4096) return kGemmConfigDecodeStreamDeep;
    // Short k (a tile streams 0.5 MB at k = 2048): the same tiles on a persistent grid,
    // which overlaps a tile's epilogue and the next tile's start with the stream (H200,
    // session 4: ds-v3 decode down 1.7449 vs 1.7551 ms, f32 out 1.7735 vs 1.7851; at
    // k = 7168 it lost, 3.44 vs 3.33-3.38). Grouped rows only (measured there), one
    // split, the kernel's group limit; MOEKIT_GEMM_PERSISTENT=0 turns it off.
    if (p.k <= 2048 && p.rows != GemmRows::kDense && p.split_k < 2 &&
        groups <= kGemmPersistentMaxGroups && persistent_decode_enabled()) {
      return kGemmConfigDecodePersistent;
    }
    return kGemmConfigDecodeStream;
  }
  // Under 4 waves, standalone contiguous GEMMs at k <= 2048: the narrow stream tiles
  // (config 12: 32 x 64 tiles, 256-byte stages, 3 stages, 3 blocks per SM; twice the tiles
  // and two stages of weight loads in flight per CTA). H200, session 14, 4 interleaved reps,
  // ms: qwen3-30b routed256 (16 experts x 16 rows) 0.0344-0.0347 vs config 4 (this rule's
  // pick since session 4: 0.0348-0.0350 vs 0.0353-0.0356 on config 0) 0.0348-0.0350;
  // ep8-decode (8 rows over 16 experts) 0.0174 vs config 0 0.0177-0.0180 (config 4
  // 0.0207-0.0216). Measured at k 2048 only; MOEKIT_GEMM_SMALL_STREAM=0 keeps config 0.
  if (config == kGemmConfigDecode && p.rows == GemmRows::kContiguous && !p.routed_counts &&
      p.k > 0 && p.k <= 2048 && small_stream_enabled()) {
    return kGemmConfigDecodeStreamNarrow;
  }
  return config;
}

bool grouped_gemm_launches(const GroupedGemmProblem& p) {
  const int64_t rows = p.rows == GemmRows::kMasked ? p.max_m : p.m;
  return !(rows <= 0 || p.n <= 0 || (p.rows != GemmRows::kDense && p.num_groups <= 0));
}

void run_grouped_gemm(const GroupedGemmProblem& p, cudaStream_t stream) {
  const char* op = "moe_grouped_gemm";
  if (!grouped_gemm_launches(p)) return;
  const int config = select_grouped_gemm_config(p);
  if (config < 0 || config >= kGemmConfigCount) {
    throw Error(std::string("moekit::") + op + ": config: expected -1.." +
                std::to_string(kGemmConfigCount - 1) + ", got " + std::to_string(config));
  }
  if (p.in_dtype != DType::kBF16 && p.in_dtype != DType::kF16) {
    throw Error(std::string("moekit::") + op + ": unsupported input dtype " +
                dtype_name(p.in_dtype));
  }
  const bool bf16 = p.in_dtype == DType::kBF16;
  // The SM90 configs need k > 0 (a TMA descriptor needs a non-empty k extent); k == 0
  // (c = 0 or silu(0) * 0) takes the decode config.
  const bool sm90 = p.k > 0;
  if (sm90 && config == kGemmConfigSm90) {
    bf16 ? launch_grouped_gemm_sm90_bf16(p, stream) : launch_grouped_gemm_sm90_f16(p, stream);
  } else if (sm90 && config == kGemmConfigSm90Pingpong) {
    bf16 ? launch_grouped_gemm_sm90_pingpong_bf16(p, stream)
         : launch_grouped_gemm_sm90_pingpong_f16(p, stream);
  } else if (sm90 && (config == kGemmConfigSm90PairN || config == kGemmConfigSm90PingpongPairM ||
                      config == kGemmConfigSm90PairM || config == kGemmConfigSm90PairAuto)) {
    bf16 ? launch_grouped_gemm_sm90_pair_bf16(p, config, stream)
         : launch_grouped_gemm_sm90_pair_f16(p, config, stream);
  } else {
    bf16 ? launch_grouped_gemm_bf16(p, config, stream) : launch_grouped_gemm_f16(p, config, stream);
  }
  check_launch(op);
}

int& sm90_tile_n_override() {
  static int v = 0;
  return v;
}

int sm90_tile_n(const GroupedGemmProblem& problem) {
  const bool silu = problem.activation == Activation::kSiluAndMul;
  const auto valid = [&](int v) { return v == 256 || v == 192 || (v == 224 && !silu); };
  if (valid(sm90_tile_n_override())) return sm90_tile_n_override();
  static const int env = [] {
    const char* v = std::getenv("MOEKIT_SM90_BN");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  if (valid(env)) return env;
  if (problem.rows != GemmRows::kDense) return 256;
  return gemm::sm90::dense_tile_n(problem.m, problem.n, silu, sm90_sm_count());
}

int& gemm_pdl_override() {
  static int v = 0;
  return v;
}

bool gemm_pdl_enabled() {
  // Only the override turns it on: the MOEKIT_GEMM_PDL=1 environment switch is gone (the
  // chain gained nothing on the H200; docs/gemm.md "PDL chain of an MLP's GEMMs").
  return gemm_pdl_override() == 1;
}

namespace {

// The configs with a PDL variant (grouped_gemm_launch.cuh instantiates exactly these):
// the decode-regime mma.sync + cp.async kernels, bf16/f16, out in the input dtype (and
// f32 for the second GEMM: the fused layer's shared expert).
bool pdl_config(const GroupedGemmProblem& p, bool second) {
  if (!grouped_gemm_launches(p)) return false;
  if (p.in_dtype != DType::kBF16 && p.in_dtype != DType::kF16) return false;
  if (p.out_dtype != p.in_dtype && !(second && p.out_dtype == DType::kF32)) return false;
  const int config = select_grouped_gemm_config(p);
  return config == kGemmConfigDecode || config == kGemmConfigDecodeSplitK ||
         config == kGemmConfigDecodeStream ||
         (config == kGemmConfigDecodeStreamDeep && p.split_k < 2);
}

}  // namespace

bool gemm_pdl_chain(const GroupedGemmProblem& first, const GroupedGemmProblem& second) {
  // Never a pair that runs as the SM90 expert-MLP chain (run_expert_mlp_gemms takes the
  // chain first; with sm90_mlp_chain_override() == 1 the chain takes decode configs too).
  return gemm_pdl_enabled() && pdl_config(first, false) && pdl_config(second, true) &&
         !sm90_mlp_chain_applies(first, second);
}

bool gemm_b_evict_first(int64_t b_bytes) {
  static const int forced = [] {
    const char* s = std::getenv("MOEKIT_GEMM_B_HINT");
    return s && *s ? (std::strcmp(s, "1") == 0 ? 1 : 0) : -1;
  }();
  return forced >= 0 ? forced == 1 : b_bytes <= kEvictFirstMaxBBytes;
}

MlpGemmForce& mlp_gemm_force_override() {
  // MOEKIT_MLP_GEMM_CONFIGS=FIRST,SECOND (a measurement knob; a negative, empty or non-numeric
  // field = the heuristic; a number past the last config fails the launch with its error).
  static MlpGemmForce v = [] {
    MlpGemmForce f;
    const char* s = std::getenv("MOEKIT_MLP_GEMM_CONFIGS");
    const auto field = [](const char* from) {
      char* end = nullptr;
      const long c = std::strtol(from, &end, 10);
      return end == from ? -1 : static_cast<int>(c);
    };
    if (s && *s) {
      f.first_config = field(s);
      if (const char* comma = std::strchr(s, ',')) f.second_config = field(comma + 1);
    }
    return f;
  }();
  return v;
}

void run_grouped_gemm_pair(GroupedGemmProblem first, GroupedGemmProblem second,
                           cudaStream_t stream) {
  const MlpGemmForce& force = mlp_gemm_force_override();
  if (first.config < 0 && force.first_config >= 0) {
    first.config = force.first_config;
    first.split_k = force.first_split;
  }
  if (second.config < 0 && force.second_config >= 0) {
    second.config = force.second_config;
    second.split_k = force.second_split;
  }
  first.pdl = GemmPdl::kNone;
  second.pdl = GemmPdl::kNone;
  // Both launch (gemm_pdl_chain checks it), so the kSecond kernel's stream predecessor is
  // the kFirst kernel: its pre-wait weight loads rely on that (docs/gemm.md).
  if (gemm_pdl_chain(first, second)) {
    first.pdl = GemmPdl::kFirst;
    second.pdl = GemmPdl::kSecond;
  }
  run_grouped_gemm(first, stream);
  run_grouped_gemm(second, stream);
}

int& sm90_mlp_chain_override() {
  static int v = 0;
  return v;
}

int& sm90_mlp_chain_pairs_override() {
  static int v = 0;
  return v;
}

namespace {

std::atomic<int64_t> g_chain_launches{0};

// A GEMM of the chain with mlp_gemm_force_override applied as run_grouped_gemm_pair would.
GroupedGemmProblem forced(GroupedGemmProblem p, int config) {
  if (p.config < 0 && config >= 0) p.config = config;
  return p;
}

bool chain_env_on() {
  static const bool on = rule_on("MOEKIT_SM90_CHAIN");
  return on;
}

// Where the heuristic gives both GEMMs config 11, the chain runs on config 11's pair tiles
// (session 13); MOEKIT_SM90_CHAIN_PAIRS=0 restores session 12's rule: config 2's tiles
// below 256 rows per group, config 11's two launches from 256.
bool chain_pairs_on() {
  static const bool env = rule_on("MOEKIT_SM90_CHAIN_PAIRS");
  const int o = sm90_mlp_chain_pairs_override();
  return o == 1 || (o == 0 && env);
}

}  // namespace

bool sm90_mlp_chain_applies(const GroupedGemmProblem& up, const GroupedGemmProblem& down) {
  return sm90_sm_count() > 0 && sm90_mlp_chain_rule(up, down);
}

bool sm90_mlp_chain_rule(const GroupedGemmProblem& up_in, const GroupedGemmProblem& down_in) {
  const int o = sm90_mlp_chain_override();
  if (o == 2 || (o == 0 && !chain_env_on())) return false;
  const MlpGemmForce& force = mlp_gemm_force_override();
  const GroupedGemmProblem up = forced(up_in, force.first_config);
  const GroupedGemmProblem down = forced(down_in, force.second_config);
  const bool dtype = (up.in_dtype == DType::kBF16 || up.in_dtype == DType::kF16) &&
                     up.out_dtype == up.in_dtype && down.in_dtype == up.in_dtype &&
                     down.out_dtype == up.in_dtype;
  const bool shape = up.rows == GemmRows::kContiguous && down.rows == GemmRows::kContiguous &&
                     up.num_groups == down.num_groups && up.m == down.m &&
                     up.alignment == down.alignment && up.layout_metadata == down.layout_metadata &&
                     up.num_groups >= 1 && up.num_groups <= 1024 &&
                     up.activation == Activation::kSiluAndMul &&
                     down.activation == Activation::kNone && down.a == up.c && up.k > 0 &&
                     down.k == up.n && grouped_gemm_launches(up) && grouped_gemm_launches(down);
  if (!dtype || !shape) return false;
  // Tile ids (both GEMMs' upper bounds together) and TMA coordinates are 32-bit.
  const int64_t m_tiles = ceil_div(up.m, 128) + up.num_groups;
  const int64_t tiles = m_tiles * (ceil_div(up.n, 128) + ceil_div(down.n, 256));
  if (tiles > INT32_MAX || up.m > INT32_MAX || 2 * up.n > INT32_MAX || down.n > INT32_MAX ||
      up.k > INT32_MAX) {
    return false;
  }
  if (o == 1) return true;
  const int c_up = select_grouped_gemm_config(up), c_down = select_grouped_gemm_config(down);
  // Both GEMMs on config 11 (the heuristic's pick): the chain on its pair tiles. H200,
  // session 13 (2 interleaved reps, against session 12's rule, once the pair chain's spill
  // was gone): FusedMoE ds-v3-grouped-prefill 7.36 / 7.52 vs 7.57 / 7.89 ms, kimi-k2-prefill
  // 7.38 / 7.73 vs 7.59 / 7.88, ExpertMLP qwen3-235b-prefill f16 2.20 / 2.25 vs 2.23 / 2.30;
  // ExpertMLP ds-v3-prefill (128 rows each: n-pairs only) bf16 6.13 / 6.15 vs 6.10 / 6.13.
  // With the knob off: config 2's chain below 256 rows per group (ahead of config 11's two
  // launches there in session 12), no chain from 256. Forced configs (MlpGemmForce) are
  // taken as they are.
  const bool both_pairs = c_up == kGemmConfigSm90PairAuto && c_down == kGemmConfigSm90PairAuto;
  const bool pair_pick = up.config < 0 && down.config < 0 && both_pairs &&
                         (chain_pairs_on() || average_rows_per_group(up) < 256);
  return (pair_pick || (c_up == kGemmConfigSm90 && c_down == kGemmConfigSm90)) &&
         sm90_tile_n(up) == 256 && sm90_tile_n(down) == 256;
}

bool sm90_mlp_chain_pairs(const GroupedGemmProblem& up, const GroupedGemmProblem& down) {
  if (!chain_pairs_on()) return false;
  const MlpGemmForce& force = mlp_gemm_force_override();
  return select_grouped_gemm_config(forced(up, force.first_config)) == kGemmConfigSm90PairAuto &&
         select_grouped_gemm_config(forced(down, force.second_config)) == kGemmConfigSm90PairAuto;
}

bool run_sm90_mlp_chain(const GroupedGemmProblem& up, const GroupedGemmProblem& down, void* scratch,
                        cudaStream_t stream) {
  if (!scratch || !sm90_mlp_chain_applies(up, down)) return false;
  const bool pairs = sm90_mlp_chain_pairs(up, down);
  up.in_dtype == DType::kBF16 ? launch_mlp_chain_sm90_bf16(up, down, scratch, pairs, stream)
                              : launch_mlp_chain_sm90_f16(up, down, scratch, pairs, stream);
  check_launch("moe_expert_mlp");
  g_chain_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

int64_t sm90_mlp_chain_launches() {
  return g_chain_launches.load(std::memory_order_relaxed);
}

int select_grouped_gemm_fp8_config(const GroupedGemmFP8Problem& p) {
  if (p.config >= 0) return p.config;
  if (env_config(kFp8ConfigCount) >= 0) return env_config(kFp8ConfigCount);
  // The SM90 TMA + wgmma kernel beat both mma.sync configs on all 14 FP8 bench rows
  // (H200, 2026-12-02, a9ccd6e: masked ds-v3 e8 up 0.261 -> 0.075 ms, kimi-k2 b256 up
  // 0.775 -> 0.362, ds-v3 b64 up 0.251 -> 0.235); the mma.sync configs remain for what
  // it does not take (k == 0, more than 1024 groups, 64-bit extents).
  if (sm90_fp8_supports(p)) return kFp8ConfigSm90;
  const int64_t groups = p.num_groups < 1 ? 1 : p.num_groups;
  // max_m only bounds the counts (DeepGEMM-style masked decode buffers are sized
  // generously): keep the decode config up to 64 (0.23 vs 0.48 ms at T = 64, E = 32).
  return pick(p.max_m, 64, groups, 128, ceil_div(p.n, 128));
}

void run_grouped_gemm_fp8(const GroupedGemmFP8Problem& p, cudaStream_t stream) {
  const char* op = "moe_grouped_gemm_fp8";
  if (p.max_m <= 0 || p.n <= 0 || p.num_groups <= 0) return;
  const int config = select_grouped_gemm_fp8_config(p);
  if (config < 0 || config >= kFp8ConfigCount) {
    throw Error(std::string("moekit::") + op + ": config: expected -1.." +
                std::to_string(kFp8ConfigCount - 1) + ", got " + std::to_string(config));
  }
  launch_grouped_gemm_fp8(p, config, stream);
  check_launch(op);
}

}  // namespace moekit::detail
