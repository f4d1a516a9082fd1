// MatmulMode::Int8 (docs/KERNELS.md, "Int8 mode"): every kernel (reference,
// AVX2, AVX-512 with and without VNNI) against the reference bit for bit, for
// every supported weight type, row counts, row offsets (batch invariance) and
// thread counts; and the int8 result against the exact f32 matmul within the
// bound that activation rounding implies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/cpu.h"
#include "core/half.h"
#include "kernels/kernel_test_util.h"
#include "kernels/ops.h"
#include "kernels/path_kernels.h"
#include "kernels/quant_blocks.h"

namespace ferry::kernels {
namespace {

using test::random_floats;
using test::random_weights;
using Kernel = test::Int8Kernel;

const DType kInt8Types[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q5_K};

std::vector<float> run(MatmulInt8Cols cols, ThreadPool* pool, const WeightView& w, const float* x,
                       size_t n_rows) {
  std::vector<float> y(n_rows * w.n_out);
  matmul_int8_with(cols, Context{pool, CpuPath::Reference, MatmulMode::Int8}, w, x, n_rows,
                   y.data());
  return y;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * 4) == 0;
}

// Activations with some structure: a zero block (d = 0), a block with a
// large outlier, and rows of different magnitudes.
std::vector<float> activations(size_t rows, size_t K, uint32_t seed) {
  auto x = random_floats(rows * K, seed);
  for (size_t r = 0; r < rows; ++r)
    for (size_t k = 0; k < K; ++k) x[r * K + k] *= 1.0f + static_cast<float>(r % 5);
  std::fill(x.begin(), x.begin() + 32, 0.0f);
  x[K + 40] = 250.0f;
  return x;
}

class Int8MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(Int8MatmulTest, KernelsRowsOffsetsAndThreadsGiveIdenticalBits) {
  const DType t = GetParam();
  const bool k_quant = dtype_traits(t).block_elems == 256;
  // Block counts cover every chunk width (docs/KERNELS.md): a short chunk
  // alone (3 and 7 blocks: widths 4, 8; 8 for K-quants), whole chunks (16,
  // 32), chunks plus a tail of width 4 (18 = SmolLM2's 576, 33), 8 (24, 40)
  // and 16 (25).
  const std::vector<size_t> widths = k_quant ? std::vector<size_t>{256, 512, 768, 1280}
                                             : std::vector<size_t>{96, 224, 512, 576, 800, 1056};
  const size_t R = 33, N = 37;
  for (size_t K : widths) {
    auto wbytes = random_weights(t, K, N, 7 + static_cast<uint32_t>(K));
    const WeightView w{t, wbytes.data(), K, N};
    const auto x = activations(R, K, 11);
    const auto ref = run(reference_kernels().matmul_int8_cols, nullptr, w, x.data(), R);
    // The public entry point with ctx.matmul = Int8 runs the same arithmetic.
    for (CpuPath p : {CpuPath::Reference, best_cpu_path()}) {
      std::vector<float> y(R * N);
      matmul(Context{nullptr, p, MatmulMode::Int8}, w, x.data(), R, y.data());
      EXPECT_TRUE(same_bits(y.data(), ref.data(), R * N)) << cpu_path_name(p) << " K=" << K;
    }
    for (const Kernel& k : test::int8_kernels())
      for (size_t threads : {1u, 2u, 3u}) {
        ThreadPool pool(threads);
        for (size_t n : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 16u, 33u})
          for (size_t off : {size_t{0}, R - n}) {
            const auto y = run(k.cols, &pool, w, x.data() + off * K, n);
            EXPECT_TRUE(same_bits(y.data(), &ref[off * N], n * N))
                << k.name << " K=" << K << " threads=" << threads << " rows=" << n
                << " offset=" << off;
          }
      }
  }
}

// Per 32-element block b of weight row j: dw_b and m_b such that each weight
// is dw_b * code + m_b with |code| <= qmax (the fields the int8 formula uses).
struct BlockScale {
  double dw, m;
};
std::vector<BlockScale> block_scales(DType t, const uint8_t* row, size_t K) {
  std::vector<BlockScale> s;
  auto h = [](const uint8_t* p) { return static_cast<double>(f16_to_f32(load_u16(p))); };
  for (size_t b = 0; b < K / 32; ++b) switch (t) {
      case DType::Q8_0:
        s.push_back({h(row + 34 * b), 0});
        break;
      case DType::Q4_0:
        s.push_back({h(row + 18 * b), 0});
        break;
      case DType::Q4_1:
        s.push_back({h(row + 20 * b), h(row + 20 * b + 2)});
        break;
      default: {
        const uint8_t* sb = row + (t == DType::Q4_K ? 144 : 176) * (b / 8);
        uint8_t sc, mn;
        k_scale_min(static_cast<int>(b % 8), sb + 4, &sc, &mn);
        s.push_back({h(sb) * sc, h(sb + 2) * mn});
      }
    }
  return s;
}

// |int8 - exact| <= Q + F per output element, where
//   Q = sum_b (d_b / 2) * sum_{i in b} |w_i|: each activation moves by at
//       most half its block's step d_b = amax_b / 127 when rounded to a code;
//   F = (nb + 8) * 2^-24 * sum_b U_b * sum_{i in b} (|x_i| + d_b) + the
//       exact path's K * 2^-24 * sum |w_i x_i|: float rounding of both sides,
//       with U_b = qmax * |dw_b| + |m_b| >= |w_i| bounding every term the
//       int8 sum forms (each term passes at most nb + 8 roundings: its
//       products, its lane's FMAs and the 4-level lane tree).
// Also checks the typical error: for uniform activations the rounding is
// uniform in [-d/2, d/2], so relative RMS error ~ 1 / (2 * 127) ~ 0.4%;
// asserted below 1% over the rows without an outlier block.
TEST_P(Int8MatmulTest, CloseToExactMatmulWithinRoundingBound) {
  const DType t = GetParam();
  const size_t K = dtype_traits(t).block_elems == 256 ? 1536 : 576, N = 64, R = 8;
  const double qmax = t == DType::Q8_0 ? 128 : t == DType::Q5_K ? 31 : 15;
  auto wbytes = random_weights(t, K, N, 3);
  const WeightView w{t, wbytes.data(), K, N};
  const auto x = activations(R, K, 5);
  std::vector<float> exact(R * N), fast(R * N), wf(K * N);
  matmul(Context{nullptr, best_cpu_path(), MatmulMode::Exact}, w, x.data(), R, exact.data());
  matmul(Context{nullptr, best_cpu_path(), MatmulMode::Int8}, w, x.data(), R, fast.data());
  decode_row(t, wbytes.data(), wf.data(), K * N);
  double err2 = 0, ref2 = 0;
  for (size_t j = 0; j < N; ++j) {
    const auto sc = block_scales(t, wbytes.data() + j * w.row_bytes(), K);
    for (size_t r = 0; r < R; ++r) {
      double q = 0, f = 0, fe = 0;
      for (size_t b = 0; b < K / 32; ++b) {
        double amax = 0;
        for (size_t i = 0; i < 32; ++i)
          amax = std::max(amax, std::fabs(double{x[r * K + 32 * b + i]}));
        const double d = static_cast<float>(amax) / 127.0f;
        const double u = qmax * std::fabs(sc[b].dw) + std::fabs(sc[b].m);
        for (size_t i = 0; i < 32; ++i) {
          const double wi = wf[j * K + 32 * b + i], xi = x[r * K + 32 * b + i];
          q += d / 2 * std::fabs(wi);
          f += u * (std::fabs(xi) + d);
          fe += std::fabs(wi * xi);
        }
      }
      const double bound = q + (K / 32 + 8) * 0x1p-24 * f + K * 0x1p-24 * fe;
      const double e = fast[r * N + j], ex = exact[r * N + j];
      ASSERT_LE(std::fabs(e - ex), bound) << "row " << r << " col " << j;
      if (r == 1) continue;  // the outlier row: its error is the bound's business
      err2 += (e - ex) * (e - ex);
      ref2 += ex * ex;
    }
  }
  const double rel = std::sqrt(err2 / ref2);
  std::printf("%s: int8 vs exact relative RMS error %.4f%%\n",
              std::string(dtype_traits(t).name).c_str(), 100 * rel);
  EXPECT_LT(rel, 0.01);
}

INSTANTIATE_TEST_SUITE_P(Int8Types, Int8MatmulTest, ::testing::ValuesIn(kInt8Types),
                         [](const auto& info) {
                           return std::string(dtype_traits(info.param).name);
                         });

// When every activation block's amax is 127 and its values are integers, the
// codes equal the activations (d = 1): with Q8_0 weights of scale 1 all
// products and sums are small integers, so int8 and exact agree exactly.
TEST(Int8Matmul, ExactWhenActivationsAreCodes) {
  const size_t K = 576, N = 24, R = 3;
  auto wbytes = random_weights(DType::Q8_0, K, N, 9);
  const uint16_t one = f32_to_f16(1.0f);
  for (size_t b = 0; b < wbytes.size() / 34; ++b) std::memcpy(&wbytes[34 * b], &one, 2);
  const WeightView w{DType::Q8_0, wbytes.data(), K, N};
  std::vector<float> x(R * K);
  std::mt19937 rng(4);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = i % 32 == 7 ? -127.0f : static_cast<float>(static_cast<int>(rng() % 255) - 127);
  std::vector<float> exact(R * N), fast(R * N);
  for (CpuPath p : {CpuPath::Reference, best_cpu_path()}) {
    matmul(Context{nullptr, p, MatmulMode::Exact}, w, x.data(), R, exact.data());
    matmul(Context{nullptr, p, MatmulMode::Int8}, w, x.data(), R, fast.data());
    EXPECT_TRUE(same_bits(exact.data(), fast.data(), R * N)) << cpu_path_name(p);
  }
}

TEST(Int8Matmul, UnsupportedTypesRunExact) {
  const size_t K = 256, N = 8;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q6_K}) {
    EXPECT_FALSE(int8_matmul_supported(t));
    auto wbytes = random_weights(t, K, N, 2);
    const WeightView w{t, wbytes.data(), K, N};
    auto x = random_floats(K, 3);
    std::vector<float> a(N), b(N);
    matmul(Context{nullptr, CpuPath::Reference, MatmulMode::Exact}, w, x.data(), 1, a.data());
    matmul(Context{nullptr, CpuPath::Reference, MatmulMode::Int8}, w, x.data(), 1, b.data());
    EXPECT_TRUE(same_bits(a.data(), b.data(), N)) << dtype_traits(t).name;
  }
}

TEST(Int8Matmul, ModeNames) {
  EXPECT_EQ(parse_matmul_mode("int8"), MatmulMode::Int8);
  EXPECT_EQ(parse_matmul_mode("exact"), MatmulMode::Exact);
  EXPECT_EQ(parse_matmul_mode("fast"), std::nullopt);
  EXPECT_EQ(matmul_mode_name(MatmulMode::Int8), "int8");
  std::printf("avx512vnni: %d\n", cpu_features().avx512vnni ? 1 : 0);
}

}  // namespace
}  // namespace ferry::kernels
