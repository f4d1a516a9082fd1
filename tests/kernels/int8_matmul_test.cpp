// MatmulMode::Int8 (docs/KERNELS.md, "Int8 mode"): the documented formula,
// computed here from the raw blocks, bit for bit; every kernel (reference,
// AVX2, AVX-512 with and without VNNI) against the reference bit for bit, for
// every supported weight type, row counts, row offsets (batch invariance) and
// thread counts; and the int8 result against the exact f32 matmul within the
// bound that activation rounding implies.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
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

const DType kInt8Types[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1,
                            DType::Q4_K, DType::Q5_K, DType::Q6_K};

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
  // and 16 (25). K-quants: one super-block (a chunk of 8), whole chunks
  // (512, 2048 = a 1B model's n_in) and chunks plus a tail of 8 (768, 1280).
  const std::vector<size_t> widths = k_quant ? std::vector<size_t>{256, 512, 768, 1280, 2048}
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

// The int8 formula's view of 32-element block b of a weight row, read
// straight from GGML's layouts: codes q_i with weight = scale_i * (q_i -
// bias) + m, where scale_i is the block's one float scale dw (or, Q6_K, d
// times the int8 scale of the 16-element sub-block: sc[i / 16]).
struct WeightBlock {
  int32_t q[32];
  int32_t bias = 0;
  int32_t sc[2] = {1, 1};  // Q6_K's sub-block scales, else 1
  float dw = 0, m = 0;
  bool has_min = false;  // Q4_1, Q4_K, Q5_K
};
WeightBlock weight_block(DType t, const uint8_t* row, size_t b) {
  WeightBlock w;
  auto h = [](const uint8_t* p) { return f16_to_f32(load_u16(p)); };
  switch (t) {
    case DType::Q8_0:
      w.dw = h(row + 34 * b);
      for (int i = 0; i < 32; ++i) w.q[i] = static_cast<int8_t>(row[34 * b + 2 + i]);
      break;
    case DType::Q4_0:
    case DType::Q4_1: {
      const uint8_t* blk = row + (t == DType::Q4_0 ? 18 : 20) * b;
      const uint8_t* qs = blk + (t == DType::Q4_0 ? 2 : 4);
      w.dw = h(blk);
      if (t == DType::Q4_0) w.bias = 8;
      if (t == DType::Q4_1) {
        w.m = h(blk + 2);
        w.has_min = true;
      }
      for (int i = 0; i < 16; ++i) {
        w.q[i] = qs[i] & 0xf;
        w.q[i + 16] = qs[i] >> 4;
      }
      break;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool five = t == DType::Q5_K;
      const uint8_t* sb = row + (five ? 176 : 144) * (b / 8);
      const int s = static_cast<int>(b % 8);
      uint8_t sc, mn;
      k_scale_min(s, sb + 4, &sc, &mn);
      w.dw = h(sb) * sc;
      w.m = -(h(sb + 2) * mn);
      w.has_min = true;
      const uint8_t* qs = sb + (five ? 48 : 16) + 32 * (s / 2);
      for (int i = 0; i < 32; ++i) {
        w.q[i] = (s % 2 ? qs[i] >> 4 : qs[i] & 0xf);
        if (five) w.q[i] |= ((sb[16 + i] >> s) & 1) << 4;
      }
      break;
    }
    case DType::Q6_K: {
      // Block b % 8 = 4 half + run: element i takes a nibble of ql[64 half
      // + 32 (run % 2) + i] (low for runs 0, 1) and bits 2 run, 2 run + 1 of
      // qh[32 half + i]; sub-blocks 2 (b % 8) and 2 (b % 8) + 1 scale it.
      const uint8_t* sb = row + 210 * (b / 8);
      const int k = static_cast<int>(b % 8), half = k / 4, run = k % 4;
      w.dw = h(sb + 208);
      w.bias = 32;
      w.sc[0] = static_cast<int8_t>(sb[192 + 2 * k]);
      w.sc[1] = static_cast<int8_t>(sb[192 + 2 * k + 1]);
      for (int i = 0; i < 32; ++i) {
        const uint8_t l = sb[64 * half + 32 * (run % 2) + i], hb = sb[128 + 32 * half + i];
        w.q[i] = ((run < 2 ? l : l >> 4) & 0xf) | (((hb >> (2 * run)) & 3) << 4);
      }
      break;
    }
    default:
      ADD_FAILURE() << "no int8 view of " << dtype_traits(t).name;
  }
  return w;
}

// The formula of docs/KERNELS.md, "Int8 mode", written out on its own: per
// activation block, d = amax / 127 and codes c = round-half-even(x / d)
// clamped to 127 (std::nearbyint in the default rounding mode), S = sum c;
// per weight block, isum = sum_s sc_s * sum_{i in s} (q_i - bias) * c_i
// (exact), lane[b % 16] = fma(dw * d, isum, lane) and, with a min,
// fma(m, float(S) * d, lane); then Vec16's fixed tree over the lanes:
// s8_i = l_i + l_(i+8), s4_i = s8_i + s8_(i+4), y = (s4_0 + s4_2) + (s4_1 + s4_3).
float formula(DType t, const uint8_t* row, const float* x, size_t K) {
  float lane[16] = {};
  for (size_t b = 0; b < K / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    int32_t c[32], S = 0;
    for (int i = 0; i < 32; ++i) {
      c[i] =
          d > 0 ? static_cast<int32_t>(std::clamp(std::nearbyint(xb[i] / d), -127.0f, 127.0f)) : 0;
      S += c[i];
    }
    const WeightBlock w = weight_block(t, row, b);
    int64_t isum = 0;
    for (int s = 0; s < 2; ++s) {
      int64_t part = 0;
      for (int i = 16 * s; i < 16 * s + 16; ++i) part += int64_t{w.q[i] - w.bias} * c[i];
      isum += w.sc[s] * part;
    }
    EXPECT_LT(std::llabs(isum), int64_t{1} << 24);  // so float(isum) is exact
    float& l = lane[b % 16];
    l = std::fma(w.dw * d, static_cast<float>(isum), l);
    if (w.has_min) l = std::fma(w.m, static_cast<float>(S) * d, l);
  }
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = lane[i] + lane[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// The kernels compute exactly the formula, element by element.
TEST_P(Int8MatmulTest, MatchesTheFormulaBitForBit) {
  const DType t = GetParam();
  const size_t K = dtype_traits(t).block_elems == 256 ? 1280 : 800, N = 19, R = 5;
  auto wbytes = random_weights(t, K, N, 21);
  const WeightView w{t, wbytes.data(), K, N};
  const auto x = activations(R, K, 23);
  for (const Kernel& k : test::int8_kernels())
    for (size_t n : {size_t{1}, R}) {  // natural and chunked activation layouts
      const auto y = run(k.cols, nullptr, w, x.data(), n);
      for (size_t r = 0; r < n; ++r)
        for (size_t j = 0; j < N; ++j) {
          const float want = formula(t, wbytes.data() + j * w.row_bytes(), x.data() + r * K, K);
          EXPECT_EQ(std::bit_cast<uint32_t>(y[r * N + j]), std::bit_cast<uint32_t>(want))
              << k.name << " rows=" << n << " r=" << r << " j=" << j << ": " << y[r * N + j]
              << " vs " << want;
        }
    }
}

// Per 32-element block b of weight row j: dw_b and m_b such that each weight
// is dw_b * code + m_b with |code| <= qmax (the fields the int8 formula uses;
// Q6_K: dw_b = d * the larger |sub-block scale|).
struct BlockScale {
  double dw, m;
};
std::vector<BlockScale> block_scales(DType t, const uint8_t* row, size_t K) {
  std::vector<BlockScale> s;
  for (size_t b = 0; b < K / 32; ++b) {
    const WeightBlock w = weight_block(t, row, b);
    const double sc = std::max(std::abs(w.sc[0]), std::abs(w.sc[1]));
    s.push_back({double{w.dw} * sc, double{w.m}});
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
  const double qmax = t == DType::Q8_0 ? 128 : t == DType::Q6_K ? 32 : t == DType::Q5_K ? 31 : 15;
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
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
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

// Every path's activation quantizer writes the reference's bytes: codes,
// d, sum and sum_lo, bit for bit, for random blocks and for the edge cases
// (zero and all-equal blocks, ties at .5 steps, subnormal and huge values,
// one infinity or NaN in a block, which take the scalar code).
TEST(Int8Matmul, QuantizerGivesTheSameBytesOnEveryPath) {
  constexpr size_t nb = 12;
  std::vector<float> x = random_floats(32 * nb, 5);
  for (size_t k = 0; k < 32; ++k) {
    x[32 * 1 + k] = 0.0f;                                     // zero block
    x[32 * 2 + k] = -3.0f;                                    // all equal
    x[32 * 4 + k] = std::ldexp(static_cast<float>(k + 1), -140);  // subnormal
    x[32 * 5 + k] = std::ldexp(static_cast<float>(k) - 16.0f, 120);  // huge
  }
  // amax 127, so d = 1 and codes 0-30 are all ties (-15.5 .. 14.5).
  for (size_t k = 0; k < 32; ++k) x[32 * 3 + k] = k < 31 ? static_cast<float>(k) - 15.5f : 127.0f;
  x[32 * 6 + 7] = INFINITY;
  x[32 * 7 + 30] = -INFINITY;
  x[32 * 8 + 3] = NAN;
  x[32 * 9 + 0] = -0.0f;
  struct Out {
    std::vector<int8_t> codes = std::vector<int8_t>(32 * nb);
    std::vector<float> d = std::vector<float>(nb);
    std::vector<int32_t> sum = std::vector<int32_t>(nb), sum_lo = std::vector<int32_t>(nb);
  };
  auto quantize = [&](CpuPath p) {
    Out o;
    kernels_for(p).quantize_int8_row(x.data(), nb, o.codes.data(), o.d.data(), o.sum.data(),
                                     o.sum_lo.data());
    return o;
  };
  const Out ref = quantize(CpuPath::Reference);
  EXPECT_EQ(ref.d[1], 0.0f);
  EXPECT_EQ(ref.d[3], 1.0f);
  EXPECT_EQ(ref.codes[32 * 3 + 0], -16);  // -15.5 rounds to even
  EXPECT_EQ(ref.codes[32 * 3 + 1], -14);  // -14.5 too
  EXPECT_TRUE(std::isinf(ref.d[6]) && std::isinf(ref.d[7]) && std::isnan(ref.d[8]));
  for (size_t k = 0; k < 32; ++k) EXPECT_EQ(ref.codes[32 * 6 + k], 0);
  for (CpuPath p : test::available_paths()) {
    const Out o = quantize(p);
    EXPECT_EQ(o.codes, ref.codes) << cpu_path_name(p);
    EXPECT_EQ(0, std::memcmp(o.d.data(), ref.d.data(), nb * sizeof(float))) << cpu_path_name(p);
    EXPECT_EQ(o.sum, ref.sum) << cpu_path_name(p);
    EXPECT_EQ(o.sum_lo, ref.sum_lo) << cpu_path_name(p);
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
