// ChatTemplate against transformers' apply_chat_template: every fixture
// template (tests/data/chat_templates/*.jinja) x every conversation, with
// goldens made by tools/goldens/chat_template_goldens.py.
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"

namespace ferry::text {
namespace {

using Json = nlohmann::ordered_json;

std::string data_path(const std::string& name) {
  return std::string(FERRY_TEST_DATA) + "/chat_templates/" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Json& goldens() {
  static const Json j = Json::parse(read_file(data_path("goldens.json")));
  return j;
}

const Json& conversation(const std::string& id) {
  static const Json all = Json::parse(read_file(data_path("conversations.json")));
  for (const Json& c : all["conversations"]) {
    if (c["id"] == id) return c;
  }
  throw std::runtime_error("no conversation " + id);
}

// The goldens pin strftime_now() to this local time (2024-09-07 12:34:56).
std::tm fixed_now() {
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 8;
  t.tm_mday = 7;
  t.tm_hour = 12;
  t.tm_min = 34;
  t.tm_sec = 56;
  std::tm copy = t;
  timegm(&copy);  // fills in tm_wday / tm_yday
  t.tm_wday = copy.tm_wday;
  t.tm_yday = copy.tm_yday;
  return t;
}

// Plain role/content conversations go through the main API.
bool is_simple(const Json& conv) {
  if (conv.contains("tools") || conv.contains("extra")) return false;
  for (const Json& m : conv["messages"]) {
    if (m.size() != 2 || !m.contains("role") || !m.contains("content")) return false;
  }
  return true;
}

std::string token(const Json& v) {
  return v.is_null() ? "" : v.get<std::string>();
}

std::string render_case(const Json& c) {
  ChatTemplate tmpl(read_file(data_path(c["template"])), fixed_now);
  const Json& conv = conversation(c["conversation"]);
  bool agp = c["add_generation_prompt"];
  if (is_simple(conv)) {
    std::vector<ChatMessage> messages;
    for (const Json& m : conv["messages"]) messages.push_back({m["role"], m["content"]});
    return tmpl.render(messages, agp, token(c["bos_token"]), token(c["eos_token"]));
  }
  ChatRenderInputs in;
  in.messages = conv["messages"];
  if (conv.contains("tools")) in.tools = conv["tools"];
  if (conv.contains("extra")) in.extra = conv["extra"];
  in.add_generation_prompt = agp;
  in.bos_token = token(c["bos_token"]);
  in.eos_token = token(c["eos_token"]);
  return tmpl.render(in);
}

class ChatTemplateGolden : public ::testing::TestWithParam<std::size_t> {};

TEST_P(ChatTemplateGolden, MatchesTransformers) {
  const Json& c = goldens()["cases"][GetParam()];
  SCOPED_TRACE(c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>());
  if (c.contains("error")) {
    try {
      render_case(c);
      FAIL() << "expected the template to raise: " << c["error"];
    } catch (const jinja::TemplateException& e) {
      EXPECT_EQ(e.message(), c["error"].get<std::string>());
      EXPECT_EQ(std::string(e.what()), "[chat_template] " + c["error"].get<std::string>());
    }
    return;
  }
  EXPECT_EQ(render_case(c), c["expected"].get<std::string>());
}

std::string case_name(const ::testing::TestParamInfo<std::size_t>& info) {
  const Json& c = goldens()["cases"][info.param];
  std::string name = c["template"].get<std::string>() + "_" + c["conversation"].get<std::string>() +
                     (c["add_generation_prompt"].get<bool>() ? "" : "_nogen");
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

std::vector<std::size_t> case_indices() {
  std::vector<std::size_t> idx(goldens()["cases"].size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  return idx;
}

INSTANTIATE_TEST_SUITE_P(ChatTemplate, ChatTemplateGolden, ::testing::ValuesIn(case_indices()),
                         case_name);

TEST(ChatTemplateTest, GoldensCoverEveryFixtureAndConversation) {
  std::set<std::string> templates, conversations;
  std::size_t errors = 0;
  for (const Json& c : goldens()["cases"]) {
    templates.insert(c["template"]);
    conversations.insert(c["conversation"]);
    errors += c.contains("error");
  }
  EXPECT_EQ(templates.size(), 9u);
  EXPECT_GE(conversations.size(), 15u);
  EXPECT_GT(errors, 0u);
}

TEST(ChatTemplateTest, ApiAndJsonPathsAgree) {
  ChatTemplate tmpl(read_file(data_path("qwen2.5-7b-instruct.jinja")));
  std::vector<ChatMessage> msgs = {{"system", "S"}, {"user", "U"}};
  ChatRenderInputs in;
  in.messages =
      Json::array({{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}});
  in.eos_token = "<|im_end|>";
  EXPECT_EQ(tmpl.render(msgs, true, "", "<|im_end|>"), tmpl.render(in));
  EXPECT_EQ(
      tmpl.render(msgs, true, "", ""),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, NullMessageFieldsAreDropped) {
  // apply_chat_template drops None-valued keys: `tool_calls: null` is absent.
  ChatTemplate tmpl("{% for m in messages %}{{ 'tool_calls' in m }}{% endfor %}");
  ChatRenderInputs in;
  in.messages = Json::array({{{"role", "assistant"}, {"content", "x"}, {"tool_calls", nullptr}}});
  EXPECT_EQ(tmpl.render(in), "False");
}

TEST(ChatTemplateTest, InvalidInputsAreRejected) {
  ChatTemplate tmpl("{{ messages[0].content }}");
  try {
    tmpl.render({{"user", "bad \xff byte"}}, false, "", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[chat_template] JSON string is not valid UTF-8");
  }
  ChatRenderInputs in;
  in.messages = Json::object();
  EXPECT_THROW(tmpl.render(in), Error);
}

TEST(ChatTemplateTest, ParseErrorsNameTheConstructAndPosition) {
  auto message = [](const std::string& src) {
    try {
      ChatTemplate t(src);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("Hi\n{% include 'x.jinja' %}"),
            "[chat_template] 2:4: unsupported statement 'include'");
  EXPECT_EQ(message("{{ x | wordwrap(5) }}"), "[chat_template] 1:8: unsupported filter 'wordwrap'");
  EXPECT_EQ(message("{% if x is prime %}{% endif %}"),
            "[chat_template] 1:12: unsupported test 'prime'");
  EXPECT_EQ(message("{% for x in y %}"),
            "[chat_template] 1:17: unexpected end of template, expected 'endfor' or 'else'");
  EXPECT_EQ(message("{{ 1 + }}"), "[chat_template] 1:8: unexpected '}}'");
}

TEST(ChatTemplateTest, RenderErrorsCarryPosition) {
  ChatTemplate t("{% for m in messages %}\n  {{ m.content.nope() }}\n{% endfor %}");
  try {
    t.render({{"user", "hi"}}, false, "", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[chat_template] 2:20: 'str object' has no attribute 'nope'");
  }
}

TEST(ChatTemplateTest, RaiseExceptionMessage) {
  ChatTemplate t("{{ raise_exception('Roles must alternate: ' ~ messages|length) }}");
  try {
    t.render({{"user", "a"}}, true, "", "");
    FAIL();
  } catch (const jinja::TemplateException& e) {
    EXPECT_EQ(e.message(), "Roles must alternate: 1");
    EXPECT_EQ(std::string(e.what()), "[chat_template] Roles must alternate: 1");
  }
}

TEST(ChatTemplateTest, ClockIsInjectable) {
  ChatTemplate fixed("{{ strftime_now('%d %b %Y %H:%M:%S %A') }}", fixed_now);
  EXPECT_EQ(fixed.render({}, false, "", ""), "07 Sep 2024 12:34:56 Saturday");
  ChatTemplate system_clock("{{ strftime_now('%Y') | length }}");
  EXPECT_EQ(system_clock.render({}, false, "", ""), "4");
}

TEST(ChatTemplateTest, Llama32DateDefaultsToToday) {
  ChatTemplate t(read_file(data_path("llama-3.2-3b-instruct.jinja")), fixed_now);
  std::string out = t.render({{"user", "hi"}}, true, "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_NE(out.find("Today Date: 07 Sep 2024\n"), std::string::npos) << out;
  ChatRenderInputs in;
  in.messages = Json::array({{{"role", "user"}, {"content", "hi"}}});
  in.extra = {{"date_string", "31 Dec 2023"}};
  EXPECT_NE(t.render(in).find("Today Date: 31 Dec 2023\n"), std::string::npos);
}

TEST(ChatTemplateTest, SmolLM2GgufTemplateIsTheFixture) {
  const char* cache = std::getenv("FERRY_CACHE");
  const char* home = std::getenv("HOME");
  std::string dir = cache ? std::string(cache) : std::string(home ? home : "") + "/.cache/ferry";
  std::string path = dir + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not fetched: " << path;
  auto file = gguf::File::open(path);
  std::string source = file->get_string("tokenizer.chat_template");
  EXPECT_EQ(source, read_file(data_path("smollm2-135m-instruct.jinja")));
  ChatTemplate t(source);
  EXPECT_EQ(t.render({{"user", "Hi"}}, true, "<|im_start|>", "<|im_end|>"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace ferry::text
