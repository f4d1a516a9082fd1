// FP8 (E4M3) products for the CUDA backend's --fp8 option (docs/CUDA.md,
// "FP8 weights"): the layers' dense weights stored as E4M3 codes with one
// f32 scale per output column, each step's activations quantized the same
// way per row, and the products run by cuBLASLt on Hopper's (and Ada's)
// FP8 tensor cores. cuBLASLt picks its kernel by the problem's shape, so
// these products are fast mode only: a row's result may change with the
// batch (CudaOptions::fp8 requires deterministic = false).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"

namespace ferry::cuda {

inline constexpr float kFp8Max = 448.0f;  // the largest finite E4M3 value

// Whether `device` runs FP8 tensor-core products (compute capability 8.9 or
// newer).
bool fp8_supported(int device);

// Rows of x ([n_rows, n] of F32, BF16 or F16 values) as E4M3 codes with one
// scale per row: with a = max |x[r, :]|, scales[r] = a / 448 and
// codes[r, k] = e4m3(x[r, k] * (448 / a)) rounded to nearest even and
// saturated to +-448 (a row of zeros: scale 1, codes 0). So x ~ code * scale,
// and a row's codes and scale depend on that row alone. A NaN anywhere in a
// row gives NaN codes where it is; an infinite value makes the row NaN.
void quantize_fp8_rows(const void* x, DType type, size_t n_rows, size_t n, uint8_t* codes,
                       float* scales, cudaStream_t stream);

// Decode steps: y = (x W^T)[r, j] * w_scales[j] for n_rows <= kFp8GemvRows
// rows of bf16 activations (x [n_rows, n_in], 16-byte aligned rows) and
// E4M3 weights w [n_out, n_in] (n_in a multiple of 16), products and sums
// in f32: the activations are not rounded to FP8. Reads each code once,
// so it runs near the copy bandwidth where cuBLASLt's small-batch FP8
// kernels and the quantize and scale launches around them do not. Its
// first weights are loaded before the kernel's dependency wait (as every
// product's are), so w must not be written by work still running on the
// stream when it launches (the backend quantizes weights at load time).
inline constexpr size_t kFp8GemvRows = 8;
// The rows up to which the backend's decode steps take gemv_fp8 unless
// FERRY_CUDA_FP8_GEMV_ROWS says otherwise (more rows: matmul_fp8).
inline constexpr size_t kFp8GemvDefaultRows = 2;
void gemv_fp8(const uint8_t* w, const float* w_scales, const uint16_t* x, size_t n_in, size_t n_out,
              size_t n_rows, float* y, cudaStream_t stream);

// Steps of more rows than gemv_fp8 takes, up to kFp8MmaRows: y = x W^T on
// E4M3 codes as Fp8Gemm::product forms it (x quantized per row by
// quantize_fp8_rows; y[r, j] = sum * (x_scales[r] * w_scales[j])), in
// ferry's kernel on Hopper's FP8 warpgroup mma: tiles of 64 columns x 32 or
// 64 rows fed by TMA, k split over CTAs where the columns alone give too
// few (the splits' sums, in `scratch` of matmul_fp8_scratch bytes, are
// added in a fixed order). The f32 sum adds the tensor core's sums of 128
// products at a time (Hopper adds FP8 products inside an mma chain at
// reduced precision). Runs any row count; matmul_fp8_applies: n_in a
// positive multiple of 16 and a device that runs the sm_90a image (Hopper). Like
// gemv_fp8 it loads its first weights before its dependency wait.
inline constexpr size_t kFp8MmaRows = 64;
bool matmul_fp8_applies(size_t n_in);
size_t matmul_fp8_scratch(size_t n_in, size_t n_out, size_t n_rows);
void matmul_fp8(const uint8_t* w, const float* w_scales, const uint8_t* x, const float* x_scales,
                size_t n_in, size_t n_out, size_t n_rows, float* y, void* scratch,
                cudaStream_t stream);

// y[r, j] = acc[r, j] * (row_scale[r] * col_scale[j]) for [n_rows, n_out]
// products; acc is f32 or bf16 (acc_bf16) and may be y itself when f32.
void scale_fp8_product(const void* acc, bool acc_bf16, const float* row_scale,
                       const float* col_scale, size_t n_rows, size_t n_out, float* y,
                       cudaStream_t stream);

// y = x W^T on E4M3 codes with their scales, through cuBLASLt: w [n_out,
// n_in] and x [n_rows, n_in] row-major codes (the "TN" layout FP8 products
// need), y [n_rows, n_out] row-major f32, y[r, j] = (sum_k w[j, k] x[r, k])
// * x_scales[r] * w_scales[j] with f32 accumulation. Where cuBLASLt offers
// it for the shape, it applies the scales itself (per-row and per-column
// "outer vector" scales); otherwise it writes the sum of code products
// (as f32, or as bf16 into `scratch` where this cuBLASLt writes no f32 for
// FP8 inputs) and scale_fp8_product applies them. n_in must be a multiple
// of 16 and the pointers 16-byte aligned. One instance per stream; it
// keeps the algorithm chosen for each shape.
class Fp8Gemm {
 public:
  // workspace: device memory cuBLASLt may use (so that nothing is
  // allocated inside a CUDA graph capture). outer_vec = false: never let
  // cuBLASLt apply the scales (tests compare both ways).
  Fp8Gemm(void* workspace, size_t workspace_bytes, bool outer_vec = true);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;
  // Bytes of `scratch` a product of this shape may use (0: none).
  size_t scratch_bytes(size_t n_out, size_t n_rows) const;
  void product(const uint8_t* w, const float* w_scales, const uint8_t* x, const float* x_scales,
               size_t n_in, size_t n_out, size_t n_rows, float* y, void* scratch,
               cudaStream_t stream);
  // Whether cuBLASLt applies the scales for this shape (after a product of
  // it has run).
  bool scales_in_cublas(size_t n_in, size_t n_out, size_t n_rows) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::cuda
