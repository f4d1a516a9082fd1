#include "server/openai_response.h"

#include <cinttypes>
#include <cstdio>
#include <random>

#include "text/tokenizer.h"

namespace ferry::server {

std::string dump_json(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string sse_event(const ojson& j) {
  return "data: " + dump_json(j) + "\n\n";
}

std::string new_response_id(Endpoint endpoint) {
  thread_local std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }();
  char hex[40];
  std::snprintf(hex, sizeof hex, "%016" PRIx64 "%08" PRIx32, rng(), static_cast<uint32_t>(rng()));
  return (endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-") + std::string(hex);
}

ResponseState::ResponseState(const ApiRequest& request, ResponseInfo info, size_t n_choices,
                             size_t prompt_tokens, const text::Tokenizer& tokenizer)
    : endpoint_(request.endpoint),
      logprobs_(request.logprobs),
      top_k_(request.top_logprobs),
      info_(std::move(info)),
      prompt_tokens_(prompt_tokens),
      tok_(tokenizer),
      choices_(n_choices),
      open_(n_choices) {}

ojson ResponseState::usage() const {
  size_t completion = 0;
  for (const Choice& c : choices_) completion += c.completion_tokens;
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens_ + completion}};
}

ojson ResponseState::base(const char* object) const {
  return {{"id", info_.id}, {"object", object}, {"created", info_.created}, {"model", info_.model}};
}

ojson ResponseState::chat_logprob_entry(int32_t token, float logprob,
                                        const std::vector<engine::TopLogprob>& top) const {
  auto entry = [&](int32_t id, float lp) {
    const std::string& bytes = tok_.token_bytes(id);
    ojson b = ojson::array();
    for (unsigned char ch : bytes) b.push_back(ch);
    return ojson{{"token", bytes}, {"logprob", lp}, {"bytes", std::move(b)}};
  };
  ojson e = entry(token, logprob);
  ojson alts = ojson::array();
  for (const engine::TopLogprob& t : top) alts.push_back(entry(t.token, t.logprob));
  e["top_logprobs"] = std::move(alts);
  return e;
}

ojson ResponseState::record_logprobs(Choice& c, const engine::StreamEvent& ev) {
  if (endpoint_ == Endpoint::Chat) {
    ojson e = chat_logprob_entry(ev.token, ev.logprob, ev.top_logprobs);
    c.content.push_back(e);
    return {{"content", ojson::array({std::move(e)})}};
  }
  const std::string& bytes = tok_.token_bytes(ev.token);
  ojson top = nullptr;
  if (top_k_ > 0) {
    top = ojson::object();
    for (const engine::TopLogprob& t : ev.top_logprobs) top[tok_.token_bytes(t.token)] = t.logprob;
  }
  c.tokens.push_back(bytes);
  c.token_logprobs.push_back(ev.logprob);
  c.top_logprobs.push_back(top);
  c.text_offset.push_back(c.text.size());
  return {{"tokens", ojson::array({bytes})},
          {"token_logprobs", ojson::array({ev.logprob})},
          {"top_logprobs", top_k_ > 0 ? ojson::array({std::move(top)}) : ojson(nullptr)},
          {"text_offset", ojson::array({c.text.size()})}};
}

bool ResponseState::apply(size_t index, const engine::StreamEvent& ev, ojson* logprobs_piece) {
  if (index >= choices_.size()) return false;
  Choice& c = choices_[index];
  if (c.finish || c.failed) return false;
  switch (ev.kind) {
    case engine::StreamEvent::Kind::Token: {
      // A Token event without a token carries text a stop string held
      // back until the end; it has no logprob.
      if (logprobs_ && ev.token >= 0) {
        ojson piece = record_logprobs(c, ev);
        if (logprobs_piece) *logprobs_piece = std::move(piece);
      }
      c.text += ev.text;
      return true;
    }
    case engine::StreamEvent::Kind::Finished:
      c.finish = ev.finish;
      c.completion_tokens = ev.completion_tokens;
      --open_;
      return true;
    case engine::StreamEvent::Kind::Error:
      c.failed = true;
      --open_;
      if (!error_) error_.emplace(500, "server_error", "generation failed: " + ev.error);
      return true;
  }
  return false;
}

ojson CompletionCollector::body() const {
  const bool chat = endpoint_ == Endpoint::Chat;
  ojson b = base(chat ? "chat.completion" : "text_completion");
  ojson choices = ojson::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    ojson lp = nullptr;
    if (logprobs_ && chat) {
      lp = {{"content", c.content}};
    } else if (logprobs_) {
      lp = {{"tokens", c.tokens},
            {"token_logprobs", c.token_logprobs},
            {"top_logprobs", top_k_ > 0 ? c.top_logprobs : ojson(nullptr)},
            {"text_offset", c.text_offset}};
    }
    ojson finish = c.finish ? ojson(engine::finish_reason_name(*c.finish)) : ojson(nullptr);
    if (chat) {
      choices.push_back({{"index", i},
                         {"message", {{"role", "assistant"}, {"content", c.text}}},
                         {"logprobs", std::move(lp)},
                         {"finish_reason", std::move(finish)}});
    } else {
      choices.push_back({{"text", c.text},
                         {"index", i},
                         {"logprobs", std::move(lp)},
                         {"finish_reason", std::move(finish)}});
    }
  }
  b["choices"] = std::move(choices);
  b["usage"] = usage();
  return b;
}

StreamRenderer::StreamRenderer(const ApiRequest& request, ResponseInfo info, size_t n_choices,
                               size_t prompt_tokens, const text::Tokenizer& tokenizer)
    : ResponseState(request, std::move(info), n_choices, prompt_tokens, tokenizer),
      include_usage_(request.include_usage) {}

ojson StreamRenderer::chunk(size_t index, const ojson& piece,
                            const std::optional<engine::FinishReason>& finish,
                            const ojson& logprobs) const {
  const bool chat = endpoint_ == Endpoint::Chat;
  ojson c = base(chat ? "chat.completion.chunk" : "text_completion");
  ojson choice;
  if (chat) {
    choice = {{"index", index}, {"delta", piece}};
  } else {
    choice = {{"text", piece}, {"index", index}};
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish ? ojson(engine::finish_reason_name(*finish)) : ojson(nullptr);
  c["choices"] = ojson::array({std::move(choice)});
  return c;
}

std::string StreamRenderer::start() {
  if (endpoint_ != Endpoint::Chat) return {};
  std::string out;
  const ojson delta = {{"role", "assistant"}, {"content", ""}};
  for (size_t i = 0; i < choices_.size(); ++i)
    out += sse_event(chunk(i, delta, std::nullopt, nullptr));
  return out;
}

std::string StreamRenderer::add(size_t index, const engine::StreamEvent& ev) {
  ojson lp = nullptr;
  if (!apply(index, ev, &lp)) return {};
  const bool chat = endpoint_ == Endpoint::Chat;
  switch (ev.kind) {
    case engine::StreamEvent::Kind::Token:
      if (ev.text.empty() && lp.is_null()) return {};
      return sse_event(
          chunk(index, chat ? ojson{{"content", ev.text}} : ojson(ev.text), std::nullopt, lp));
    case engine::StreamEvent::Kind::Finished:
      return sse_event(chunk(index, chat ? ojson::object() : ojson(""), ev.finish, nullptr));
    case engine::StreamEvent::Kind::Error:
      return "data: " +
             error_body(ApiError(500, "server_error", "generation failed: " + ev.error)) + "\n\n";
  }
  return {};
}

std::string StreamRenderer::abort(const ApiError& error) {
  bool any = false;
  for (Choice& c : choices_) {
    if (c.finish || c.failed) continue;
    c.failed = true;
    --open_;
    any = true;
  }
  return any ? "data: " + error_body(error) + "\n\n" : std::string();
}

std::string StreamRenderer::finish() {
  std::string out;
  if (include_usage_) {
    ojson u = base(endpoint_ == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
    u["choices"] = ojson::array();
    u["usage"] = usage();
    out += sse_event(u);
  }
  return out + kSseDone;
}

}  // namespace ferry::server
