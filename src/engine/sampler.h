// Per-request sampling: penalties, temperature, top-k, top-p, min-p and a
// seeded generator. Deterministic: the same logits, history and seed give
// the same token on every machine (own PRNG, fixed processing order).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/outputs.h"

namespace ferry::engine {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // 0: off
  float min_p = 0.0f;               // [0, 1]
  float presence_penalty = 0.0f;    // [-2, 2], on generated tokens
  float frequency_penalty = 0.0f;   // [-2, 2], on generated tokens
  float repetition_penalty = 1.0f;  // > 0, on prompt and generated tokens
  std::optional<uint64_t> seed;     // none: drawn from the OS
  // Throws ferry::Error("[sampling] ...") naming the first bad field.
  void validate() const;
};

// splitmix64-seeded xoshiro256**: small, fast and identical everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1) with 53 random bits
 private:
  uint64_t s_[4];
};

struct Sampled {
  int32_t token;
  float logprob;  // log-softmax of the raw model logits at `token` (or NaN)
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, std::span<const int32_t> prompt);
  // Picks the next token from raw logits; `logits` is used as scratch.
  // Without want_logprob, Sampled::logprob is NaN and the vocabulary-wide
  // normaliser is skipped.
  Sampled sample(std::span<float> logits, bool want_logprob = true);
  // What sample(RowLogits) needs of the step's output: the largest logit
  // for greedy, else a token drawn by model::draw_from_row's definition
  // with the uniform the next sample() takes (greedy with penalties: the
  // draw's first token), after the penalties (OutputNeed::penalties, a
  // view of this sampler's list, valid until the next accept()). Both are
  // reductions a device can do; the whole row is never needed.
  model::OutputNeed need(bool want_logprob) const;
  // Samples from a step's output: its whole row when present (as above),
  // else what `need` asked for. Both give the same token for the same
  // logits and generator state.
  Sampled sample(const model::RowLogits& row, bool want_logprob);
  // Records a generated token (for penalties).
  void accept(int32_t token);
  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(std::span<float> logits) const;
  bool penalized() const;
  // The draw's parameters with uniform u.
  model::DrawSpec spec(double u) const;

  SamplingParams params_;
  Rng rng_;
  // Adds token to seen_ if new; its index there (SIZE_MAX: a negative id).
  size_t seen(int32_t token);

  // Prompt ∪ generated tokens, each once, with what the penalties take off
  // (the list a device applies: OutputNeed::penalties); counts_[i]: times
  // seen_[i] was generated; seen_at_: token -> its index (memory grows with
  // the tokens seen, not with the vocabulary).
  std::vector<model::DrawPenalty> seen_;
  std::vector<int32_t> counts_;
  std::unordered_map<int32_t, size_t> seen_at_;
  std::vector<std::pair<int32_t, float>> saved_;  // raw logits penalties change
};

// log-softmax of raw logits at `token`, computed in double.
float log_softmax_at(std::span<const float> logits, int32_t token);

}  // namespace ferry::engine
