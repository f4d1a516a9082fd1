// OpenAI-compatible answers built from the scheduler's events: a whole
// response (CompletionCollector) or a stream of SSE chunks
// (StreamRenderer). Pure: no sockets, no clock but `created`.
//
// Events arrive per choice in the scheduler's order (Token..., then one
// Finished or Error); choices interleave freely.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/scheduler.h"
#include "server/openai_api.h"

namespace ferry::server {

using ojson = nlohmann::ordered_json;

// JSON text with ill-formed UTF-8 (a token cut inside a character)
// replaced by U+FFFD, so any token can be sent.
std::string dump_json(const ojson& j);
// "data: <json>\n\n": one server-sent event.
std::string sse_event(const ojson& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// "chatcmpl-" or "cmpl-" and 24 random hex digits.
std::string new_response_id(Endpoint endpoint);

struct ResponseInfo {
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// State shared by both answer shapes: per choice text, logprobs, finish.
class ResponseState {
 public:
  ResponseState(const ApiRequest& request, ResponseInfo info, size_t n_choices,
                size_t prompt_tokens, const text::Tokenizer& tokenizer);
  bool done() const { return open_ == 0; }
  const ResponseInfo& info() const { return info_; }
  ojson usage() const;

 protected:
  struct Choice {
    std::string text;
    std::optional<engine::FinishReason> finish;
    bool failed = false;
    size_t completion_tokens = 0;
    // Completions' logprobs arrays, or chat's "content" entries.
    ojson tokens = ojson::array(), token_logprobs = ojson::array(), top_logprobs = ojson::array(),
          text_offset = ojson::array(), content = ojson::array();
  };
  // Records a Token event's logprobs on `c` (when asked); returns the
  // chunk-sized piece: chat's {"content": [entry]} or completions' arrays.
  ojson record_logprobs(Choice& c, const engine::StreamEvent& ev);
  // Updates choice state; returns false for an event after the choice ended.
  bool apply(size_t index, const engine::StreamEvent& ev, ojson* logprobs_piece);
  ojson chat_logprob_entry(int32_t token, float logprob,
                           const std::vector<engine::TopLogprob>& top) const;
  ojson base(const char* object) const;

  Endpoint endpoint_;
  bool logprobs_;
  size_t top_k_;  // alternatives per token
  ResponseInfo info_;
  size_t prompt_tokens_;
  const text::Tokenizer& tok_;
  std::vector<Choice> choices_;
  size_t open_;
  std::optional<ApiError> error_;
};

// A non-streamed answer: feed every event, then body().
class CompletionCollector : public ResponseState {
 public:
  using ResponseState::ResponseState;
  void add(size_t index, const engine::StreamEvent& ev) { apply(index, ev, nullptr); }
  // An Error event fails the whole request (500 server_error).
  const std::optional<ApiError>& error() const { return error_; }
  // "chat.completion" or "text_completion" with choices and usage.
  ojson body() const;
};

// A streamed answer: start(), add() per event, finish() once done().
// Each returns the SSE text to write (possibly empty).
class StreamRenderer : public ResponseState {
 public:
  StreamRenderer(const ApiRequest& request, ResponseInfo info, size_t n_choices,
                 size_t prompt_tokens, const text::Tokenizer& tokenizer);
  // Chat: each choice's first chunk, delta {"role": "assistant"}.
  std::string start();
  std::string add(size_t index, const engine::StreamEvent& ev);
  // Ends every open choice with an error event (the server is stopping).
  std::string abort(const ApiError& error);
  // The usage chunk when stream_options.include_usage, then [DONE].
  std::string finish();

 private:
  ojson chunk(size_t index, const ojson& piece, const std::optional<engine::FinishReason>& finish,
              const ojson& logprobs) const;
  bool include_usage_;
};

}  // namespace ferry::server
