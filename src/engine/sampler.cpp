#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"

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
// Sort by logit descending, id ascending: a total order, so the candidate
// list is the same on every run.
bool before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}
}  // namespace

bool Sampler::penalized() const {
  return params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
         params_.frequency_penalty != 0.0f;
}

model::OutputNeed Sampler::need(bool want_logprob) const {
  model::OutputNeed n;
  n.lse = want_logprob;
  if (penalized()) return n;  // penalties change logits the reduction would not see
  if (params_.temperature == 0.0f) {
    n.full = false;
    n.top_n = 1;
  } else if (params_.top_k > 0 && static_cast<uint32_t>(params_.top_k) <= model::kMaxTopN) {
    n.full = false;
    n.top_n = static_cast<uint32_t>(params_.top_k);
  }
  return n;
}

Sampled Sampler::sample(const model::RowLogits& row, bool want_logprob) {
  if (!row.full.empty()) return sample(row.full, want_logprob);
  const model::OutputNeed n = need(want_logprob);
  FERRY_CHECK(!n.full && !row.top.empty() && (!want_logprob || row.lse.valid()), "sampling",
              "the step delivered neither the whole row nor its largest logits");
  int32_t chosen = row.top[0].id;
  float raw_chosen = row.top[0].value;
  if (params_.temperature != 0.0f) {
    const size_t k = std::min<size_t>(n.top_n, row.top.size());
    cand_.clear();
    for (size_t i = 0; i < k; ++i)
      cand_.emplace_back(row.top[i].value / params_.temperature, row.top[i].id);
    // Scaling can make neighbours equal: re-sort as the whole-row path does.
    std::sort(cand_.begin(), cand_.end(), before);
    chosen = draw();
    for (size_t i = 0; i < k; ++i)
      if (row.top[i].id == chosen) raw_chosen = row.top[i].value;
  }
  return Sampled{chosen, want_logprob ? row.lse.logprob(raw_chosen) : NAN};
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
    cand_.clear();
    cand_.reserve(V);
    for (size_t i = 0; i < V; ++i)
      cand_.emplace_back(logits[i] / params_.temperature, static_cast<int32_t>(i));
    size_t keep = V;
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < V) {
      keep = static_cast<size_t>(params_.top_k);
      std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), before);
      cand_.resize(keep);
    } else {
      std::sort(cand_.begin(), cand_.end(), before);
    }
    chosen = draw();
  }
  float raw_chosen = logits[chosen];
  for (const auto& [t, l] : saved_)
    if (t == chosen) raw_chosen = l;
  return Sampled{chosen, want_logprob ? raw.logprob(raw_chosen) : NAN};
}

int32_t Sampler::draw() {
  // Softmax over the survivors (double, in sorted order).
  const double mx = cand_[0].first;
  std::vector<double>& p = probs_;
  p.resize(cand_.size());
  double sum = 0.0;
  for (size_t i = 0; i < cand_.size(); ++i) sum += p[i] = std::exp(cand_[i].first - mx);
  for (double& x : p) x /= sum;
  // min-p: drop tokens below min_p * p_max.
  size_t n = cand_.size();
  if (params_.min_p > 0.0f) {
    const double floor = params_.min_p * p[0];
    while (n > 1 && p[n - 1] < floor) --n;
  }
  // top-p: smallest prefix whose mass reaches top_p.
  if (params_.top_p < 1.0f) {
    double acc = 0.0;
    size_t m = 0;
    while (m < n) {
      acc += p[m++];
      if (acc >= params_.top_p) break;
    }
    n = m;
  }
  double mass = 0.0;
  for (size_t i = 0; i < n; ++i) mass += p[i];
  double u = rng_.uniform() * mass;
  int32_t chosen = cand_[n - 1].second;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) {
      chosen = cand_[i].second;
      break;
    }
  }
  return chosen;
}

}  // namespace ferry::engine
