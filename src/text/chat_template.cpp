#include "text/chat_template.h"

#include <memory>
#include <utility>

#include "core/error.h"

namespace ferry::text {
namespace {

constexpr const char* kOp = "chat_template";

jinja::Value json_or_none(const nlohmann::ordered_json& j) {
  return j.is_null() ? jinja::Value::none() : jinja::from_json(j);
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, jinja::Clock clock)
    : source_(std::move(source)),
      template_(source_, jinja::LexOptions{}, kOp),
      clock_(std::move(clock)) {}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token) const {
  ChatRenderInputs in;
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json msg = nlohmann::ordered_json::object();
    msg["role"] = m.role;
    msg["content"] = m.content;
    in.messages.push_back(std::move(msg));
  }
  in.add_generation_prompt = add_generation_prompt;
  in.bos_token = bos_token;
  in.eos_token = eos_token;
  return render(in);
}

namespace {

// The template's variables, as apply_chat_template passes them.
jinja::Value make_context(const ChatRenderInputs& in) {
  if (!in.messages.is_array()) fail(kOp, "messages must be a JSON array");
  if (!in.extra.is_object()) fail(kOp, "extra variables must be a JSON object");
  std::vector<jinja::Value> messages;
  for (const auto& m : in.messages) {
    if (!m.is_object()) fail(kOp, "each message must be a JSON object");
    nlohmann::ordered_json kept = nlohmann::ordered_json::object();
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (!it.value().is_null()) kept[it.key()] = it.value();
    }
    messages.push_back(jinja::from_json(kept));
  }
  auto ctx = std::make_shared<jinja::DictData>();
  ctx->set("messages", jinja::Value::list(std::move(messages)));
  ctx->set("tools", json_or_none(in.tools));
  ctx->set("documents", json_or_none(in.documents));
  ctx->set("add_generation_prompt", jinja::Value(in.add_generation_prompt));
  ctx->set("bos_token", jinja::Value(in.bos_token));
  ctx->set("eos_token", jinja::Value(in.eos_token));
  for (auto it = in.extra.begin(); it != in.extra.end(); ++it) {
    ctx->set(it.key(), jinja::from_json(it.value()));
  }
  return jinja::Value::dict(std::move(ctx));
}

}  // namespace

std::string ChatTemplate::render(const ChatRenderInputs& in) const {
  jinja::Value ctx;
  try {
    ctx = make_context(in);
  } catch (const Error& e) {
    // from_json reports as "[jinja] ..."; keep one prefix for this API.
    std::string msg = e.what();
    if (msg.rfind("[jinja] ", 0) == 0) msg = msg.substr(8);
    if (msg.rfind("[chat_template] ", 0) == 0) throw;
    fail(kOp, msg);
  }
  jinja::RenderOptions options;
  options.clock = clock_;
  return template_.render(ctx, options);
}

}  // namespace ferry::text
