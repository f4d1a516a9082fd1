// Response building (server/openai_response.h), the metrics text and the
// chat page, without HTTP: exact JSON shapes and SSE framing.
#include "server/openai_response.h"

#include <gtest/gtest.h>

#include <set>

#include "model/model.h"
#include "server/chat_page.h"
#include "server/prometheus.h"
#include "text/tokenizer.h"

namespace ferry::server {
namespace {

using engine::FinishReason;
using engine::StreamEvent;
using json = nlohmann::json;

StreamEvent token(int32_t id, const std::string& text, float lp = -0.5f,
                  std::vector<engine::TopLogprob> top = {}) {
  StreamEvent e;
  e.kind = StreamEvent::Kind::Token;
  e.token = id;
  e.text = text;
  e.logprob = lp;
  e.top_logprobs = std::move(top);
  return e;
}

StreamEvent finished(FinishReason r, size_t completion_tokens) {
  StreamEvent e;
  e.kind = StreamEvent::Kind::Finished;
  e.finish = r;
  e.completion_tokens = completion_tokens;
  return e;
}

StreamEvent failed(const std::string& msg) {
  StreamEvent e;
  e.kind = StreamEvent::Kind::Error;
  e.error = msg;
  return e;
}

// Splits SSE text into its events' data, checking the framing.
std::vector<std::string> sse_data(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event: " << text.substr(pos);
    if (end == std::string::npos) break;
    const std::string ev = text.substr(pos, end - pos);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    EXPECT_EQ(ev.find('\n'), std::string::npos) << "one line per event: " << ev;
    out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

class ResponseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ =
        model::load_model(std::string(FERRY_TEST_DATA) + "/models/tiny-llama-f32.gguf").release();
    tok_ = text::Tokenizer::from_gguf(model_->file()).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete model_;
  }
  static ApiRequest request(Endpoint ep, const std::string& extra = "") {
    const std::string input =
        ep == Endpoint::Chat ? R"("messages":[{"role":"user","content":"x"}])" : R"("prompt":"x")";
    return parse_request(ep, "{" + input + extra + "}");
  }
  static ResponseInfo info(Endpoint ep) {
    return {ep == Endpoint::Chat ? "chatcmpl-1" : "cmpl-1", 1700000000, "tiny"};
  }
  // A token id whose bytes are the given text.
  static int32_t id_of(const std::string& s) {
    std::vector<int32_t> ids = tok_->encode(s, false);
    EXPECT_EQ(ids.size(), 1u) << s;
    return ids.empty() ? 0 : ids[0];
  }
  static model::Model* model_;
  static text::Tokenizer* tok_;
};
model::Model* ResponseTest::model_ = nullptr;
text::Tokenizer* ResponseTest::tok_ = nullptr;

TEST_F(ResponseTest, ChatCompletionBody) {
  ApiRequest r = request(Endpoint::Chat, R"(, "n": 2)");
  CompletionCollector c(r, info(Endpoint::Chat), 2, 11, *tok_);
  c.add(1, token(id_of("a"), "a"));
  c.add(0, token(id_of("b"), "b"));
  c.add(0, token(-1, "c"));  // held-back text released at the end: no token
  EXPECT_FALSE(c.done());
  c.add(0, finished(FinishReason::Stop, 3));
  c.add(1, finished(FinishReason::Length, 1));
  c.add(1, token(id_of("z"), "z"));  // after the end: ignored
  c.add(7, token(id_of("z"), "z"));  // no such choice: ignored
  EXPECT_TRUE(c.done());
  EXPECT_FALSE(c.error());
  EXPECT_EQ(dump_json(c.body()),
            R"({"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"tiny",)"
            R"("choices":[{"index":0,"message":{"role":"assistant","content":"bc"},)"
            R"("logprobs":null,"finish_reason":"stop"},)"
            R"({"index":1,"message":{"role":"assistant","content":"a"},)"
            R"("logprobs":null,"finish_reason":"length"}],)"
            R"("usage":{"prompt_tokens":11,"completion_tokens":4,"total_tokens":15}})");
}

TEST_F(ResponseTest, CompletionBodyWithLogprobs) {
  ApiRequest r = request(Endpoint::Completions, R"(, "logprobs": 2)");
  CompletionCollector c(r, info(Endpoint::Completions), 1, 2, *tok_);
  const int32_t a = id_of("a"), b = id_of("b");
  c.add(0, token(a, "a", -0.25f, {{a, -0.25f}, {b, -2.0f}}));
  c.add(0, token(b, "", -1.5f, {{a, -0.5f}, {b, -1.5f}}));  // text held back
  c.add(0, token(-1, "b"));
  c.add(0, finished(FinishReason::Stop, 2));
  EXPECT_EQ(dump_json(c.body()),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"tiny",)"
            R"("choices":[{"text":"ab","index":0,"logprobs":{"tokens":["a","b"],)"
            R"("token_logprobs":[-0.25,-1.5],"top_logprobs":[{"a":-0.25,"b":-2.0},)"
            R"({"a":-0.5,"b":-1.5}],"text_offset":[0,1]},"finish_reason":"stop"}],)"
            R"("usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}})");
  // logprobs 0: the chosen tokens only.
  r = request(Endpoint::Completions, R"(, "logprobs": 0)");
  CompletionCollector z(r, info(Endpoint::Completions), 1, 2, *tok_);
  z.add(0, token(a, "a", -0.25f));
  z.add(0, finished(FinishReason::Length, 1));
  EXPECT_EQ(z.body()["choices"][0]["logprobs"],
            ojson::parse(R"({"tokens":["a"],"token_logprobs":[-0.25],"top_logprobs":null,)"
                         R"("text_offset":[0]})"));
}

TEST_F(ResponseTest, ChatLogprobsEntries) {
  ApiRequest r = request(Endpoint::Chat, R"(, "logprobs": true, "top_logprobs": 1)");
  CompletionCollector c(r, info(Endpoint::Chat), 1, 2, *tok_);
  const int32_t a = id_of("a");
  c.add(0, token(a, "a", -0.25f, {{a, -0.25f}}));
  c.add(0, finished(FinishReason::Length, 1));
  EXPECT_EQ(c.body()["choices"][0]["logprobs"],
            ojson::parse(R"({"content":[{"token":"a","logprob":-0.25,"bytes":[97],)"
                         R"("top_logprobs":[{"token":"a","logprob":-0.25,"bytes":[97]}]}]})"));
}

TEST_F(ResponseTest, AnErrorEventFailsTheWholeAnswer) {
  ApiRequest r = request(Endpoint::Completions, R"(, "n": 2)");
  CompletionCollector c(r, info(Endpoint::Completions), 2, 2, *tok_);
  c.add(0, finished(FinishReason::Stop, 1));
  c.add(1, failed("out of memory"));
  EXPECT_TRUE(c.done());
  ASSERT_TRUE(c.error());
  EXPECT_EQ(c.error()->status, 500);
  EXPECT_EQ(c.error()->type, "server_error");
  EXPECT_NE(std::string(c.error()->what()).find("out of memory"), std::string::npos);
}

TEST_F(ResponseTest, ChatStreamChunks) {
  ApiRequest r = request(Endpoint::Chat, R"(, "stream": true, "n": 2,
                                            "stream_options": {"include_usage": true})");
  StreamRenderer s(r, info(Endpoint::Chat), 2, 5, *tok_);
  std::string all = s.start();
  all += s.add(0, token(id_of("a"), "a"));
  EXPECT_EQ(s.add(1, token(id_of("b"), "")), "");  // nothing to say yet
  all += s.add(1, token(id_of("c"), "bc"));
  all += s.add(0, finished(FinishReason::Stop, 1));
  EXPECT_FALSE(s.done());
  all += s.add(1, finished(FinishReason::Length, 2));
  EXPECT_TRUE(s.done());
  all += s.finish();
  const std::string head =
      R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"tiny",)";
  const std::vector<std::string> want = {
      head +
          R"("choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})",
      head +
          R"("choices":[{"index":1,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})",
      head +
          R"("choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]})",
      head +
          R"("choices":[{"index":1,"delta":{"content":"bc"},"logprobs":null,"finish_reason":null}]})",
      head + R"("choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]})",
      head + R"("choices":[{"index":1,"delta":{},"logprobs":null,"finish_reason":"length"}]})",
      head + R"("choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}})",
      "[DONE]"};
  EXPECT_EQ(sse_data(all), want);
  EXPECT_EQ(all.substr(all.size() - 14), "data: [DONE]\n\n");
}

TEST_F(ResponseTest, CompletionStreamChunksWithLogprobs) {
  ApiRequest r = request(Endpoint::Completions, R"(, "stream": true, "logprobs": 1)");
  StreamRenderer s(r, info(Endpoint::Completions), 1, 1, *tok_);
  EXPECT_EQ(s.start(), "");
  const int32_t a = id_of("a");
  std::string all = s.add(0, token(a, "", -0.5f, {{a, -0.5f}}));  // logprobs: sent even empty
  all += s.add(0, finished(FinishReason::Length, 1));
  all += s.finish();  // no usage chunk unless asked
  const std::string head =
      R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"tiny",)";
  EXPECT_EQ(
      sse_data(all),
      (std::vector<std::string>{
          head + R"("choices":[{"text":"","index":0,"logprobs":{"tokens":["a"],)"
                 R"("token_logprobs":[-0.5],"top_logprobs":[{"a":-0.5}],)"
                 R"("text_offset":[0]},"finish_reason":null}]})",
          head + R"("choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}]})",
          "[DONE]"}));
}

TEST_F(ResponseTest, StreamErrorsAndAbort) {
  ApiRequest r = request(Endpoint::Completions, R"(, "stream": true, "n": 3)");
  StreamRenderer s(r, info(Endpoint::Completions), 3, 1, *tok_);
  std::vector<std::string> ev = sse_data(s.add(0, failed("boom")));
  ASSERT_EQ(ev.size(), 1u);
  json err = json::parse(ev[0]);
  EXPECT_EQ(err["error"]["type"], "server_error");
  EXPECT_NE(err["error"]["message"].get<std::string>().find("boom"), std::string::npos);
  s.add(1, finished(FinishReason::Stop, 1));
  ev = sse_data(s.abort(ApiError(503, "server_error", "stopping", {}, "server_shutting_down")));
  ASSERT_EQ(ev.size(), 1u);  // one error event for the open choices
  EXPECT_EQ(json::parse(ev[0])["error"]["code"], "server_shutting_down");
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.abort(ApiError(503, "server_error", "again")), "");
  EXPECT_EQ(sse_data(s.finish()), std::vector<std::string>{"[DONE]"});
}

TEST_F(ResponseTest, IllFormedUtf8IsReplacedNotFatal) {
  ApiRequest r = request(Endpoint::Chat, R"(, "stream": true)");
  StreamRenderer s(r, info(Endpoint::Chat), 1, 1, *tok_);
  std::vector<std::string> ev = sse_data(s.add(0, token(id_of("a"), "x\xff\ny")));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(json::parse(ev[0])["choices"][0]["delta"]["content"], "x\xEF\xBF\xBD\ny");
}

TEST(ResponseId, PrefixedRandomAndUnique) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) ids.insert(new_response_id(Endpoint::Completions));
  EXPECT_EQ(ids.size(), 1000u);
  const std::string id = new_response_id(Endpoint::Chat);
  EXPECT_EQ(id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(id.size(), 9u + 24u);
  EXPECT_EQ(ids.begin()->rfind("cmpl-", 0), 0u);
}

TEST(Prometheus, GaugesCountersAndCumulativeHistograms) {
  engine::SchedulerMetrics m;
  m.running = 3;
  m.waiting = 2;
  m.kv_bytes_in_use = 4096;
  m.kv_budget_bytes = 1 << 20;
  m.prompt_tokens_total = 100;
  m.generation_tokens_total = 50;
  m.ttft = engine::Histogram::latency();
  m.itl = engine::Histogram::latency();
  m.ttft.observe(0.003);
  m.ttft.observe(0.2);
  m.ttft.observe(100);
  HttpStats http;
  http.active_requests = 4;
  http.responses = {{200, 7}, {400, 1}};
  const std::string t = prometheus_text(m, http);
  for (const char* line :
       {"# TYPE ferry_requests_running gauge\nferry_requests_running 3\n",
        "ferry_requests_waiting 2\n", "ferry_kv_bytes_in_use 4096\n",
        "ferry_kv_budget_bytes 1048576\n", "# TYPE ferry_prompt_tokens_total counter\n",
        "ferry_prompt_tokens_total 100\n", "ferry_generation_tokens_total 50\n",
        "# TYPE ferry_time_to_first_token_seconds histogram\n",
        "ferry_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n",
        "ferry_time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n",
        "ferry_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n",
        "ferry_time_to_first_token_seconds_bucket{le=\"30\"} 2\n",
        "ferry_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n",
        "ferry_time_to_first_token_seconds_count 3\n",
        "ferry_inter_token_latency_seconds_count 0\n", "ferry_http_active_requests 4\n",
        "ferry_http_responses_total{code=\"200\"} 7\n",
        "ferry_http_responses_total{code=\"400\"} 1\n"})
    EXPECT_NE(t.find(line), std::string::npos) << line;
  EXPECT_EQ(t.back(), '\n');
}

TEST(ChatPage, SelfContainedAndStreamsTheChatApi) {
  const std::string page(chat_page_html());
  EXPECT_EQ(page.rfind("<!doctype html>", 0), 0u);
  EXPECT_NE(page.find("/v1/chat/completions"), std::string::npos);
  EXPECT_NE(page.find("stream: true"), std::string::npos);
  EXPECT_NE(page.find("data-state"), std::string::npos);  // the test hook
  // No external assets: nothing fetched from another origin.
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  EXPECT_EQ(page.find("<script src"), std::string::npos);
}

}  // namespace
}  // namespace ferry::server
