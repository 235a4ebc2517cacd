// The GEMM planner and the expert-MLP GEMMs' planner (docs/gemm.md): pure functions of a
// problem's shapes and the device's properties (no CUDA calls, no globals), unit-tested
// on the CPU with made-up devices.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <string>
#include <vector>

#include "core/device.h"
#include "gemm/grouped_gemm.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/mma/split_k.h"
#include "moekit/plan.h"

namespace moekit::detail {

// What the GEMM planners know of a device: its properties and the decode split-K kernel's
// co-resident clusters per cluster size (splitk_clusters[s], s = 1..kMaxSplitK, from
// cudaOccupancyMaxActiveClusters; 0 = unknown: the planner then models sms x 2 / s).
// Implicit from DeviceProps so tests pass made-up properties; call sites pass
// current_gemm_device(), which carries the measured capacities too.
struct GemmDevice {
  DeviceProps props;
  std::array<int, kMaxSplitK + 1> splitk_clusters{};
  GemmDevice() = default;
  GemmDevice(const DeviceProps& p) : props(p) {}  // NOLINT(google-explicit-constructor)
};

// device_props() and the split-K capacities of the current device (queried once per device
// through device_cached, slots kSplitKClusterSlot + s).
GemmDevice current_gemm_device();
constexpr int kSplitKClusterSlot = 48;  // device_cached slots 49..56

// The plan run_grouped_gemm runs for `p` when the caller names none.
GemmPlan plan_gemm(const GroupedGemmProblem& p, const GemmDevice& device);
// Every plan this build can run `p` with (the planner's pick among them).
std::vector<GemmPlan> gemm_plan_candidates(const GroupedGemmProblem& p, const GemmDevice& device);
// Empty when `plan` can run `p`, else why not (for moekit::Error messages).
std::string gemm_plan_rejection(const GemmPlan& plan, const GroupedGemmProblem& p,
                                const GemmDevice& device);

// fp8_sm90 128x256 from this many rows a contiguous group on average (plan_gemm_fp8).
constexpr int64_t kFp8FastMinRows = 256;
// With block scales (promoted in 64-column chunks), from this many: H100, the FP8 block
// layers at T = 4096 (Kimi-K2's 85 rows a group the fewest) 0.90x-0.91x of 128 x 128.
constexpr int64_t kFp8BlockWideMinRows = 80;
// Masked block-scaled groups of at most kFp8BlockWideMaskedMaxRows rows (max_m) take
// fp8_sm90 128x256 from this k where its waves are not much longer (plan_gemm_fp8; H200, the
// page's ds-v3-e8, ds-v3-dec-b64 and kimi-k2-dec-b64 rows at k = 2048 and 7168: 0.88x-0.96x
// of 128 x 128; qwen3-235b-dec-b64-down at k = 1536: 1.03x-1.06x).
constexpr int64_t kFp8BlockWideMaskedMinK = 2048;
constexpr int64_t kFp8BlockWideMaskedMaxRows = 128;  // the measured rows' max_m: 64 and 128
// fp8_sm90 128x256 up to this k: it sums the whole k in the fp8 wgmma's accumulator, which
// keeps ~13 mantissa bits, so its error grows with k; at k = 7168 1.2% of a silu_and_mul
// GEMM's elements fell outside the bf16 tolerance (H100, test_gemm's contig_long_k7168).
constexpr int64_t kFp8FastMaxK = 4096;
// The same for the FP8 grouped GEMM: kFp8Sm90, every layout, scale mode and activation (k == 0:
// the fill of the empty sums).
GemmPlan plan_gemm_fp8(const GroupedGemmFP8Problem& p, const GemmDevice& device);
std::vector<GemmPlan> gemm_fp8_plan_candidates(const GroupedGemmFP8Problem& p,
                                               const GemmDevice& device);
std::string gemm_fp8_plan_rejection(const GemmPlan& plan, const GroupedGemmFP8Problem& p,
                                    const GemmDevice& device);

// The two GEMMs of a gated MLP: `up` (silu_and_mul into act) then `down` (from act).
// kTwoGemms or kChain (one persistent SM90 launch).
MlpPlan plan_mlp_gemms(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                       const GemmDevice& device);
std::vector<MlpPlan> mlp_gemms_plan_candidates(const GroupedGemmProblem& up,
                                               const GroupedGemmProblem& down,
                                               const GemmDevice& device);
std::string mlp_gemms_plan_rejection(const MlpPlan& plan, const GroupedGemmProblem& up,
                                     const GroupedGemmProblem& down, const GemmDevice& device);
// Runs (up, down) as `plan` says, or throws moekit::Error naming `op` when it cannot.
// scratch: kSm90MlpChainScratchBytes (kChain), may be null otherwise.
void run_mlp_gemms(const MlpPlan& plan, const GroupedGemmProblem& up,
                   const GroupedGemmProblem& down, void* scratch, cudaStream_t stream,
                   const char* op = "moe_expert_mlp");

// Rows per group the planner goes by: contiguous, the rows without alignment padding over
// the groups; masked, max_m (an upper bound: the counts live on the device); dense, m.
int64_t average_rows_per_group(const GroupedGemmProblem& p);

}  // namespace moekit::detail
