// Correctness against an independent reference: logits from transformers
// (tools/goldens/model_goldens.py; the GGUF dequantized to float32 by
// transformers, run in float32 with eager attention), for the tiny random
// llama-family models of every weight type and for SmolLM2-135M Q4_1.
//
// Tolerances. ferry and the reference use the same float32 weights (the
// dequantizers agree bit for bit, tests/kernels/dequant_test.cpp) and both
// compute in float32, so logits differ only by rounding: different
// summation orders in dot products and softmax, float32 vs double RoPE
// angles, libm vs torch exp/cos. Each of those is a relative error of a few
// ulp per operation, growing roughly with sqrt(terms) and with depth.
//  - tiny models (1-2 layers, |logits| < 15): 1e-4 absolute;
//  - SmolLM2 (30 layers, |logits| up to ~30, 49152 vocab): 5e-4 absolute.
// Measured maxima (printed by the tests, recorded in docs/PARITY.md):
// 1.7e-5 (tiny) and 8.8e-5 (SmolLM2); the bounds leave ~6x room for other
// CPUs' libm and thread counts, and stay far below the smallest greedy
// margin of the goldens (0.035 for SmolLM2).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "model/model.h"
#include "model/test_models.h"

namespace ferry::model {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes(std::istreambuf_iterator<char>(f), {});
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// Logits of every position of seq (prompt + generated, teacher-forced),
// one forward per prompt and one per generated token, as a server would.
std::vector<float> run_sequence(const Model& m, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& gen) {
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path()};
  kv::BatchKv kv(m.config().kv_spec());
  const size_t len = prompt.size();
  kv.prepare_prefill(std::span<const size_t>(&len, 1));
  std::vector<float> all, logits;
  RowInput in{prompt, true};
  m.forward(ctx, kv, std::span<const RowInput>(&in, 1), logits);
  kv.finalize_prefill();
  all = logits;
  for (size_t i = 0; i + 1 < gen.size(); ++i) {
    in = RowInput{std::span<const int32_t>(&gen[i], 1), false};
    m.forward(ctx, kv, std::span<const RowInput>(&in, 1), logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

struct MaxDiff {
  double v = 0;
  void add(double a, double b) { v = std::max(v, std::fabs(a - b)); }
};

class TinyParity : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyParity, LogitsOfEveryPositionMatchTransformers) {
  const std::string name = GetParam();
  const json g = read_json(test::data_path("goldens/" + name + ".json"));
  const auto bin = read_floats(test::data_path("goldens/" + g["bin_file"].get<std::string>()));
  auto m = load_model(test::data_path("models/" + name + ".gguf"));
  const size_t V = g["n_vocab"];
  ASSERT_EQ(m->config().vocab_size, V);
  MaxDiff diff;
  for (const auto& c : g["cases"]) {
    auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    auto gen = c["generated_ids"].get<std::vector<int32_t>>();
    auto got = run_sequence(*m, prompt, gen);
    ASSERT_EQ(got.size(), c["n_rows"].get<size_t>() * V);
    // Full logits of every prompt position.
    const size_t off = c["prompt_logits"]["offset"].get<size_t>() / 4;
    for (size_t i = 0; i < prompt.size() * V; ++i) diff.add(got[i], bin[off + i]);
    // Top-5 of every row, prompt and generated.
    for (size_t r = 0; r < c["n_rows"].get<size_t>(); ++r)
      for (size_t k = 0; k < 5; ++k)
        diff.add(got[r * V + c["top5_ids"][r][k].get<size_t>()],
                 c["top5_values"][r][k].get<double>());
  }
  std::printf("%s: max |ferry - transformers| = %.3g\n", name.c_str(), diff.v);
  EXPECT_LE(diff.v, 1e-4) << name;
}

INSTANTIATE_TEST_SUITE_P(Models, TinyParity,
                         ::testing::Values("tiny-llama-f32", "tiny-llama-f16", "tiny-llama-bf16",
                                           "tiny-llama-q8_0", "tiny-llama-q4_0", "tiny-llama-q4_1",
                                           "tiny-llama-q4_k", "tiny-llama-q5_k", "tiny-llama-q6_k",
                                           "tiny-llama3-f32", "tiny-mistral-f32",
                                           "tiny-mistral-sw4-f32"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(SmolLM2Parity, GreedyContinuationAndLogitsMatchTransformers) {
  const json g = read_json(test::data_path("goldens/smollm2.json"));
  const auto bin = read_floats(test::data_path("goldens/" + g["bin_file"].get<std::string>()));
  auto m = load_model(test::smollm2_path());
  const size_t V = g["n_vocab"];
  const size_t start = g["subset_ids"]["start"], stride = g["subset_ids"]["stride"],
               count = g["subset_ids"]["count"];
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path()};
  MaxDiff diff;
  for (const auto& c : g["cases"]) {
    auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    auto want = c["generated_ids"].get<std::vector<int32_t>>();
    // Free-running greedy decode: every token must equal transformers'.
    {
      kv::BatchKv kv(m->config().kv_spec());
      const size_t len = prompt.size();
      kv.prepare_prefill(std::span<const size_t>(&len, 1));
      std::vector<float> logits;
      RowInput in{prompt, false};
      m->forward(ctx, kv, std::span<const RowInput>(&in, 1), logits);
      kv.finalize_prefill();
      std::vector<int32_t> got;
      for (size_t i = 0; i < want.size(); ++i) {
        got.push_back(
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
        in = RowInput{std::span<const int32_t>(&got.back(), 1), false};
        if (i + 1 < want.size()) m->forward(ctx, kv, std::span<const RowInput>(&in, 1), logits);
      }
      EXPECT_EQ(got, want) << c["text"];
    }
    // Logits, teacher-forced: the strided subset of every row, the top-5
    // of every row and the full last-prompt row.
    auto got = run_sequence(*m, prompt, want);
    const size_t rows = c["n_rows"];
    ASSERT_EQ(got.size(), rows * V);
    const size_t soff = c["subset_logits"]["offset"].get<size_t>() / 4;
    for (size_t r = 0; r < rows; ++r) {
      for (size_t k = 0; k < count; ++k)
        diff.add(got[r * V + start + k * stride], bin[soff + r * count + k]);
      for (size_t k = 0; k < 5; ++k)
        diff.add(got[r * V + c["top5_ids"][r][k].get<size_t>()],
                 c["top5_values"][r][k].get<double>());
    }
    const size_t loff = c["last_prompt_logits"]["offset"].get<size_t>() / 4;
    for (size_t i = 0; i < V; ++i) diff.add(got[(prompt.size() - 1) * V + i], bin[loff + i]);
  }
  std::printf("SmolLM2: max |ferry - transformers| = %.3g\n", diff.v);
  EXPECT_LE(diff.v, 5e-4);
}

}  // namespace
}  // namespace ferry::model
