// Sequence: one request's generation state (sampler, streaming decoder,
// stop strings, budget), independent of how its forward steps are batched.
#pragma once

#include <functional>
#include <string_view>

#include "engine/generate.h"
#include "engine/stop_matcher.h"

namespace ferry::engine {

class Sequence {
 public:
  using OnText = std::function<void(std::string_view)>;
  // Throws ferry::Error if the prompt is empty or does not fit the context.
  Sequence(const GenerationRequest& req, const text::Tokenizer& tok, size_t context_length,
           OnText on_text = {});

  const GenerationRequest& request() const { return req_; }
  // Takes the logits that follow the sequence's last token, samples, streams
  // text; returns true when the sequence has finished.
  bool on_logits(std::span<float> logits);
  // The same from a step's output (model/outputs.h), which must hold what
  // need() asked for.
  bool on_logits(const model::RowLogits& row);
  // What the sequence needs of its next step's output.
  model::OutputNeed need() const { return sampler_.need(req_.logprobs); }
  bool finished() const { return finished_; }
  // The token to feed next (the last sampled one).
  int32_t last_token() const { return res_.tokens.back(); }
  GenerationResult& result() { return res_; }

 private:
  void emit(const std::string& s);
  void finish(FinishReason r);

  GenerationRequest req_;
  const text::Tokenizer& tok_;
  size_t budget_;
  Sampler sampler_;
  StopMatcher stops_;
  text::StreamDecoder decoder_;
  OnText on_text_;
  GenerationResult res_;
  bool finished_ = false;
};

}  // namespace ferry::engine
