// OpenAI-compatible requests: pure functions from a request body to engine
// requests, testable without HTTP (http_server.cpp wires them to sockets;
// openai_response.h builds the answers).
//
//   body ──parse_request──► ApiRequest ──plan_request──► Plan
//   (JSON text)             (fields checked,            (token ids, one
//                            nothing tokenized)          GenerationRequest
//                                                        per choice)
//
// Every failure is an ApiError carrying the HTTP status and OpenAI's error
// object; nothing else escapes these functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/generate.h"

namespace ferry::text {
class Tokenizer;
class ChatTemplate;
}  // namespace ferry::text

namespace ferry::server {

// An error answered as {"error": {"message", "type", "param", "code"}}
// with `status`. An empty param or code is sent as null.
class ApiError : public Error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = {},
           std::string code = {});
  int status;
  std::string type;   // "invalid_request_error", "server_error", ...
  std::string param;  // the offending request field
  std::string code;   // "context_length_exceeded", "invalid_api_key", ...
};

// 400 invalid_request_error.
ApiError invalid_request(const std::string& message, std::string param = {}, std::string code = {});
// The JSON text of the error body.
std::string error_body(const ApiError& e);

enum class Endpoint { Chat, Completions };

// One completions prompt: text, or token ids given directly.
struct PromptInput {
  std::string text;
  std::vector<int32_t> tokens;
  bool is_tokens = false;
};

// A request's fields, type- and range-checked; nothing tokenized yet.
struct ApiRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;                                                  // as sent (may be empty)
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // Chat: {role, content}
  std::vector<PromptInput> prompts;                                   // Completions
  size_t n = 1;                                                       // choices per prompt
  std::optional<size_t> max_tokens;  // none: the rest of the context
  engine::SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // per-token logprobs in the answer
  size_t top_logprobs = 0;     // alternatives per token (0..20)
};

// Limits on what one request may ask for.
inline constexpr size_t kMaxChoices = 128;  // prompts x n
inline constexpr size_t kMaxTopLogprobs = 20;
inline constexpr size_t kMaxStops = 16;

// Parses and checks a request body. Unknown fields are ignored; a field
// sent as null counts as absent. Throws ApiError (400).
ApiRequest parse_request(Endpoint endpoint, std::string_view body);

// What the server serves, as the request planner needs it.
struct ServedModel {
  std::string id;                              // the name /v1/models lists
  const text::Tokenizer* tokenizer = nullptr;  // required
  const text::ChatTemplate* chat = nullptr;    // null: chat requests get 400
  size_t context_length = 0;
  size_t default_max_tokens = 0;       // when a request names none; 0: the rest of the context
  engine::GenerationRequest defaults;  // prefill_chunk and KV formats
};

struct Plan {
  // One request per choice, in OpenAI's index order: prompt p's choice j
  // has index p * n + j. With a seed s, choice j of every prompt has seed
  // s + j, so a choice never depends on the other prompts in the list.
  std::vector<engine::GenerationRequest> choices;
  size_t prompt_tokens = 0;  // usage: the prompts' tokens, each counted once
};

// Renders chat messages with the model's template and tokenizes them (BOS
// added as `ferry run` does), or tokenizes the prompts; checks each prompt
// against the context (400 context_length_exceeded) and clamps max_tokens
// to what the context leaves. Throws ApiError.
Plan plan_request(const ApiRequest& request, const ServedModel& model);

// The token ids of each prompt (chat: the rendered conversation).
std::vector<std::vector<int32_t>> encode_prompts(const ApiRequest& request,
                                                 const ServedModel& model);

}  // namespace ferry::server
