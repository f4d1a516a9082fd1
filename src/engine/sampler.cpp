#include "engine/sampler.h"

#include <algorithm>
#include <cfloat>
#include <climits>
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
  for (int32_t t : prompt) seen(t);
}

size_t Sampler::seen(int32_t token) {
  if (token < 0) return SIZE_MAX;
  const auto [it, added] = seen_at_.try_emplace(token, seen_.size());
  if (added) {
    seen_.push_back(model::DrawPenalty{token, 0.0f});
    counts_.push_back(0);
  }
  return it->second;
}

void Sampler::accept(int32_t token) {
  const size_t at = seen(token);
  if (at == SIZE_MAX) return;
  // What OpenAI's penalties take off a generated token, in float as
  // apply_draw_penalties subtracts it (0 while both are 0).
  seen_[at].sub =
      params_.frequency_penalty * static_cast<float>(++counts_[at]) + params_.presence_penalty;
}

void Sampler::apply_penalties(std::span<float> logits) const {
  if (penalized()) model::apply_draw_penalties(logits, params_.repetition_penalty, seen_);
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
  d.repetition = params_.repetition_penalty;
  return d;
}

model::OutputNeed Sampler::need(bool want_logprob) const {
  model::OutputNeed n;
  n.lse = want_logprob;
  n.full = false;
  if (penalized()) n.penalties = seen_;  // applied where the token is drawn
  if (params_.temperature == 0.0f) {
    if (penalized()) {
      // Greedy on penalised logits: the draw's first token (x = l, top_k 1),
      // as max_element's first largest; no uniform is taken.
      model::DrawSpec d;
      d.top_k = 1;
      d.repetition = params_.repetition_penalty;
      n.draw = d;
    } else {
      n.top_n = 1;
    }
  } else {
    Rng next = rng_;  // the uniform sample() will take
    n.draw = spec(next.uniform());
  }
  return n;
}

Sampled Sampler::sample(const model::RowLogits& row, bool want_logprob) {
  if (!row.full.empty()) return sample(row.full, want_logprob);
  FERRY_CHECK(!want_logprob || row.lse.valid(), "sampling",
              "the step delivered neither the whole row nor the log-sum-exp asked for");
  model::TopLogit chosen;
  if (params_.temperature == 0.0f && !penalized()) {
    FERRY_CHECK(!row.top.empty(), "sampling", "the step delivered no largest logit");
    chosen = row.top[0];
  } else {
    FERRY_CHECK(row.drawn.id >= 0, "sampling", "the step delivered no drawn token");
    if (params_.temperature != 0.0f) rng_.uniform();  // the draw's uniform, taken on the device
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
    for (const model::DrawPenalty& p : seen_)  // generated tokens are in seen_ too
      if (static_cast<size_t>(p.token) < V) saved_.emplace_back(p.token, logits[p.token]);
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
