// Host side of the grouped-GEMM engine: runs the plans gemm_planner.cpp makes.
#include "gemm/grouped_gemm.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/check.h"
#include "gemm/gemm_planner.h"
#include "gemm/grouped_gemm_fp8.h"
#include "gemm/launch.h"
#include "moekit/error.h"

namespace moekit::detail {
namespace {

std::atomic<int64_t> g_chain_launches{0};

template <int S>
int splitk_clusters_query() {
  return splitk_co_resident_clusters(S);
}

template <int... S>
void fill_splitk_clusters(GemmDevice& d, std::integer_sequence<int, S...>) {
  ((d.splitk_clusters[S + 1] =
        device_cached(kSplitKClusterSlot + S + 1, &splitk_clusters_query<S + 1>)),
   ...);
}

[[noreturn]] void reject(const char* op, const GemmPlan& plan, const std::string& why) {
  throw Error(std::string("moekit::") + op + ": plan \"" + to_string(plan) +
              "\" cannot run these arguments: " + why);
}

}  // namespace

GemmDevice current_gemm_device() {
  GemmDevice d(device_props());
  // Off sm_90 nothing picks the split-K kernel's cluster capacities (none to query).
  if (d.props.sm90()) {
    fill_splitk_clusters(d, std::make_integer_sequence<int, kMaxSplitK>{});
  }
  return d;
}

bool grouped_gemm_launches(const GroupedGemmProblem& p) {
  const int64_t rows = p.rows == GemmRows::kMasked ? p.max_m : p.m;
  return !(rows <= 0 || p.n <= 0 || (p.rows != GemmRows::kDense && p.num_groups <= 0));
}

void run_grouped_gemm(const GroupedGemmProblem& p, cudaStream_t stream, const char* op) {
  if (!grouped_gemm_launches(p)) return;
  const std::string why = gemm_plan_rejection(p.plan, p, current_gemm_device());
  if (!why.empty()) reject(op, p.plan, why);
  if (p.b_scale != nullptr) {
    launch_grouped_gemm_fp8_weights(p, stream);
    check_launch(op);
    return;
  }
  const bool bf16 = p.in_dtype == DType::kBF16;
  switch (p.plan.kernel) {
    case GemmKernel::kSm90:
      bf16 ? launch_grouped_gemm_sm90_bf16(p, stream) : launch_grouped_gemm_sm90_f16(p, stream);
      break;
    case GemmKernel::kSm90Pairs:
      bf16 ? launch_grouped_gemm_sm90_pair_bf16(p, stream)
           : launch_grouped_gemm_sm90_pair_f16(p, stream);
      break;
    default:
      bf16 ? launch_grouped_gemm_bf16(p, stream) : launch_grouped_gemm_f16(p, stream);
      break;
  }
  check_launch(op);
}

void run_mlp_gemms(const MlpPlan& plan, const GroupedGemmProblem& up_in,
                   const GroupedGemmProblem& down_in, void* scratch, cudaStream_t stream,
                   const char* op) {
  GroupedGemmProblem up = up_in, down = down_in;
  up.plan = plan.gate_up;
  down.plan = plan.down;
  if (!grouped_gemm_launches(up) && !grouped_gemm_launches(down)) return;
  const std::string why = mlp_gemms_plan_rejection(plan, up, down, current_gemm_device());
  if (!why.empty()) {
    throw Error(std::string("moekit::") + op + ": plan \"" + to_string(plan) +
                "\" cannot run these arguments: " + why);
  }
  if (plan.path != MlpPath::kChain) {
    run_grouped_gemm(up, stream, op);
    run_grouped_gemm(down, stream, op);
    return;
  }
  if (!scratch) throw Error(std::string("moekit::") + op + ": internal: the chain needs scratch");
  const bool pairs = plan.gate_up.kernel == GemmKernel::kSm90Pairs;
  up.in_dtype == DType::kBF16 ? launch_mlp_chain_sm90_bf16(up, down, scratch, pairs, stream)
                              : launch_mlp_chain_sm90_f16(up, down, scratch, pairs, stream);
  check_launch(op);
  g_chain_launches.fetch_add(1, std::memory_order_relaxed);
}

int64_t sm90_mlp_chain_launches() {
  return g_chain_launches.load(std::memory_order_relaxed);
}

Fp8ScaleIndex fp8_scale_index(Fp8Scales scales, int64_t b_rows, int64_t k) {
  const int64_t kb = (k + 127) / 128;
  Fp8ScaleIndex s;
  switch (scales) {
    case Fp8Scales::kBlock:
      s.a_row = kb;
      s.a_kb = 1;
      s.b_group = (b_rows + 127) / 128 * kb;
      s.b_row_div = 128;
      s.b_row = kb;
      s.b_kb = 1;
      break;
    case Fp8Scales::kPerChannel:
      s.a_row = 1;
      s.b_group = b_rows;
      s.b_row = 1;
      break;
    case Fp8Scales::kPerTensor:
      s.b_group = 1;
      break;
  }
  return s;
}

void run_grouped_gemm_fp8(const GroupedGemmFP8Problem& p, cudaStream_t stream) {
  const char* op = "moe_grouped_gemm_fp8";
  if (fp8_total_rows(p) <= 0 || p.n <= 0 || p.num_groups <= 0) return;
  const std::string why = gemm_fp8_plan_rejection(p.plan, p, current_gemm_device());
  if (!why.empty()) reject(op, p.plan, why);
  // k == 0 reads no operand and no scale: the empty sums' value, whatever the plan.
  if (p.k == 0) {
    launch_fp8_empty_sums(p, stream);
  } else if (p.plan.tile_n == 256 && p.scales == Fp8Scales::kBlock) {
    launch_grouped_gemm_sm90_fp8_block256(p, stream);
  } else if (p.plan.tile_n == 256) {
    launch_grouped_gemm_sm90_fp8_fast(p, stream);
  } else {
    launch_grouped_gemm_sm90_fp8(p, stream);
  }
  check_launch(op);
}

}  // namespace moekit::detail
