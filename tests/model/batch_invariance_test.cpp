// The promise at the model level: a row's logits are bit-identical whether
// it runs alone or beside other rows (padded, with different chunking),
// whatever the prefill chunk size and the thread count.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "model/model.h"
#include "model/test_models.h"

namespace ferry::model {
namespace {

// Logits of every position of prompts[0], prefilled in chunks of `chunk`
// in one cache with the other prompts (each row advancing by its own chunk
// size: row r takes chunk + r tokens a step).
std::vector<float> run(const Model& m, const std::vector<std::vector<int32_t>>& prompts,
                       size_t chunk, size_t threads) {
  ThreadPool pool(threads);
  kernels::Context ctx{&pool, best_cpu_path()};
  const size_t V = m.config().vocab_size;
  std::vector<size_t> lengths;
  for (const auto& p : prompts) lengths.push_back(p.size());
  kv::BatchKv kv(m.config().kv_spec());
  kv.prepare_prefill(lengths);
  std::vector<size_t> done(prompts.size(), 0);
  std::vector<float> out, logits;
  while (done[0] < prompts[0].size()) {
    std::vector<RowInput> rows(prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      size_t n = std::min(chunk + r, prompts[r].size() - done[r]);
      rows[r] = RowInput{std::span<const int32_t>(prompts[r]).subspan(done[r], n), r == 0};
      done[r] += n;
    }
    m.forward(ctx, kv, rows, logits);
    out.insert(out.end(), logits.begin(), logits.begin() + rows[0].tokens.size() * V);
  }
  kv.check_integrity();
  return out;
}

TEST(BatchInvariance, SmolLM2LogitsIdenticalAloneBatchedChunkedThreaded) {
  auto m = load_model(test::smollm2_path());
  std::vector<int32_t> prompt{1, 504, 3458, 282, 4193, 314, 253, 1345, 28, 9, 2, 17, 99, 1000, 30};
  std::vector<std::vector<int32_t>> batch{
      prompt,
      {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17},
      {400, 401},
      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}};
  auto solo = run(*m, {prompt}, prompt.size(), 1);
  ASSERT_EQ(solo.size(), prompt.size() * m->config().vocab_size);
  struct Case {
    size_t chunk, threads;
    bool batched;
  };
  for (Case c : {Case{1, 1, false}, Case{4, 2, false}, Case{15, 2, true}, Case{1, 2, true},
                 Case{6, 3, true}}) {
    auto got =
        run(*m, c.batched ? batch : std::vector<std::vector<int32_t>>{prompt}, c.chunk, c.threads);
    ASSERT_EQ(got.size(), solo.size());
    EXPECT_EQ(std::memcmp(got.data(), solo.data(), solo.size() * 4), 0)
        << "chunk=" << c.chunk << " threads=" << c.threads << " batched=" << c.batched;
  }
}

// A step given output needs for another number of outputs is refused by
// name, and the cache is left as it was.
TEST(ModelStep, WrongNumberOfOutputNeedsIsRefused) {
  auto m = load_model(test::data_path("models/tiny-llama-f32.gguf"));
  ThreadPool pool(1);
  kernels::Context ctx{&pool, best_cpu_path()};
  kv::BatchKv kv(m->config().kv_spec());
  const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5};
  kv.prepare_prefill(std::vector<size_t>{a.size(), b.size()});
  const std::vector<RowInput> rows = {RowInput{a}, RowInput{b}};
  const std::vector<OutputNeed> needs(3);  // two outputs, three needs
  StepOutputs out;
  const size_t len0 = kv.table().row(0).length();
  try {
    m->step(ctx, kv, rows, needs, out);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 output needs for a step of 2 outputs"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(kv.table().row(0).length(), len0);
  // The same step with the right count runs.
  const std::vector<OutputNeed> two(2);
  m->step(ctx, kv, rows, two, out);
  EXPECT_EQ(out.size(), 2u);
  EXPECT_EQ(out.row(1).full.size(), m->config().vocab_size);
}

}  // namespace
}  // namespace ferry::model
