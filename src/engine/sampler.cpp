#include "engine/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>

#include "core/error.h"
#include "model/draw.h"

namespace ferry::engine {

void SamplingParams::validate() const {
  auto bad = [](const char* field, auto value, const char* rule) {
    fail("sampling", field, "=", value, " ", rule);
  };
  if (!(temperature >= 0.0f) || temperature > 100.0f)
    bad("temperature", temperature, "must be in [0, 100]");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p", top_p, "must be in (0, 1]");
  if (top_k < 0) bad("top_k", top_k, "must be >= 0 (0 disables)");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p", min_p, "must be in [0, 1]");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    bad("presence_penalty", presence_penalty, "must be in [-2, 2]");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    bad("frequency_penalty", frequency_penalty, "must be in [-2, 2]");
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 10.0f))
    bad("repetition_penalty", repetition_penalty, "must be in (0, 10]");
}

static uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

static uint64_t os_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt)
    : params_(params), rng_(params.seed ? *params.seed : os_seed()) {
  params_.validate();
  for (int32_t t : prompt) {
    if (t < 0) continue;
    if (static_cast<size_t>(t) >= seen_mask_.size()) seen_mask_.resize(t + 1, 0);
    if (!seen_mask_[t]) {
      seen_mask_[t] = 1;
      seen_.push_back(t);
    }
  }
}

void Sampler::accept(int32_t token) {
  ++generated_counts_[token];
  if (static_cast<size_t>(token) >= seen_mask_.size()) seen_mask_.resize(token + 1, 0);
  if (!seen_mask_[token]) {
    seen_mask_[token] = 1;
    seen_.push_back(token);
  }
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const size_t V = logits.size();
  if (params_.repetition_penalty != 1.0f) {
    // As in HF/vLLM: divide positive logits, multiply negative ones.
    for (int32_t t : seen_) {
      if (static_cast<size_t>(t) >= V) continue;
      float& l = logits[t];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (auto [t, n] : generated_counts_) {
      if (static_cast<size_t>(t) >= V) continue;
      logits[t] -= params_.frequency_penalty * static_cast<float>(n) + params_.presence_penalty;
    }
  }
}

namespace {
using model::LogSumExp;
LogSumExp log_sum_exp(std::span<const float> logits) {
  LogSumExp r{-INFINITY, 0.0};
  for (float l : logits) r.max = std::max(r.max, l);
  for (float l : logits) r.sum += std::exp(static_cast<double>(l) - r.max);
  return r;
}
}  // namespace

bool Sampler::penalized() const {
  return params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
         params_.frequency_penalty != 0.0f;
}

model::DrawSpec Sampler::spec(double u) const {
  model::DrawSpec d;
  // Finite even for the tiniest temperature (0 * inf would make a NaN).
  d.inv_temp = std::min(1.0f / params_.temperature, FLT_MAX);
  d.top_k = params_.top_k > 0 ? static_cast<uint32_t>(params_.top_k) : 0;
  d.top_p = params_.top_p;
  d.log_min_p = params_.min_p > 0.0f
                    ? static_cast<float>(std::log(static_cast<double>(params_.min_p)))
                    : -INFINITY;
  d.u = u;
  return d;
}

model::OutputNeed Sampler::need(bool want_logprob) const {
  model::OutputNeed n;
  n.lse = want_logprob;
  if (penalized()) return n;  // penalties change logits the device never saw
  n.full = false;
  if (params_.temperature == 0.0f) {
    n.top_n = 1;
  } else {
    Rng next = rng_;  // the uniform sample() will take
    n.draw = spec(next.uniform());
  }
  return n;
}

Sampled Sampler::sample(const model::RowLogits& row, bool want_logprob) {
  if (!row.full.empty()) return sample(row.full, want_logprob);
  FERRY_CHECK(!penalized() && (!want_logprob || row.lse.valid()), "sampling",
              "the step delivered neither the whole row nor what the sampler asked for");
  model::TopLogit chosen;
  if (params_.temperature == 0.0f) {
    FERRY_CHECK(!row.top.empty(), "sampling", "the step delivered no largest logit");
    chosen = row.top[0];
  } else {
    FERRY_CHECK(row.drawn.id >= 0, "sampling", "the step delivered no drawn token");
    rng_.uniform();  // the draw's uniform, taken on the device
    chosen = row.drawn;
  }
  return Sampled{chosen.id, want_logprob ? row.lse.logprob(chosen.value) : NAN};
}

float log_softmax_at(std::span<const float> logits, int32_t token) {
  return log_sum_exp(logits).logprob(logits[token]);
}

Sampled Sampler::sample(std::span<float> logits, bool want_logprob) {
  const size_t V = logits.size();
  FERRY_CHECK(V > 0, "sampling", "empty logits");
  // The reported logprob is of the raw model distribution (before
  // penalties and temperature), as OpenAI-compatible servers report it:
  // take its normaliser now and keep the raw values penalties overwrite
  // (only seen tokens), instead of copying the whole vocabulary.
  const LogSumExp raw = want_logprob ? log_sum_exp(logits) : LogSumExp{NAN, 0.0};
  saved_.clear();
  if (penalized())
    for (int32_t t : seen_)  // generated tokens are in seen_ too
      if (static_cast<size_t>(t) < V) saved_.emplace_back(t, logits[t]);
  apply_penalties(logits);

  int32_t chosen;
  if (params_.temperature == 0.0f) {
    // Greedy; ties go to the lowest id.
    chosen = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    chosen = model::draw_from_row(logits, spec(rng_.uniform())).id;
    FERRY_CHECK(chosen >= 0, "sampling", "every logit of the row is NaN");
  }
  float raw_chosen = logits[chosen];
  for (const auto& [t, l] : saved_)
    if (t == chosen) raw_chosen = l;
  return Sampled{chosen, want_logprob ? raw.logprob(raw_chosen) : NAN};
}

}  // namespace ferry::engine
