// Chat templates: a model's tokenizer.chat_template (Jinja) rendered the way
// Hugging Face transformers' apply_chat_template(messages, tokenize=False,
// add_generation_prompt=...) renders it, so that ferry's prompts are
// byte-identical to the reference's.
//
// The template sees the same variables transformers passes: messages (a
// list of {"role", "content"} dicts), tools and documents (None unless
// given), add_generation_prompt, bos_token and eos_token, plus the globals
// raise_exception, strftime_now, namespace and dict.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/jinja.h"

namespace ferry::text {

struct ChatMessage {
  std::string role;
  std::string content;
};

// Everything a render can pass, for callers beyond plain role/content chats.
struct ChatRenderInputs {
  // Array of message objects; members that are null are dropped, as
  // apply_chat_template does.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;      // null renders as None
  nlohmann::ordered_json documents = nullptr;  // null renders as None
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // More template variables (e.g. date_string); an object.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Parses now; throws ferry::Error("[chat_template] line:col: ...") naming
  // the syntax error or unsupported construct. `clock` supplies the local
  // time for strftime_now() (default: the system clock); tests fix it.
  explicit ChatTemplate(std::string source, jinja::Clock clock = {});

  // Throws ferry::Error("[chat_template] ...") on render errors and
  // jinja::TemplateException (a ferry::Error) when the template calls
  // raise_exception(msg), e.g. for roles that do not alternate.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token, const std::string& eos_token) const;
  std::string render(const ChatRenderInputs& inputs) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
  jinja::Clock clock_;
};

}  // namespace ferry::text
