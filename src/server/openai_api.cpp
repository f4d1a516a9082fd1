#include "server/openai_api.h"

#include <cmath>
#include <limits>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace ferry::server {

using json = nlohmann::json;

ApiError::ApiError(int status_, std::string type_, const std::string& message, std::string param_,
                   std::string code_)
    : Error(message),
      status(status_),
      type(std::move(type_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

ApiError invalid_request(const std::string& message, std::string param, std::string code) {
  return ApiError(400, "invalid_request_error", message, std::move(param), std::move(code));
}

std::string error_body(const ApiError& e) {
  using ojson = nlohmann::ordered_json;
  ojson err = {{"message", e.what()},
               {"type", e.type},
               {"param", e.param.empty() ? ojson(nullptr) : ojson(e.param)},
               {"code", e.code.empty() ? ojson(nullptr) : ojson(e.code)}};
  return ojson{{"error", err}}.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

namespace {

// Field readers: each returns nullopt when the field is absent or null and
// throws a 400 naming the field when it has the wrong type or range.
const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void bad_type(const char* key, const char* want) {
  throw invalid_request(std::string("'") + key + "' must be " + want, key, "invalid_type");
}

[[noreturn]] void bad_value(const char* key, const std::string& rule) {
  throw invalid_request(std::string("'") + key + "' " + rule, key, "invalid_value");
}

std::optional<double> opt_number(const json& j, const char* key, double lo, double hi) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_type(key, "a number");
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad_value(key, "must be between " + json(lo).dump() + " and " + json(hi).dump());
  return d;
}

// Integers may be sent as 3 or 3.0 (as Python clients sometimes do).
std::optional<int64_t> opt_int(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  int64_t i = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad_value(key, "is too large");
    i = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    i = v->get<int64_t>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15)
      bad_type(key, "an integer");
    i = static_cast<int64_t>(d);
  } else {
    bad_type(key, "an integer");
  }
  if (i < lo || i > hi)
    bad_value(key, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return i;
}

std::optional<bool> opt_bool(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_type(key, "a boolean");
  return v->get<bool>();
}

// "content" may be a string or a list of parts; text parts are joined.
std::string message_content(const json& content, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw invalid_request("'" + param + "' must be a string or a list of text parts", param,
                          "invalid_type");
  std::string out;
  for (const json& part : content) {
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    const json* text = part.is_object() ? field(part, "text") : nullptr;
    if (!type || !type->is_string() || *type != "text" || !text || !text->is_string())
      throw invalid_request("'" + param +
                                "' parts must be {\"type\": \"text\", \"text\": ...}; "
                                "only text is supported",
                            param, "invalid_value");
    out += text->get<std::string>();
  }
  return out;
}

void parse_messages(const json& j, ApiRequest& r) {
  const json* msgs = field(j, "messages");
  if (!msgs)
    throw invalid_request("'messages' is required", "messages", "missing_required_parameter");
  if (!msgs->is_array()) bad_type("messages", "a list of messages");
  if (msgs->empty()) bad_value("messages", "must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object())
      throw invalid_request("'" + where + "' must be an object", where, "invalid_type");
    const json* role = field(m, "role");
    if (!role || !role->is_string())
      throw invalid_request("'" + where + ".role' must be a string", where + ".role",
                            "invalid_type");
    auto it = m.find("content");
    const std::string content = message_content(it == m.end() ? json(nullptr) : *it, i);
    r.messages.push_back({{"role", role->get<std::string>()}, {"content", content}});
  }
}

std::vector<int32_t> token_list(const json& a) {
  std::vector<int32_t> ids;
  for (const json& t : a) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw invalid_request("'prompt' token ids must be non-negative integers", "prompt",
                            "invalid_type");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

// "prompt": a string, a list of strings, a list of token ids or a list of
// lists of token ids.
void parse_prompts(const json& j, ApiRequest& r) {
  const json* p = field(j, "prompt");
  if (!p) throw invalid_request("'prompt' is required", "prompt", "missing_required_parameter");
  const char* want = "a string, a list of strings or a list of token ids";
  if (p->is_string()) {
    r.prompts.push_back({p->get<std::string>(), {}, false});
    return;
  }
  if (!p->is_array()) bad_type("prompt", want);
  if (p->empty()) bad_value("prompt", "must not be an empty list");
  if ((*p)[0].is_number()) {
    r.prompts.push_back({{}, token_list(*p), true});
    return;
  }
  for (const json& e : *p) {
    if (e.is_string()) {
      r.prompts.push_back({e.get<std::string>(), {}, false});
    } else if (e.is_array()) {
      r.prompts.push_back({{}, token_list(e), true});
    } else {
      bad_type("prompt", want);
    }
  }
}

void parse_stop(const json& j, ApiRequest& r) {
  const json* s = field(j, "stop");
  if (!s) return;
  if (s->is_string()) {
    r.stop.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    if (s->size() > kMaxStops)
      bad_value("stop", "may hold at most " + std::to_string(kMaxStops) + " strings");
    for (const json& e : *s) {
      if (!e.is_string()) bad_type("stop", "a string or a list of strings");
      r.stop.push_back(e.get<std::string>());
    }
  } else {
    bad_type("stop", "a string or a list of strings");
  }
  // An empty stop string would end every generation before it starts;
  // clients that send one mean "no stop string".
  std::erase(r.stop, std::string());
}

void parse_sampling(const json& j, ApiRequest& r) {
  engine::SamplingParams& s = r.sampling;
  if (auto v = opt_number(j, "temperature", 0, 2)) s.temperature = static_cast<float>(*v);
  if (auto v = opt_number(j, "top_p", 0, 1)) {
    if (*v == 0) bad_value("top_p", "must be greater than 0");
    s.top_p = static_cast<float>(*v);
  }
  // -1 means "off" in vLLM and llama.cpp; 0 means it here.
  if (auto v = opt_int(j, "top_k", -1, std::numeric_limits<int32_t>::max()))
    s.top_k = static_cast<int32_t>(std::max<int64_t>(*v, 0));
  if (auto v = opt_number(j, "min_p", 0, 1)) s.min_p = static_cast<float>(*v);
  if (auto v = opt_number(j, "presence_penalty", -2, 2))
    s.presence_penalty = static_cast<float>(*v);
  if (auto v = opt_number(j, "frequency_penalty", -2, 2))
    s.frequency_penalty = static_cast<float>(*v);
  if (auto v = opt_number(j, "repetition_penalty", 0, 1e6)) {
    if (*v == 0) bad_value("repetition_penalty", "must be greater than 0");
    s.repetition_penalty = static_cast<float>(*v);
  }
  // A negative seed is taken as its two's-complement bits.
  if (auto v = opt_int(j, "seed", std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max()))
    s.seed = static_cast<uint64_t>(*v);
  try {
    s.validate();
  } catch (const Error& e) {
    throw invalid_request(e.what(), {}, "invalid_value");
  }
}

void parse_logprobs(const json& j, ApiRequest& r) {
  const int64_t kTop = static_cast<int64_t>(kMaxTopLogprobs);
  if (r.endpoint == Endpoint::Chat) {
    r.logprobs = opt_bool(j, "logprobs").value_or(false);
    if (auto k = opt_int(j, "top_logprobs", 0, kTop)) {
      if (!r.logprobs && *k > 0) bad_value("top_logprobs", "needs 'logprobs' set to true");
      r.top_logprobs = static_cast<size_t>(*k);
    }
  } else if (auto k = opt_int(j, "logprobs", 0, kTop)) {
    r.logprobs = true;
    r.top_logprobs = static_cast<size_t>(*k);
  }
}

}  // namespace

ApiRequest parse_request(Endpoint endpoint, std::string_view body) {
  // Parsing is iterative in nlohmann::json, so deep nesting cannot
  // overflow the stack; the body size is bounded by the HTTP layer.
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw invalid_request("the request body is not valid JSON", {}, "invalid_json");
  if (!j.is_object())
    throw invalid_request("the request body must be a JSON object", {}, "invalid_json");
  ApiRequest r;
  r.endpoint = endpoint;
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) bad_type("model", "a string");
    r.model = m->get<std::string>();
  }
  if (endpoint == Endpoint::Chat) {
    parse_messages(j, r);
  } else {
    parse_prompts(j, r);
  }
  const int64_t kChoices = static_cast<int64_t>(kMaxChoices);
  r.n = static_cast<size_t>(opt_int(j, "n", 1, kChoices).value_or(1));
  if (r.n * r.prompts.size() > kMaxChoices)
    bad_value("n", "times the number of prompts must be at most " + std::to_string(kMaxChoices));
  // max_completion_tokens is the newer name; it wins when both are sent.
  const int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  auto max_tokens = opt_int(j, "max_completion_tokens", 1, kMaxInt);
  if (!max_tokens) max_tokens = opt_int(j, "max_tokens", 1, kMaxInt);
  if (max_tokens) r.max_tokens = static_cast<size_t>(*max_tokens);
  parse_sampling(j, r);
  parse_stop(j, r);
  parse_logprobs(j, r);
  r.ignore_eos = opt_bool(j, "ignore_eos").value_or(false);
  r.stream = opt_bool(j, "stream").value_or(false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad_type("stream_options", "an object");
    r.include_usage = opt_bool(*so, "include_usage").value_or(false);
  }
  return r;
}

namespace {

std::vector<int32_t> encode_text(const text::Tokenizer& tok, const std::string& text) {
  // Special tokens in the text are parsed, as `ferry run` does, so a raw
  // prompt can spell out a template by hand.
  std::vector<int32_t> ids = tok.encode(text, /*parse_special=*/true);
  if (tok.add_bos() && tok.bos() >= 0 && (ids.empty() || ids.front() != tok.bos()))
    ids.insert(ids.begin(), tok.bos());
  return ids;
}

std::string render_chat(const ApiRequest& r, const ServedModel& m) {
  if (!m.chat)
    throw invalid_request("model '" + m.id +
                              "' has no chat template: use /v1/completions, or start the "
                              "server with --chat-template FILE",
                          "messages", "no_chat_template");
  const text::Tokenizer& tok = *m.tokenizer;
  auto token_text = [&](int32_t id) { return id >= 0 ? tok.token_bytes(id) : std::string(); };
  text::ChatRenderInputs in;
  in.messages = r.messages;
  in.add_generation_prompt = true;
  in.bos_token = token_text(tok.bos());
  in.eos_token = token_text(tok.eos());
  try {
    return m.chat->render(in);
  } catch (const Error& e) {
    // Templates reject conversations they cannot render (roles that do not
    // alternate, a system message where none is allowed, ...).
    throw invalid_request(std::string("the chat template rejected the messages: ") + e.what(),
                          "messages", "invalid_value");
  }
}

}  // namespace

std::vector<std::vector<int32_t>> encode_prompts(const ApiRequest& r, const ServedModel& m) {
  std::vector<std::vector<int32_t>> out;
  if (r.endpoint == Endpoint::Chat) {
    out.push_back(encode_text(*m.tokenizer, render_chat(r, m)));
    return out;
  }
  const int32_t vocab = m.tokenizer->vocab_size();
  for (const PromptInput& p : r.prompts) {
    if (!p.is_tokens) {
      out.push_back(encode_text(*m.tokenizer, p.text));
      continue;
    }
    for (int32_t id : p.tokens)
      if (id >= vocab)
        throw invalid_request("token id " + std::to_string(id) +
                                  " in 'prompt' is outside the "
                                  "vocabulary of " +
                                  std::to_string(vocab) + " tokens",
                              "prompt", "invalid_value");
    out.push_back(p.tokens);
  }
  return out;
}

Plan plan_request(const ApiRequest& r, const ServedModel& m) {
  const char* param = r.endpoint == Endpoint::Chat ? "messages" : "prompt";
  Plan plan;
  for (const std::vector<int32_t>& prompt : encode_prompts(r, m)) {
    if (prompt.empty()) bad_value(param, "must not be empty");
    if (prompt.size() >= m.context_length)
      throw invalid_request("this model's maximum context length is " +
                                std::to_string(m.context_length) + " tokens, but the prompt has " +
                                std::to_string(prompt.size()) +
                                " tokens (at least one token must be left to generate)",
                            param, "context_length_exceeded");
    const size_t room = m.context_length - prompt.size();
    plan.prompt_tokens += prompt.size();
    for (size_t j = 0; j < r.n; ++j) {
      engine::GenerationRequest g = m.defaults;
      g.prompt = prompt;
      const size_t fallback = m.default_max_tokens ? m.default_max_tokens : room;
      g.max_tokens = std::min(r.max_tokens.value_or(fallback), room);
      g.sampling = r.sampling;
      if (r.sampling.seed) g.sampling.seed = *r.sampling.seed + j;
      g.stop = r.stop;
      g.ignore_eos = r.ignore_eos;
      g.logprobs = r.logprobs;
      plan.choices.push_back(std::move(g));
    }
  }
  return plan;
}

}  // namespace ferry::server
