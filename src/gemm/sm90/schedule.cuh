// Device-side persistent tile schedule of the SM90 bf16/f16 grouped-GEMM kernels
// (grouped_gemm.cuh, mlp_chain.cuh, the FP8 kernel): every block builds
// tile_start[G + 1] in shared memory from the layout metadata (no host sync), then walks
// tile ids blockIdx.x, + gridDim.x, ... and maps each to its coordinates.
#pragma once

#include <cutlass/arch/barrier.h>

#include <climits>
#include <cstdint>

#include "gemm/mma/tile_scheduler.cuh"
#include "gemm/sm90/tile_math.h"

namespace moekit::detail::gemm::sm90 {

// Tile schedule: tiles per group, then an inclusive scan by warp 0 (any G <= the
// caller's tile_start capacity - 1), in 64 bits and saturated at the host's bound
// (<= INT_MAX): non-monotonic metadata can make the groups overlap and their tile counts
// sum past it (tile_prefix). Block-wide (contains a __syncthreads); tile_start is
// complete for warp 0 on return, for the others after the caller's next __syncthreads.
// AUTO: pair tiles of the adaptive pairs (pair_tiles_of_group).
template <int THREADS, int BM, bool AUTO = false>
__device__ __forceinline__ void build_tile_schedule(const RowsDesc& rows, int n_tiles,
                                                    int tile_bound, int* tile_start) {
  const int G = rows.num_groups;
  for (int g = threadIdx.x; g < G; g += THREADS) {
    int64_t first, count;
    group_rows(rows, g, first, count);
    tile_start[g + 1] = AUTO ? pair_tiles_of_group(count, BM, n_tiles, tile_bound)
                             : tiles_of_group(count, BM, n_tiles, tile_bound);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int64_t running = 0;
    for (int base = 0; base < G; base += 32) {
      const int g = base + lane;
      int64_t v = g < G ? tile_start[g + 1] : 0;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int64_t u = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) v += u;
      }
      if (g < G) tile_start[g + 1] = tile_prefix(running, v, tile_bound);
      running += __shfl_sync(0xffffffffu, v, 31);
      running = running < tile_bound ? running : tile_bound;  // no overflow over chunks
    }
    if (lane == 0) tile_start[0] = 0;
  }
}

// Cluster pairs (the adaptive pairs, kPairAuto): the two CTAs of a 2-CTA cluster take the
// two tiles of one "pair tile" in lockstep and load the operand they share once, multicast
// to both. Per group, kPairM pairs of its m-tiles (m-tiles 2i and 2i + 1 of one n-tile share
// b rows) and, for an odd last m-tile, kPairN pairs of its n-tiles (n-tiles 2j and 2j + 1 of
// one m-tile share a rows); each pair tile says which (Tile::share), so ragged groups waste
// no half pair. The schedule then counts pair tiles (pair_tiles_of_group). kPairN and kPairM
// name only a pair tile's shared operand: no kernel config pairs one way only.
enum TilePair : int { kPairNone = 0, kPairN = 1, kPairM = 2, kPairAuto = 3 };

// A block's walk over (pair) tile ids: ids first, first + stride, ... < total, and the
// CTA's rank in its pair (a 2-CTA cluster along x is blocks 2c, 2c + 1; units = blocks,
// or pairs for the paired configs). Every unit walks: even waves on fewer units lose,
// since neighbouring blocks then no longer read the same b tile at the same time
// (docs/gemm.md, "Persistent grid and dynamic schedule").
struct Walk {
  int first, stride, rank;
};
template <class Cfg>
__device__ __forceinline__ Walk tile_walk() {
  const bool pair = Cfg::PAIR != kPairNone;
  return {static_cast<int>(pair ? blockIdx.x >> 1 : blockIdx.x),
          static_cast<int>(pair ? gridDim.x >> 1 : gridDim.x),
          pair ? static_cast<int>(blockIdx.x & 1) : 0};
}

// Tile ids from the producer thread to the consumer warpgroups: a
// ring of kChannelSlots ids, each with a full barrier (the producer's arrive) and an
// empty one (one arrive per consumer warp that reads the slot). The producer writes
// tile j's id into slot j % kChannelSlots before it loads the tile's stages, so the
// consumers learn which tile their next stages hold without walking the schedule
// themselves; that lets the producer take ids from a global counter (dynamic
// schedule: SMs that run ahead take more tiles) as well as the static walk. An id >=
// total ends the consumers' loops (one per consumer that reads distinct tiles).
constexpr int kChannelSlots = 4;
struct TileChannel {
  uint64_t full[kChannelSlots];
  uint64_t empty[kChannelSlots];
  int id[kChannelSlots];
};

// Thread 0, before the block's first __syncthreads: `readers` = consumer warps that read
// each slot (both warpgroups read every tile's id: 8 warps).
__device__ __forceinline__ void channel_init(TileChannel& ch, int readers) {
  for (int i = 0; i < kChannelSlots; ++i) {
    cutlass::arch::ClusterBarrier::init(&ch.full[i], 1);
    cutlass::arch::ClusterBarrier::init(&ch.empty[i], readers);
  }
  cutlass::arch::fence_barrier_init();
}

// Producer thread: publishes tile j's id (waits until slot j % kChannelSlots was read by
// every consumer warp of its previous round; a fresh barrier passes parity 1).
__device__ __forceinline__ void channel_put(TileChannel& ch, int j, int id) {
  const int slot = j % kChannelSlots;
  const uint32_t phase = (j / kChannelSlots) & 1;
  cutlass::arch::ClusterBarrier::wait(&ch.empty[slot], phase ^ 1);
  // CUTLASS's barrier asm has no memory clobber: keep the store between wait and arrive.
  asm volatile("" ::: "memory");
  *reinterpret_cast<volatile int*>(&ch.id[slot]) = id;
  asm volatile("" ::: "memory");
  cutlass::arch::ClusterBarrier::arrive(&ch.full[slot]);  // release: the id is visible
}

// A consumer warp: tile j's id. Lane 0 alone reads the slot and frees it, then passes the
// id to the warp by shuffle: the read and the release are one thread's, in program order,
// so the slot's reuse is ordered by the empty barrier alone (with every lane reading and
// lane 0 releasing after a __syncwarp, racecheck reported the reads against the next
// round's write).
__device__ __forceinline__ int channel_get(TileChannel& ch, int j) {
  const int slot = j % kChannelSlots;
  const uint32_t phase = (j / kChannelSlots) & 1;
  cutlass::arch::ClusterBarrier::wait(&ch.full[slot], phase);
  asm volatile("" ::: "memory");  // the load stays after the wait (acquire)
  int id = 0;
  if ((threadIdx.x & 31) == 0) {
    id = *reinterpret_cast<volatile int*>(&ch.id[slot]);
    asm volatile("" ::: "memory");  // the read stays before the release
    cutlass::arch::ClusterBarrier::arrive(&ch.empty[slot]);
  }
  return __shfl_sync(0xffffffffu, id, 0);
}

// Pair ids from a 2-CTA cluster's rank 0 to rank 1 (the paired configs under the dynamic
// schedule): both CTAs of a pair must take the same pair tiles, so
// rank 0's producer claims each id and writes it into rank 1's ring through distributed
// shared memory (st.shared::cluster, then a remote arrive with cluster-scope release on
// rank 1's full barrier); rank 1's producer reads it (acquire at cluster scope) and frees
// the slot with a remote arrive on rank 0's empty barrier. Both rings exist in both CTAs;
// rank 0 uses its empty barriers, rank 1 its full barriers and ids.
struct PairMailbox {
  uint64_t full[kChannelSlots];
  uint64_t empty[kChannelSlots];
  int id[kChannelSlots];
};

__device__ __forceinline__ void mailbox_init(PairMailbox& mb) {
  for (int i = 0; i < kChannelSlots; ++i) {
    cutlass::arch::ClusterBarrier::init(&mb.full[i], 1);
    cutlass::arch::ClusterBarrier::init(&mb.empty[i], 1);
  }
  cutlass::arch::fence_barrier_init();
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t cluster_peer(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

__device__ __forceinline__ void wait_cluster_acquire(const uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void arrive_remote_release(const uint64_t* local_bar, uint32_t rank) {
  const uint32_t remote = cluster_peer(smem_u32(local_bar), rank);
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote)
               : "memory");
}

// Rank 0's producer: pair id number j (from 0) to rank 1.
__device__ __forceinline__ void mailbox_send(PairMailbox& mb, int j, int id) {
  const int slot = j % kChannelSlots;
  const uint32_t phase = (j / kChannelSlots) & 1;
  wait_cluster_acquire(&mb.empty[slot], phase ^ 1);  // rank 1 read the slot's last id
  const uint32_t remote_id = cluster_peer(smem_u32(&mb.id[slot]), 1);
  asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(remote_id), "r"(id) : "memory");
  arrive_remote_release(&mb.full[slot], 1);
}

// Rank 1's producer: pair id number j.
__device__ __forceinline__ int mailbox_recv(PairMailbox& mb, int j) {
  const int slot = j % kChannelSlots;
  const uint32_t phase = (j / kChannelSlots) & 1;
  wait_cluster_acquire(&mb.full[slot], phase);
  const int id = *reinterpret_cast<volatile int*>(&mb.id[slot]);
  arrive_remote_release(&mb.empty[slot], 0);
  return id;
}

// Rank 0's producer, before it exits: waits until rank 1 took pair id number j (its remote
// arrive on this CTA's empty barrier has landed). Where loads follow every id, rank 1's
// receipt precedes the stages rank 0 waits for anyway; the MLP chain's first claim may
// already be past the end, and rank 0 must not exit with that receipt still in flight.
__device__ __forceinline__ void mailbox_wait_receipt(PairMailbox& mb, int j) {
  wait_cluster_acquire(&mb.empty[j % kChannelSlots], (j / kChannelSlots) & 1);
}

// The first tile id a launch hands out dynamically: ids below it are walked statically
// (block b: b, b + stride, ...; a multiple of stride, so every block walks the same number),
// the last `waves` waves' worth from there on go to whichever block asks first; at least
// stride (each block's first tile is its own). Without a counter: none (INT_MAX).
__device__ __forceinline__ int dynamic_base(int total, int stride, const unsigned* counter,
                                            int waves) {
  if (!counter) return INT_MAX;
  const int static_waves = total / stride - waves;
  return static_waves > 1 ? static_waves * stride : stride;
}

// The producer's next tile id after `id`: the static walk (id + stride) below `base`, then
// base + the counter's next value (zeroed before the launch), in increasing id order, so
// the tiles in flight stay a window of consecutive ids.
__device__ __forceinline__ int next_tile_id(int id, int stride, unsigned* counter, int base) {
  const int next = id + stride;
  return next < base ? next : base + static_cast<int>(atomicAdd(counter, 1u));
}

struct Tile {
  int group;
  int share;       // paired: the operand the pair shares, kPairN (a) or kPairM (b)
  int a_row, a_l;  // first A row (TMA coordinates)
  int rows;        // valid rows, 1..BM (<= 0: a pair's empty second tile)
  int b_row0, b_row1;
  int64_t c_row;  // first output row
  int n0;         // first output column
};

// Tile `id` (< total) -> coordinates. Order: group-major, then n-tile, m-tile fastest
// (the m-tiles sharing one b tile are processed side by side by neighbouring blocks).
// Paired configs (Cfg::PAIR == kPairAuto): `id` is a pair tile and `rank` (0, 1) the CTA's half; a
// pair's second tile may lie past the group (rows <= 0) or past n (n0 >= n): the CTA then
// loads and waits in step with its partner but stores nothing.
// Cfg: BM (tile rows), BN (b rows per tile = output columns without silu), B_BOX (b rows
// per TMA box; with silu the tile's output columns: box 0 gate, box 1 up). P: the
// kernel's params (rows, n, silu).
template <class Cfg, class P>
__device__ __forceinline__ Tile locate_tile(const P& p, const int* tile_start, int id,
                                            int rank = 0) {
  // Largest g with tile_start[g] <= id: a non-empty group (an empty g has
  // tile_start[g] == tile_start[g + 1], so g + 1 would also qualify).
  int lo = 0, hi = p.rows.num_groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tile_start[mid] <= id)
      lo = mid;
    else
      hi = mid - 1;
  }
  Tile t;
  t.group = lo;
  int64_t first, count;
  group_rows(p.rows, lo, first, count);
  const int local = id - tile_start[lo];
  int m_tile, n_tile;
  t.share = Cfg::PAIR;
  if constexpr (Cfg::PAIR == kPairAuto) {
    const int m_tiles = static_cast<int>((count + Cfg::BM - 1) / Cfg::BM);
    const int m_pairs = m_tiles / 2;
    if (local < m_pairs * p.n_tiles) {
      m_tile = local % m_pairs * 2 + rank;
      n_tile = local / m_pairs;
      t.share = kPairM;
    } else {  // the odd last m-tile
      m_tile = m_tiles - 1;
      n_tile = (local - m_pairs * p.n_tiles) * 2 + rank;
      t.share = kPairN;
    }
  } else {
    static_assert(Cfg::PAIR == kPairNone, "unpaired or adaptive pairs");
    const int m_tiles = static_cast<int>((count + Cfg::BM - 1) / Cfg::BM);
    m_tile = local % m_tiles;
    n_tile = local / m_tiles;
  }
  t.rows = static_cast<int>(min(static_cast<int64_t>(Cfg::BM), count - int64_t{m_tile} * Cfg::BM));
  t.c_row = first + int64_t{m_tile} * Cfg::BM;
  if (p.rows.mode == kRowsMasked) {
    t.a_row = m_tile * Cfg::BM;  // inside the group's slab (L = group)
    t.a_l = lo;
  } else {
    t.a_row = static_cast<int>(t.c_row);
    t.a_l = 0;
  }
  if (p.silu) {
    t.n0 = n_tile * Cfg::B_BOX;
    t.b_row0 = t.n0;        // gate rows
    t.b_row1 = p.n + t.n0;  // the matching up rows
  } else {
    t.n0 = n_tile * Cfg::BN;
    t.b_row0 = t.n0;
    t.b_row1 = t.n0 + Cfg::B_BOX;
  }
  return t;
}

}  // namespace moekit::detail::gemm::sm90
