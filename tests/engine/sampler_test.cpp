#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"

namespace ferry::engine {
namespace {

std::vector<float> logits_of(std::vector<float> v) {
  return v;
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, {});
  auto l = logits_of({0.1f, 2.0f, 2.0f, -1.0f});
  Sampled r = s.sample(l);
  EXPECT_EQ(r.token, 1);
  // log-softmax of the raw logits.
  double z = std::exp(0.1) + 2 * std::exp(2.0) + std::exp(-1.0);
  EXPECT_NEAR(r.logprob, 2.0 - std::log(z), 1e-6);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<float> base(50);
  for (size_t i = 0; i < base.size(); ++i) base[i] = std::sin(static_cast<float>(i));
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p, {});
    std::vector<int32_t> out;
    for (int i = 0; i < 40; ++i) {
      auto l = base;
      out.push_back(s.sample(l).token);
    }
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.top_k = 1;
  p.seed = 1;
  Sampler s(p, {});
  for (int i = 0; i < 20; ++i) {
    auto l = logits_of({1.0f, 3.0f, 2.9f});
    EXPECT_EQ(s.sample(l).token, 1);
  }
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingMass) {
  // Probabilities ~ 0.665, 0.245, 0.090: top_p 0.5 keeps only token 0.
  SamplingParams p;
  p.top_p = 0.5f;
  p.seed = 3;
  Sampler s(p, {});
  for (int i = 0; i < 50; ++i) {
    auto l = logits_of({2.0f, 1.0f, 0.0f});
    EXPECT_EQ(s.sample(l).token, 0);
  }
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max
  p.seed = 5;
  Sampler s(p, {});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 200; ++i) {
    auto l = logits_of({0.0f, 0.0f, -3.0f});
    ++seen[s.sample(l).token];
  }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_EQ(seen.count(2), 0u);
}

TEST(Sampler, PenaltiesFollowOpenAIAndHFDefinitions) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 0.5f;
  Sampler s(p, {});
  s.accept(0);
  s.accept(0);
  // token 0: 3.0 - (2 * 0.5 + 1.0) = 1.0 < token 1's 1.5.
  auto l = logits_of({3.0f, 1.5f});
  EXPECT_EQ(s.sample(l).token, 1);
  EXPECT_FLOAT_EQ(l[0], 1.0f);

  SamplingParams r;
  r.temperature = 0;
  r.repetition_penalty = 2.0f;
  std::vector<int32_t> prompt{0, 1};
  Sampler s2(r, prompt);
  auto l2 = logits_of({3.0f, -1.0f, 1.6f});
  EXPECT_EQ(s2.sample(l2).token, 2);  // 3/2 = 1.5 < 1.6
  EXPECT_FLOAT_EQ(l2[0], 1.5f);
  EXPECT_FLOAT_EQ(l2[1], -2.0f);
}

TEST(Sampler, TinyTemperatureKeepsTheScaledLogitsFinite) {
  SamplingParams p;
  p.temperature = 1e-44f;  // 1 / T overflows float
  p.seed = 2;
  Sampler s(p, {});
  const model::OutputNeed n = s.need(false);
  ASSERT_TRUE(n.draw);
  EXPECT_EQ(n.draw->inv_temp, FLT_MAX);
  auto l = logits_of({0.0f, -1e-3f, 1e-3f, 0.0f});
  EXPECT_EQ(s.sample(l, false).token, 2);  // the others weigh 0 beside it
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams p;
  p.top_p = 0;
  try {
    p.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  p = {};
  p.temperature = -1;
  EXPECT_THROW(p.validate(), Error);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_THROW(p.validate(), Error);
}

// What a GPU step delivers instead of the whole row: the largest logits,
// the log-sum-exp and the drawn token, by the reference reductions.
model::RowLogits reduced(std::span<const float> row, const model::OutputNeed& need,
                         std::vector<model::TopLogit>& top) {
  model::RowLogits r;
  model::select_from_row(row, need.top_n, top, need.lse ? &r.lse : nullptr);
  r.top = top;
  if (need.draw) {
    std::vector<float> penalised(row.begin(), row.end());
    model::apply_draw_penalties(penalised, need.draw->repetition, need.penalties);
    r.drawn = model::draw_from_row(penalised, *need.draw);
    r.drawn.value = row[static_cast<size_t>(r.drawn.id)];  // the raw logit
  }
  return r;
}

TEST(Sampler, NeedNeverAsksForTheWholeRow) {
  SamplingParams p;
  p.temperature = 0;
  model::OutputNeed n = Sampler(p, {}).need(true);
  EXPECT_FALSE(n.full);
  EXPECT_EQ(n.top_n, 1u);
  EXPECT_FALSE(n.draw);
  EXPECT_TRUE(n.lse);
  p.temperature = 0.5f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.25f;
  p.seed = 9;
  Sampler s(p, {});
  n = s.need(false);
  EXPECT_FALSE(n.full);
  EXPECT_EQ(n.top_n, 0u);
  EXPECT_FALSE(n.lse);
  ASSERT_TRUE(n.draw);
  EXPECT_EQ(n.draw->inv_temp, 2.0f);
  EXPECT_EQ(n.draw->top_k, 40u);
  EXPECT_EQ(n.draw->top_p, 0.9f);
  EXPECT_EQ(n.draw->log_min_p, static_cast<float>(std::log(0.25)));
  EXPECT_EQ(n.draw->u, Rng(9).uniform());       // the uniform the next sample takes
  EXPECT_EQ(s.need(false).draw->u, n.draw->u);  // asking again draws nothing
  p.top_k = 0;  // the whole vocabulary competes, still on the device
  p.min_p = 0;
  n = Sampler(p, {}).need(false);
  ASSERT_TRUE(n.draw);
  EXPECT_EQ(n.draw->top_k, 0u);
  EXPECT_EQ(n.draw->log_min_p, -INFINITY);
  // Penalties travel with the draw: each seen token once, with what the
  // frequency and presence penalties take off the generated ones.
  p.repetition_penalty = 1.1f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  const std::vector<int32_t> prompt = {4, 9, 4};
  Sampler pen(p, prompt);
  pen.accept(9);
  pen.accept(2);
  pen.accept(9);
  n = pen.need(false);
  EXPECT_FALSE(n.full);
  ASSERT_TRUE(n.draw);
  EXPECT_EQ(n.draw->repetition, 1.1f);
  ASSERT_EQ(n.penalties.size(), 3u);
  EXPECT_EQ(n.penalties[0].token, 4);
  EXPECT_EQ(n.penalties[0].sub, 0.0f);
  EXPECT_EQ(n.penalties[1].token, 9);
  EXPECT_EQ(n.penalties[1].sub, 0.5f * 2 + 0.25f);
  EXPECT_EQ(n.penalties[2].token, 2);
  EXPECT_EQ(n.penalties[2].sub, 0.5f + 0.25f);
  p.temperature = 0;  // greedy on penalised logits: the draw's first token
  n = Sampler(p, prompt).need(true);
  ASSERT_TRUE(n.draw);
  EXPECT_EQ(n.draw->top_k, 1u);
  EXPECT_EQ(n.draw->inv_temp, 1.0f);
  EXPECT_EQ(n.top_n, 0u);
  EXPECT_TRUE(n.lse);
}

// From what the device delivers the sampler draws exactly what it draws from
// the whole row: the same tokens, generator state and logprobs, over greedy,
// temperature alone and with top-k, min-p and top-p, with and without
// penalties, on rows with ties.
TEST(Sampler, DeviceReductionsGiveTheSameTokensAsTheWholeRow) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const float temps[] = {0.0f, 0.3f, 1.0f, 1.7f};
  const int32_t top_ks[] = {0, 1, 2, 7, 50};
  const std::vector<int32_t> prompt = {5, 17, 5, 299, 40};
  for (int penalties = 0; penalties < 2; ++penalties)
    for (float t : temps)
      for (int32_t k : top_ks) {
        SamplingParams p;
        p.temperature = t;
        p.top_k = k;
        p.top_p = k == 7 || k == 0 ? 0.8f : 1.0f;
        p.min_p = k == 50 || k == 0 ? 0.05f : 0.0f;
        p.seed = 11;
        if (penalties) {
          p.repetition_penalty = 1.3f;
          p.frequency_penalty = 0.4f;
          p.presence_penalty = -0.3f;
        }
        Sampler whole(p, prompt), part(p, prompt);
        for (int step = 0; step < 30; ++step) {
          const model::OutputNeed need = part.need(true);
          ASSERT_FALSE(need.full);
          std::vector<float> row(300);
          for (float& x : row) x = std::round(u(gen) * 4) / 4;  // many ties
          std::vector<model::TopLogit> top;
          const model::RowLogits r = reduced(row, need, top);
          std::vector<float> scratch = row;
          const Sampled a = whole.sample(scratch, true);
          const Sampled b = part.sample(r, true);
          ASSERT_EQ(a.token, b.token)
              << "t " << t << " k " << k << " step " << step << " penalties " << penalties;
          EXPECT_EQ(a.logprob, b.logprob);
          whole.accept(a.token);
          part.accept(b.token);
        }
      }
}

TEST(Sampler, ARowWithoutWhatItNeedsIsAnError) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, {});
  EXPECT_THROW(s.sample(model::RowLogits{}, false), Error);
  // A sampled row without its drawn token, a row without the asked
  // log-sum-exp, and a whole row of NaN logits are refused by name.
  p.temperature = 0.7f;
  Sampler t(p, {});
  try {
    t.sample(model::RowLogits{}, false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no drawn token"), std::string::npos) << e.what();
  }
  model::RowLogits drawn;
  drawn.drawn = model::TopLogit{1.0f, 0};
  try {
    t.sample(drawn, true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("log-sum-exp"), std::string::npos) << e.what();
  }
  auto nan = logits_of({NAN, NAN});
  try {
    t.sample(nan, false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NaN"), std::string::npos) << e.what();
  }
}

TEST(SelectFromRow, OrdersByValueThenIdSkipsNanAndFoldsNegativeZero) {
  const std::vector<float> row = {1.0f, NAN, 3.0f, -0.0f, 3.0f, 0.0f, -INFINITY, 2.0f};
  std::vector<model::TopLogit> top;
  model::LogSumExp lse;
  model::select_from_row(row, 6, top, &lse);
  const std::vector<std::pair<float, int32_t>> want = {{3.0f, 2}, {3.0f, 4}, {2.0f, 7},
                                                       {1.0f, 0}, {0.0f, 3}, {0.0f, 5}};
  ASSERT_EQ(top.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(top[i].value, want[i].first) << i;
    EXPECT_FALSE(std::signbit(top[i].value)) << i;
    EXPECT_EQ(top[i].id, want[i].second) << i;
  }
  EXPECT_EQ(lse.max, 3.0f);
  const double z = std::exp(-2.0) + 2 * 1 + 2 * std::exp(-3.0) + std::exp(-1.0);
  EXPECT_DOUBLE_EQ(lse.sum, z);
  model::select_from_row(row, 100, top, nullptr);  // more than the row holds
  EXPECT_EQ(top.size(), 7u);                       // every non-NaN entry
}

TEST(Rng, KnownSequenceIsStable) {
  // Pinned: a seed must mean the same text across releases and machines
  // (splitmix64-seeded xoshiro256**; values computed once and frozen).
  Rng a(0);
  EXPECT_EQ(a.next(), 11091344671253066420ull);
  EXPECT_EQ(a.next(), 13793997310169335082ull);
  EXPECT_EQ(a.next(), 1900383378846508768ull);
  Rng c(12345);
  EXPECT_EQ(c.uniform(), 0.74380816315658937);
}

}  // namespace
}  // namespace ferry::engine
