// Scheduler: the continuous-batching engine loop behind `ferry serve`.
//
// There is no prefill phase and no decode phase: each step, every running
// request's computed tokens catch up with its total tokens under a token
// budget. Running rows decode one token each; newcomers' prompts are
// prefilled in chunks (prefill_chunk tokens per step) beside them, so a long
// prompt never freezes running streams. Admission is first come, first
// served against a KV byte budget using BatchKv::projected_bytes(prompt +
// max_tokens); an admitted request is never evicted or truncated. A
// cancelled request leaves at the next step and its KV is freed. While
// rows decode, a step's prompt tokens are also capped so that the step's
// projected time stays near step_target_ms (StepTimeBudget,
// engine/step_policy.h), so a running stream's time per token stays near
// the target instead of growing with the prompts that arrive.
//
// Threading: one engine thread runs steps; submit()/cancel()/metrics() may
// be called from any thread. Sinks are called on the engine thread and must
// not block (the server queues events per connection).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/generate.h"
#include "engine/sequence.h"
#include "engine/step_policy.h"
#include "kv/batch_kv.h"

namespace ferry::engine {

struct TopLogprob {
  int32_t token;
  float logprob;
};

// What a request's sink receives, in order: Token events, then exactly one
// Finished (or Error) event.
struct StreamEvent {
  enum class Kind { Token, Finished, Error };
  Kind kind = Kind::Token;
  std::string text;    // Token: text that became final with this token (may be empty)
  int32_t token = -1;  // -1: text only (held-back text released at the end)
  float logprob = 0;
  std::vector<TopLogprob> top_logprobs;             // Token: when requested
  FinishReason finish = FinishReason::Length;       // Finished
  std::string error;                                // Error
  size_t prompt_tokens = 0, completion_tokens = 0;  // Finished
};
using Sink = std::function<void(const StreamEvent&)>;

struct SchedulerOptions {
  size_t max_batch = 256;          // running rows
  size_t prefill_chunk = 256;      // prompt tokens per row per step
  size_t step_token_budget = 512;  // tokens forwarded per step (decode rows count 1)
  size_t kv_budget_bytes = 0;      // 0: derived from the machine's memory
  kernels::KvFormat kv_k = kernels::KvFormat::f16();
  kernels::KvFormat kv_v = kernels::KvFormat::f16();
  size_t threads = 0;                                       // kernel threads (0: all cores)
  kernels::MatmulMode matmul = kernels::MatmulMode::Exact;  // CPU products
  // Step-time target while rows decode (StepTimeBudget); 0: off, prompts
  // take the whole token budget. 60 ms, with at least 16 prompt tokens a
  // step: on a 2-core CPU a step of 16 decode rows of SmolLM2-135M takes
  // about 50 ms, and 80 ms / 32 tokens let the steps that carry a
  // newcomer's prompt reach 100-120 ms, the serving p99 inter-token
  // latency; 60 / 16 keeps it near 65-80 ms at the same output rate, for a
  // longer wait to the first token (docs/BENCHMARKS.md, "ferry bench").
  double step_target_ms = 60;
  size_t step_min_prefill = 16;  // prompt tokens a step always may take
  // Seconds on a monotonic clock for timing steps (null: steady_clock).
  // Tests inject a fake to make the step-time policy deterministic.
  std::function<double()> step_clock;
};

// Histogram with fixed bucket bounds (seconds), Prometheus-style.
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // cumulative per bound, plus +Inf last
  double sum = 0;
  uint64_t count = 0;
  void observe(double v);
  static Histogram latency();
};

struct SchedulerMetrics {
  size_t running = 0, waiting = 0;
  size_t kv_bytes_in_use = 0;     // projected bytes of admitted requests
  size_t kv_bytes_allocated = 0;  // BatchKv::allocated_bytes of the batch
  size_t kv_budget_bytes = 0;
  uint64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  uint64_t requests_finished = 0, requests_cancelled = 0, requests_rejected = 0;
  Histogram ttft, itl;
};

class Scheduler {
 public:
  Scheduler(const model::Model& model, const text::Tokenizer& tok, SchedulerOptions opts);
  ~Scheduler();  // shutdown() and join
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates and queues a request. Throws ferry::Error("[generate] ...")
  // for a bad request or a prompt that does not fit the context, and
  // ferry::Error("[admission] ...") when it could never fit the KV budget
  // or the scheduler is shutting down. Returns the request id.
  uint64_t submit(const GenerationRequest& req, Sink sink, size_t top_logprobs = 0);
  // Removes a request wherever it is; its sink gets no more events. Safe to
  // call for finished or unknown ids.
  void cancel(uint64_t id);
  SchedulerMetrics metrics() const;
  // Stops accepting new requests; in-flight ones run to their end. Returns
  // when all have finished (or at once with drain = false, cancelling them
  // with an Error event).
  void shutdown(bool drain = true);
  const SchedulerOptions& options() const { return opts_; }
  const model::Model& model() const { return model_; }
  const text::Tokenizer& tokenizer() const { return tok_; }

  // Runs one step on the calling thread (for tests that drive the loop;
  // only when constructed with start_thread = false).
  bool step();
  Scheduler(const model::Model& model, const text::Tokenizer& tok, SchedulerOptions opts,
            bool start_thread);

 private:
  struct Request;
  void loop();
  void admit_locked();
  void finish(Request& r, const StreamEvent& ev);
  double step_seconds() const;

  const model::Model& model_;
  const text::Tokenizer& tok_;
  SchedulerOptions opts_;
  kv::KvSpec spec_;
  std::unique_ptr<ThreadPool> pool_;
  kernels::Context ctx_;
  StepTimeBudget step_budget_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<std::shared_ptr<Request>> running_;  // running_[b] is batch_ row b
  std::vector<uint64_t> cancelled_;
  kv::BatchKv batch_;
  model::StepOutputs outputs_;  // engine thread only; kept across steps
  std::vector<model::OutputNeed> needs_;
  size_t kv_in_use_ = 0;
  uint64_t next_id_ = 1;
  bool accepting_ = true, stop_ = false;
  SchedulerMetrics m_;
  std::thread thread_;
};

}  // namespace ferry::engine
