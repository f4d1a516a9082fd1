// ferry's affine KV quantizer against MLX's, bit for bit.
//
// Goldens: tests/data/kv_quant/goldens.json, made by
// tools/goldens/kv_quant_goldens.py from mx.quantize / mx.dequantize
// (mlx 0.32.4, CPU) on float16 matrices [rows, head_dim]. Every value is an
// integer bit pattern, so every comparison here is exact.
#include "kv/affine_quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "core/half.h"

namespace ferry::kv {
namespace {

using nlohmann::json;

const json& goldens() {
  static const json doc = [] {
    const std::string path = std::string(FERRY_TEST_DATA) + "/kv_quant/goldens.json";
    std::ifstream in(path);
    if (!in) return json();
    return json::parse(in);
  }();
  return doc;
}

struct Config {
  size_t head_dim;
  int bits;
  int group;
};

void PrintTo(const Config& c, std::ostream* os) {
  *os << "{head_dim " << c.head_dim << ", bits " << c.bits << ", group " << c.group << "}";
}

std::string config_name(const testing::TestParamInfo<Config>& info) {
  return "hd" + std::to_string(info.param.head_dim) + "_b" + std::to_string(info.param.bits) +
         "_g" + std::to_string(info.param.group);
}

// One golden case, unpacked into flat row-major vectors.
struct Case {
  size_t rows = 0;
  std::vector<std::string> row_names;
  std::vector<uint16_t> x;  // f16 [rows, head_dim]
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales, biases, dequant_f16;
  std::vector<uint32_t> dequant_f32;
};

class AffineQuantGolden : public testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    const json& doc = goldens();
    ASSERT_TRUE(doc.is_object()) << "missing " FERRY_TEST_DATA "/kv_quant/goldens.json";
    const Config c = GetParam();
    const json& in = doc.at("inputs").at(std::to_string(c.head_dim));
    for (const json& j : doc.at("cases")) {
      if (j.at("head_dim") != c.head_dim || j.at("bits") != c.bits || j.at("group") != c.group) {
        continue;
      }
      g_.rows = in.at("rows");
      g_.row_names = in.at("row_names").get<std::vector<std::string>>();
      g_.x = in.at("f16").get<std::vector<uint16_t>>();
      g_.packed = j.at("packed").get<std::vector<uint32_t>>();
      g_.scales = j.at("scales").get<std::vector<uint16_t>>();
      g_.biases = j.at("biases").get<std::vector<uint16_t>>();
      g_.dequant_f16 = j.at("dequant_f16").get<std::vector<uint16_t>>();
      g_.dequant_f32 = j.at("dequant_f32").get<std::vector<uint32_t>>();
      found_ = true;
    }
    ASSERT_TRUE(found_) << "no golden case for " << config_name({GetParam(), 0});
    ASSERT_EQ(g_.x.size(), g_.rows * c.head_dim);
    ASSERT_EQ(g_.packed.size(), g_.rows * words());
    ASSERT_EQ(g_.scales.size(), g_.rows * groups());
    ASSERT_EQ(g_.biases.size(), g_.rows * groups());
    ASSERT_EQ(g_.dequant_f16.size(), g_.rows * c.head_dim);
    ASSERT_EQ(g_.dequant_f32.size(), g_.rows * c.head_dim);
  }

  size_t words() const { return GetParam().head_dim * GetParam().bits / 32; }
  size_t groups() const { return GetParam().head_dim / GetParam().group; }

  // Counts mismatches of row r's `n` values; reports the first one with the
  // row's name (e.g. "f16_max_mixed") and index.
  template <typename T>
  int compare(const char* what, size_t r, const T* got, const T* want, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; ++i) {
      if (got[i] == want[i]) continue;
      if (bad++ == 0) {
        ADD_FAILURE() << what << " row " << r << " (" << g_.row_names[r] << ") [" << i
                      << "]: got 0x" << std::hex << got[i] << ", MLX 0x" << want[i];
      }
    }
    return bad;
  }

  Case g_;
  bool found_ = false;
};

TEST_P(AffineQuantGolden, QuantizeMatchesMlx) {
  const Config c = GetParam();
  std::vector<float> x(c.head_dim);
  std::vector<uint32_t> packed(words());
  std::vector<uint16_t> scales(groups()), biases(groups());
  int bad = 0;
  for (size_t r = 0; r < g_.rows; ++r) {
    for (size_t i = 0; i < c.head_dim; ++i) x[i] = f16_to_f32(g_.x[r * c.head_dim + i]);
    affine_quantize(x.data(), c.head_dim, c.bits, c.group, packed.data(), scales.data(),
                    biases.data());
    bad += compare("packed", r, packed.data(), &g_.packed[r * words()], words());
    bad += compare("scale", r, scales.data(), &g_.scales[r * groups()], groups());
    bad += compare("bias", r, biases.data(), &g_.biases[r * groups()], groups());
  }
  EXPECT_EQ(bad, 0);
}

// Dequantizes MLX's own packed/scales/biases, so this holds independently of
// the quantizer.
TEST_P(AffineQuantGolden, DequantizeF16MatchesMlx) {
  const Config c = GetParam();
  std::vector<uint16_t> out(c.head_dim);
  int bad = 0;
  for (size_t r = 0; r < g_.rows; ++r) {
    affine_dequantize_f16(&g_.packed[r * words()], &g_.scales[r * groups()],
                          &g_.biases[r * groups()], c.head_dim, c.bits, c.group, out.data());
    bad += compare("dequant_f16", r, out.data(), &g_.dequant_f16[r * c.head_dim], c.head_dim);
  }
  EXPECT_EQ(bad, 0);
}

// The float dequantization equals mx.dequantize with the f16 scales and
// biases widened to float32 (one rounding, at the add).
TEST_P(AffineQuantGolden, DequantizeF32MatchesMlx) {
  const Config c = GetParam();
  std::vector<float> out(c.head_dim);
  std::vector<uint32_t> bits(c.head_dim);
  int bad = 0;
  for (size_t r = 0; r < g_.rows; ++r) {
    affine_dequantize(&g_.packed[r * words()], &g_.scales[r * groups()], &g_.biases[r * groups()],
                      c.head_dim, c.bits, c.group, out.data());
    for (size_t i = 0; i < c.head_dim; ++i) bits[i] = std::bit_cast<uint32_t>(out[i]);
    bad += compare("dequant_f32", r, bits.data(), &g_.dequant_f32[r * c.head_dim], c.head_dim);
  }
  EXPECT_EQ(bad, 0);
}

// Pins the finding that makes affine_dequantize_f16 necessary: rounding the
// float result to f16 once is not what MLX returns for f16.
TEST_P(AffineQuantGolden, RoundingFloatDequantOnceIsNotMlxF16) {
  const Config c = GetParam();
  std::vector<float> out(c.head_dim);
  size_t differ = 0;
  for (size_t r = 0; r < g_.rows; ++r) {
    affine_dequantize(&g_.packed[r * words()], &g_.scales[r * groups()], &g_.biases[r * groups()],
                      c.head_dim, c.bits, c.group, out.data());
    for (size_t i = 0; i < c.head_dim; ++i) {
      differ += f32_to_f16(out[i]) != g_.dequant_f16[r * c.head_dim + i];
    }
  }
  EXPECT_GT(differ, 0u);
}

INSTANTIATE_TEST_SUITE_P(AffineQuantMlx, AffineQuantGolden,
                         testing::Values(Config{64, 4, 32}, Config{64, 4, 64}, Config{64, 8, 32},
                                         Config{64, 8, 64}, Config{128, 4, 32}, Config{128, 4, 64},
                                         Config{128, 4, 128}, Config{128, 8, 32},
                                         Config{128, 8, 64}, Config{128, 8, 128}),
                         config_name);

// ---- Hand-computed cases (one group of 32 unless stated).

struct Quantized {
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales, biases;
};

Quantized quantize(const std::vector<float>& x, int bits, int group) {
  Quantized q;
  q.packed.resize(x.size() * bits / 32);
  q.scales.resize(x.size() / group);
  q.biases.resize(x.size() / group);
  affine_quantize(x.data(), x.size(), bits, group, q.packed.data(), q.scales.data(),
                  q.biases.data());
  return q;
}

std::vector<float> dequantize(const Quantized& q, size_t head_dim, int bits, int group) {
  std::vector<float> out(head_dim);
  affine_dequantize(q.packed.data(), q.scales.data(), q.biases.data(), head_dim, bits, group,
                    out.data());
  return out;
}

constexpr uint16_t kF16One = 0x3c00, kF16MinusOne = 0xbc00;
constexpr uint16_t kF16Fifteen = 0x4b80, kF16MinusFifteen = 0xcb80;
// f16(-1e-7): the clamped scale, negative (the max is the edge on a tie), is
// 2 * 2^-24, a subnormal.
constexpr uint16_t kF16MinusEps = 0x8002;

// 0..15: the max is the edge, so the scale is negative and the codes count
// down from 15 (scale -1, bias 15), not up.
TEST(AffineQuant, ZeroToFifteenCountsDown) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i % 16);
  const Quantized q = quantize(x, 4, 32);
  EXPECT_EQ(q.scales[0], kF16MinusOne);
  EXPECT_EQ(q.biases[0], kF16Fifteen);
  // Codes 15, 14, ..., 8 low nibble first, then 7..0.
  EXPECT_EQ(q.packed, (std::vector<uint32_t>{0x89abcdef, 0x01234567, 0x89abcdef, 0x01234567}));
  EXPECT_EQ(dequantize(q, 32, 4, 32), x);
}

// -15..0: the min is the edge; scale 1, bias -15, codes 0..15.
TEST(AffineQuant, MinusFifteenToZeroCountsUp) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i % 16 - 15);
  const Quantized q = quantize(x, 4, 32);
  EXPECT_EQ(q.scales[0], kF16One);
  EXPECT_EQ(q.biases[0], kF16MinusFifteen);
  EXPECT_EQ(q.packed, (std::vector<uint32_t>{0x76543210, 0xfedcba98, 0x76543210, 0xfedcba98}));
  EXPECT_EQ(dequantize(q, 32, 4, 32), x);
}

// 8 bits: x[k] = -255 + 8k (k < 31), x[31] = 0, so scale 1, bias -255 and
// code k is 8k, with 255 last; four codes a word, lowest byte first.
TEST(AffineQuant, EightBitPackingOrder) {
  std::vector<float> x(32);
  for (int k = 0; k < 31; ++k) x[k] = static_cast<float>(-255 + 8 * k);
  x[31] = 0.0f;
  const Quantized q = quantize(x, 8, 32);
  EXPECT_EQ(q.scales[0], kF16One);
  EXPECT_EQ(q.biases[0], 0xdbf8);  // -255
  ASSERT_EQ(q.packed.size(), 8u);
  EXPECT_EQ(q.packed[0], 0x18100800u);
  EXPECT_EQ(q.packed[1], 0x38302820u);
  EXPECT_EQ(q.packed[7], 0xfff0e8e0u);
  EXPECT_EQ(dequantize(q, 32, 8, 32), x);
}

// Two groups are independent: group 1 of a 64-vector quantizes as it would
// alone, with its own scale and bias.
TEST(AffineQuant, GroupsAreIndependent) {
  std::vector<float> x(64);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i % 16);
  for (int i = 32; i < 64; ++i) x[i] = static_cast<float>(i % 16 - 15);
  const Quantized q = quantize(x, 4, 32);
  EXPECT_EQ(q.scales, (std::vector<uint16_t>{kF16MinusOne, kF16One}));
  EXPECT_EQ(q.biases, (std::vector<uint16_t>{kF16Fifteen, kF16MinusFifteen}));
  EXPECT_EQ(q.packed[4], 0x76543210u);
}

// All zeros: scale clamps to 1e-7 and is negated (tie: the max is the edge);
// q0 = rint(0 / -1e-7) = 0, so the bias is 0 and every code 0.
TEST(AffineQuant, AllZerosTakeTheQ0ZeroBranch) {
  const std::vector<float> x(32, 0.0f);
  const Quantized q = quantize(x, 4, 32);
  EXPECT_EQ(q.scales[0], kF16MinusEps);
  EXPECT_EQ(q.biases[0], 0x0000);
  EXPECT_EQ(q.packed, std::vector<uint32_t>(4, 0u));
  const std::vector<float> back = dequantize(q, 32, 4, 32);
  for (float v : back) EXPECT_EQ(std::bit_cast<uint32_t>(v), 0u);  // +0, not -0
}

// All equal and nonzero: scale clamps, q0 != 0 re-fits it, bias is the value
// itself and every code is 0, so dequantization is exact.
TEST(AffineQuant, AllEqualIsExact) {
  const std::vector<float> x(32, 3.0f);
  const Quantized q = quantize(x, 4, 32);
  EXPECT_EQ(q.scales[0], kF16MinusEps);
  EXPECT_EQ(q.biases[0], 0x4200);  // 3.0
  EXPECT_EQ(q.packed, std::vector<uint32_t>(4, 0u));
  EXPECT_EQ(dequantize(q, 32, 4, 32), x);
}

// Codes exactly at k + 0.5 round half to even: with -15 and 0 in the group
// (scale 1, bias -15), -15 + k + 0.5 gives code 2 * round_half_even((k+1)/2).
TEST(AffineQuant, MidpointsRoundHalfToEven) {
  std::vector<float> x(32, -15.0f);
  x[1] = 0.0f;
  for (int k = 0; k < 15; ++k) x[2 + k] = -15.0f + static_cast<float>(k) + 0.5f;
  const Quantized q = quantize(x, 4, 32);
  ASSERT_EQ(q.scales[0], kF16One);
  ASSERT_EQ(q.biases[0], kF16MinusFifteen);
  const uint32_t want[15] = {0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14};
  for (int k = 0; k < 15; ++k) {
    const size_t e = 2 + k;
    EXPECT_EQ((q.packed[e / 8] >> (e % 8 * 4)) & 0xf, want[k]) << "x = " << x[e];
  }
}

// The f16 dequantization rounds the product first: scale 0x2c0c
// (0.063232421875) times code 255 is 16.124267578125, which f16 rounds to
// 16.125; minus 15 gives 1.125 (0x3c80). One rounding of the float result,
// 1.124267578125, would give 1.1240234375 (0x3c7f).
TEST(AffineQuant, DequantizeF16RoundsTheProduct) {
  const uint16_t scale = 0x2c0c, bias = kF16MinusFifteen;
  const uint32_t packed[4] = {0xffu, 0, 0, 0};  // code 255 at element 0, 0 elsewhere
  uint16_t out[16];
  affine_dequantize_f16(packed, &scale, &bias, 16, 8, 16, out);
  EXPECT_EQ(out[0], 0x3c80);
  EXPECT_EQ(out[1], bias);
  float exact[16];
  affine_dequantize(packed, &scale, &bias, 16, 8, 16, exact);
  EXPECT_EQ(exact[0], 1.124267578125f);
  EXPECT_EQ(f32_to_f16(exact[0]), 0x3c7f);
}

}  // namespace
}  // namespace ferry::kv
