// Request parsing and planning (server/openai_api.h) without HTTP: every
// field, every error with its status, type, param and code.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "server/generation.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace ferry::server {
namespace {

using json = nlohmann::json;

ApiRequest chat(const std::string& extra = "") {
  return parse_request(Endpoint::Chat,
                       R"({"messages":[{"role":"user","content":"hi"}])" + extra + "}");
}

ApiRequest completion(const std::string& extra = "") {
  return parse_request(Endpoint::Completions, R"({"prompt":"hello")" + extra + "}");
}

TEST(ParseRequest, DefaultsWhenOnlyTheInputIsGiven) {
  ApiRequest r = chat();
  EXPECT_EQ(r.endpoint, Endpoint::Chat);
  EXPECT_EQ(r.messages, nlohmann::ordered_json::parse(R"([{"role":"user","content":"hi"}])"));
  EXPECT_EQ(r.n, 1u);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_EQ(r.sampling.temperature, 1.0f);  // OpenAI's default
  EXPECT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FALSE(r.sampling.seed);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream || r.include_usage || r.logprobs || r.ignore_eos);
  EXPECT_EQ(r.top_logprobs, 0u);
}

TEST(ParseRequest, EveryField) {
  ApiRequest r = chat(R"(, "model": "m", "n": 3, "max_tokens": 17, "temperature": 0.5,
      "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
      "frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": 42, "stop": ["a", "bc"],
      "logprobs": true, "top_logprobs": 5, "stream": true,
      "stream_options": {"include_usage": true}, "ignore_eos": true)");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.n, 3u);
  EXPECT_EQ(r.max_tokens, 17u);
  EXPECT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 5u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignore_eos);
}

TEST(ParseRequest, FieldVariants) {
  EXPECT_EQ(chat(R"(, "max_tokens": 5, "max_completion_tokens": 9)").max_tokens, 9u);
  EXPECT_EQ(chat(R"(, "max_completion_tokens": 9)").max_tokens, 9u);
  EXPECT_EQ(chat(R"(, "max_tokens": 5.0)").max_tokens, 5u);  // integral float
  EXPECT_EQ(chat(R"(, "top_k": -1)").sampling.top_k, 0);     // vLLM's "off"
  EXPECT_EQ(chat(R"(, "seed": -1)").sampling.seed, ~uint64_t{0});
  EXPECT_EQ(chat(R"(, "stop": "x")").stop, std::vector<std::string>{"x"});
  EXPECT_EQ(chat(R"(, "stop": ["", "y"])").stop, std::vector<std::string>{"y"});
  EXPECT_EQ(chat(R"(, "temperature": 0)").sampling.temperature, 0.0f);
  // null means absent; unknown fields are ignored.
  ApiRequest r = chat(R"(, "temperature": null, "stop": null, "tools": [1], "x": {"y": 1})");
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_TRUE(r.stop.empty());
  // Completions: logprobs is the number of alternatives.
  ApiRequest c = completion(R"(, "logprobs": 3)");
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 3u);
  c = completion(R"(, "logprobs": 0)");
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 0u);
  EXPECT_FALSE(completion(R"(, "logprobs": null)").logprobs);
  // Chat logprobs without alternatives.
  r = chat(R"(, "logprobs": true)");
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0u);
}

TEST(ParseRequest, MessageContentForms) {
  ApiRequest r = parse_request(Endpoint::Chat, R"({"messages":[
      {"role":"system","content":"s"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null},
      {"role":"user","content":"q","name":"ignored"}]})");
  EXPECT_EQ(r.messages, nlohmann::ordered_json::parse(R"([{"role":"system","content":"s"},
      {"role":"user","content":"ab"},{"role":"assistant","content":""},
      {"role":"user","content":"q"}])"));
}

TEST(ParseRequest, PromptForms) {
  ApiRequest r = completion();
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "hello");
  EXPECT_FALSE(r.prompts[0].is_tokens);
  r = parse_request(Endpoint::Completions, R"({"prompt":["a","b","c"],"n":2})");
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[2].text, "c");
  r = parse_request(Endpoint::Completions, R"({"prompt":[1,2,3]})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.prompts[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  r = parse_request(Endpoint::Completions, R"({"prompt":[[1],[2,3]]})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].tokens, (std::vector<int32_t>{2, 3}));
}

struct BadCase {
  Endpoint endpoint;
  std::string body;
  const char* param;  // "" : null
  const char* code;
};

TEST(ParseRequest, EveryErrorIs400WithTheFieldNamed) {
  const Endpoint C = Endpoint::Chat, P = Endpoint::Completions;
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  const std::vector<BadCase> cases = {
      {C, "", "", "invalid_json"},
      {C, "{", "", "invalid_json"},
      {C, "{\"messages\": [}", "", "invalid_json"},
      {C, "[1, 2]", "", "invalid_json"},
      {C, "\"text\"", "", "invalid_json"},
      {C, "{}", "messages", "missing_required_parameter"},
      {C, R"({"messages": "hi"})", "messages", "invalid_type"},
      {C, R"({"messages": []})", "messages", "invalid_value"},
      {C, R"({"messages": [1]})", "messages[0]", "invalid_type"},
      {C, R"({"messages": [{"content": "x"}]})", "messages[0].role", "invalid_type"},
      {C, R"({"messages": [{"role": 1, "content": "x"}]})", "messages[0].role", "invalid_type"},
      {C, R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "invalid_type"},
      {C, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content", "invalid_value"},
      {P, "{}", "prompt", "missing_required_parameter"},
      {P, R"({"prompt": 5})", "prompt", "invalid_type"},
      {P, R"({"prompt": []})", "prompt", "invalid_value"},
      {P, R"({"prompt": [{"a": 1}]})", "prompt", "invalid_type"},
      {P, R"({"prompt": [1, -2]})", "prompt", "invalid_type"},
      {P, R"({"prompt": [1, "a"]})", "prompt", "invalid_type"},
      {P, R"({"prompt": "a", "model": 3})", "model", "invalid_type"},
      {C, "{" + msgs + R"(, "temperature": "hot"})", "temperature", "invalid_type"},
      {C, "{" + msgs + R"(, "temperature": 2.5})", "temperature", "invalid_value"},
      {C, "{" + msgs + R"(, "temperature": true})", "temperature", "invalid_type"},
      {C, "{" + msgs + R"(, "top_p": 0})", "top_p", "invalid_value"},
      {C, "{" + msgs + R"(, "top_p": 1.5})", "top_p", "invalid_value"},
      {C, "{" + msgs + R"(, "top_k": 1.5})", "top_k", "invalid_type"},
      {C, "{" + msgs + R"(, "top_k": -2})", "top_k", "invalid_value"},
      {C, "{" + msgs + R"(, "min_p": -0.1})", "min_p", "invalid_value"},
      {C, "{" + msgs + R"(, "presence_penalty": 3})", "presence_penalty", "invalid_value"},
      {C, "{" + msgs + R"(, "frequency_penalty": -3})", "frequency_penalty", "invalid_value"},
      {C, "{" + msgs + R"(, "repetition_penalty": 0})", "repetition_penalty", "invalid_value"},
      {C, "{" + msgs + R"(, "seed": 1.5})", "seed", "invalid_type"},
      {C, "{" + msgs + R"(, "seed": "7"})", "seed", "invalid_type"},
      {C, "{" + msgs + R"(, "n": 0})", "n", "invalid_value"},
      {C, "{" + msgs + R"(, "n": 129})", "n", "invalid_value"},
      {P, R"({"prompt": ["a", "b"], "n": 100})", "n", "invalid_value"},
      {C, "{" + msgs + R"(, "max_tokens": 0})", "max_tokens", "invalid_value"},
      {C, "{" + msgs + R"(, "max_tokens": "many"})", "max_tokens", "invalid_type"},
      {C, "{" + msgs + R"(, "max_completion_tokens": -1})", "max_completion_tokens",
       "invalid_value"},
      {C, "{" + msgs + R"(, "max_tokens": 1e300})", "max_tokens", "invalid_type"},
      {C, "{" + msgs + R"(, "stop": 5})", "stop", "invalid_type"},
      {C, "{" + msgs + R"(, "stop": ["a", 1]})", "stop", "invalid_type"},
      {C, "{" + msgs + R"(, "stop": ["1","2","3","4","5","6","7","8","9","10","11","12",
           "13","14","15","16","17"]})",
       "stop", "invalid_value"},
      {C, "{" + msgs + R"(, "logprobs": 1})", "logprobs", "invalid_type"},
      {C, "{" + msgs + R"(, "top_logprobs": 2})", "top_logprobs", "invalid_value"},
      {C, "{" + msgs + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs",
       "invalid_value"},
      {P, R"({"prompt": "a", "logprobs": 21})", "logprobs", "invalid_value"},
      {P, R"({"prompt": "a", "logprobs": true})", "logprobs", "invalid_type"},
      {C, "{" + msgs + R"(, "stream": "yes"})", "stream", "invalid_type"},
      {C, "{" + msgs + R"(, "stream_options": 1})", "stream_options", "invalid_type"},
      {C, "{" + msgs + R"(, "stream_options": {"include_usage": 1}})", "include_usage",
       "invalid_type"},
      {C, "{" + msgs + R"(, "ignore_eos": "no"})", "ignore_eos", "invalid_type"},
  };
  for (const BadCase& c : cases) {
    try {
      parse_request(c.endpoint, c.body);
      ADD_FAILURE() << "accepted: " << c.body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << c.body;
      EXPECT_EQ(e.type, "invalid_request_error") << c.body;
      EXPECT_EQ(e.param, c.param) << c.body;
      EXPECT_EQ(e.code, c.code) << c.body;
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
}

TEST(ParseRequest, DeepNestingIsAnErrorNotACrash) {
  std::string deep(200000, '[');
  EXPECT_THROW(parse_request(Endpoint::Chat, deep), ApiError);
  deep += std::string(200000, ']');
  EXPECT_THROW(parse_request(Endpoint::Chat, deep), ApiError);
  std::string obj = R"({"messages":[{"role":"user","content":"x"}],"junk":)" +
                    std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_NO_THROW(parse_request(Endpoint::Chat, obj));
}

TEST(ErrorBody, HasOpenAIsShapeAndOrder) {
  EXPECT_EQ(error_body(invalid_request("bad 'n'", "n", "invalid_value")),
            R"({"error":{"message":"bad 'n'","type":"invalid_request_error","param":"n",)"
            R"("code":"invalid_value"}})");
  EXPECT_EQ(error_body(ApiError(500, "server_error", "boom")),
            R"({"error":{"message":"boom","type":"server_error","param":null,"code":null}})");
}

TEST(ApiErrorFrom, MapsSchedulerErrors) {
  ApiError e = api_error_from(Error("[admission] the server is shutting down"));
  EXPECT_EQ(e.status, 503);
  EXPECT_EQ(e.type, "server_error");
  e = api_error_from(Error("[admission] a request of 9 tokens needs 10 bytes of KV cache"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "kv_budget_exceeded");
  e = api_error_from(Error("[generate] prompt of 300 tokens does not fit the context"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(api_error_from(Error("[sampling] top_p=0 must be in (0, 1]")).status, 400);
  e = api_error_from(Error("[model] something broke"));
  EXPECT_EQ(e.status, 500);
  EXPECT_EQ(e.type, "server_error");
}

// Planning needs a tokenizer: the tiny test model's (byte-level BPE, no
// BOS added).
class PlanTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ =
        model::load_model(std::string(FERRY_TEST_DATA) + "/models/tiny-llama-f32.gguf").release();
    tok_ = text::Tokenizer::from_gguf(model_->file()).release();
    chat_ = new text::ChatTemplate(
        "{% for m in messages %}{% if m.role == 'tool' %}"
        "{{ raise_exception('no tools here') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
  }
  static void TearDownTestSuite() {
    delete chat_;
    delete tok_;
    delete model_;
  }
  ServedModel served(bool with_chat = true) const {
    ServedModel m;
    m.id = "tiny";
    m.tokenizer = tok_;
    m.chat = with_chat ? chat_ : nullptr;
    m.context_length = 64;
    m.defaults.prefill_chunk = 7;
    return m;
  }
  static model::Model* model_;
  static text::Tokenizer* tok_;
  static text::ChatTemplate* chat_;
};
model::Model* PlanTest::model_ = nullptr;
text::Tokenizer* PlanTest::tok_ = nullptr;
text::ChatTemplate* PlanTest::chat_ = nullptr;

ApiError plan_error(const ApiRequest& r, const ServedModel& m) {
  try {
    plan_request(r, m);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "planned without error";
  return ApiError(0, "", "");
}

TEST_F(PlanTest, ChatRendersTheTemplateAndTokenizes) {
  Plan p = plan_request(chat(R"(, "max_tokens": 5, "temperature": 0)"), served());
  ASSERT_EQ(p.choices.size(), 1u);
  const std::vector<int32_t> want =
      tok_->encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", true);
  EXPECT_EQ(p.choices[0].prompt, want);
  EXPECT_EQ(p.prompt_tokens, want.size());
  EXPECT_EQ(p.choices[0].max_tokens, 5u);
  EXPECT_EQ(p.choices[0].sampling.temperature, 0.0f);
  EXPECT_EQ(p.choices[0].prefill_chunk, 7u);  // from the served defaults
}

TEST_F(PlanTest, CompletionsPromptsTimesNInIndexOrderWithSeedsPerChoice) {
  ApiRequest r = parse_request(Endpoint::Completions,
                               R"({"prompt": ["ab", [5, 6, 7]], "n": 3, "seed": 10,
                                   "stop": ["z"], "ignore_eos": true})");
  Plan p = plan_request(r, served());
  ASSERT_EQ(p.choices.size(), 6u);
  const std::vector<int32_t> ab = tok_->encode("ab", true);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(p.choices[i].prompt, i < 3 ? ab : std::vector<int32_t>({5, 6, 7})) << i;
    EXPECT_EQ(p.choices[i].sampling.seed, 10 + i % 3) << i;
    EXPECT_EQ(p.choices[i].stop, std::vector<std::string>{"z"});
    EXPECT_TRUE(p.choices[i].ignore_eos);
  }
  EXPECT_EQ(p.prompt_tokens, ab.size() + 3);  // each prompt once, not per choice
}

TEST_F(PlanTest, MaxTokensDefaultsToAndIsClampedByTheContext) {
  ApiRequest r = parse_request(Endpoint::Completions, R"({"prompt": [1, 2, 3, 4]})");
  EXPECT_EQ(plan_request(r, served()).choices[0].max_tokens, 60u);
  r.max_tokens = 1000;
  EXPECT_EQ(plan_request(r, served()).choices[0].max_tokens, 60u);
  r.max_tokens = 9;
  EXPECT_EQ(plan_request(r, served()).choices[0].max_tokens, 9u);
  // --default-max-tokens applies only where the request names none.
  ServedModel m = served();
  m.default_max_tokens = 20;
  EXPECT_EQ(plan_request(r, m).choices[0].max_tokens, 9u);
  r.max_tokens.reset();
  EXPECT_EQ(plan_request(r, m).choices[0].max_tokens, 20u);
  m.default_max_tokens = 100;
  EXPECT_EQ(plan_request(r, m).choices[0].max_tokens, 60u);
}

TEST_F(PlanTest, PromptLongerThanTheContextIs400) {
  json ids = json::array();
  for (int i = 0; i < 64; ++i) ids.push_back(i);
  ApiRequest r = parse_request(Endpoint::Completions, json{{"prompt", ids}}.dump());
  ApiError e = plan_error(r, served());
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  ids.erase(ids.size() - 1);  // 63 tokens leave one to generate
  r = parse_request(Endpoint::Completions, json{{"prompt", ids}}.dump());
  EXPECT_EQ(plan_request(r, served()).choices[0].max_tokens, 1u);
  // A chat conversation too long for the context.
  r = chat();
  r.messages[0]["content"] = std::string(400, 'x');
  e = plan_error(r, served());
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "messages");
}

TEST_F(PlanTest, BadPromptsAndChatsAre400) {
  ApiError e = plan_error(chat(), served(/*with_chat=*/false));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "no_chat_template");
  EXPECT_NE(std::string(e.what()).find("/v1/completions"), std::string::npos);
  e = plan_error(parse_request(Endpoint::Chat, R"({"messages":[{"role":"tool","content":"x"}]})"),
                 served());
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(std::string(e.what()).find("no tools here"), std::string::npos) << e.what();
  e = plan_error(parse_request(Endpoint::Completions, R"({"prompt": [1, 300]})"), served());
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(std::string(e.what()).find("300"), std::string::npos);
  e = plan_error(parse_request(Endpoint::Completions, R"({"prompt": ""})"), served());
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.code, "invalid_value");
}

}  // namespace
}  // namespace ferry::server
