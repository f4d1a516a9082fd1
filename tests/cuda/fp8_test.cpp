// --fp8's pieces (cuda/fp8.h) against host references: the per-row E4M3
// quantization code for code, and the FP8 products (cuBLASLt's, and
// ferry's decode and mma kernels) against the same codes multiplied out in
// double.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "cuda/fp8.h"
#include "cuda/matmul_tc.cuh"
#include "cuda_test_util.h"

namespace ferry::test {
namespace {

using cuda::kFp8Max;

float e4m3_value(uint8_t c) {
  __nv_fp8_e4m3 v;
  v.__x = c;
  return static_cast<float>(v);
}

// Row j of E4M3 weight codes (w, [.., n] row-major) against x(k) in double:
// the exact sum and the sum of |terms|, which bounds an f32 sum's error.
struct RefDot {
  double sum = 0, mag = 0;
};
template <typename X>
RefDot ref_dot(const std::vector<uint8_t>& w, size_t j, size_t n, X x) {
  RefDot d;
  for (size_t k = 0; k < n; ++k) {
    const double t = double(e4m3_value(w[j * n + k])) * x(k);
    d.sum += t;
    d.mag += std::fabs(t);
  }
  return d;
}

// What quantize_fp8_rows must give for one row (fp8.h's definition; the
// rounding is cuda_fp8.h's host conversion, the device uses the hardware's).
void host_quantize(const std::vector<float>& row, std::vector<uint8_t>& codes, float& scale) {
  float a = 0.0f;
  for (float v : row) a = std::fmax(a, std::fabs(v));
  const bool zero = !(a > 0.0f);
  const float inv = zero ? 1.0f : kFp8Max / a;
  scale = zero ? 1.0f : a / kFp8Max;
  codes.resize(row.size());
  for (size_t i = 0; i < row.size(); ++i)
    codes[i] = __nv_cvt_float_to_fp8(row[i] * inv, __NV_SATFINITE, __NV_E4M3);
}

// Both operands of an FP8 product made as the backend makes them: bf16
// weights ~ N(0, 0.05) and f32 activations ~ N(0, 2), each row quantized
// by quantize_fp8_rows (synchronized: the kernels read their first
// weights before their dependency wait); y poisoned.
struct Fp8Operands {
  size_t n_in, n_out, n_rows;
  DeviceBuffer<uint8_t> wc, xc;
  DeviceBuffer<float> ws, xs, y;
  Fp8Operands(std::mt19937& rng, size_t in, size_t out, size_t rows)
      : n_in(in),
        n_out(out),
        n_rows(rows),
        wc(out * in),
        xc(rows * in),
        ws(out),
        xs(rows),
        y(rows * out) {
    std::vector<uint16_t> w(n_out * n_in);
    std::vector<float> x(n_rows * n_in);
    for (auto& v : w) v = f32_to_bf16(std::normal_distribution<float>(0.0f, 0.05f)(rng));
    for (auto& v : x) v = std::normal_distribution<float>(0.0f, 2.0f)(rng);
    DeviceBuffer<uint16_t> dw(w);
    DeviceBuffer<float> dx(x);
    y.poison();
    cuda::quantize_fp8_rows(dw.get(), DType::BF16, n_out, n_in, wc.get(), ws.get(), nullptr);
    cuda::quantize_fp8_rows(dx.get(), DType::F32, n_rows, n_in, xc.get(), xs.get(), nullptr);
    CK(cudaDeviceSynchronize());
  }
};

// The outputs of y farther from the codes multiplied out in double than an
// f32 sum's bound (2^-10 of the sum of |terms|, scaled), plus 2^-8 of the
// value where the sums were rounded to bf16; the first few are reported.
size_t count_off(const Fp8Operands& o, bool bf16_sums) {
  const std::vector<uint8_t> hw = o.wc.download(), hx = o.xc.download();
  const std::vector<float> hws = o.ws.download(), hxs = o.xs.download(), got = o.y.download();
  size_t bad = 0;
  for (size_t r = 0; r < o.n_rows; ++r)
    for (size_t j = 0; j < o.n_out; ++j) {
      const auto [sum, mag] =
          ref_dot(hw, j, o.n_in, [&](size_t k) { return e4m3_value(hx[r * o.n_in + k]); });
      const double scale = double(hxs[r]) * hws[j];
      const double want = sum * scale;
      double tol = std::ldexp(mag, -10) * scale;
      if (bf16_sums) tol += std::ldexp(std::fabs(want), -8);
      const double g = got[r * o.n_out + j];
      if (!(std::fabs(g - want) <= tol) && ++bad <= 5)
        ADD_FAILURE() << o.n_in << "->" << o.n_out << " x" << o.n_rows << " (" << r << ", " << j
                      << "): " << g << " against " << want << " (tol " << tol << ")";
    }
  return bad;
}

class Fp8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    if (!cuda::fp8_supported(0)) GTEST_SKIP() << "no FP8 tensor cores";
  }
};

void quantize_case(size_t n);

// Codes and scales are exact: every row of F32, BF16 and F16 values, at
// magnitudes from 1e-6 to 1e4, with a row of zeros and a row holding a NaN.
// Rows of 1,000 F32 values take the kernel's register path, rows of 1,002
// (not a multiple of 4) its loop.
TEST_F(Fp8Test, QuantizeRowsMatchesHostCodeForCode) {
  for (const size_t n : {size_t{1000}, size_t{1002}}) quantize_case(n);
}

void quantize_case(size_t n) {
  std::mt19937 rng(11);
  const size_t n_rows = 7;
  std::vector<float> x(n_rows * n);
  const float mags[n_rows] = {1e-6f, 1e-2f, 1.0f, 3.0f, 1e4f, 0.0f, 1.0f};
  for (size_t r = 0; r < n_rows; ++r)
    for (size_t i = 0; i < n; ++i)
      x[r * n + i] = mags[r] * std::normal_distribution<float>(0.0f, 1.0f)(rng);
  x[6 * n + 123] = std::numeric_limits<float>::quiet_NaN();
  for (DType type : {DType::F32, DType::BF16, DType::F16}) {
    // The values the kernel sees: x rounded to the input type.
    std::vector<float> seen(x);
    std::vector<uint16_t> half(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      if (type == DType::BF16) {
        half[i] = f32_to_bf16(x[i]);
        seen[i] = bf16_to_f32(half[i]);
      } else if (type == DType::F16) {
        half[i] = f32_to_f16(x[i]);
        seen[i] = f16_to_f32(half[i]);
      }
    }
    DeviceBuffer<float> xf(x);
    DeviceBuffer<uint16_t> xh(half);
    DeviceBuffer<uint8_t> codes(n_rows * n);
    DeviceBuffer<float> scales(n_rows);
    codes.poison(0x55);
    scales.poison();
    cuda::quantize_fp8_rows(type == DType::F32 ? static_cast<const void*>(xf.get()) : xh.get(),
                            type, n_rows, n, codes.get(), scales.get(), nullptr);
    const std::vector<uint8_t> got = codes.download();
    const std::vector<float> got_scales = scales.download();
    for (size_t r = 0; r < n_rows; ++r) {
      std::vector<uint8_t> want;
      float want_scale = 0;
      host_quantize(std::vector<float>(seen.begin() + r * n, seen.begin() + (r + 1) * n), want,
                    want_scale);
      EXPECT_EQ(bits(got_scales[r]), bits(want_scale)) << "type " << int(type) << " row " << r;
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(got[r * n + i], want[i]) << "type " << int(type) << " row " << r << " i " << i;
    }
    // The largest magnitude of a row maps to +-448 exactly.
    EXPECT_EQ(got_scales[5], 1.0f);  // the row of zeros
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[5 * n + i] & 0x7f, 0) << i;
  }
}

// The whole product: cuBLASLt's sum of code products times the row's and
// the column's scales, applied by cuBLASLt itself where it offers that
// (outer_vec) and by scale_fp8_product otherwise; both ways are run. The
// reference sums the same codes' values in double. Tolerance: Hopper's FP8
// tensor cores add their products at reduced precision and cuBLASLt
// promotes the partial sums to f32 every few k steps; 2^-10 of the sum of
// |terms| covers both with room to spare, while a wrong layout or scale is
// off by the size of the terms themselves. Sums stored as bf16 (where
// cuBLASLt writes no f32 for FP8) add 2^-8 of the value.
TEST_F(Fp8Test, ProductMatchesCodesMultipliedOut) {
  std::mt19937 rng(5);
  void* workspace = nullptr;
  const size_t ws_bytes = size_t{32} << 20;
  CK(cudaMalloc(&workspace, ws_bytes));
  struct Shape {
    size_t n_in, n_out, n_rows;
  };
  for (bool outer_vec : {true, false}) {
    cuda::Fp8Gemm gemm(workspace, ws_bytes, outer_vec);
    for (const Shape s :
         {Shape{64, 48, 1}, Shape{160, 64, 3}, Shape{64, 160, 8}, Shape{4096, 1024, 8},
          Shape{1024, 4096, 17}, Shape{256, 128, 64}, Shape{512, 256, 300}}) {
      Fp8Operands o(rng, s.n_in, s.n_out, s.n_rows);
      DeviceBuffer<uint8_t> scratch(std::max<size_t>(gemm.scratch_bytes(s.n_out, s.n_rows), 1));
      gemm.product(o.wc.get(), o.ws.get(), o.xc.get(), o.xs.get(), s.n_in, s.n_out, s.n_rows,
                   o.y.get(), scratch.get(), nullptr);
      const bool bf16_sums = gemm.scratch_bytes(s.n_out, s.n_rows) > 0 &&
                             !gemm.scales_in_cublas(s.n_in, s.n_out, s.n_rows);
      if (!outer_vec) {
        EXPECT_FALSE(gemm.scales_in_cublas(s.n_in, s.n_out, s.n_rows));
      }
      std::printf("[fp8] %zu -> %zu x %zu: scales applied by %s%s\n", s.n_in, s.n_out, s.n_rows,
                  gemm.scales_in_cublas(s.n_in, s.n_out, s.n_rows) ? "cuBLASLt" : "ferry",
                  bf16_sums ? " (bf16 sums)" : "");
      EXPECT_EQ(count_off(o, bf16_sums), 0u)
          << s.n_in << "->" << s.n_out << " x" << s.n_rows << " outer_vec " << outer_vec;
    }
  }
  cudaFree(workspace);
}

// Decode steps' kernel: E4M3 codes against bf16 activations for 1-8 rows,
// against the same values multiplied out in double. The kernel sums in f32
// (per lane in k order, then lanes and warps by trees), so it is within
// 2^-16 of the sum of |terms| (n_in up to 14,336: about 2^14 additions of
// relative error 2^-24 each in the worst case); a wrong column, row or
// scale is off by the size of the terms. Column counts that are not a
// multiple of the kernel's 2 or 4 columns a block, and n_in of one partial
// stretch (48) and of many (14,336), are covered.
TEST_F(Fp8Test, DecodeKernelMatchesCodesMultipliedOut) {
  std::mt19937 rng(9);
  struct Shape {
    size_t n_in, n_out;
  };
  for (const Shape s : {Shape{48, 33}, Shape{4096, 1024}, Shape{14336, 258}, Shape{160, 64}})
    for (size_t n_rows = 1; n_rows <= cuda::kFp8GemvRows; ++n_rows) {
      std::vector<uint16_t> w(s.n_out * s.n_in), x(n_rows * s.n_in);
      for (auto& v : w) v = f32_to_bf16(std::normal_distribution<float>(0.0f, 0.05f)(rng));
      for (auto& v : x) v = f32_to_bf16(std::normal_distribution<float>(0.0f, 2.0f)(rng));
      DeviceBuffer<uint16_t> dw(w), dx(x);
      DeviceBuffer<uint8_t> wc(s.n_out * s.n_in);
      DeviceBuffer<float> ws(s.n_out), y(n_rows * s.n_out);
      y.poison();
      cuda::quantize_fp8_rows(dw.get(), DType::BF16, s.n_out, s.n_in, wc.get(), ws.get(), nullptr);
      // gemv_fp8 reads its first weights before its dependency wait (they
      // are settled when the backend runs it), so they must be written
      // before it launches, not by the kernel just ahead of it.
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cuda::gemv_fp8(wc.get(), ws.get(), dx.get(), s.n_in, s.n_out, n_rows, y.get(), nullptr);
      const std::vector<uint8_t> hw = wc.download();
      const std::vector<float> hws = ws.download(), got = y.download();
      size_t bad = 0;
      for (size_t r = 0; r < n_rows; ++r)
        for (size_t j = 0; j < s.n_out; ++j) {
          const auto [sum, mag] =
              ref_dot(hw, j, s.n_in, [&](size_t k) { return bf16_to_f32(x[r * s.n_in + k]); });
          const double want = sum * hws[j], tol = std::ldexp(mag, -16) * hws[j];
          const double g = got[r * s.n_out + j];
          if (!(std::fabs(g - want) <= tol) && ++bad <= 5)
            ADD_FAILURE() << s.n_in << "->" << s.n_out << " x" << n_rows << " (" << r << ", " << j
                          << "): " << g << " against " << want << " (tol " << tol << ")";
        }
      EXPECT_EQ(bad, 0u) << s.n_in << "->" << s.n_out << " x" << n_rows;
    }
}

// Steps of more rows (matmul_fp8): E4M3 codes against quantized
// activations on the FP8 mma, against the same codes multiplied out in
// double, with the tolerance of cuBLASLt's product above (the kernel adds
// the tensor core's sums of 128 products in f32). Row counts from 1
// (decode steps of more than kFp8GemvDefaultRows rows take it) to
// several row tiles (of 32 or 64 rows), column counts that are not a
// multiple of a tile's 64, k split over CTAs and not (narrow products
// split, 8,192 columns do not), and n_in of less than one stage of 128
// (64), of many (14,336) and not a multiple of 128 (4,112: the last
// stage is partly zeros). A second run of a shape gives the same bits
// (the splits are added in one order).
TEST_F(Fp8Test, MmaKernelMatchesCodesMultipliedOut) {
  if (!cuda::matmul_fp8_applies(64)) GTEST_SKIP() << "matmul_fp8 runs on Hopper only";
  EXPECT_FALSE(cuda::matmul_fp8_applies(72));  // n_in must be a multiple of 16
  std::mt19937 rng(13);
  struct Shape {
    size_t n_in, n_out, n_rows;
  };
  for (const Shape s :
       {Shape{64, 33, 9}, Shape{128, 40, 16}, Shape{4096, 1024, 1}, Shape{4096, 520, 4},
        Shape{14336, 200, 8}, Shape{4096, 1024, 17}, Shape{4096, 1024, 64}, Shape{256, 100, 65},
        Shape{192, 72, 130}, Shape{14336, 96, 33}, Shape{64, 8192, 24}, Shape{128, 8200, 57},
        Shape{4112, 200, 40}, Shape{208, 64, 32}, Shape{256, 704, 20}, Shape{384, 2624, 40},
        Shape{384, 2500, 70}}) {
    Fp8Operands o(rng, s.n_in, s.n_out, s.n_rows);
    DeviceBuffer<uint8_t> scratch(
        std::max<size_t>(cuda::matmul_fp8_scratch(s.n_in, s.n_out, s.n_rows), 1));
    const auto run = [&] {
      cuda::matmul_fp8(o.wc.get(), o.ws.get(), o.xc.get(), o.xs.get(), s.n_in, s.n_out, s.n_rows,
                       o.y.get(), scratch.get(), nullptr);
    };
    run();
    EXPECT_EQ(count_off(o, false), 0u) << s.n_in << "->" << s.n_out << " x" << s.n_rows;
    const std::vector<float> first = o.y.download();
    o.y.poison();
    scratch.poison();
    run();
    EXPECT_EQ(first_bit_diff(first, o.y.download().data(), first.size()), -1)
        << s.n_in << "->" << s.n_out << " x" << s.n_rows;
  }
}

// Bad shapes are refused with an error naming the operation, before any
// device work (no GPU needed): matmul_fp8 with n_in 0 or not a multiple of 16,
// and a tensor map of elements neither 1 nor 2 bytes wide.
TEST(Fp8Errors, BadShapesAreRefused) {
  float y = 0.0f;
  EXPECT_FALSE(cuda::matmul_fp8_applies(72));
  EXPECT_THROW(cuda::matmul_fp8(nullptr, nullptr, nullptr, nullptr, 72, 8, 9, &y, nullptr, nullptr),
               Error);
  EXPECT_FALSE(cuda::matmul_fp8_applies(0));  // (no k: nothing to cut)
  EXPECT_THROW(cuda::matmul_fp8(nullptr, nullptr, nullptr, nullptr, 0, 8, 9, &y, nullptr, nullptr),
               Error);
  EXPECT_THROW(cuda::tc::tensor_map_sw128(nullptr, 4, 64, 8, 8), Error);
}

}  // namespace
}  // namespace ferry::test
