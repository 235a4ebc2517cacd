// The stream-K dense MLP for few tokens (docs/dense-mlp.md "Stream-K MLP"): one persistent,
// cooperative kernel runs both GEMMs of out = (silu(x Wg^T) * (x Wu^T)) Wd^T for T <= 64
// rows. Both GEMMs stream their weights at the memory's speed; the tokens are the narrow
// side (swap-AB: weight rows fill the 16-row side of mma.sync m16n8k16).
//
// Work: phase 1 (gate_up) has tiles1 = ceil(S / 32) tiles of 32 gate + 32 up weight rows,
// phase 2 (down) tiles2 = ceil(H / 64) tiles of 64 rows; a tile's k is cut into 128-wide
// iterations. Each phase's (tile, k) iterations are split evenly over the CTAs (one per
// SM), so a CTA's range may start or end inside a tile (stream-K): such partial sums go
// to an f32 workspace slot, and the last contributor to arrive (a counter per tile) adds
// all of the tile's partials in CTA order (deterministic) and runs the epilogue.
//
// Warps: 0-3 consume (16 weight rows each), 4 loads the weights (TMA), 5 the
// activations (TMA: x in phase 1, the phase-1 output h in phase 2). Both producers walk
// the CTA's phase-1 then phase-2 iterations through one ring of stages; the weight
// producer never waits for phase 1 to finish, so down's weights stream into the free
// stages while gate_up ends. Only the activation producer waits (for every h tile to be
// written: a counter) before its first phase-2 load.
#pragma once

#include <cooperative_groups.h>
#include <cuda.h>

#include <cstdint>

#include "core/dtype.cuh"
#include "gemm/common/ptx.cuh"
#include "gemm/common/tma_ptx.cuh"

namespace moekit::detail::gemm::streamk {

constexpr int kTileRows = 64;  // weight rows per tile: 4 row groups of 16
constexpr int kGateCols = 32;  // output columns of a gate_up tile (32 gate + 32 up rows)
constexpr int kStageK = 128;   // k per stage: two 64-element (128-byte) TMA boxes
// Consumer warps w = 0..7: rows 16 (w % 4) .. + 15 of the tile, k box w / 4 of each stage
// (two warps per SM sub-partition hide the mma.sync chains' latency; the k halves are
// added through shared memory at a segment's end). Warps 0-3 run the fixup / epilogue.
constexpr int kConsumerWarps = 8;
constexpr int kConsumers = 32 * kConsumerWarps;
constexpr int kEpilogueThreads = 128;
constexpr int kThreads = kConsumers + 64;  // + the weight and activation producer warps
constexpr int kStageBudget = 224 * 1024;   // shared bytes for the stage ring + k-half sums

template <int TN>
struct Layout {
  static constexpr int kBoxBytes = kTileRows * 128;  // one 64-row, 64-k weight box
  static constexpr int kWBytes = 2 * kBoxBytes;
  static constexpr int kXBytes = 2 * TN * 128;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kRedBytes = kTileRows * TN * 4;  // k box 1's f32 sums of a segment
  static constexpr int kStages = (kStageBudget - kRedBytes) / kStageBytes;
  static constexpr int kNF = TN / 8;  // mma n-fragments (8 tokens each)
  // Stages, the k-half sums, 1024 bytes to align the stages (128-byte swizzle), 2
  // mbarriers per stage, the grid-token mbarrier, a flag and the grid token.
  static constexpr int kSmemBytes = kStages * kStageBytes + kRedBytes + 1024 + kStages * 16 + 32;
  static constexpr int kSlotFloats = kTileRows * TN;  // one partial tile
  static_assert(TN % 16 == 0 && TN <= 64, "tokens per tile: 16, 32 or 64");
  static_assert(kStageBytes % 1024 == 0, "stages keep the boxes 1024-byte aligned");
};

struct Params {
  int T, H, S;
  int tiles1, iters1;  // phase 1 (gate_up)
  int tiles2, iters2;  // phase 2 (down)
  void* act;           // [T, S] in the input dtype (h)
  void* out;           // [T, H] in the input dtype, or f32
  int out_f32;
  float* partials;  // [2 phases][gridDim.x][2 segments][kSlotFloats]
  int* counters;    // [tiles1] + [tiles2] arrivals per tile, [1] h tiles written
};

// Split-phase grid barrier on the cooperative launch's barrier word, with the protocol of
// cooperative_groups::grid_group::sync (CTA 0 adds 2^31 - (grid - 1), the others 1, so
// bit 31 flips once every CTA arrived). grid.sync() arrives and waits in one call; the
// kernel arrives first thing and waits only where it touches the counters, so the
// barrier's latency (microseconds behind the first weight loads) hides under the
// mainloop. grid_arrive: one thread per CTA, after a __syncthreads that orders the CTA's
// writes before it (release; cumulative).
__device__ __forceinline__ unsigned* grid_barrier_word() {
  return &cooperative_groups::details::get_grid_workspace()->barrier;
}
__device__ __forceinline__ unsigned grid_arrive() {
  const unsigned nb = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
  unsigned old;
  asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(grid_barrier_word()), "r"(nb)
               : "memory");
  return old;
}
// Returns once every CTA has arrived (acquire: their writes before arriving are visible).
__device__ __forceinline__ void grid_wait(unsigned token) {
  const unsigned* bar = grid_barrier_word();
  unsigned cur;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(cur) : "l"(bar) : "memory");
  } while (((token ^ cur) & 0x80000000u) == 0);
}

// A phase's `total` iterations are split over its first min(grid, total) CTAs, so every
// CTA that takes part holds at least one iteration (a tile's contributors are exactly
// the CTAs cta_of(first iteration) .. cta_of(last iteration)).
__device__ __forceinline__ int phase_ctas(int total) {
  return total < static_cast<int>(gridDim.x) ? total : static_cast<int>(gridDim.x);
}
// First iteration of CTA `cta` (total when it takes no part).
__device__ __forceinline__ int range_start(int cta, int total) {
  const int ctas = phase_ctas(total);
  if (cta >= ctas) return total;
  return static_cast<int>(static_cast<long long>(cta) * total / ctas);
}
// The CTA whose range holds iteration i (the last with range_start <= i).
__device__ __forceinline__ int cta_of(int i, int total) {
  return static_cast<int>((static_cast<long long>(i + 1) * phase_ctas(total) - 1) / total);
}

template <int TN>
struct Walk {
  int b1, e1, b2, e2;  // this CTA's iterations of each phase
  __device__ int count() const { return (e1 - b1) + (e2 - b2); }
  // The u-th iteration of the CTA's walk: phase (0 / 1), tile, k iteration.
  __device__ void at(int u, const Params& p, int& phase, int& tile, int& kb) const {
    int i;
    if (u < e1 - b1) {
      phase = 0;
      i = b1 + u;
      tile = i / p.iters1;
      kb = i - tile * p.iters1;
    } else {
      phase = 1;
      i = b2 + u - (e1 - b1);
      tile = i / p.iters2;
      kb = i - tile * p.iters2;
    }
  }
};

// The weights are read once: their loads are evict-first in L2, so they do not push out
// what the L2 holds (docs/gemm.md).
struct WeightMaps {
  const CUtensorMap *gate, *up, *down;
  uint64_t policy;  // the evict-first L2 policy
  __device__ void load(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) const {
    ptx90::tma_load_2d_hint(dst, map, bar, c0, c1, policy);
  }
};

template <int TN>
__device__ __forceinline__ void load_weights(uint8_t* stage, uint64_t* full, int phase, int tile,
                                             int kb, const WeightMaps& w) {
  using L = Layout<TN>;
  ptx90::mbar_arrive_expect_tx(full, L::kStageBytes);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint8_t* box = stage + h * L::kBoxBytes;
    const int k = kb * kStageK + h * 64;
    if (phase == 0) {
      w.load(box, w.gate, full, k, tile * kGateCols);
      w.load(box + L::kBoxBytes / 2, w.up, full, k, tile * kGateCols);
    } else {
      w.load(box, w.down, full, k, tile * kTileRows);
    }
  }
}

template <int TN>
__device__ __forceinline__ void load_activations(uint8_t* stage, uint64_t* full, int phase, int kb,
                                                 const CUtensorMap* x, const CUtensorMap* act) {
  using L = Layout<TN>;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    ptx90::tma_load_2d(stage + L::kWBytes + h * TN * 128, phase == 0 ? x : act, full,
                       kb * kStageK + h * 64, 0);
  }
}

// acc0 / acc1 += W(16 rows of this warp) . X(TN tokens)^T over k box h of one stage
// (64 k: even / odd 16-k steps into two accumulator sets, two independent mma chains).
template <typename Mma, int TN>
__device__ __forceinline__ void mma_stage(float (&acc0)[TN / 8][4], float (&acc1)[TN / 8][4],
                                          const uint8_t* stage, int h, int a_row, int lane) {
  using L = Layout<TN>;
  const int a_hi = lane >> 4;
  const int x_row = ((lane >> 4) << 3) + (lane & 7);
  const int x_hi = (lane >> 3) & 1;
  const int sw = lane & 7;  // a_row % 8 == x row % 8 == lane % 8 (128-byte swizzle)
  const uint32_t w = smem_addr(stage + h * L::kBoxBytes) + a_row * 128;
  const uint32_t xs = smem_addr(stage + L::kWBytes + h * TN * 128) + x_row * 128;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    float(&acc)[TN / 8][4] = (kk & 1) ? acc1 : acc0;
    uint32_t a[4];
    ldmatrix_x4(a, w + (((2 * kk + a_hi) ^ sw) << 4));
#pragma unroll
    for (int pp = 0; pp < TN / 16; ++pp) {
      uint32_t b[4];
      ldmatrix_x4(b, xs + pp * 16 * 128 + (((2 * kk + x_hi) ^ sw) << 4));
      const uint32_t b0[2] = {b[0], b[1]};
      const uint32_t b1[2] = {b[2], b[3]};
      Mma::mma(acc[2 * pp], a, b0);
      Mma::mma(acc[2 * pp + 1], a, b1);
    }
  }
}

// Phase 1: h[t, c] = silu(gate) * up. Fragment rows g / g + 8 are gate / up of column c.
template <typename T, int TN>
__device__ __forceinline__ void store_h(const float (&acc)[TN / 8][4], const Params& p, int tile,
                                        int warp, int lane) {
  T* act = static_cast<T*>(p.act);
  const int col = tile * kGateCols + warp * 8 + (lane >> 2);
  if (col >= p.S) return;
#pragma unroll
  for (int nf = 0; nf < TN / 8; ++nf) {
    const int t = nf * 8 + 2 * (lane & 3);
    if (t < p.T)
      act[static_cast<int64_t>(t) * p.S + col] = from_float<T>(silu(acc[nf][0]) * acc[nf][2]);
    if (t + 1 < p.T)
      act[static_cast<int64_t>(t + 1) * p.S + col] = from_float<T>(silu(acc[nf][1]) * acc[nf][3]);
  }
}

template <typename O>
__device__ __forceinline__ void store_out(O* out, const Params& p, int t, int n, float v) {
  if (t < p.T && n < p.H) out[static_cast<int64_t>(t) * p.H + n] = from_float<O>(v);
}

// Phase 2: out[t, n], n = the fragment's weight rows g and g + 8.
template <typename O, int TN>
__device__ __forceinline__ void store_y(const float (&acc)[TN / 8][4], const Params& p, int tile,
                                        int warp, int lane) {
  O* out = static_cast<O*>(p.out);
  const int n = tile * kTileRows + warp * 16 + (lane >> 2);
#pragma unroll
  for (int nf = 0; nf < TN / 8; ++nf) {
    const int t = nf * 8 + 2 * (lane & 3);
    store_out(out, p, t, n, acc[nf][0]);
    store_out(out, p, t + 1, n, acc[nf][1]);
    store_out(out, p, t, n + 8, acc[nf][2]);
    store_out(out, p, t + 1, n + 8, acc[nf][3]);
  }
}

// Partial slot of CTA `cta`'s segment `seg` (0: the one at its range start, 1: at its end).
template <int TN>
__device__ __forceinline__ float4* slot(const Params& p, int phase, int cta, int seg) {
  const size_t i = (static_cast<size_t>(phase) * gridDim.x + cta) * 2 + seg;
  return reinterpret_cast<float4*>(p.partials + i * Layout<TN>::kSlotFloats);
}

// A segment of `tile` ended. Returns true when this CTA holds the tile's whole sum in
// acc (it ran the whole tile, or arrived last and added every partial in CTA order).
template <int TN>
__device__ __forceinline__ bool complete_tile(float (&acc)[TN / 8][4], const Params& p, int phase,
                                              int tile, bool whole, int range_begin, int* flag) {
  constexpr int NF = TN / 8;
  if (whole) return true;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int iters = phase == 0 ? p.iters1 : p.iters2;
  const int total = iters * (phase == 0 ? p.tiles1 : p.tiles2);
  const int cta = blockIdx.x;
  const int idx = (warp * NF) * 32 + lane;
  float4* mine = slot<TN>(p, phase, cta, tile == range_begin / iters ? 0 : 1);
#pragma unroll
  for (int nf = 0; nf < NF; ++nf)
    __stcg(mine + idx + nf * 32, make_float4(acc[nf][0], acc[nf][1], acc[nf][2], acc[nf][3]));
  __threadfence();
  ptx90::named_barrier_sync(1, kEpilogueThreads);
  if (threadIdx.x == 0) *flag = atomicAdd(&p.counters[phase == 0 ? tile : p.tiles1 + tile], 1);
  ptx90::named_barrier_sync(1, kEpilogueThreads);
  const int first = cta_of(tile * iters, total);
  const int last = cta_of(tile * iters + iters - 1, total);
  if (*flag != last - first) return false;
  __threadfence();
  float sum[NF][4] = {};
  for (int c = first; c <= last; ++c) {
    if (c == cta) {
#pragma unroll
      for (int nf = 0; nf < NF; ++nf)
#pragma unroll
        for (int j = 0; j < 4; ++j) sum[nf][j] += acc[nf][j];
      continue;
    }
    const float4* other =
        slot<TN>(p, phase, c, tile == range_start(c, total) / iters ? 0 : 1) + idx;
#pragma unroll
    for (int nf = 0; nf < NF; ++nf) {
      const float4 v = __ldcg(other + nf * 32);
      sum[nf][0] += v.x;
      sum[nf][1] += v.y;
      sum[nf][2] += v.z;
      sum[nf][3] += v.w;
    }
  }
#pragma unroll
  for (int nf = 0; nf < NF; ++nf)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[nf][j] = sum[nf][j];
  return true;
}

template <typename T, typename Mma, int TN>
__global__ void __launch_bounds__(kThreads, 1)
    streamk_mlp_kernel(const __grid_constant__ CUtensorMap x_map,
                       const __grid_constant__ CUtensorMap gate_map,
                       const __grid_constant__ CUtensorMap up_map,
                       const __grid_constant__ CUtensorMap act_map,
                       const __grid_constant__ CUtensorMap down_map, const Params p) {
  using L = Layout<TN>;
  constexpr int NF = L::kNF;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  float4* red = reinterpret_cast<float4*>(smem + L::kStages * L::kStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kStages * L::kStageBytes + L::kRedBytes);
  uint64_t* empty = full + L::kStages;
  uint64_t* token_ready = empty + L::kStages;  // the grid token is in shared memory
  int* flag = reinterpret_cast<int*>(token_ready + 1);
  unsigned* token_smem = reinterpret_cast<unsigned*>(flag + 1);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grid = gridDim.x, cta = blockIdx.x;
  const int n1 = p.tiles1 * p.iters1, n2 = p.tiles2 * p.iters2;
  Walk<TN> walk{range_start(cta, n1), range_start(cta + 1, n1), range_start(cta, n2),
                range_start(cta + 1, n2)};
  const int count = walk.count();
  const int count1 = walk.e1 - walk.b1;

  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      ptx90::mbar_init(&full[s], 1);
      ptx90::mbar_init(&empty[s], kConsumerWarps);
    }
    ptx90::mbar_init(token_ready, 1);
    ptx90::fence_barrier_init();
  }
  // The counters start at zero in every launch (the workspace holds anything before).
  const int n_counters = p.tiles1 + p.tiles2 + 1;
  for (int i = cta * kThreads + threadIdx.x; i < n_counters; i += grid * kThreads)
    p.counters[i] = 0;
  __syncthreads();

  // The grid barrier only orders the counters' zeroing before their first use: the
  // weight producer arrives (before its first loads, which would delay the arrival's
  // release), and only the threads that touch the counters wait (thread 0 before its
  // first counter atomic, the activation producer before it polls h). Round 0 of each
  // stage needs no wait.
  const int prefill = count < L::kStages ? count : L::kStages;
  const bool w_producer = warp == kConsumerWarps && lane == 0;
  const bool x_producer = warp == kConsumerWarps + 1 && lane == 0;
  const WeightMaps wmaps{&gate_map, &up_map, &down_map, ptx90::evict_first_policy()};
  if (w_producer) {
    const unsigned token = grid_arrive();
    ptx90::prefetch_tensormap(&gate_map);
    ptx90::prefetch_tensormap(&up_map);
    ptx90::prefetch_tensormap(&down_map);
    for (int u = 0; u < prefill; ++u) {
      int phase, tile, kb;
      walk.at(u, p, phase, tile, kb);
      load_weights<TN>(smem + u * L::kStageBytes, &full[u], phase, tile, kb, wmaps);
    }
    *token_smem = token;
    ptx90::mbar_arrive(token_ready);
  }
  const int x_prefill = prefill < count1 ? prefill : count1;
  if (x_producer) {
    ptx90::prefetch_tensormap(&x_map);
    ptx90::prefetch_tensormap(&act_map);
    for (int u = 0; u < x_prefill; ++u) {
      int phase, tile, kb;
      walk.at(u, p, phase, tile, kb);
      load_activations<TN>(smem + u * L::kStageBytes, &full[u], phase, kb, &x_map, &act_map);
    }
  }
  // Thread 0 (counter atomics) and the activation producer (h poll): wait for the grid.
  bool grid_passed = false;
  const auto pass_grid = [&] {
    if (grid_passed) return;
    ptx90::mbar_wait(token_ready, 0);
    grid_wait(*token_smem);
    grid_passed = true;
  };

  if (w_producer) {
    for (int u = prefill; u < count; ++u) {
      const int s = u % L::kStages;
      ptx90::mbar_wait(&empty[s], ((u / L::kStages) & 1) ^ 1);
      int phase, tile, kb;
      walk.at(u, p, phase, tile, kb);
      load_weights<TN>(smem + s * L::kStageBytes, &full[s], phase, tile, kb, wmaps);
    }
  } else if (x_producer) {
    for (int u = x_prefill; u < count; ++u) {
      const int s = u % L::kStages;
      if (u >= prefill) ptx90::mbar_wait(&empty[s], ((u / L::kStages) & 1) ^ 1);
      if (u == count1) {
        // Phase 2 reads h: wait until every phase-1 tile is written (all CTAs run phase 1
        // first and never wait inside it, so this cannot deadlock in a co-resident grid).
        const int* written = p.counters + p.tiles1 + p.tiles2;
        pass_grid();
        while (ptx90::ld_acquire_gpu(written) < p.tiles1) __nanosleep(64);
        ptx90::fence_proxy_async_global();
      }
      int phase, tile, kb;
      walk.at(u, p, phase, tile, kb);
      load_activations<TN>(smem + s * L::kStageBytes, &full[s], phase, kb, &x_map, &act_map);
    }
  } else if (warp < kConsumerWarps) {
    const int rw = warp & 3, kh = warp >> 2;  // row group, k box
    float acc[NF][4], acc1[NF][4];
    int u = 0;
    for (int phase = 0; phase < 2; ++phase) {
      const int b = phase == 0 ? walk.b1 : walk.b2;
      const int e = phase == 0 ? walk.e1 : walk.e2;
      const int iters = phase == 0 ? p.iters1 : p.iters2;
      // This lane's ldmatrix row of the A (weight) fragment: phase 1 pairs gate row c
      // (fragment rows 0-7) with up row c (rows 8-15) so one thread holds both.
      const int fr = ((lane >> 3) & 1) * 8 + (lane & 7);
      const int a_row =
          phase == 0 ? (fr < 8 ? rw * 8 + fr : kGateCols + rw * 8 + fr - 8) : rw * 16 + fr;
      for (int i = b; i < e;) {
        const int tile = i / iters;
        const int seg_begin = i;
        const int seg_end = min(e, (tile + 1) * iters);
#pragma unroll
        for (int nf = 0; nf < NF; ++nf)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[nf][j] = acc1[nf][j] = 0.f;
        for (; i < seg_end; ++i, ++u) {
          const int s = u % L::kStages;
          ptx90::mbar_wait(&full[s], (u / L::kStages) & 1);
          mma_stage<Mma, TN>(acc, acc1, smem + s * L::kStageBytes, kh, a_row, lane);
          __syncwarp();
          if (lane == 0) ptx90::mbar_arrive(&empty[s]);
        }
        // The segment's sum, in a fixed order: (even + odd steps) of box 0, + box 1's.
#pragma unroll
        for (int nf = 0; nf < NF; ++nf)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[nf][j] += acc1[nf][j];
        float4* mine = red + (rw * NF) * 32 + lane;
        if (kh == 1) {
#pragma unroll
          for (int nf = 0; nf < NF; ++nf)
            mine[nf * 32] = make_float4(acc[nf][0], acc[nf][1], acc[nf][2], acc[nf][3]);
        }
        ptx90::named_barrier_sync(2, kConsumers);
        if (kh == 0) {
#pragma unroll
          for (int nf = 0; nf < NF; ++nf) {
            const float4 v = mine[nf * 32];
            acc[nf][0] += v.x;
            acc[nf][1] += v.y;
            acc[nf][2] += v.z;
            acc[nf][3] += v.w;
          }
        }
        // Box 1's warps may overwrite the sums only after box 0's warps read them.
        ptx90::named_barrier_sync(3, kConsumers);
        if (kh == 1) continue;
        const bool whole = seg_begin == tile * iters && seg_end == (tile + 1) * iters;
        if (threadIdx.x == 0 && !whole) pass_grid();  // complete_tile counts arrivals
        if (!complete_tile<TN>(acc, p, phase, tile, whole, b, flag)) continue;
        if (phase == 0) {
          store_h<T, TN>(acc, p, tile, warp, lane);
          // Publish the h tile: every thread's stores, then one release-ordered count.
          __threadfence();
          ptx90::named_barrier_sync(1, kEpilogueThreads);
          if (threadIdx.x == 0) {
            pass_grid();
            atomicAdd(&p.counters[p.tiles1 + p.tiles2], 1);
          }
        } else if (p.out_f32) {
          store_y<float, TN>(acc, p, tile, warp, lane);
        } else {
          store_y<T, TN>(acc, p, tile, warp, lane);
        }
      }
    }
  }
}

}  // namespace moekit::detail::gemm::streamk
