// Host side of the direct dense MLP: per-GEMM plan (k split over a cluster, k slice,
// tokens per tile) and the two launches. Kernel: direct_mlp_kernel.cuh.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "core/pdl.h"
#include "gemm/sm90/device.h"
#include "mlp/direct_mlp.h"
#include "mlp/direct_mlp_kernel.cuh"
#include "mlp/streamk_mlp.h"
#include "moekit/error.h"

namespace moekit::detail {
namespace {

namespace dg = gemm::direct;

constexpr int kMaxDevices = 64;
constexpr int kMaxSmem = 200 * 1024;
constexpr int kSliceAlign = dg::kBatch * dg::kChunkK;  // whole load batches per slice

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The kernel of a plan's tile width, its shared-memory limit raised (once per device).
template <typename T, typename Mma, typename Out, bool kSilu>
const void* prepared_kernel(int tn) {
  const void* kernel =
      tn == 8 ? reinterpret_cast<const void*>(dg::direct_gemm_kernel<T, Mma, Out, 8, kSilu>)
              : reinterpret_cast<const void*>(dg::direct_gemm_kernel<T, Mma, Out, 32, kSilu>);
  static bool attr_set[2][kMaxDevices] = {};  // per instantiation and device
  int device = 0;
  cudaGetDevice(&device);
  if (device < 0 || device >= kMaxDevices) device = 0;
  bool& set = attr_set[tn == 8 ? 0 : 1][device];
  if (!set) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem) !=
        cudaSuccess)
      throw Error("moekit: direct MLP: cannot reserve its shared memory on this device");
    set = true;
  }
  return kernel;
}

// Clusters of `split` CTAs with `smem` bytes each of `kernel` the device holds at once
// (cached: the query costs a driver call).
int cluster_capacity(const void* kernel, int split, int smem) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, int>, int> cache;
  int device = 0;
  cudaGetDevice(&device);
  const auto key = std::make_tuple(device, kernel, split, smem);
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(split));
  cfg.blockDim = dim3(dg::kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(split);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();  // not fatal: the plan keeps its first choice
    clusters = 0;
  }
  cache[key] = clusters;
  return clusters;
}

// Weight elements per row that each CTA prefetches into L2 before its loads start (its
// slice's head; docs/dense-mlp.md "Direct dense MLP"): 256 by default, MOEKIT_DIRECT_PF (gate_up)
// and MOEKIT_DIRECT_PF_DOWN (down; default: gate_up's) override, 0 turns it off. H200,
// moekit-bench: 128-320 all helped, 512 and more delayed x and lost.
constexpr int kDefaultPrefetchElems = 256;
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? std::atoi(v) : fallback;
}
// How the direct kernels load weight lines (docs/dense-mlp.md "Direct dense MLP", H200 session
// 6): paired lanes (a warp instruction reads 4 whole 128-byte lines, not 16 halves) where a
// CTA's k slice is >= 1024 (ds-v3's 32-token gate_up), else single lanes with a 128-byte
// L2 fetch. SharedExpertMLP, interleaved on one GPU: ds-v3-t32 0.0352 -> 0.0333 ms (pairing
// on gate_up alone: 0.0335), glm45-t32 0.0238 -> 0.0236 (pairing lost there: 0.0241).
// MOEKIT_DIRECT_PAIR (bit 0 gate_up, bit 1 down) and MOEKIT_DIRECT_L2FETCH / _DOWN (0, 128, 256)
// override.
constexpr int kPairMinSlice = 1024;
int direct_pair_rows(bool silu, int k_slice) {
  if (direct_mlp_load_mode_override() > 0) return direct_mlp_load_mode_override() == 2;
  static const int env = env_int("MOEKIT_DIRECT_PAIR", -1);
  return env >= 0 ? (env >> (silu ? 0 : 1)) & 1 : k_slice >= kPairMinSlice;
}
int direct_l2_fetch(bool silu, bool pair) {
  static const int up = env_int("MOEKIT_DIRECT_L2FETCH", -1);
  static const int down = env_int("MOEKIT_DIRECT_L2FETCH_DOWN", up);
  const int v = silu ? up : down;
  if (v < 0) return pair ? 0 : 128;  // paired loads already ask for whole lines
  return v == 128 || v == 256 ? v : 0;
}
int direct_prefetch_elems(bool silu) {
  static const int up = std::max(0, env_int("MOEKIT_DIRECT_PF", kDefaultPrefetchElems)) / 8 * 8;
  static const int down = std::max(0, env_int("MOEKIT_DIRECT_PF_DOWN", up)) / 8 * 8;
  return silu ? up : down;
}

// The cluster sum's form (dg::kReduce*; the kernel's comment): push by default (H200,
// SharedExpertMLP, interleaved: ds-v3-t32 0.0342 -> 0.0308 ms, glm45-t32 0.0254 -> 0.0215;
// batched pull 0.0329 / 0.0235); MOEKIT_DIRECT_REDUCE (0 pull, 1 batched pull) or the test
// knob override.
int direct_reduce_mode() {
  if (direct_mlp_reduce_override() >= 0) return direct_mlp_reduce_override();
  static const int env = env_int("MOEKIT_DIRECT_REDUCE", dg::kReducePush);
  return env >= dg::kReducePull && env <= dg::kReducePush ? env : dg::kReducePush;
}

template <typename T, typename Mma, typename Out, bool kSilu>
DirectGemmPlan plan_for(int64_t T_, int64_t n_out, int64_t k, int sms) {
  const ClusterCapacity capacity = [&](int split, int smem) {
    const int tn = T_ <= 8 ? 8 : 32;
    return split == 1 ? 1 << 30  // no cluster: any number of CTAs queue behind each other
                      : cluster_capacity(prepared_kernel<T, Mma, Out, kSilu>(tn), split, smem);
  };
  static const int forced_up = env_int("MOEKIT_DIRECT_SPLIT_UP", 0);
  static const int forced_down = env_int("MOEKIT_DIRECT_SPLIT_DOWN", 0);
  const int forced = direct_mlp_split_override() > 0 ? direct_mlp_split_override()
                                                     : (kSilu ? forced_up : forced_down);
  return direct_gemm_plan(T_, n_out, k, kSilu, sms, capacity, forced);
}

void launch(const void* kernel, const DirectGemmPlan& pl, const dg::Params& p,
            cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(pl.split), static_cast<unsigned>(pl.row_groups));
  cfg.blockDim = dim3(dg::kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(pl.smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pl.split > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(pl.split);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (p.pdl != dg::kPdlNone) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  void* args[] = {const_cast<dg::Params*>(&p)};
  cudaLaunchKernelExC(&cfg, kernel, args);
}

bool dims_fit(int64_t T, int64_t H, int64_t S) {
  constexpr int64_t kMaxDim = int64_t{1} << 30;
  return T >= 1 && T <= kDirectMlpMaxTokens && H >= 8 && S >= 8 && H <= kMaxDim && S <= kMaxDim &&
         H % 8 == 0 && S % 8 == 0;
}

}  // namespace

DirectGemmPlan direct_gemm_plan(int64_t T, int64_t n_out, int64_t k, bool silu, int sms,
                                const ClusterCapacity& capacity, int force_split) {
  DirectGemmPlan pl;
  pl.tn = T <= 8 ? 8 : 32;
  pl.row_groups = static_cast<int>(
      ceil_div(n_out, silu ? dg::cols_per_cta<true>() : dg::cols_per_cta<false>()));
  const auto with_split = [&](int64_t want, int64_t max_split = dg::kMaxSplit) {
    const int64_t split = std::clamp<int64_t>(want, 1, max_split);
    const int64_t slice = ceil_div(ceil_div(k, split), kSliceAlign) * kSliceAlign;
    pl.split = static_cast<int>(ceil_div(k, slice));
    pl.k_slice = static_cast<int>(slice);
    pl.smem =
        pl.tn * (pl.k_slice + dg::kXPad) * 2 + dg::reduce_slots(pl.split) * (pl.tn / 8) * 32 * 16;
  };
  if (force_split > 0) {  // taken as it is where its x slice fits the shared memory
    with_split(force_split);
    if (pl.smem <= kMaxSmem) return pl;
  }
  // Enough CTAs for ~2 per SM (the loads in flight that the memory's rate needs), a k
  // slice whose x fits the shared memory at 2-3 CTAs per SM, at most 8 ranks.
  const int64_t k_max = pl.tn == 8 ? 4096 : 1024;
  with_split(std::max<int64_t>(ceil_div(k, k_max), ceil_div(2 * sms, pl.row_groups)));
  if (!capacity) return pl;
  // Then the largest split at or below it whose clusters all fit at once, if any does.
  const DirectGemmPlan first = pl;
  for (int s = first.split; s >= 1; --s) {
    with_split(s);
    if (pl.split == s && pl.smem <= kMaxSmem && capacity(s, pl.smem) >= pl.row_groups) return pl;
  }
  return first;
}

bool direct_mlp_preferred(int64_t T, int64_t H, int64_t S) {
  const int forced = dense_mlp_forced_path();
  if (forced != 0) return forced == 3;
  return T <= kDirectMlpDefaultMaxTokens && 3 * H * S * 2 < kStreamkMlpMinWeightBytes;
}

bool direct_mlp_supported(DType dtype, int64_t T, int64_t H, int64_t S) {
  if ((dtype != DType::kBF16 && dtype != DType::kF16) || !dims_fit(T, H, S)) return false;
  const int sms = sm90_sm_count();
  if (sms == 0) return false;
  return direct_gemm_plan(T, S, H, true, sms).smem <= kMaxSmem &&
         direct_gemm_plan(T, H, S, false, sms).smem <= kMaxSmem;
}

namespace {

// out [T, n_out] = x [T, K] w [rows, K]^T under plan pl.
dg::Params gemm_params(const void* x, const void* w, void* out, int64_t T, int64_t K, int64_t n_out,
                       const DirectGemmPlan& pl, int pdl) {
  return {x,
          w,
          out,
          static_cast<int>(T),
          static_cast<int>(K),
          static_cast<int>(n_out),
          pl.k_slice,
          pl.k_slice + dg::kXPad,
          pdl,
          0,
          0,
          0,
          0,
          dg::kReducePull};
}

template <typename E, typename Mma, typename Out>
void run_typed(const void* x, int64_t T, int64_t H, int64_t S, const void* w_gate_up,
               const void* w_down, void* act, void* out, cudaStream_t stream) {
  const int sms = sm90_sm_count();
  const bool pdl = pdl_enabled();
  const DirectGemmPlan up = plan_for<E, Mma, E, true>(T, S, H, sms);
  const DirectGemmPlan down = plan_for<E, Mma, Out, false>(T, H, S, sms);
  dg::Params pu = gemm_params(x, w_gate_up, act, T, H, S, up, pdl ? dg::kPdlFirst : dg::kPdlNone);
  dg::Params pd = gemm_params(act, w_down, out, T, S, H, down, pdl ? dg::kPdlSecond : dg::kPdlNone);
  // x's copies before the first weight batch: at 32 tokens x is 4x the bytes and its
  // staging gates the k loop (H200: ds-v3-t32 35.7-35.9 -> 35.1 us, glm45-t32 24.2 ->
  // 23.8); at one token it lost 0.3 us. MOEKIT_DIRECT_XFIRST=0 / 1 forces it.
  static const int x_first_env = env_int("MOEKIT_DIRECT_XFIRST", -1);
  pu.x_first = x_first_env >= 0 ? x_first_env : up.tn == 32;
  pd.x_first = x_first_env >= 0 ? x_first_env : down.tn == 32;
  pu.pair_rows = direct_pair_rows(true, up.k_slice);
  pd.pair_rows = direct_pair_rows(false, down.k_slice);
  pu.l2_fetch = direct_l2_fetch(true, pu.pair_rows != 0);
  pd.l2_fetch = direct_l2_fetch(false, pd.pair_rows != 0);
  pu.prefetch = direct_prefetch_elems(true);
  pd.prefetch = direct_prefetch_elems(false);
  pu.reduce = pd.reduce = direct_reduce_mode();
  launch(prepared_kernel<E, Mma, E, true>(up.tn), up, pu, stream);
  launch(prepared_kernel<E, Mma, Out, false>(down.tn), down, pd, stream);
}

}  // namespace

void run_direct_mlp(DType dtype, const void* x, int64_t T, int64_t H, int64_t S,
                    const void* w_gate_up, const void* w_down, void* act, void* out,
                    DType out_dtype, cudaStream_t stream) {
  if (!direct_mlp_supported(dtype, T, H, S))
    throw Error("moekit: direct MLP called for a shape or device it does not support");
  const bool f32 = out_dtype == DType::kF32;
  if (dtype == DType::kBF16) {
    if (f32)
      run_typed<__nv_bfloat16, gemm::MmaBF16, float>(x, T, H, S, w_gate_up, w_down, act, out,
                                                     stream);
    else
      run_typed<__nv_bfloat16, gemm::MmaBF16, __nv_bfloat16>(x, T, H, S, w_gate_up, w_down, act,
                                                             out, stream);
  } else {
    if (f32)
      run_typed<__half, gemm::MmaF16, float>(x, T, H, S, w_gate_up, w_down, act, out, stream);
    else
      run_typed<__half, gemm::MmaF16, __half>(x, T, H, S, w_gate_up, w_down, act, out, stream);
  }
}

int& direct_mlp_load_mode_override() {
  static int v = 0;
  return v;
}

int& direct_mlp_reduce_override() {
  static int v = -1;
  return v;
}

int& direct_mlp_split_override() {
  static int v = 0;
  return v;
}

#if defined(MOEKIT_DIRECT_TRACE)
// The timeline probe's buffer (bench/tools/direct_trace): nullptr turns the stamps off.
void set_direct_trace_buffer(unsigned long long* buffer) {
  cudaMemcpyToSymbol(dg::g_direct_trace, &buffer, sizeof(buffer));
}
#endif

}  // namespace moekit::detail
