#include <stdexcept>

#include "blas.h"

namespace moekit::bench {

void blas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}

Blas::Blas() : ws_(64u << 20) {
  blas_check(cublasCreate(&h_), "cublasCreate");
  blas_check(cublasLtCreate(&lt_), "cublasLtCreate");
}

Blas::~Blas() {
  if (h_) cublasDestroy(h_);
  if (lt_) cublasLtDestroy(lt_);
}

void Blas::bind(cudaStream_t s) {
  blas_check(cublasSetStream(h_, s), "cublasSetStream");
  // A fixed workspace keeps cuBLAS from allocating inside graph capture.
  blas_check(cublasSetWorkspace(h_, ws_.data(), ws_.bytes()), "cublasSetWorkspace");
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kFP8E4M3:
      return CUDA_R_8F_E4M3;
    default:
      throw std::runtime_error("cuda_type: unsupported dtype");
  }
}

void gemm_nt(Blas& blas, DType ab, DType ct, const void* A, const void* B, void* C, int64_t m,
             int64_t n, int64_t k, cudaStream_t s) {
  if (m == 0 || n == 0) return;
  blas.bind(s);
  const float alpha = 1.f, beta = 0.f;
  // Column-major view: C^T [n, m] = B [n, k] . A^T, i.e. op(B) = T on a k x n matrix.
  blas_check(
      cublasGemmEx(blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                   static_cast<int>(m), static_cast<int>(k), &alpha, B, cuda_type(ab),
                   static_cast<int>(k), A, cuda_type(ab), static_cast<int>(k), &beta, C,
                   cuda_type(ct), static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

void grouped_gemm_loop(Blas& blas, DType ab, DType ct, const void* A, const void* B, void* C,
                       const std::vector<int64_t>& row_start, const std::vector<int64_t>& count,
                       int64_t n, int64_t k, cudaStream_t s) {
  const size_t es = dtype_size(ab), cs = dtype_size(ct);
  for (size_t e = 0; e < count.size(); ++e) {
    if (count[e] <= 0) continue;
    gemm_nt(blas, ab, ct, static_cast<const char*>(A) + row_start[e] * k * es,
            static_cast<const char*>(B) + static_cast<int64_t>(e) * n * k * es,
            static_cast<char*>(C) + row_start[e] * n * cs, count[e], n, k, s);
  }
}

GroupedBatched::GroupedBatched(DType ab, DType ct, const std::vector<int64_t>& row_start,
                               const std::vector<int64_t>& count, int64_t n, int64_t k)
    : ab_(ab), c_(ct), n_(n), k_(k), start_(row_start), count_(count) {
  for (size_t e = 0; e < count.size(); ++e) {
    if (count[e] <= 0) continue;
    experts_.push_back(static_cast<int64_t>(e));
    ta_.push_back(CUBLAS_OP_T);
    tb_.push_back(CUBLAS_OP_N);
    m_arr_.push_back(static_cast<int>(n));
    n_arr_.push_back(static_cast<int>(count[e]));
    k_arr_.push_back(static_cast<int>(k));
    lda_.push_back(static_cast<int>(k));
    ldb_.push_back(static_cast<int>(k));
    ldc_.push_back(static_cast<int>(n));
    group_size_.push_back(1);
    alpha_.push_back(1.f);
    beta_.push_back(0.f);
  }
}

int GroupedBatched::add_pointers(const void* A, const void* B, void* C) {
  const size_t g = experts_.size(), es = dtype_size(ab_), cs = dtype_size(c_);
  std::vector<const void*> h(3 * g);
  for (size_t i = 0; i < g; ++i) {
    int64_t e = experts_[i];
    h[i] = static_cast<const char*>(B) + e * n_ * k_ * es;             // cuBLAS "A": weights
    h[g + i] = static_cast<const char*>(A) + start_[e] * k_ * es;      // cuBLAS "B": rows
    h[2 * g + i] = static_cast<const char*>(C) + start_[e] * n_ * cs;  // output rows
  }
  DBuffer buf(h.size() * sizeof(void*));
  BENCH_CUDA(cudaMemcpy(buf.data(), h.data(), h.size() * sizeof(void*), cudaMemcpyHostToDevice));
  tables_.push_back(std::move(buf));
  return static_cast<int>(tables_.size()) - 1;
}

void GroupedBatched::run(Blas& blas, int table, cudaStream_t s) const {
  const int g = static_cast<int>(experts_.size());
  if (g == 0) return;
  blas.bind(s);
  void* const* p = static_cast<void* const*>(tables_[table].data());
  blas_check(
      cublasGemmGroupedBatchedEx(
          blas.handle(), ta_.data(), tb_.data(), m_arr_.data(), n_arr_.data(), k_arr_.data(),
          alpha_.data(), reinterpret_cast<const void* const*>(p), cuda_type(ab_), lda_.data(),
          reinterpret_cast<const void* const*>(p + g), cuda_type(ab_), ldb_.data(), beta_.data(),
          p + 2 * g, cuda_type(c_), ldc_.data(), g, group_size_.data(), CUBLAS_COMPUTE_32F),
      "cublasGemmGroupedBatchedEx");
}

}  // namespace moekit::bench

namespace moekit::bench {

LtFp8Gemm::LtFp8Gemm(Blas& blas, int64_t m, int64_t n, int64_t k, bool block_scales)
    : block_(block_scales) {
  blas_check(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "LtDescCreate");
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  blas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
             "TRANSA");
  blas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
             "TRANSB");
  if (block_) {
    // cuBLAS "A" is our B (weights, 128x128 blocks); cuBLAS "B" is our A (rows, 1x128).
    int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    int32_t bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    blas_check(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am),
        "A_SCALE_MODE");
    blas_check(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm),
        "B_SCALE_MODE");
  }
  if (block_) {
    // Block-scaled modes are rejected (INVALID_VALUE) without scale pointers, also by the
    // heuristic query: set placeholders here, the real ones in run().
    const void* placeholder = blas.workspace();
    blas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                              &placeholder, sizeof placeholder),
               "A_SCALE_POINTER");
    blas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                              &placeholder, sizeof placeholder),
               "B_SCALE_POINTER");
  }
  blas_check(cublasLtMatrixLayoutCreate(&a_, CUDA_R_8F_E4M3, k, n, k), "layout A");
  blas_check(cublasLtMatrixLayoutCreate(&b_, CUDA_R_8F_E4M3, k, m, k), "layout B");
  blas_check(cublasLtMatrixLayoutCreate(&d_, CUDA_R_16BF, n, m, n), "layout D");
  cublasLtMatmulPreference_t pref;
  blas_check(cublasLtMatmulPreferenceCreate(&pref), "pref");
  size_t ws = blas.workspace_bytes();
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof ws);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(blas.lt(), desc_, a_, b_, d_, d_, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    throw std::runtime_error(std::string("cuBLASLt has no fp8 kernel for this problem") +
                             (block_ ? " with 1x128 / 128x128 block scales" : "") + " (status " +
                             std::to_string(int(st)) + ")");
  algo_ = result.algo;
}

LtFp8Gemm::~LtFp8Gemm() {
  if (a_) cublasLtMatrixLayoutDestroy(a_);
  if (b_) cublasLtMatrixLayoutDestroy(b_);
  if (d_) cublasLtMatrixLayoutDestroy(d_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
}

void LtFp8Gemm::run(Blas& blas, const void* A, const void* B, void* D, const float* a_scale,
                    const float* b_scale, cudaStream_t s) {
  if (block_) {
    blas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale,
                                              sizeof b_scale),
               "A_SCALE_POINTER");
    blas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale,
                                              sizeof a_scale),
               "B_SCALE_POINTER");
  }
  const float alpha = 1.f, beta = 0.f;
  blas_check(cublasLtMatmul(blas.lt(), desc_, &alpha, B, a_, A, b_, &beta, D, d_, D, d_, &algo_,
                            blas.workspace(), blas.workspace_bytes(), s),
             "cublasLtMatmul");
}

}  // namespace moekit::bench
