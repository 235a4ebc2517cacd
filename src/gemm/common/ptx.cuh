// Thin wrappers over the sm_80+/sm_90 PTX the GEMM kernels use: cp.async (16-byte
// global->shared copies with zero fill), ldmatrix, mma.sync, streamed weight loads and
// L2 bulk prefetches.
#pragma once

#include <cstdint>

namespace moekit::detail::gemm {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes, or writes 16 zero bytes when !valid (src is then not read:
// a src-size of 0 reads nothing, so out-of-range rows and columns cost no traffic).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
               : "memory");
}

// The same with an L2 cache policy (see l2_evict_first_policy).
__device__ __forceinline__ void cp_async_16_hint(uint32_t dst, const void* src, bool valid,
                                                 uint64_t policy) {
  int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(src_size), "l"(policy)
               : "memory");
}

// Marks the lines a load touches evict-first in L2: weights streamed once at decode then
// replace each other instead of the L2's other (possibly dirty) lines.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A . B + D for a 16x8 f32 tile; A 16x(32 bytes of k) row-major, B (32 bytes of k)x8.
struct MmaBF16 {
  static constexpr int kElemBytes = 2;
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

struct MmaF16 {
  static constexpr int kElemBytes = 2;
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// 16 weight bytes, or zeros when !valid. The load is predicated inside the asm (no
// branch): with a branch per load ptxas sank the next batch's loads below the current
// batch's mmas, leaving one batch in flight.
// kL2Prefetch: 0, or 128 / 256 = the L2 fetches that many bytes around the address from
// DRAM (.L2::128B / .L2::256B): loads that take a row 64 bytes at a time then find the
// line's rest in L2 rather than sending a second DRAM request for it.
template <int kL2Prefetch = 0>
__device__ __forceinline__ uint4 ld_weights(const void* p, bool valid, uint64_t policy) {
  static_assert(kL2Prefetch == 0 || kL2Prefetch == 128 || kL2Prefetch == 256);
  uint4 v;
#define MOEKIT_LD_WEIGHTS(SIZE)                             \
  asm volatile(                                             \
      "{\n"                                                 \
      ".reg .pred p;\n"                                     \
      "setp.ne.b32 p, %5, 0;\n"                             \
      "mov.b32 %0, 0;\n"                                    \
      "mov.b32 %1, 0;\n"                                    \
      "mov.b32 %2, 0;\n"                                    \
      "mov.b32 %3, 0;\n"                                    \
      "@p ld.global.nc.L1::no_allocate.L2::cache_hint" SIZE \
      ".v4.u32 {%0, %1, %2, %3}, [%4], %6;\n"               \
      "}\n"                                                 \
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)          \
      : "l"(p), "r"(static_cast<int>(valid)), "l"(policy))
  if constexpr (kL2Prefetch == 256)
    MOEKIT_LD_WEIGHTS(".L2::256B");
  else if constexpr (kL2Prefetch == 128)
    MOEKIT_LD_WEIGHTS(".L2::128B");
  else
    MOEKIT_LD_WEIGHTS("");
#undef MOEKIT_LD_WEIGHTS
  return v;
}

// [p, p + bytes) into L2 (16-byte aligned, bytes a multiple of 16).
__device__ __forceinline__ void bulk_prefetch_l2(const void* p, int bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// The 128-byte line holding p into L1 (a hint: no fault, no data).
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}

}  // namespace moekit::detail::gemm
