// The promise that matters most (issue 3, item 12), on the CPU: every
// row's logits at every step are bit-identical to its solo run
// (schedule_harness.h). tests/cuda runs the same harness on the GPU.
#include <filesystem>

#include "model/schedule_harness.h"
#include "model/wide_head_model.h"

namespace ferry::model {
namespace {

class ScheduleTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ScheduleTest, SmolLM2RowsMatchSoloBitForBit) {
  static auto m = load_model(test::smollm2_path());
  const std::string f = GetParam();
  KvFormat k = kernels::parse_kv_format(f == "q8k_q4v" ? "q8g64" : f);
  KvFormat v = kernels::parse_kv_format(f == "q8k_q4v" ? "q4g32" : f);
  // Under sanitizers (tools/test.sh sets FERRY_SANITIZED) the same checks
  // run on fewer requests: ASan makes every forward ~10x slower.
  const bool sanitized = std::getenv("FERRY_SANITIZED") != nullptr;
  run_schedule(*m, k, v, sanitized ? 3 : 8, 1234);
}

// The tiny models: many more requests, and a sliding window of 4 whose
// rings wrap many times (generation runs far past the window). Affine KV
// needs head_dim >= 32, so quantized formats run on the head_dim-64 model.
class TinyScheduleTest : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(TinyScheduleTest, RowsMatchSoloBitForBit) {
  auto [model, fmt] = GetParam();
  auto m = load_model(test::data_path(std::string("models/") + model + ".gguf"));
  const KvFormat f = kernels::parse_kv_format(fmt);
  const bool sanitized = std::getenv("FERRY_SANITIZED") != nullptr;
  for (uint32_t seed : {1u, 2u, 3u}) run_schedule(*m, f, f, sanitized ? 8 : 24, seed);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TinyScheduleTest,
                         ::testing::Values(std::tuple("tiny-llama-f32", "f32"),
                                           std::tuple("tiny-llama-f32", "f16"),
                                           std::tuple("tiny-mistral-sw4-f32", "f32"),
                                           std::tuple("tiny-mistral-sw4-f32", "f16"),
                                           std::tuple("tiny-mistral-sw4-f32", "bf16"),
                                           std::tuple("tiny-llama-q4_k", "q8g32"),
                                           std::tuple("tiny-llama-q4_k", "q4g32"),
                                           std::tuple("tiny-llama-q4_k", "q4g64")));

// Head dimensions of 64 and 128 with bf16 weights (the synthetic model of
// wide_head_model.h), dense and affine caches.
class WideHeadScheduleTest : public ::testing::TestWithParam<std::tuple<uint32_t, const char*>> {};

TEST_P(WideHeadScheduleTest, RowsMatchSoloBitForBit) {
  auto [hd, fmt] = GetParam();
  const std::string path = test::wide_head_model(hd == 64 ? 4 : 2, hd == 64 ? 2 : 1, hd);
  auto m = load_model(path);
  const KvFormat f = kernels::parse_kv_format(fmt);
  const bool sanitized = std::getenv("FERRY_SANITIZED") != nullptr;
  run_schedule(*m, f, f, sanitized ? 4 : 12, 7);
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(WideHeads, WideHeadScheduleTest,
                         ::testing::Values(std::tuple(64u, "q4g64"), std::tuple(128u, "q4g64"),
                                           std::tuple(128u, "q8g32"), std::tuple(128u, "bf16")));

INSTANTIATE_TEST_SUITE_P(KvFormats, ScheduleTest,
                         ::testing::Values("f32", "f16", "q8g64", "q4g64", "q4g32", "q8k_q4v"));

}  // namespace
}  // namespace ferry::model
