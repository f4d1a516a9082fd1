// cuda::quantize_q8 and cuda::matmul_q8 (int8 mode on the GPU):
// - the activation codes, scales and code sums bit-identical to the CPU's
//   int8 quantization formula (kernels/ops.cpp), evaluated here on the host;
// - every tile variant's output bit-identical to a host evaluation of the
//   determinism contract (matmul_q8.cu: one f32 chain of fma steps over the
//   weight's pieces), for row counts from 1 to 130 and ragged n_out; since
//   the host value of y[r, j] depends on row r and column j alone, this is
//   also the batch invariance of every variant;
// - the same outputs against an independent f64 evaluation through the
//   CPU's weight decoder (kernels::decode_row) and the dequantized
//   activations, which checks the element mapping of each type. Tolerance:
//   each f32 step rounds once, losing at most 2^-24 of the running sum's
//   magnitude, itself at most S = sum_k |w_k xq_k|; n_in = 4096 takes 272
//   steps per output (Q4_K: 128 pieces x 2 plus 16 part additions; Q6_K:
//   256 + 16), and the scale products and the decoder's own rounding add
//   about 3 more, so |y - ref| <= 275 * 2^-24 S = 1.64e-5 S; we allow
//   2e-5 S.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "cuda/matmul_q8.cuh"
#include "cuda_test_util.h"
#include "kernels/kernel_test_util.h"
#include "kernels/quant_blocks.h"

namespace ferry::test {
namespace {

struct HostQ8 {
  std::vector<int8_t> codes;
  std::vector<float> d, dsum;
};

// kernels/ops.cpp's quantize_row, per 32-element block.
HostQ8 quantize_host(const std::vector<float>& x, size_t n_rows, size_t n_in) {
  HostQ8 q;
  const size_t n_blocks = n_rows * n_in / 32;
  q.codes.resize(n_rows * n_in);
  q.d.resize(n_blocks);
  q.dsum.resize(n_blocks);
  for (size_t b = 0; b < n_blocks; ++b) {
    const float* xb = x.data() + 32 * b;
    float amax = 0.0f;
    for (size_t k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(xb[k]));
    for (size_t k = 0; k < 32; ++k) amax = std::isnan(xb[k]) ? xb[k] : amax;
    const float d = amax / 127.0f;
    int32_t s = 0;
    for (size_t k = 0; k < 32; ++k) {
      float v = 0.0f;
      if (d > 0.0f && std::isfinite(d)) {
        constexpr float kMagic = 0x1.8p23f;
        const float t = xb[k] / d + kMagic;
        v = t - kMagic;
      }
      v = std::min(127.0f, std::max(-127.0f, v));
      q.codes[32 * b + k] = static_cast<int8_t>(v);
      s += static_cast<int8_t>(v);
    }
    q.d[b] = d;
    q.dsum[b] = static_cast<float>(s) * d;
  }
  return q;
}

uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The contract (matmul_q8.cu) for one weight row against one quantized row.
float contract(DType t, const uint8_t* row, size_t n_in, const int8_t* c, const float* dx,
               const float* ds) {
  float y = 0.0f;
  for (size_t sb = 0; sb < n_in / 256; ++sb) {
    const int8_t* cs = c + 256 * sb;
    float acc = 0.0f;  // the super-block's part
    if (t == DType::Q4_K) {
      const uint8_t* blk = row + 144 * sb;
      const float d = f16_to_f32(u16(blk)), dmin = f16_to_f32(u16(blk + 2));
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, mn;
        kernels::k_scale_min(s, blk + 4, &sc, &mn);
        int32_t isum = 0;
        for (int i = 0; i < 32; ++i)
          isum += ((blk[16 + 32 * (s / 2) + i] >> (4 * (s & 1))) & 15) * cs[32 * s + i];
        const size_t b = 8 * sb + s;
        const float dw = d * static_cast<float>(sc);
        const float step = dw * dx[b];
        acc = std::fma(step, static_cast<float>(isum), acc);
        const float nm = -(dmin * static_cast<float>(mn));
        acc = std::fma(nm, ds[b], acc);
      }
    } else {
      const uint8_t* blk = row + 210 * sb;
      const float d = f16_to_f32(u16(blk + 208));
      for (int p = 0; p < 16; ++p) {
        const int u = p / 2, half = u / 4, m = u % 4, ih = p % 2;
        int32_t isum = 0;
        for (int i = 0; i < 16; ++i) {
          const int ii = 16 * ih + i;
          const int lo = (blk[64 * half + 32 * (m & 1) + ii] >> (4 * (m >> 1))) & 15;
          const int hi = (blk[128 + 32 * half + ii] >> (2 * m)) & 3;
          isum += ((lo | (hi << 4)) - 32) * cs[16 * p + i];
        }
        const float dw = d * static_cast<float>(static_cast<int8_t>(blk[192 + p]));
        const float step = dw * dx[8 * sb + p / 2];
        acc = std::fma(step, static_cast<float>(isum), acc);
      }
    }
    y += acc;
  }
  return y;
}

std::vector<float> contract_all(DType t, const std::vector<uint8_t>& w, size_t n_in, size_t n_out,
                                const HostQ8& q, size_t n_rows) {
  const size_t rb = row_bytes(t, n_in), nb = n_in / 32;
  std::vector<float> y(n_rows * n_out);
  for (size_t r = 0; r < n_rows; ++r)
    for (size_t j = 0; j < n_out; ++j)
      y[r * n_out + j] = contract(t, w.data() + j * rb, n_in, q.codes.data() + r * n_in,
                                  q.d.data() + r * nb, q.dsum.data() + r * nb);
  return y;
}

// Device copies of a weight (padded by 16 bytes, as the backend pads) and
// of the quantized rows.
struct DeviceQ8 {
  DeviceBuffer<uint8_t> w;
  DeviceBuffer<int8_t> codes;
  DeviceBuffer<float> d, dsum;
  DeviceQ8(const std::vector<uint8_t>& wh, const HostQ8& q)
      : w(wh.size() + 16), codes(q.codes), d(q.d), dsum(q.dsum) {
    std::vector<uint8_t> padded(wh);
    padded.resize(wh.size() + 16, 0);
    w.upload(padded);
  }
};

// y through variant cfg (matmul_q8's own choice when cfg < 0); the 64 floats
// past the end must stay poisoned.
std::vector<float> run_q8(const DeviceQ8& dev, DType t, size_t n_in, size_t n_out, size_t n_rows,
                          int cfg) {
  constexpr size_t guard = 64;
  DeviceBuffer<float> y(n_rows * n_out + guard);
  y.poison();
  if (cfg < 0)
    cuda::matmul_q8(dev.w.get(), t, n_in, n_out, dev.codes.get(), dev.d.get(), dev.dsum.get(),
                    n_rows, y.get(), nullptr);
  else
    cuda::q8::matmul_q8_with(static_cast<size_t>(cfg), dev.w.get(), t, n_in, n_out,
                             dev.codes.get(), dev.d.get(), dev.dsum.get(), n_rows, y.get(),
                             nullptr);
  auto out = y.download();
  for (size_t i = n_rows * n_out; i < out.size(); ++i)
    EXPECT_TRUE(std::isnan(out[i])) << "wrote past the end at " << i;
  out.resize(n_rows * n_out);
  return out;
}

TEST(CudaQ8, QuantizeMatchesTheCpuFormula) {
  REQUIRE_GPU();
  const size_t n_rows = 5, n_in = 512;
  auto x = random_floats(n_rows * n_in, 3, 4.0f);
  for (size_t k = 0; k < 32; ++k) x[32 + k] = 0.0f;  // an all-zero block
  x[100] = std::numeric_limits<float>::infinity();   // block 3: zero codes, d = inf
  x[200] = std::numeric_limits<float>::quiet_NaN();  // block 6: zero codes, d = NaN
  for (size_t k = 0; k < 32; ++k) x[320 + k] = 1e-30f * static_cast<float>(k);  // tiny values
  x[416] = 127.0f;  // block 13: d = 1, so the quotients below are exact halves
  x[417] = 2.5f;    // -> 2 (ties to even)
  x[418] = -3.5f;   // -> -4
  x[419] = 0.5f;    // -> 0
  for (size_t k = 420; k < 448; ++k) x[k] = 0.0f;
  const HostQ8 want = quantize_host(x, n_rows, n_in);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<int8_t> codes(n_rows * n_in);
  DeviceBuffer<float> d(n_rows * n_in / 32), dsum(n_rows * n_in / 32);
  codes.poison(0x55);
  cuda::quantize_q8(dx.get(), n_rows, n_in, codes.get(), d.get(), dsum.get(), nullptr);
  EXPECT_EQ(codes.download(), want.codes);
  const auto gd = d.download(), gs = dsum.download();
  for (size_t b = 0; b < gd.size(); ++b) {
    if (std::isnan(want.d[b])) {
      EXPECT_TRUE(std::isnan(gd[b]) && std::isnan(gs[b])) << "block " << b;
      continue;
    }
    EXPECT_EQ(bits(gd[b]), bits(want.d[b])) << "block " << b;
    if (std::isnan(want.dsum[b]))
      EXPECT_TRUE(std::isnan(gs[b])) << "block " << b;
    else
      EXPECT_EQ(bits(gs[b]), bits(want.dsum[b])) << "block " << b;
  }
}

TEST(CudaQ8, EveryVariantIsTheContractBitForBit) {
  REQUIRE_GPU();
  for (DType t : {DType::Q4_K, DType::Q6_K})
    for (size_t n_in : {256u, 1536u, 14336u}) {
      const size_t n_out = n_in > 4096 ? 40 : 200;  // not a multiple of any tile
      const auto w = random_weights(t, n_in, n_out, 41 + static_cast<uint32_t>(n_in));
      for (size_t n_rows : {1u, 2u, 3u, 5u, 8u, 37u, 130u}) {
        const auto x = random_floats(n_rows * n_in, static_cast<uint32_t>(n_rows), 2.0f);
        const HostQ8 q = quantize_host(x, n_rows, n_in);
        const auto want = contract_all(t, w, n_in, n_out, q, n_rows);
        DeviceQ8 dev(w, q);
        for (int cfg = -1; cfg < static_cast<int>(cuda::q8::n_configs()); ++cfg) {
          const auto got = run_q8(dev, t, n_in, n_out, n_rows, cfg);
          const long at = first_bit_diff(want, got.data(), want.size());
          EXPECT_EQ(at, -1) << dtype_traits(t).name << " n_in " << n_in << " rows " << n_rows
                            << " variant " << (cfg < 0 ? "auto" : cuda::q8::config(cfg).name)
                            << " first diff at " << at << ": " << (at < 0 ? 0.0f : got[at])
                            << " vs " << (at < 0 ? 0.0f : want[at]);
        }
      }
    }
}

// Several weights in one launch (matmul_q8_many: Q/K/V, gate/up): every
// variant's outputs equal the contract for each weight, and nothing is
// written past any output.
TEST(CudaQ8, ManyWeightsInOneLaunchAreTheContract) {
  REQUIRE_GPU();
  for (DType t : {DType::Q4_K, DType::Q6_K}) {
    const size_t n_in = 512, n_outs[] = {70, 16, 130};
    std::vector<std::vector<uint8_t>> wh;
    for (size_t i = 0; i < 3; ++i) wh.push_back(random_weights(t, n_in, n_outs[i], 90 + i));
    for (size_t n_rows : {1u, 3u, 40u}) {
      const auto x = random_floats(n_rows * n_in, 91 + static_cast<uint32_t>(n_rows), 2.0f);
      const HostQ8 q = quantize_host(x, n_rows, n_in);
      std::vector<std::unique_ptr<DeviceQ8>> dev;
      for (size_t i = 0; i < 3; ++i) dev.push_back(std::make_unique<DeviceQ8>(wh[i], q));
      for (size_t cfg = 0; cfg < cuda::q8::n_configs(); ++cfg) {
        constexpr size_t guard = 64;
        std::vector<std::unique_ptr<DeviceBuffer<float>>> y;
        const uint8_t* ws[3];
        float* ys[3];
        for (size_t i = 0; i < 3; ++i) {
          y.push_back(std::make_unique<DeviceBuffer<float>>(n_rows * n_outs[i] + guard));
          y.back()->poison();
          ws[i] = dev[i]->w.get();
          ys[i] = y.back()->get();
        }
        cuda::q8::matmul_q8_many_with(cfg, ws, t, n_in, n_outs, dev[0]->codes.get(),
                                      dev[0]->d.get(), dev[0]->dsum.get(), n_rows, ys, nullptr);
        for (size_t i = 0; i < 3; ++i) {
          const auto want = contract_all(t, wh[i], n_in, n_outs[i], q, n_rows);
          const auto got = y[i]->download();
          EXPECT_EQ(first_bit_diff(want, got.data(), want.size()), -1)
              << dtype_traits(t).name << " " << cuda::q8::config(cfg).name << " weight " << i
              << " rows " << n_rows;
          for (size_t k = want.size(); k < got.size(); ++k)
            ASSERT_TRUE(std::isnan(got[k])) << "weight " << i << " wrote past its end";
        }
      }
    }
  }
}

TEST(CudaQ8, MatchesTheDecodedWeightsInDouble) {
  REQUIRE_GPU();
  for (DType t : {DType::Q4_K, DType::Q6_K}) {
    const size_t n_in = 4096, n_out = 96, n_rows = 3;
    const auto w = random_weights(t, n_in, n_out, 77);
    const auto x = random_floats(n_rows * n_in, 78, 3.0f);
    const HostQ8 q = quantize_host(x, n_rows, n_in);
    DeviceQ8 dev(w, q);
    const auto got = run_q8(dev, t, n_in, n_out, n_rows, -1);
    std::vector<float> wf(n_in);
    const size_t rb = row_bytes(t, n_in);
    double worst = 0;
    for (size_t j = 0; j < n_out; ++j) {
      kernels::decode_row(t, w.data() + j * rb, wf.data(), n_in);
      for (size_t r = 0; r < n_rows; ++r) {
        double ref = 0, mag = 0;
        for (size_t k = 0; k < n_in; ++k) {
          const double xq =
              static_cast<double>(q.codes[r * n_in + k]) * q.d[r * (n_in / 32) + k / 32];
          ref += static_cast<double>(wf[k]) * xq;
          mag += std::fabs(static_cast<double>(wf[k]) * xq);
        }
        const double err = std::fabs(got[r * n_out + j] - ref);
        EXPECT_LE(err, 2e-5 * mag) << dtype_traits(t).name << " r " << r << " j " << j;
        worst = std::max(worst, err / mag);
      }
    }
    std::printf("[q8] %s: worst error %.3g of sum|w x|\n", std::string(dtype_traits(t).name).c_str(), worst);
  }
}

TEST(CudaQ8, RefusesWhatItCannotTake) {
  REQUIRE_GPU();
  DeviceBuffer<uint8_t> w(4096);
  DeviceBuffer<int8_t> c(512);
  DeviceBuffer<float> d(16), y(16);
  EXPECT_THROW(cuda::matmul_q8(w.get(), DType::Q8_0, 256, 1, c.get(), d.get(), d.get(), 1, y.get(),
                               nullptr),
               ferry::Error);
  EXPECT_THROW(cuda::matmul_q8(w.get(), DType::Q4_K, 288, 1, c.get(), d.get(), d.get(), 1, y.get(),
                               nullptr),
               ferry::Error);
  EXPECT_THROW(cuda::quantize_q8(d.get(), 1, 40, c.get(), d.get(), d.get(), nullptr), ferry::Error);
  // Launches of several weights: at most 4, and one output per weight.
  const uint8_t* five[5] = {w.get(), w.get(), w.get(), w.get(), w.get()};
  const size_t n_outs[5] = {1, 1, 1, 1, 1};
  float* ys[5] = {y.get(), y.get(), y.get(), y.get(), y.get()};
  EXPECT_THROW(cuda::matmul_q8_many(five, DType::Q4_K, 256, n_outs, c.get(), d.get(), d.get(), 1,
                                    ys, nullptr),
               ferry::Error);
  EXPECT_THROW(cuda::matmul_q8_many(std::span(five, 2), DType::Q4_K, 256, std::span(n_outs, 2),
                                    c.get(), d.get(), d.get(), 1, std::span(ys, 1), nullptr),
               ferry::Error);
  EXPECT_FALSE(cuda::q8_supported(DType::Q8_0));
  EXPECT_TRUE(cuda::q8_supported(DType::Q4_K) && cuda::q8_supported(DType::Q6_K));
}

}  // namespace
}  // namespace ferry::test
