#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/stop_matcher.h"

namespace ferry::engine {

const char* finish_reason_name(FinishReason r) {
  return r == FinishReason::Stop ? "stop" : "length";
}

GenerationResult generate(const model::Model& model, const text::Tokenizer& tok,
                          const kernels::Context& ctx, const GenerationRequest& req,
                          const std::function<void(std::string_view)>& on_text) {
  using clock = std::chrono::steady_clock;
  const model::ModelConfig& cfg = model.config();
  if (req.prompt.empty()) fail("generate", "the prompt is empty");
  if (req.prompt.size() >= cfg.context_length)
    fail("generate", "prompt of ", req.prompt.size(), " tokens does not fit the context of ",
         cfg.context_length);
  const size_t budget = std::min(req.max_tokens, cfg.context_length - req.prompt.size());
  kv::BatchKv kv(cfg.kv_spec(req.kv_k, req.kv_v));
  const size_t prompt_len = req.prompt.size();
  kv.prepare_prefill(std::span<const size_t>(&prompt_len, 1));
  Sampler sampler(req.sampling, req.prompt);
  StopMatcher stops(req.stop);
  text::StreamDecoder decoder(tok);
  GenerationResult res;
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    res.text += s;
    if (on_text) on_text(s);
  };

  std::vector<float> logits;
  auto t0 = clock::now();
  const size_t chunk = std::max<size_t>(1, req.prefill_chunk);
  for (size_t i = 0; i < req.prompt.size(); i += chunk) {
    size_t n = std::min(chunk, req.prompt.size() - i);
    model::RowInput row{std::span<const int32_t>(req.prompt).subspan(i, n), false};
    model.forward(ctx, kv, std::span<const model::RowInput>(&row, 1), logits);
  }
  kv.finalize_prefill();
  auto t1 = clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  bool stopped = false;
  while (res.tokens.size() < budget) {
    Sampled s = sampler.sample(logits);
    res.tokens.push_back(s.token);
    res.logprobs.push_back(s.logprob);
    sampler.accept(s.token);
    if (!req.ignore_eos && tok.is_end_of_generation(s.token)) {
      stopped = true;
      break;
    }
    emit(stops.push(decoder.push(s.token)));
    if (stops.stopped()) {
      stopped = true;
      break;
    }
    if (res.tokens.size() == budget) break;
    model::RowInput row{std::span<const int32_t>(&res.tokens.back(), 1), false};
    model.forward(ctx, kv, std::span<const model::RowInput>(&row, 1), logits);
  }
  if (!stops.stopped()) {
    emit(stops.push(decoder.flush()));
    if (!stops.stopped()) emit(stops.flush());
  }
  res.finish = stopped ? FinishReason::Stop : FinishReason::Length;
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

}  // namespace ferry::engine
