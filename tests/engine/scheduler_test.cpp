// The scheduler driven step by step (no thread, no HTTP) on the tiny model:
// every request's tokens equal its solo run whatever else is running, with
// prompts chunked beside decoding rows; exact FCFS admission under a KV
// budget; the budget back to zero; cancellation of waiting and running
// requests; requests that could never fit are refused at once; with the
// step-time policy on (and a fake clock), every decoding row advances each
// step while prompts still make progress.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace ferry::engine {
namespace {

struct Fixture {
  std::unique_ptr<model::Model> model =
      model::load_model(std::string(FERRY_TEST_DATA) + "/models/tiny-llama-f32.gguf");
  std::unique_ptr<text::Tokenizer> tok = text::Tokenizer::from_gguf(model->file());
};

GenerationRequest make(size_t prompt_len, size_t max_tokens, uint32_t salt) {
  GenerationRequest r;
  for (size_t i = 0; i < prompt_len; ++i)
    r.prompt.push_back(static_cast<int32_t>(3 + (i * 7 + salt * 13) % 250));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = salt % 2 ? 0.0f : 0.9f;
  r.sampling.seed = salt;
  return r;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  bool finished = false;
  size_t finish_order = 0;
};

std::shared_ptr<Collected> sink_into(Sink* sink, size_t* counter) {
  auto c = std::make_shared<Collected>();
  *sink = [c, counter](const StreamEvent& ev) {
    if (ev.kind == StreamEvent::Kind::Token) {
      if (ev.token >= 0) c->tokens.push_back(ev.token);
      c->text += ev.text;
    } else {
      c->finished = true;
      c->finish_order = ++*counter;
    }
  };
  return c;
}

SchedulerOptions options(size_t max_batch) {
  SchedulerOptions o;
  o.max_batch = max_batch;
  o.prefill_chunk = 3;  // prompts arrive in chunks beside decoding rows
  o.step_token_budget = 8;
  o.step_target_ms = 0;  // exact step compositions: no timing in the plan
  o.kv_k = o.kv_v = kernels::KvFormat::f32();
  o.threads = 2;
  return o;
}

TEST(Scheduler, TokensEqualSoloRunsAndKvReturnsToZero) {
  Fixture f;
  Scheduler s(*f.model, *f.tok, options(4), /*start_thread=*/false);
  ThreadPool pool(1);
  kernels::Context ctx{&pool, best_cpu_path()};
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<Collected>> got;
  size_t counter = 0;
  for (uint32_t i = 0; i < 10; ++i) {
    reqs.push_back(make(1 + (i * 5) % 17, 2 + (i * 3) % 9, i));
    Sink sink;
    got.push_back(sink_into(&sink, &counter));
    s.submit(reqs.back(), sink);
  }
  size_t steps = 0;
  while (s.step()) ASSERT_LT(++steps, 1000u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerationResult solo = generate(*f.model, *f.tok, ctx, reqs[i], nullptr);
    EXPECT_TRUE(got[i]->finished) << i;
    EXPECT_EQ(got[i]->tokens, solo.tokens) << "request " << i;
    EXPECT_EQ(got[i]->text, solo.text) << "request " << i;
  }
  const SchedulerMetrics m = s.metrics();
  EXPECT_EQ(m.kv_bytes_in_use, 0u);
  EXPECT_EQ(m.running, 0u);
  EXPECT_EQ(m.waiting, 0u);
  EXPECT_EQ(m.requests_finished, 10u);
  size_t prompt_tokens = 0, generated = 0;
  for (auto& r : reqs) {
    prompt_tokens += r.prompt.size();
    generated += r.max_tokens;
  }
  EXPECT_EQ(m.prompt_tokens_total, prompt_tokens);
  EXPECT_EQ(m.generation_tokens_total, generated);
}

TEST(Scheduler, AdmissionIsFirstComeFirstServedUnderTheKvBudget) {
  Fixture f;
  SchedulerOptions o = options(8);
  // Budget for exactly two requests of 10 tokens at a time.
  kv::BatchKv probe(f.model->config().kv_spec(o.kv_k, o.kv_v));
  o.kv_budget_bytes = 2 * probe.projected_bytes(10, o.prefill_chunk);
  Scheduler s(*f.model, *f.tok, o, false);
  size_t counter = 0;
  std::vector<std::shared_ptr<Collected>> got;
  // Same cost each: 5 prompt + 5 generated tokens; all equal, so at most
  // two run at once and they finish in submission order.
  for (uint32_t i = 0; i < 5; ++i) {
    Sink sink;
    got.push_back(sink_into(&sink, &counter));
    s.submit(make(5, 5, 2 * i + 1), sink);
  }
  s.step();
  EXPECT_EQ(s.metrics().running, 2u);
  EXPECT_EQ(s.metrics().waiting, 3u);
  EXPECT_EQ(s.metrics().kv_bytes_in_use, o.kv_budget_bytes);
  while (s.step()) {
    EXPECT_LE(s.metrics().kv_bytes_in_use, o.kv_budget_bytes);
    EXPECT_LE(s.metrics().running, 2u);
  }
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i]->finish_order, i + 1);
  EXPECT_EQ(s.metrics().kv_bytes_in_use, 0u);

  // A request that could never fit is refused at once, naming the budget.
  try {
    s.submit(make(5, 200, 1), [](const StreamEvent&) {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("budget"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.metrics().requests_rejected, 1u);
}

TEST(Scheduler, CancelledRequestsLeaveAndFreeTheirKv) {
  Fixture f;
  Scheduler s(*f.model, *f.tok, options(4), false);
  size_t counter = 0;
  std::vector<std::shared_ptr<Collected>> got;
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < 6; ++i) {
    Sink sink;
    got.push_back(sink_into(&sink, &counter));
    ids.push_back(s.submit(make(4, 30, i), sink));
  }
  s.step();
  s.step();
  s.cancel(ids[1]);  // running
  s.cancel(ids[5]);  // waiting
  s.step();
  EXPECT_EQ(s.metrics().requests_cancelled, 2u);
  const size_t tokens_at_cancel = got[1]->tokens.size();
  while (s.step()) {
  }
  EXPECT_EQ(got[1]->tokens.size(), tokens_at_cancel);  // no events after cancel
  EXPECT_FALSE(got[1]->finished);
  EXPECT_FALSE(got[5]->finished);
  EXPECT_TRUE(got[5]->tokens.empty());
  for (size_t i : {0u, 2u, 3u, 4u}) EXPECT_TRUE(got[i]->finished) << i;
  EXPECT_EQ(s.metrics().kv_bytes_in_use, 0u);
  EXPECT_EQ(s.metrics().running, 0u);
}

TEST(Scheduler, BadRequestsAreRefusedAtSubmit) {
  Fixture f;
  Scheduler s(*f.model, *f.tok, options(4), false);
  GenerationRequest empty = make(0, 4, 1);
  EXPECT_THROW(s.submit(empty, [](const StreamEvent&) {}), Error);
  GenerationRequest too_long = make(f.model->config().context_length, 4, 1);
  EXPECT_THROW(s.submit(too_long, [](const StreamEvent&) {}), Error);
  GenerationRequest bad = make(3, 4, 1);
  bad.sampling.top_p = 2;
  EXPECT_THROW(s.submit(bad, [](const StreamEvent&) {}), Error);
  EXPECT_FALSE(s.step());
}

// Every step is measured at 1 s (the fake clock advances 0.5 s per reading,
// two readings per step) against a 100 ms target, so while rows decode the
// policy allows only step_min_prefill prompt tokens per step.
TEST(Scheduler, StepTargetCapsPromptsButNeverDecodeRows) {
  Fixture f;
  SchedulerOptions o = options(8);
  o.step_token_budget = 64;
  o.step_target_ms = 100;
  o.step_min_prefill = 2;
  auto ticks = std::make_shared<int>(0);
  o.step_clock = [ticks] { return 0.5 * ++*ticks; };
  Scheduler s(*f.model, *f.tok, o, false);
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<Collected>> got;
  size_t counter = 0;
  auto submit = [&](size_t prompt_len, size_t max_tokens, uint32_t salt) {
    reqs.push_back(make(prompt_len, max_tokens, salt));
    Sink sink;
    got.push_back(sink_into(&sink, &counter));
    s.submit(reqs.back(), sink);
  };
  submit(4, 30, 1);
  submit(4, 30, 2);
  // Nothing decodes yet: the whole budget (two chunks of 3).
  ASSERT_TRUE(s.step());
  EXPECT_EQ(s.metrics().prompt_tokens_total, 6u);
  ASSERT_TRUE(s.step());  // the prompts' last tokens; both now decode
  for (uint32_t i = 0; i < 3; ++i) submit(10, 5, 10 + i);
  size_t steps = 0, capped_steps = 0;
  for (;;) {
    std::vector<size_t> before;
    size_t decoding = 0, pending_prompts = 0;
    for (auto& c : got) {
      before.push_back(c->tokens.size());
      if (!c->tokens.empty() && !c->finished) ++decoding;
      if (c->tokens.empty()) ++pending_prompts;
    }
    const uint64_t prompt_before = s.metrics().prompt_tokens_total;
    if (!s.step()) break;
    ASSERT_LT(++steps, 1000u);
    const uint64_t prompt_step = s.metrics().prompt_tokens_total - prompt_before;
    for (size_t i = 0; i < got.size(); ++i) {
      if (before[i] > 0 && !(got[i]->finished && got[i]->tokens.size() == before[i])) {
        EXPECT_EQ(got[i]->tokens.size(), before[i] + 1) << "request " << i << ", step " << steps;
      }
    }
    if (pending_prompts > 0) {
      EXPECT_GT(prompt_step, 0u) << "step " << steps;
    }
    if (decoding > 0) {
      EXPECT_LE(prompt_step, 2u) << "step " << steps;
      ++capped_steps;
    }
  }
  EXPECT_GT(capped_steps, 10u);
  ThreadPool pool(1);
  kernels::Context ctx{&pool, best_cpu_path()};
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerationResult solo = generate(*f.model, *f.tok, ctx, reqs[i], nullptr);
    EXPECT_TRUE(got[i]->finished) << i;
    EXPECT_EQ(got[i]->tokens, solo.tokens) << "request " << i;
  }
  EXPECT_EQ(s.metrics().kv_bytes_in_use, 0u);
}

TEST(Scheduler, ThreadedLoopDrainsOnShutdown) {
  Fixture f;
  Scheduler s(*f.model, *f.tok, options(4));
  size_t counter = 0;
  std::vector<std::shared_ptr<Collected>> got;
  std::mutex mu;
  for (uint32_t i = 0; i < 5; ++i) {
    auto c = std::make_shared<Collected>();
    got.push_back(c);
    s.submit(make(3, 6, i), [c, &counter, &mu](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.kind == StreamEvent::Kind::Token && ev.token >= 0) c->tokens.push_back(ev.token);
      if (ev.kind == StreamEvent::Kind::Finished) c->finished = true, c->finish_order = ++counter;
    });
  }
  s.shutdown(true);
  for (auto& c : got) {
    EXPECT_TRUE(c->finished);
    EXPECT_EQ(c->tokens.size(), 6u);
  }
  EXPECT_THROW(s.submit(make(3, 6, 1), [](const StreamEvent&) {}), Error);
}

}  // namespace
}  // namespace ferry::engine
