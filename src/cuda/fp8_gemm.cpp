// Fp8Gemm (fp8.h): E4M3 products through cuBLASLt.
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "core/error.h"
#include "cuda/fp8.h"

namespace ferry::cuda {

namespace {

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    fail("cuda", what, ": cuBLASLt status ", static_cast<int>(st), " (FP8 product)");
}

// RAII for cuBLASLt's descriptors.
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld) {
    check_lt(cublasLtMatrixLayoutCreate(&h, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(h); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

template <class T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v) {
  check_lt(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)), "cublasLtMatmulDescSetAttribute");
}

cublasLtMatmulDesc_t make_desc(bool outer_vec) {
  cublasLtMatmulDesc_t d = nullptr;
  check_lt(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
  set(d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set(d, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  if (outer_vec) {
    set(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
    set(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
  }
  return d;
}

}  // namespace

struct Fp8Gemm::Impl {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t plain = nullptr, vec = nullptr;  // vec: null when not allowed
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaDataType_t acc_type = CUDA_R_32F;
  struct Plan {
    cublasLtMatmulAlgo_t algo;
    bool vec;  // cuBLASLt applies the scales
  };
  std::map<std::tuple<size_t, size_t, size_t>, Plan> plans;  // by (n_in, n_out, n_rows)

  // Column-major view: y^T [n_out, n_rows] = op_T(W^T [n_in, n_out]) * x^T [n_in, n_rows].
  bool find(cublasLtMatmulDesc_t desc, cudaDataType_t out, size_t n_in, size_t n_out, size_t n_rows,
            cublasLtMatmulAlgo_t* algo) const {
    Layout a(CUDA_R_8F_E4M3, n_in, n_out, static_cast<int64_t>(n_in));
    Layout b(CUDA_R_8F_E4M3, n_in, n_rows, static_cast<int64_t>(n_in));
    Layout c(out, n_out, n_rows, static_cast<int64_t>(n_out));
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace_bytes, sizeof(workspace_bytes)),
             "cublasLtMatmulPreferenceSetAttribute");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, desc, a.h, b.h, c.h, c.h, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
      return false;
    *algo = result.algo;
    return true;
  }

  const Plan& plan(size_t n_in, size_t n_out, size_t n_rows) {
    const auto key = std::make_tuple(n_in, n_out, n_rows);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p{};
    p.vec = vec && find(vec, CUDA_R_32F, n_in, n_out, n_rows, &p.algo);
    if (!p.vec && !find(plain, acc_type, n_in, n_out, n_rows, &p.algo))
      fail("cuda", "cuBLASLt has no FP8 product for ", n_rows, " rows of ", n_in, " -> ", n_out);
    return plans.emplace(key, p).first->second;
  }
};

Fp8Gemm::Fp8Gemm(void* workspace, size_t workspace_bytes, bool outer_vec)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.workspace = workspace;
  m.workspace_bytes = workspace_bytes;
  check_lt(cublasLtCreate(&m.lt), "cublasLtCreate");
  m.plain = make_desc(false);
  // f32 results where this cuBLASLt has FP8 kernels that write them, else
  // bf16 (asked on a small shape: the output types FP8 kernels support do
  // not depend on the shape). Scales applied by cuBLASLt only with f32.
  cublasLtMatmulAlgo_t probe;
  if (!m.find(m.plain, CUDA_R_32F, 64, 64, 16, &probe)) {
    m.acc_type = CUDA_R_16BF;
    if (!m.find(m.plain, CUDA_R_16BF, 64, 64, 16, &probe))
      fail("cuda", "cuBLASLt offers no FP8 (E4M3) product on this GPU");
  }
  if (outer_vec && m.acc_type == CUDA_R_32F) m.vec = make_desc(true);
}

Fp8Gemm::~Fp8Gemm() {
  if (impl_->vec) cublasLtMatmulDescDestroy(impl_->vec);
  cublasLtMatmulDescDestroy(impl_->plain);
  cublasLtDestroy(impl_->lt);
}

size_t Fp8Gemm::scratch_bytes(size_t n_out, size_t n_rows) const {
  return impl_->acc_type == CUDA_R_16BF ? n_out * n_rows * 2 : 0;
}

bool Fp8Gemm::scales_in_cublas(size_t n_in, size_t n_out, size_t n_rows) const {
  auto it = impl_->plans.find(std::make_tuple(n_in, n_out, n_rows));
  return it != impl_->plans.end() && it->second.vec;
}

void Fp8Gemm::product(const uint8_t* w, const float* w_scales, const uint8_t* x,
                      const float* x_scales, size_t n_in, size_t n_out, size_t n_rows, float* y,
                      void* scratch, cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  FERRY_CHECK(n_in % 16 == 0 && n_in > 0, "fp8", "FP8 products need n_in a multiple of 16, not ",
              n_in);
  Impl& m = *impl_;
  const Impl::Plan& p = m.plan(n_in, n_out, n_rows);
  cublasLtMatmulDesc_t desc = p.vec ? m.vec : m.plain;
  const cudaDataType_t out = p.vec ? CUDA_R_32F : m.acc_type;
  if (p.vec) {
    set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scales);
    set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scales);
  }
  void* acc = out == CUDA_R_32F ? static_cast<void*>(y) : scratch;
  FERRY_CHECK(acc != nullptr, "fp8", "a bf16 FP8 product needs scratch");
  Layout a(CUDA_R_8F_E4M3, n_in, n_out, static_cast<int64_t>(n_in));
  Layout b(CUDA_R_8F_E4M3, n_in, n_rows, static_cast<int64_t>(n_in));
  Layout c(out, n_out, n_rows, static_cast<int64_t>(n_out));
  const float one = 1.0f, zero = 0.0f;
  check_lt(cublasLtMatmul(m.lt, desc, &one, w, a.h, x, b.h, &zero, acc, c.h, acc, c.h, &p.algo,
                          m.workspace, m.workspace_bytes, stream),
           "cublasLtMatmul");
  if (!p.vec)
    scale_fp8_product(acc, out == CUDA_R_16BF, x_scales, w_scales, n_rows, n_out, y, stream);
}

}  // namespace ferry::cuda
