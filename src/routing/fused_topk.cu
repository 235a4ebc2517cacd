// FusedTopKFwd kernel: one warp per token, the whole row (E <= 1024) in registers.
//
// Expert e lives in lane e % 32, slot e / 32, so the row loads are coalesced.
// sel values become order-preserving 32-bit keys (>= 1; 0 means "none"). Each of
// the K picks is two REDUX warp reductions: the largest key, then the lowest expert
// id holding it (the tie rule: equal sel -> lower id); every lane then recomputes its
// own best (key, slot, score) as a balanced tree over its slots.
// Grouped routing: when a group is exactly one 32-expert slot (DeepSeek-V3: 8
// groups of 32) a warp reduction per slot gives every lane every group score;
// otherwise sel is staged in shared memory, one lane per group computes the group
// score and a group is kept when fewer than topk_group groups beat it (score, then
// lower group index). Either way exactly topk_group groups are kept.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "core/device.h"
#include "core/dtype.cuh"
#include "core/dtype_dispatch.h"
#include "core/kernel_launch.h"
#include "core/pdl.cuh"
#include "routing/fused_topk_kernel.h"

namespace moekit::detail {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;

// Monotone map float -> uint32 (total order, -0 < +0, NaNs at the ends by their sign).
__device__ __forceinline__ uint32_t ordered_bits(float f) {
  uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Correctly rounded 1/x for x in [1, 2^126): the fast path of __frcp_rn.
__device__ __forceinline__ float rcp_rn_normal(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return fmaf(r, fmaf(-x, r, 1.f), r);
}

__device__ __forceinline__ float from_ordered_bits(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// max / min that return NaN when either operand is NaN (fmaxf / fminf skip it): the group
// scores carry a NaN sel through their reductions at no extra instruction.
__device__ __forceinline__ float max_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float min_nan(float a, float b) {
  float d;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

// The selection key of a sel value or a group score: ordered_bits, except that every NaN,
// whatever its sign and payload, ranks above every number (as torch.topk ranks NaN), so a
// NaN is picked first and its NaN weight shows in the output (docs/routing-permute.md).
// max.NaN turns any NaN into the canonical 0x7fffffff (PTX), whose ordered bits are
// 0xffffffff, and returns every number unchanged (-0 included): one FMNMX instead of a
// NaN test and a select.
__device__ __forceinline__ uint32_t sel_key(float f) {
  return ordered_bits(max_nan(f, -INFINITY));
}

__device__ __forceinline__ float warp_max_nan(float v) {
#pragma unroll
  for (int off = 16; off; off >>= 1) v = max_nan(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// kEarlyTrigger: a compile-time choice, since a run-time flag rescheduled the loads
// (docs/routing-permute.md, "FusedTopK's trigger and grid balance").
// kMapped (the layer ops with an expert map, docs/moe.md "Engine inputs"): each picked
// global id is written as expert_map[id] when that is in [0, num_local), else -1; the
// unmapped instances never read the two trailing parameters (their code is unchanged).
template <class T, int kSlots, bool kEarlyTrigger, bool kMapped>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    fused_topk_kernel(const T* __restrict__ gating, const float* __restrict__ bias,
                      int64_t num_tokens, int E, int K, bool softmax, bool renormalize,
                      int num_groups, int topk_group, float scale, float* __restrict__ out_w,
                      int32_t* __restrict__ out_ids, const int32_t* __restrict__ expert_map,
                      int num_local) {
  extern __shared__ __align__(16) unsigned char smem_raw[];  // grouped, general group size
  pdl_wait();  // PDL: the previous kernel's writes of gating / reads of the outputs are done
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= num_tokens) return;
  const T* row = gating + t * E;

  // Every global load is issued here, before any math: the bias loads do not wait
  // for the scores (one memory round trip instead of two).
  float score[kSlots], bv[kSlots];
  uint32_t avail = 0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = s * 32 + lane;
    score[s] = e < E ? to_float(row[e]) : -INFINITY;
    bv[s] = (bias != nullptr && e < E) ? __ldg(bias + e) : 0.f;
    if (e < E) avail |= 1u << s;
  }
  // Every global load is issued: the next kernel may launch (grids that could leave
  // it unbalanced skip this, see fused_topk_early_trigger; their CTAs' exits count).
  if constexpr (kEarlyTrigger) pdl_trigger();
  if (softmax) {
    // The row max as one REDUX over order-preserving keys (NaNs skipped like fmaxf;
    // a +-0 difference does not change any exp(x - m)).
    uint32_t mk = ordered_bits(-INFINITY);
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (!isnan(score[s])) mk = max(mk, ordered_bits(score[s]));
    const float m = from_ordered_bits(__reduce_max_sync(kFullMask, mk));
    // expf on every slot, then a select: no branch per slot, so the slots overlap.
    float v[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) v[s] = expf(score[s] - m);
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      score[s] = ((avail >> s) & 1u) ? v[s] : 0.f;
      sum += score[s];
    }
    const float inv = 1.f / warp_sum(sum);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) score[s] *= inv;
  } else {
    // __frcp_rn(x) without its per-call slow-path branch (which serializes the slots):
    // for x in [1, 2^126) it is exactly MUFU.RCP + one Newton step, which is what
    // __frcp_rn runs there. x >= 2^126 (results below the normal range), Inf and NaN
    // take the exact routine; padding slots get x = 1 (never selected).
    float x[kSlots];
    bool slow = false;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) x[s] = 1.f + expf(-score[s]);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      x[s] = ((avail >> s) & 1u) ? x[s] : 1.f;
      slow |= !(x[s] < 0x1p126f);
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) score[s] = rcp_rn_normal(x[s]);
    if (slow) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) score[s] = __frcp_rn(x[s]);  // == 1/(1+e)
    }
  }

  float sel[kSlots];
  uint32_t key[kSlots];  // >= 1 for every real expert: 0 means "nothing"
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = s * 32 + lane;
    sel[s] = score[s];
    if (bias != nullptr && e < E) sel[s] += bv[s];
    key[s] = sel_key(sel[s]);  // >= 0x007fffff (the key of -inf): never "nothing"
  }

  if (num_groups > 0 && topk_group < num_groups) {
    if (E == num_groups * 32) {
      // Group g is slot g: a warp reduction per slot gives every lane all group scores. A
      // group holding a NaN sel scores NaN (the reductions propagate it), which sel_key
      // ranks above every number.
      float gs[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        float a = s < num_groups ? sel[s] : -INFINITY, b = -INFINITY;
        if (bias != nullptr) {
#pragma unroll
          for (int off = 16; off; off >>= 1) {
            const float a2 = __shfl_xor_sync(kFullMask, a, off);
            const float b2 = __shfl_xor_sync(kFullMask, b, off);
            b = max_nan(min_nan(a, a2), max_nan(b, b2));  // second best of the union
            a = max_nan(a, a2);
          }
          gs[s] = a + b;
        } else {
          gs[s] = warp_max_nan(a);
        }
      }
      uint32_t gk[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) gk[s] = sel_key(gs[s]);
      // Rank: group s is kept when fewer than topk_group groups beat it (a larger
      // score, or an equal one at a lower index). All comparisons are independent.
      uint32_t kept = 0;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        int better = 0;
#pragma unroll
        for (int s2 = 0; s2 < kSlots; ++s2) {
          if (s2 == s) continue;
          const bool b = s2 < s ? gk[s2] >= gk[s] : gk[s2] > gk[s];
          better += (s2 < num_groups && b) ? 1 : 0;
        }
        if (s < num_groups && better < topk_group) kept |= 1u << s;
      }
      avail &= kept;
    } else {
      float* s_sel = reinterpret_cast<float*>(smem_raw) + warp * E;
      unsigned long long* s_gkey =
          reinterpret_cast<unsigned long long*>(smem_raw + kWarpsPerBlock * E * sizeof(float)) +
          warp * num_groups;
      unsigned char* s_kept = smem_raw + kWarpsPerBlock * E * sizeof(float) +
                              kWarpsPerBlock * num_groups * sizeof(unsigned long long) +
                              warp * num_groups;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int e = s * 32 + lane;
        if (e < E) s_sel[e] = sel[s];
      }
      __syncwarp();
      const int G = E / num_groups;
      for (int g = lane; g < num_groups; g += 32) {
        float top1 = -INFINITY, top2 = -INFINITY;
        bool nan_in_group = false;  // then the group scores NaN (fmaxf skips it)
#pragma unroll 4
        for (int j = 0; j < G; ++j) {
          const float v = s_sel[g * G + j];
          top2 = fmaxf(top2, fminf(top1, v));
          top1 = fmaxf(top1, v);
          nan_in_group |= isnan(v);
        }
        const float gsc = (bias != nullptr && G >= 2) ? top1 + top2 : top1;
        const uint32_t gkey = nan_in_group ? 0xffffffffu : sel_key(gsc);
        s_gkey[g] = (static_cast<unsigned long long>(gkey) << 32) |
                    static_cast<uint32_t>(~static_cast<uint32_t>(g));
      }
      __syncwarp();
      for (int g = lane; g < num_groups; g += 32) {
        const unsigned long long mine = s_gkey[g];
        int better = 0;
        for (int h = 0; h < num_groups; ++h) better += s_gkey[h] > mine;
        s_kept[g] = better < topk_group;
      }
      __syncwarp();
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int e = s * 32 + lane;
        if (e < E && !s_kept[e / G]) avail &= ~(1u << s);
      }
    }
  }

  float my_w = 0.f, wsum = 0.f;
  int my_id = -1;
  // Unavailable experts (padding lanes, dropped groups) get key 0.
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
    if (!((avail >> s) & 1u)) key[s] = 0;
  // Lane-local best as a balanced tree over the slots (depth log2(kSlots) instead
  // of a kSlots-long compare chain): the largest key, the lowest slot on ties
  // (the lower half of every pair wins an equal key).
  uint32_t bk;
  int bslot;
  float bscore;
  auto lane_best = [&]() {
    uint32_t tk[kSlots];
    int ts[kSlots];
    float tv[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      tk[s] = key[s];
      ts[s] = s;
      tv[s] = score[s];
    }
#pragma unroll
    for (int w = 1; w < kSlots; w <<= 1) {
#pragma unroll
      for (int s = 0; s + w < kSlots; s += 2 * w) {
        const bool up = tk[s + w] > tk[s];
        tk[s] = up ? tk[s + w] : tk[s];
        ts[s] = up ? ts[s + w] : ts[s];
        tv[s] = up ? tv[s + w] : tv[s];
      }
    }
    bk = tk[0];
    bslot = ts[0];
    bscore = tv[0];
  };
  lane_best();
  for (int k = 0; k < K; ++k) {
    const uint32_t m = __reduce_max_sync(kFullMask, bk);
    if (m == 0) break;  // fewer selectable experts than K: excluded by validation
    const uint32_t id = __reduce_min_sync(
        kFullMask, bk == m ? static_cast<uint32_t>(bslot * 32 + lane) : 0xffffffffu);
    const int owner = static_cast<int>(id & 31u);
    const float w = __shfl_sync(kFullMask, bscore, owner);
    wsum += w;  // k order
    if (lane == k) {
      my_w = w;
      my_id = static_cast<int>(id);
    }
    // The owner drops the pick (no branch: every lane recomputes its best).
    const int dropped = lane == owner ? static_cast<int>(id >> 5) : -1;
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (s == dropped) key[s] = 0;
    lane_best();
  }
  if (lane < K) {
    float w = my_w;
    if (renormalize) w = w / wsum;
    w *= scale;
    out_w[t * K + lane] = w;
    int id = my_id;
    if constexpr (kMapped) {
      // my_id is a picked expert in [0, E) (E = the map's length), or -1 where the loop
      // stopped early (fewer selectable experts than K, excluded by validation): never
      // read expert_map[-1].
      const int local = id >= 0 ? __ldg(expert_map + id) : -1;
      id = local >= 0 && local < num_local ? local : -1;
    }
    out_ids[t * K + lane] = id;
  }
}

// Grids up to this many blocks trigger early without asking the device (fewer blocks
// than any Hopper part has SMs).
constexpr int64_t kTopKSmallGridBlocks = 64;

template <class T, int kSlots, bool kMapped>
void launch_typed(const FusedTopKLaunch& l, cudaStream_t stream) {
  const TopKParams& p = l.params;
  const bool grouped = p.num_expert_group > 0 && p.topk_group < p.num_expert_group;
  const size_t smem = grouped ? kWarpsPerBlock * (static_cast<size_t>(l.num_experts) * 4 +
                                                  static_cast<size_t>(p.num_expert_group) * 9)
                              : 0;
  const int64_t blocks = (l.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // Staged grouping past 512 experts can pass 48 KiB (E = 1024 in 1024 groups: 52 KiB);
  // up to 512 experts it stays below 27 KiB, so those launches set nothing. Before the
  // occupancy query, which counts the same bytes.
  if constexpr (kSlots > 16) {
    if (smem > 48 * 1024) {
      raise_smem_limit<fused_topk_kernel<T, kSlots, true, kMapped>>(static_cast<int>(smem));
      raise_smem_limit<fused_topk_kernel<T, kSlots, false, kMapped>>(static_cast<int>(smem));
    }
  }
  auto kernel = fused_topk_kernel<T, kSlots, true, kMapped>;
  if (blocks > kTopKSmallGridBlocks) {  // small grids always trigger: no host queries
    const bool early = fused_topk_early_trigger(
        blocks, std::max(device_props().sms, 1),
        blocks_per_sm(reinterpret_cast<const void*>(kernel), kWarpsPerBlock * 32, smem));
    if (!early) kernel = fused_topk_kernel<T, kSlots, false, kMapped>;
  }
  launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kWarpsPerBlock * 32), smem, stream,
             static_cast<const T*>(l.gating), l.bias, l.num_tokens, l.num_experts, p.top_k,
             p.scoring_func == ScoringFunc::kSoftmax, p.renormalize, p.num_expert_group,
             p.topk_group, p.routed_scaling_factor, l.topk_weights, l.topk_ids, l.expert_map,
             l.num_local);
}

template <class T, bool kMapped>
void launch_slots(const FusedTopKLaunch& l, cudaStream_t stream) {
  // Slot counts are bucketed to keep the number of instantiations small.
  if (l.num_experts <= 128) {
    launch_typed<T, 4, kMapped>(l, stream);
  } else if (l.num_experts <= 256) {
    launch_typed<T, 8, kMapped>(l, stream);
  } else if (l.num_experts <= 384) {
    launch_typed<T, 12, kMapped>(l, stream);
  } else if (l.num_experts <= 512) {
    launch_typed<T, 16, kMapped>(l, stream);
  } else {
    launch_typed<T, 32, kMapped>(l, stream);  // E > 512 only: 32 slots fill the u32 `avail` mask
  }
}

template <class T>
void launch_mapped_or_not(const FusedTopKLaunch& l, cudaStream_t stream) {
  if (l.expert_map != nullptr) {
    launch_slots<T, true>(l, stream);
  } else {
    launch_slots<T, false>(l, stream);
  }
}

}  // namespace

void launch_fused_topk(const FusedTopKLaunch& l, cudaStream_t stream) {
  if (l.num_tokens == 0) return;
  dispatch_float</*kWithF32=*/true>(l.dtype, "fused_topk", [&](auto in_type) {
    launch_mapped_or_not<typename decltype(in_type)::type>(l, stream);
  });
  check_launch("fused_topk");
}

}  // namespace moekit::detail
