// Weight decoding against gguf-py's dequantizers (tests/data/dequant, made
// by tools/goldens/dequant_goldens.py), for every supported type, on every
// kernel path (the matmul's fused and scratch decoders included, through a
// one-hot activation that selects each weight exactly).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "kernels/ops.h"
#include "kernels/quant_blocks.h"

namespace ferry::kernels {
namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::string dir() {
  return std::string(FERRY_TEST_DATA) + "/dequant/";
}

class DequantTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DequantTest, MatchesGgufPyBitForBit) {
  std::ifstream idx(dir() + "index.json");
  const auto index = nlohmann::json::parse(idx);
  const auto& t = index.at("types").at(GetParam());
  const DType type = static_cast<DType>(t.at("ggml_type").get<uint32_t>());
  const auto& d = t.at("dequant");
  const auto blocks = read_file(dir() + d.at("blocks").get<std::string>());
  const auto expected_bytes = read_file(dir() + d.at("expected_f32").get<std::string>());
  const size_t n = d.at("n_values").get<size_t>();
  ASSERT_EQ(expected_bytes.size(), n * 4);
  std::vector<float> expected(n), got(n);
  std::memcpy(expected.data(), expected_bytes.data(), n * 4);
  decode_row(type, blocks.data(), got.data(), n);
  // gguf-py computes in float32 with the same operation order: exact.
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(std::memcmp(&got[i], &expected[i], 4), 0)
        << GetParam() << " value " << i << ": " << got[i] << " vs " << expected[i];

  // The matmul decoders: W is one row of n values; x one-hot at k picks
  // W[k] (times 1.0, plus zeros: exact) on every path.
  if (n % 16 != 0) return;
  WeightView w{type, blocks.data(), n, 1};
  std::vector<CpuPath> paths{CpuPath::Reference};
  if (best_cpu_path() >= CpuPath::Avx2) paths.push_back(CpuPath::Avx2);
  if (best_cpu_path() >= CpuPath::Avx512) paths.push_back(CpuPath::Avx512);
  for (CpuPath p : paths)
    for (size_t rows : {1u, 5u}) {
      for (size_t k = 0; k < n; k += 37) {
        std::vector<float> x(rows * n, 0.0f), y(rows);
        for (size_t r = 0; r < rows; ++r) x[r * n + k] = 1.0f;
        matmul(Context{nullptr, p}, w, x.data(), rows, y.data());
        for (size_t r = 0; r < rows; ++r)
          ASSERT_EQ(y[r], expected[k] + 0.0f) << cpu_path_name(p) << " k=" << k;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantTest,
                         ::testing::Values("f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q5_k",
                                           "q6_k"));

}  // namespace
}  // namespace ferry::kernels
