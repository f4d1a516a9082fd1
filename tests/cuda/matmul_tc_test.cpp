// cuda::matmul_tc (tensor-core dense product): accuracy against an f64
// reference, every output written and nothing past the end, and its
// determinism contract bit for bit: a row alone equals the same row at any
// position of any batch, and every tile variant gives the same bits.
//
// Tolerance. Inputs are bf16 (weights bf16 or f16) widened exactly; the f64
// reference of y[r, j] is exact to ~1e-16. Products of bf16 x bf16 (and of
// the f16 weight's exact bf16 parts) are exact in the tensor core; the error
// is the accumulation: each mma step (16 products into the f32 accumulator)
// is taken to lose at most ~2 ulp (2^-22 relative, truncating alignment) of
// the largest magnitude involved, which is <= S = sum_k |W[j,k] x[r,k]|. So
// |y - ref| <= (steps + 1) * 2^-22 * S with steps = n_in / 16 (n_in / 8 for
// f16 weights: two steps per k16). For n_in = 4096 that is 6e-5 * S; the
// observed error is printed (typically far under it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "cuda/cuda_ops.h"
#include "cuda/matmul_tc.cuh"
#include "cuda_test_util.h"

namespace ferry::test {
namespace {

using kernels::KvFormat;

// Random 16-bit inputs in [-scale, scale] and their exact f32 values.
struct Half16 {
  std::vector<uint16_t> bits;
  std::vector<float> f;
};
Half16 random_half16(size_t n, uint32_t seed, bool f16, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  Half16 h;
  h.bits.resize(n);
  h.f.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = d(rng);
    h.bits[i] = f16 ? f32_to_f16(v) : f32_to_bf16(v);
    h.f[i] = f16 ? f16_to_f32(h.bits[i]) : bf16_to_f32(h.bits[i]);
  }
  return h;
}

// y for x [n_rows, n_in] at d_x (device), through `cfg` (or matmul_tc's own
// choice when cfg < 0). y is poisoned first; `guard` floats past the end must
// stay poisoned (checked here).
std::vector<float> run_tc(const DeviceBuffer<uint16_t>& w, bool f16, size_t n_in, size_t n_out,
                          const uint16_t* d_x, size_t n_rows, int cfg = -1) {
  constexpr size_t guard = 64;
  DeviceBuffer<float> d_y(n_rows * n_out + guard);
  d_y.poison();
  if (cfg < 0)
    cuda::matmul_tc(w.get(), f16, n_in, n_out, d_x, n_rows, d_y.get(), nullptr);
  else
    cuda::tc::matmul_tc_with(static_cast<size_t>(cfg), w.get(), f16, n_in, n_out, d_x, n_rows,
                             d_y.get(), nullptr);
  auto y = d_y.download();
  for (size_t i = n_rows * n_out; i < y.size(); ++i)
    EXPECT_EQ(bits(y[i]), 0xffffffffu) << "wrote past the end at " << i - n_rows * n_out;
  y.resize(n_rows * n_out);
  return y;
}

struct Shape {
  size_t n_in, n_out;
};
// n_out not a multiple of any tile (and 1); n_in a multiple of 16 that is
// not one of 64 or 128 (partial last stage), one k step, and the 8B shapes'
// n_in values.
const Shape kShapes[] = {{16, 1}, {64, 40}, {80, 130}, {1040, 77}, {4096, 272}, {14336, 48}};

TEST(CudaTc, MatmulTcMatchesF64Reference) {
  REQUIRE_GPU();
  for (bool f16 : {false, true})
    for (const Shape& s : kShapes) {
      const auto w = random_half16(s.n_out * s.n_in, 101 + s.n_in, f16);
      const DeviceBuffer<uint16_t> d_w(w.bits);
      const size_t steps = s.n_in / 16 * (f16 ? 2 : 1);
      const double tol = (steps + 1) * std::ldexp(1.0, -22);
      double worst = 0;  // max |err| / S seen
      for (size_t n_rows : {1, 2, 7, 8, 9, 16, 17, 32, 33, 64, 65, 129, 300}) {
        if (s.n_in * n_rows * s.n_out > (size_t{200} << 20)) continue;  // CPU time
        const auto x = random_half16(n_rows * s.n_in, 202 + n_rows, false, 2.0f);
        const DeviceBuffer<uint16_t> d_x(x.bits);
        const auto y = run_tc(d_w, f16, s.n_in, s.n_out, d_x.get(), n_rows);
        size_t bad = 0;
        for (size_t r = 0; r < n_rows; ++r)
          for (size_t j = 0; j < s.n_out; ++j) {
            double ref = 0, mag = 0;
            for (size_t k = 0; k < s.n_in; ++k) {
              const double p = double{w.f[j * s.n_in + k]} * x.f[r * s.n_in + k];
              ref += p;
              mag += std::fabs(p);
            }
            const double got = y[r * s.n_out + j];
            const double err = std::fabs(got - ref);
            if (!(err <= tol * mag + 1e-30)) {  // also catches NaN (unwritten)
              if (bad++ < 5)
                ADD_FAILURE() << (f16 ? "f16" : "bf16") << " n_in=" << s.n_in
                              << " n_out=" << s.n_out << " n_rows=" << n_rows << " r=" << r
                              << " j=" << j << " got " << got << " want " << ref;
            } else if (mag > 0) {
              worst = std::max(worst, err / mag);
            }
          }
        EXPECT_EQ(bad, 0u);
      }
      std::printf("[ tc ] %s n_in=%zu n_out=%zu: max |err|/S = %.3g (bound %.3g)\n",
                  f16 ? "f16 " : "bf16", s.n_in, s.n_out, worst, tol);
    }
}

// The determinism contract: row r computed alone (n_rows = 1) equals row r
// inside batches of 7..300 rows at the first, middle and last offsets of a
// 300-row pool (so it sits at positions 0, middle and B - 1 of batches that
// take different tile variants), bit for bit.
TEST(CudaTc, MatmulTcRowAloneEqualsRowInAnyBatch) {
  REQUIRE_GPU();
  const size_t pool = 300;
  const size_t batches[] = {7, 8, 9, 33, 64, 129, 256, 300};
  const struct {
    Shape s;
    bool f16;
  } cases[] = {{{64, 40}, false},     {{1040, 77}, false}, {{4096, 272}, false},
               {{4096, 4096}, false}, {{1040, 77}, true},  {{14336, 48}, true}};
  for (const auto& c : cases) {
    const Shape s = c.s;
    const auto w = random_half16(s.n_out * s.n_in, 301 + s.n_out, c.f16);
    const auto x = random_half16(pool * s.n_in, 302 + s.n_in, false, 3.0f);
    const DeviceBuffer<uint16_t> d_w(w.bits), d_x(x.bits);
    std::vector<float> alone(pool * s.n_out);
    for (size_t r = 0; r < pool; ++r) {
      const auto y = run_tc(d_w, c.f16, s.n_in, s.n_out, d_x.get() + r * s.n_in, 1);
      std::copy(y.begin(), y.end(), alone.begin() + r * s.n_out);
    }
    for (size_t b : batches)
      for (size_t off : {size_t{0}, (pool - b) / 2, pool - b}) {
        const auto y = run_tc(d_w, c.f16, s.n_in, s.n_out, d_x.get() + off * s.n_in, b);
        const long diff = first_bit_diff(y, alone.data() + off * s.n_out, b * s.n_out);
        EXPECT_EQ(diff, -1) << (c.f16 ? "f16" : "bf16") << " n_in=" << s.n_in
                            << " n_out=" << s.n_out << " batch=" << b << " offset=" << off
                            << ": row " << (diff < 0 ? 0 : diff / s.n_out)
                            << " (position in batch)";
      }
  }
}

// Every tile variant (whatever the row count it is meant for) computes the
// same bits as matmul_tc's choice, for both weight types.
TEST(CudaTc, MatmulTcEveryVariantGivesTheSameBits) {
  REQUIRE_GPU();
  const Shape shapes[] = {{64, 40}, {1040, 77}, {4096, 272}, {80, 1030}};
  for (bool f16 : {false, true})
    for (const Shape& s : shapes) {
      const auto w = random_half16(s.n_out * s.n_in, 401 + s.n_in, f16);
      const DeviceBuffer<uint16_t> d_w(w.bits);
      // (250 rows: four row tiles of 64, the last one ragged)
      for (size_t n_rows : {1, 9, 70, 250, 300}) {
        const auto x = random_half16(n_rows * s.n_in, 402 + n_rows, false, 2.0f);
        const DeviceBuffer<uint16_t> d_x(x.bits);
        const auto want = run_tc(d_w, f16, s.n_in, s.n_out, d_x.get(), n_rows);
        for (size_t i = 0; i < cuda::tc::n_configs(); ++i) {
          if (cuda::tc::config(i).sm90a && !f16 && !cuda::tc::wgmma_available()) continue;
          const auto got =
              run_tc(d_w, f16, s.n_in, s.n_out, d_x.get(), n_rows, static_cast<int>(i));
          EXPECT_EQ(first_bit_diff(want, got.data(), want.size()), -1)
              << cuda::tc::config(i).name << (f16 ? " f16" : " bf16") << " n_in=" << s.n_in
              << " n_out=" << s.n_out << " n_rows=" << n_rows;
        }
      }
    }
}

// Special values flow as IEEE says: a NaN input poisons only its own
// outputs, +-0 and exact cancellation give exact results.
TEST(CudaTc, MatmulTcSpecialValuesStayInTheirOutputs) {
  REQUIRE_GPU();
  const size_t n_in = 64, n_out = 24, n_rows = 5;
  auto w = random_half16(n_out * n_in, 501, false);
  auto x = random_half16(n_rows * n_in, 502, false);
  x.bits[2 * n_in + 7] = 0x7fc0;                               // NaN in row 2
  for (size_t k = 0; k < n_in; ++k) w.bits[3 * n_in + k] = 0;  // column 3: all +0
  const DeviceBuffer<uint16_t> d_w(w.bits), d_x(x.bits);
  const auto y = run_tc(d_w, false, n_in, n_out, d_x.get(), n_rows);
  for (size_t r = 0; r < n_rows; ++r)
    for (size_t j = 0; j < n_out; ++j) {
      const float v = y[r * n_out + j];
      if (r == 2)
        EXPECT_TRUE(std::isnan(v)) << r << "," << j;
      else if (j == 3)
        EXPECT_EQ(v, 0.0f) << r << "," << j;  // zero (either sign)
      else
        EXPECT_TRUE(std::isfinite(v)) << r << "," << j;
    }
}

// The H200's multiprocessors: the picks below were measured there.
constexpr size_t kH200Sms = 132;

// The variant table choose_config applies (host only): pins the picks
// measured best on the H200 for Llama-3.1-8B's shapes (matmul_tc.cu), so a
// change to the menu or the rule shows up here.
TEST(CudaTc, ChooseConfigPicksTheMeasuredVariants) {
  const struct {
    size_t n_in, n_out, n_rows;
    const char* want;
  } cases[] = {{4096, 4096, 1, "S32x8k256"},
               {14336, 4096, 8, "S32x8k512"},
               {4096, 6144, 1, "S32x8k256"},
               {4096, 14336, 1, "S64x8k256"},
               {4096, 28672, 1, "S64x8k256"},
               {4096, 128256, 8, "S64x8"},
               {4096, 1024, 1, "S16x8"},
               {4096, 4096, 16, "S32x16"},
               {4096, 14336, 16, "S64x16"},
               {4096, 4096, 32, "S64x16"},
               {14336, 4096, 32, "S64x16"},
               {4096, 128256, 32, "S64x32"},
               {4096, 4096, 64, "S64x32"},
               {4096, 14336, 64, "L128x64"},
               {4096, 4096, 96, "M64x64"},
               {4096, 128256, 128, "L256x128"},
               {4096, 4096, 256, "L128x64"},
               {4096, 14336, 256, "L256x128"},
               {14336, 4096, 256, "L128x64"},
               {4096, 128256, 256, "L256x128"},
               // Unmeasured (k / v projections): the finest fallbacks.
               {4096, 1024, 32, "S16x16"},
               {4096, 1024, 64, "S32x16"}};
  for (const auto& c : cases)
    EXPECT_STREQ(
        cuda::tc::config(cuda::tc::choose_config(c.n_in, c.n_out, c.n_rows, false, kH200Sms)).name,
        c.want)
        << c.n_in << "->" << c.n_out << " rows=" << c.n_rows;
}

// The same on Hopper, where the wgmma variants take over above 32 rows
// (measured on the H200, 2026-12-01: matmul_tc.cu).
TEST(CudaTc, ChooseConfigPicksTheMeasuredWgmmaVariants) {
  const struct {
    size_t n_in, n_out, n_rows;
    const char* want;
  } cases[] = {{4096, 4096, 32, "S64x16"},      {4096, 4096, 64, "W64x64"},
               {4096, 6144, 64, "W64x64"},      {4096, 28672, 64, "W128x64"},
               {14336, 4096, 64, "W64x64"},     {4096, 128256, 64, "W128x64"},
               {4096, 4096, 128, "W64x64"},     {4096, 6144, 128, "W128x64"},
               {4096, 28672, 128, "W128x128"},  {14336, 4096, 128, "W64x64"},
               {4096, 4096, 256, "W128x64"},    {4096, 6144, 256, "W128x128"},
               {4096, 14336, 256, "W128x256"},  {14336, 4096, 256, "W128x64"},
               {4096, 4096, 512, "W128x128"},   {4096, 6144, 512, "W128x256"},
               {14336, 4096, 512, "W128x128"},  {4096, 4096, 2048, "W128x256"},
               {4096, 128256, 8192, "W128x256"}};
  for (const auto& c : cases)
    EXPECT_STREQ(
        cuda::tc::config(cuda::tc::choose_config(c.n_in, c.n_out, c.n_rows, true, kH200Sms)).name,
        c.want)
        << c.n_in << "->" << c.n_out << " rows=" << c.n_rows;
}

// Decode steps on Hopper take the producer-fed tile whose CTAs all fit at
// once on the device's SMs (two per SM of F16x8s8, three of F16x8, else
// the persistent F32x8), so the pick follows the SM count: o (256 tiles of
// 16 columns) takes F16x8s8 on 132 SMs, F16x8 on 114 (an H100 PCIe).
TEST(CudaTc, ChooseConfigFitsDecodeTilesToTheSmCount) {
  const struct {
    size_t n_in, n_out, sms;
    const char* want;
  } cases[] = {{4096, 4096, 132, "F16x8s8"},  {4096, 4096, 114, "F16x8"},
               {4096, 6144, 132, "F16x8"},    {4096, 6144, 114, "F32x8"},
               {14336, 4096, 132, "F16x8s8"}, {4096, 28672, 132, "F32x8"}};
  for (const auto& c : cases)
    for (size_t rows : {1, 8})
      EXPECT_STREQ(
          cuda::tc::config(cuda::tc::choose_config(c.n_in, c.n_out, rows, true, c.sms)).name,
          c.want)
          << c.n_in << "->" << c.n_out << " sms=" << c.sms << " rows=" << rows;
}

TEST(CudaTc, MatmulTcRejectsBadShapes) {
  // Checked on the host before any launch (no GPU needed).
  alignas(16) static uint16_t buf[64];
  float out[4];
  EXPECT_THROW(cuda::matmul_tc(buf, false, 24, 1, buf, 1, out, nullptr), Error);      // n_in % 16
  EXPECT_THROW(cuda::matmul_tc(buf + 1, false, 16, 1, buf, 1, out, nullptr), Error);  // align
  EXPECT_THROW(cuda::matmul_tc(buf, false, 16, 1, buf + 1, 1, out, nullptr), Error);
  cuda::matmul_tc(buf, false, 16, 1, buf, 0, out, nullptr);  // no rows: nothing to do
}

// Several weights in one launch (matmul_tc_many: Q/K/V, gate/up): each
// output bit-identical to its weight's own matmul_tc call, for every tile
// variant, ragged widths (tiles of one weight end mid-grid) and 1 to 130
// rows; nothing written past any output.
TEST(CudaTc, ManyWeightsInOneLaunchEqualSeparateCalls) {
  REQUIRE_GPU();
  const size_t n_in = 1040, n_outs[] = {77, 16, 200};
  std::vector<Half16> w;
  std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> d_w;
  for (size_t i = 0; i < 3; ++i) {
    w.push_back(random_half16(n_outs[i] * n_in, 401 + i, false));
    d_w.push_back(std::make_unique<DeviceBuffer<uint16_t>>(w.back().bits));
  }
  for (size_t n_rows : {1, 9, 130, 256}) {
    const auto x = random_half16(n_rows * n_in, 402 + n_rows, false, 2.0f);
    const DeviceBuffer<uint16_t> d_x(x.bits);
    std::vector<std::vector<float>> alone;
    for (size_t i = 0; i < 3; ++i)
      alone.push_back(run_tc(*d_w[i], false, n_in, n_outs[i], d_x.get(), n_rows));
    for (size_t cfg = 0; cfg < cuda::tc::n_configs(); ++cfg) {
      if (cuda::tc::config(cfg).sm90a && !cuda::tc::wgmma_available()) continue;
      constexpr size_t guard = 64;
      std::vector<std::unique_ptr<DeviceBuffer<float>>> d_y;
      const uint16_t* ws[3];
      float* ys[3];
      for (size_t i = 0; i < 3; ++i) {
        d_y.push_back(std::make_unique<DeviceBuffer<float>>(n_rows * n_outs[i] + guard));
        d_y.back()->poison();
        ws[i] = d_w[i]->get();
        ys[i] = d_y.back()->get();
      }
      cuda::tc::matmul_tc_many_with(cfg, ws, false, n_in, n_outs, d_x.get(), n_rows, ys, nullptr);
      for (size_t i = 0; i < 3; ++i) {
        const auto y = d_y[i]->download();
        EXPECT_EQ(first_bit_diff(alone[i], y.data(), alone[i].size()), -1)
            << cuda::tc::config(cfg).name << " weight " << i << " rows " << n_rows;
        for (size_t k = n_rows * n_outs[i]; k < y.size(); ++k)
          ASSERT_EQ(bits(y[k]), 0xffffffffu) << "weight " << i << " wrote past its end";
      }
    }
  }
}

// The fused SwiGLU input: every variant with the fused epilogue (the
// two-warpgroup wgmma ones, S64x8k256) gives silu_mul(matmul_tc(gate),
// matmul_tc(up)) bit for bit, and its bf16 copy that of silu_mul; ragged
// widths and row counts, nothing written past the outputs. matmul_tc_swiglu
// applies to wide FFNs up to 8 rows and (Hopper) to any above 32 rows.
TEST(CudaTc, SwigluEpilogueEqualsSeparateOps) {
  REQUIRE_GPU();
  if (!cuda::tc::wgmma_available()) GTEST_SKIP() << "no sm_90a GPU here";
  EXPECT_TRUE(cuda::matmul_tc_swiglu_applies(4096, 14336, 1));
  EXPECT_TRUE(cuda::matmul_tc_swiglu_applies(4096, 14336, 8));
  EXPECT_FALSE(cuda::matmul_tc_swiglu_applies(4096, 14336, 9));
  EXPECT_FALSE(cuda::matmul_tc_swiglu_applies(4096, 14336, 32));
  EXPECT_TRUE(cuda::matmul_tc_swiglu_applies(4096, 14336, 33));
  EXPECT_FALSE(cuda::matmul_tc_swiglu_applies(64, 8, 1));  // narrow: separate ops
  EXPECT_TRUE(cuda::matmul_tc_swiglu_applies(64, 8, 300));
  {  // Where no fused tile applies, or with a variant that has none: refused.
    const DeviceBuffer<uint16_t> w(64 * 8), x(32 * 64);
    DeviceBuffer<float> y(32 * 8);
    EXPECT_THROW(
        cuda::matmul_tc_swiglu(w.get(), w.get(), 64, 8, x.get(), 32, y.get(), nullptr, nullptr),
        Error);
    for (size_t cfg = 0; cfg < cuda::tc::n_configs(); ++cfg) {
      if (cuda::tc::swiglu_variant(cfg)) continue;
      EXPECT_THROW(cuda::tc::matmul_tc_swiglu_with(cfg, w.get(), w.get(), 64, 8, x.get(), 32,
                                                   y.get(), nullptr, nullptr),
                   Error)
          << cuda::tc::config(cfg).name;
    }
  }
  for (const Shape& s : {Shape{1040, 77}, Shape{64, 200}, Shape{4096, 136}}) {
    const auto wg = random_half16(s.n_out * s.n_in, 601 + s.n_in, false);
    const auto wu = random_half16(s.n_out * s.n_in, 602 + s.n_in, false);
    const DeviceBuffer<uint16_t> d_wg(wg.bits), d_wu(wu.bits);
    for (size_t n_rows : {1, 5, 33, 70, 250, 300}) {
      const size_t n = n_rows * s.n_out;
      const auto x = random_half16(n_rows * s.n_in, 603 + n_rows, false, 2.0f);
      const DeviceBuffer<uint16_t> d_x(x.bits);
      // The separate ops: two products, then silu_mul with its bf16 copy.
      DeviceBuffer<float> g(run_tc(d_wg, false, s.n_in, s.n_out, d_x.get(), n_rows)),
          u(run_tc(d_wu, false, s.n_in, s.n_out, d_x.get(), n_rows));
      DeviceBuffer<uint16_t> gb(n);
      cuda::silu_mul(g.get(), u.get(), n, nullptr, gb.get());
      const auto want = g.download();
      const auto want_b = gb.download();
      for (size_t cfg = 0; cfg < cuda::tc::n_configs(); ++cfg) {
        if (!cuda::tc::swiglu_variant(cfg)) continue;
        constexpr size_t guard = 64;
        DeviceBuffer<float> y(n + guard);
        DeviceBuffer<uint16_t> yb(n + guard);
        y.poison();
        CK(cudaMemset(yb.get(), 0xff, (n + guard) * 2));
        cuda::tc::matmul_tc_swiglu_with(cfg, d_wg.get(), d_wu.get(), s.n_in, s.n_out, d_x.get(),
                                        n_rows, y.get(), yb.get(), nullptr);
        const auto got = y.download();
        const auto got_b = yb.download();
        EXPECT_EQ(first_bit_diff(want, got.data(), n), -1)
            << cuda::tc::config(cfg).name << " n_in=" << s.n_in << " n_out=" << s.n_out
            << " rows=" << n_rows;
        EXPECT_TRUE(std::equal(want_b.begin(), want_b.end(), got_b.begin()))
            << "bf16 copy, " << cuda::tc::config(cfg).name << " rows=" << n_rows;
        for (size_t k = n; k < n + guard; ++k) {
          ASSERT_EQ(bits(got[k]), 0xffffffffu) << "wrote past the end";
          ASSERT_EQ(got_b[k], 0xffffu) << "wrote past the bf16 copy's end";
        }
      }
    }
  }
}

// The Q/K/V epilogue (a decode step's product with rope and the KV write
// fused, matmul_tc_qkv_rope): every producer-fed variant gives the bits of
// matmul_tc_many, then rope2 of q and k, then kv_store of k and v, for
// head_dim 64 and 128, 1 to 8 rows, dense caches of each kind (every byte
// of the planes compared) and an affine one (only rotated, the planes left
// alone); nothing is written past the outputs.
TEST(CudaTc, QkvEpilogueEqualsSeparateOps) {
  REQUIRE_GPU();
  if (!cuda::tc::wgmma_available()) GTEST_SKIP() << "no sm_90a GPU here";
  EXPECT_TRUE(cuda::matmul_tc_qkv_rope_applies(4096, 6144, 1));
  EXPECT_TRUE(cuda::matmul_tc_qkv_rope_applies(4096, 6144, 8));
  EXPECT_FALSE(cuda::matmul_tc_qkv_rope_applies(4096, 6144, 9));
  {  // Refused by name: a variant without the epilogue, a head_dim that does
     // not divide the outputs, a dense store without its writes.
    const DeviceBuffer<uint16_t> w(64 * 64), x(64);
    DeviceBuffer<float> y(64);
    const uint16_t* const ws[3] = {w.get(), w.get(), w.get()};
    float* const ys[3] = {y.get(), y.get(), y.get()};
    const size_t outs[3] = {64, 32, 32};
    cuda::QkvEpilogue ep;
    ep.head_dim = 16;
    for (size_t cfg = 0; cfg < cuda::tc::n_configs(); ++cfg) {
      if (cuda::tc::rope_variant(cfg)) continue;
      EXPECT_THROW(
          cuda::tc::matmul_tc_qkv_rope_with(cfg, ws, 64, outs, x.get(), 1, ys, ep, nullptr), Error)
          << cuda::tc::config(cfg).name;
    }
    ep.head_dim = 24;
    EXPECT_THROW(cuda::matmul_tc_qkv_rope(ws, 64, outs, x.get(), 1, ys, ep, nullptr), Error);
    ep.head_dim = 16;
    ep.kv = KvFormat::Kind::BF16;
    EXPECT_THROW(cuda::matmul_tc_qkv_rope(ws, 64, outs, x.get(), 1, ys, ep, nullptr), Error);
  }
  const size_t n_in = 1040, C = 48, q_heads = 4, kv_heads = 2;
  for (size_t hd : {64, 128}) {
    const size_t n_outs[3] = {q_heads * hd, kv_heads * hd, kv_heads * hd};
    std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> d_w;
    for (size_t i = 0; i < 3; ++i)
      d_w.push_back(std::make_unique<DeviceBuffer<uint16_t>>(
          random_half16(n_outs[i] * n_in, 701 + i + hd, false).bits));
    const uint16_t* const ws[3] = {d_w[0]->get(), d_w[1]->get(), d_w[2]->get()};
    std::vector<float> inv_freq(hd / 2);
    for (size_t i = 0; i < hd / 2; ++i)
      inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(hd));
    const DeviceBuffer<float> d_freq(inv_freq);
    for (size_t n_rows : {1, 3, 8}) {
      const auto x = random_half16(n_rows * n_in, 703 + n_rows, false, 2.0f);
      const DeviceBuffer<uint16_t> d_x(x.bits);
      std::vector<int32_t> pos(n_rows);
      for (size_t r = 0; r < n_rows; ++r) pos[r] = static_cast<int32_t>(37 + 1011 * r);
      const DeviceBuffer<int32_t> d_pos(pos);
      for (const KvFormat& f :
           {KvFormat::bf16(), KvFormat::f16(), KvFormat::f32(), KvFormat::affine(4, 64)}) {
        // One run: fresh outputs (poisoned, with guards) and cache planes.
        constexpr size_t guard = 64;
        struct Run {
          std::vector<std::unique_ptr<DeviceBuffer<float>>> y;
          float* ys[3];
          std::unique_ptr<KvPlanes> K, V;
          std::unique_ptr<DeviceBuffer<cuda::KvWrite>> writes;
        };
        auto start = [&](Run& run) {
          for (size_t i = 0; i < 3; ++i) {
            run.y.push_back(std::make_unique<DeviceBuffer<float>>(n_rows * n_outs[i] + guard));
            run.y.back()->poison();
            run.ys[i] = run.y.back()->get();
          }
          run.K = std::make_unique<KvPlanes>(f, hd, kv_heads, C, 0xab);
          run.V = std::make_unique<KvPlanes>(f, hd, kv_heads, C, 0xcd);
          run.K->upload();
          run.V->upload();
          std::vector<cuda::KvWrite> w(n_rows);
          for (size_t r = 0; r < n_rows; ++r) {
            w[r].k = run.K->side(true);
            w[r].v = run.V->side(true);
            w[r].slot = static_cast<uint32_t>((5 + 7 * r) % C);
            w[r].token = static_cast<uint32_t>(r);
          }
          run.writes = std::make_unique<DeviceBuffer<cuda::KvWrite>>(w.size());
          CK(cudaMemcpy(run.writes->get(), w.data(), w.size() * sizeof(cuda::KvWrite),
                        cudaMemcpyHostToDevice));
        };
        const bool dense = f.kind != KvFormat::Kind::Affine;
        Run want;
        start(want);
        cuda::matmul_tc_many(ws, false, n_in, n_outs, d_x.get(), n_rows, want.ys, nullptr);
        cuda::rope2(want.ys[0], q_heads, want.ys[1], kv_heads, n_rows, hd, d_pos.get(),
                    d_freq.get(), nullptr);
        if (dense)
          cuda::kv_store(want.writes->get(), n_rows, kv_heads, hd, want.ys[1], want.ys[2], nullptr);
        for (size_t cfg = 0; cfg < cuda::tc::n_configs(); ++cfg) {
          if (!cuda::tc::rope_variant(cfg)) continue;
          Run got;
          start(got);
          cuda::QkvEpilogue ep;
          ep.pos = d_pos.get();
          ep.inv_freq = d_freq.get();
          ep.head_dim = hd;
          ep.kv = f.kind;
          ep.writes = got.writes->get();
          cuda::tc::matmul_tc_qkv_rope_with(cfg, ws, n_in, n_outs, d_x.get(), n_rows, got.ys, ep,
                                            nullptr);
          const std::string where = std::string(cuda::tc::config(cfg).name) + " " + f.name() +
                                    " head_dim " + std::to_string(hd) + " rows " +
                                    std::to_string(n_rows);
          for (size_t i = 0; i < 3; ++i) {
            const auto a = want.y[i]->download(), b = got.y[i]->download();
            EXPECT_EQ(first_bit_diff(a, b.data(), a.size()), -1) << where << " output " << i;
          }
          for (size_t p = 0; p < got.K->units.size(); ++p) {
            EXPECT_TRUE(got.K->download(p) == want.K->download(p)) << where << " K plane " << p;
            EXPECT_TRUE(got.V->download(p) == want.V->download(p)) << where << " V plane " << p;
          }
        }
      }
    }
  }
}

TEST(CudaTc, ManyWeightsRefusesBadLists) {
  REQUIRE_GPU();
  const DeviceBuffer<uint16_t> w(64), x(64);
  DeviceBuffer<float> y(64);
  const uint16_t* five[5] = {w.get(), w.get(), w.get(), w.get(), w.get()};
  const size_t n_outs[5] = {1, 1, 1, 1, 1};
  float* ys[5] = {y.get(), y.get(), y.get(), y.get(), y.get()};
  EXPECT_THROW(cuda::matmul_tc_many(five, false, 16, n_outs, x.get(), 1, ys, nullptr),
               ferry::Error);  // more than kMaxWeights
  EXPECT_THROW(cuda::matmul_tc_many(std::span(five, 2), false, 16, std::span(n_outs, 2), x.get(), 1,
                                    std::span(ys, 1), nullptr),
               ferry::Error);  // one output for two weights
  EXPECT_THROW(cuda::matmul_tc_many(std::span(five, 1), false, 24, std::span(n_outs, 1), x.get(), 1,
                                    std::span(ys, 1), nullptr),
               ferry::Error);  // n_in not a multiple of 16
}

}  // namespace
}  // namespace ferry::test
