#include "engine/sequence.h"

#include <algorithm>

#include "core/error.h"

namespace ferry::engine {

Sequence::Sequence(const GenerationRequest& req, const text::Tokenizer& tok, size_t context_length,
                   OnText on_text)
    : req_(req),
      tok_(tok),
      budget_(0),
      sampler_(req.sampling, req.prompt),
      stops_(req.stop),
      decoder_(tok),
      on_text_(std::move(on_text)) {
  if (req.prompt.empty()) fail("generate", "the prompt is empty");
  if (req.prompt.size() >= context_length)
    fail("generate", "prompt of ", req.prompt.size(), " tokens does not fit the context of ",
         context_length, " tokens");
  budget_ = std::min(req.max_tokens, context_length - req.prompt.size());
  if (budget_ == 0) finish(FinishReason::Length);
}

void Sequence::emit(const std::string& s) {
  if (s.empty()) return;
  res_.text += s;
  if (on_text_) on_text_(s);
}

void Sequence::finish(FinishReason r) {
  if (!stops_.stopped()) {
    emit(stops_.push(decoder_.flush()));
    if (!stops_.stopped()) emit(stops_.flush());
  }
  res_.finish = r;
  finished_ = true;
}

bool Sequence::on_logits(std::span<float> logits) {
  model::RowLogits row;
  row.full = logits;
  return on_logits(row);
}

bool Sequence::on_logits(const model::RowLogits& row) {
  FERRY_CHECK(!finished_, "generate", "logits for a finished sequence");
  Sampled s = sampler_.sample(row, req_.logprobs);
  res_.tokens.push_back(s.token);
  res_.logprobs.push_back(s.logprob);
  sampler_.accept(s.token);
  if (!req_.ignore_eos && tok_.is_end_of_generation(s.token)) {
    finish(FinishReason::Stop);
    return true;
  }
  emit(stops_.push(decoder_.push(s.token)));
  if (stops_.stopped()) {
    finish(FinishReason::Stop);
  } else if (res_.tokens.size() >= budget_) {
    finish(FinishReason::Length);
  }
  return finished_;
}

}  // namespace ferry::engine
