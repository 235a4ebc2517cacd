// cuBLAS / cuBLASLt for the benchmark's alternatives and ceilings (bench only: the
// library never links cuBLAS).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "device.h"
#include "moekit/tensor.h"

namespace moekit::bench {

void blas_check(cublasStatus_t s, const char* what);

class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t handle() const { return h_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return ws_.data(); }
  size_t workspace_bytes() const { return ws_.bytes(); }
  void bind(cudaStream_t s);  // stream + workspace for the next calls

 private:
  cublasHandle_t h_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DBuffer ws_;
};

cudaDataType_t cuda_type(DType d);

// Row-major C[m, n] = A[m, k] . B[n, k]^T (f32 accumulation), C in c_type.
void gemm_nt(Blas& blas, DType ab_type, DType c_type, const void* A, const void* B, void* C,
             int64_t m, int64_t n, int64_t k, cudaStream_t s);

// One GEMM per expert with rows: expert e's rows start at row_start[e] in A and C
// (row strides k and n) and number count[e]; B is [E, n, k]. Experts with no rows are
// skipped.
void grouped_gemm_loop(Blas& blas, DType ab_type, DType c_type, const void* A, const void* B,
                       void* C, const std::vector<int64_t>& row_start,
                       const std::vector<int64_t>& count, int64_t n, int64_t k, cudaStream_t s);

// The same problem through cublasGemmGroupedBatchedEx (one group per active expert).
// Prepare once per (A, B, C) set; throws when cuBLAS rejects the problem.
class GroupedBatched {
 public:
  GroupedBatched(DType ab_type, DType c_type, const std::vector<int64_t>& row_start,
                 const std::vector<int64_t>& count, int64_t n, int64_t k);
  // Pointer tables for one copy of (A, B, C); returns its index.
  int add_pointers(const void* A, const void* B, void* C);
  void run(Blas& blas, int table, cudaStream_t s) const;

 private:
  DType ab_, c_;
  int64_t n_, k_;
  std::vector<int64_t> start_, count_, experts_;
  std::vector<int> m_arr_, n_arr_, k_arr_, lda_, ldb_, ldc_, group_size_;
  std::vector<cublasOperation_t> ta_, tb_;
  std::vector<float> alpha_, beta_;
  std::vector<DBuffer> tables_;  // per copy: A, B, C pointer arrays (device)
};

}  // namespace moekit::bench

namespace moekit::bench {

// Row-major D[m, n] (bf16) = A[m, k] (fp8) . B[n, k]^T (fp8) through cuBLASLt, optionally
// with DeepSeek-style block scales: 1x128 per row of A (VEC128) and 128x128 per block of
// B (BLK128x128). Throws when cuBLASLt has no kernel for the problem.
class LtFp8Gemm {
 public:
  LtFp8Gemm(Blas& blas, int64_t m, int64_t n, int64_t k, bool block_scales);
  ~LtFp8Gemm();
  LtFp8Gemm(const LtFp8Gemm&) = delete;
  LtFp8Gemm& operator=(const LtFp8Gemm&) = delete;
  void run(Blas& blas, const void* A, const void* B, void* D, const float* a_scale,
           const float* b_scale, cudaStream_t s);

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool block_ = false;
};

}  // namespace moekit::bench
