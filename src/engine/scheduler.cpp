#include "engine/scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/cpu.h"
#include "core/error.h"

namespace ferry::engine {

using Clock = std::chrono::steady_clock;

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (v <= bounds[i]) ++counts[i];
  ++counts.back();
  sum += v;
  ++count;
}

Histogram Histogram::latency() {
  Histogram h;
  h.bounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  h.counts.assign(h.bounds.size() + 1, 0);
  return h;
}

struct Scheduler::Request {
  uint64_t id = 0;
  GenerationRequest req;
  Sink sink;
  size_t top_logprobs = 0;
  std::unique_ptr<Sequence> seq;
  std::string text;      // text the last token made final
  size_t projected = 0;  // KV bytes reserved at admission
  size_t prefilled = 0;  // prompt tokens in the cache
  Clock::time_point submitted, last_token;
  bool decoding() const { return prefilled == req.prompt.size(); }
};

static size_t default_kv_budget() {
  // A third of physical memory: the weights, activations and the rest of
  // the machine keep the remainder.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return size_t{1} << 30;
  return static_cast<size_t>(pages) * static_cast<size_t>(page) / 3;
}

Scheduler::Scheduler(const model::Model& model, const text::Tokenizer& tok, SchedulerOptions opts)
    : Scheduler(model, tok, std::move(opts), true) {}

Scheduler::Scheduler(const model::Model& model, const text::Tokenizer& tok, SchedulerOptions opts,
                     bool start_thread)
    : model_(model),
      tok_(tok),
      opts_(std::move(opts)),
      spec_(model.config().kv_spec(opts_.kv_k, opts_.kv_v)),
      pool_(std::make_unique<ThreadPool>(opts_.threads)),
      ctx_{pool_.get(), best_cpu_path(), opts_.matmul},
      step_budget_(std::max(0.0, opts_.step_target_ms) / 1000, opts_.step_min_prefill),
      batch_(spec_, model_.kv_allocator()) {
  if (opts_.kv_budget_bytes == 0) opts_.kv_budget_bytes = batch_.allocator()->memory_hint();
  if (opts_.kv_budget_bytes == 0) opts_.kv_budget_bytes = default_kv_budget();
  opts_.max_batch = std::max<size_t>(1, opts_.max_batch);
  opts_.prefill_chunk = std::max<size_t>(1, opts_.prefill_chunk);
  opts_.step_token_budget = std::max(opts_.step_token_budget, opts_.max_batch);
  m_.kv_budget_bytes = opts_.kv_budget_bytes;
  m_.ttft = Histogram::latency();
  m_.itl = Histogram::latency();
  if (start_thread) thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  shutdown(false);
  if (thread_.joinable()) thread_.join();
}

uint64_t Scheduler::submit(const GenerationRequest& req, Sink sink, size_t top_logprobs) {
  auto r = std::make_shared<Request>();
  r->req = req;
  r->sink = std::move(sink);
  r->top_logprobs = std::min<size_t>(top_logprobs, 20);
  r->seq = std::make_unique<Sequence>(req, tok_, model_.config().context_length,
                                      [p = r.get()](std::string_view s) { p->text += s; });
  const size_t total = std::min(req.prompt.size() + req.max_tokens, model_.config().context_length);
  // From the spec, not batch_: the engine thread replaces batch_ (under
  // mu_) while callers submit.
  r->projected = spec_.projected_bytes(total, opts_.prefill_chunk);
  r->submitted = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (!accepting_) fail("admission", "the server is shutting down");
  if (r->projected > opts_.kv_budget_bytes) {
    ++m_.requests_rejected;
    fail("admission", "a request of ", total, " tokens needs ", r->projected,
         " bytes of KV cache, more than the whole budget of ", opts_.kv_budget_bytes,
         " bytes; lower max_tokens or shorten the prompt");
  }
  r->id = next_id_++;
  const uint64_t id = r->id;
  waiting_.push_back(std::move(r));
  cv_.notify_all();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.push_back(id);
  cv_.notify_all();
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerMetrics m = m_;
  m.waiting = waiting_.size();
  m.kv_bytes_in_use = kv_in_use_;
  return m;
}

void Scheduler::shutdown(bool drain) {
  std::unique_lock<std::mutex> lock(mu_);
  accepting_ = false;
  if (!drain) {
    for (auto& r : waiting_) cancelled_.push_back(r->id);
    for (auto& r : running_) cancelled_.push_back(r->id);
  }
  cv_.notify_all();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) {
    cv_.wait(lock, [&] { return waiting_.empty() && running_.empty(); });
    stop_ = true;
    cv_.notify_all();
  } else {
    stop_ = true;
  }
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !waiting_.empty() || !running_.empty() || !cancelled_.empty();
      });
      if (stop_ && waiting_.empty() && running_.empty()) return;
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failed step leaves the cache as it was (BatchKv is transactional),
      // but the rows' requests cannot continue: end them with the error.
      std::vector<std::shared_ptr<Request>> failed;
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed.swap(running_);
        batch_ = kv::BatchKv(spec_, model_.kv_allocator());
        kv_in_use_ = 0;  // only admitted (running) requests hold a reservation
      }
      StreamEvent ev;
      ev.kind = StreamEvent::Kind::Error;
      ev.error = e.what();
      for (auto& r : failed) r->sink(ev);
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
  }
}

double Scheduler::step_seconds() const {
  if (opts_.step_clock) return opts_.step_clock();
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

void Scheduler::finish(Request& r, const StreamEvent& ev) {
  {
    // Release the reservation first: a client that has its answer must
    // see it gone from the metrics.
    std::lock_guard<std::mutex> lock(mu_);
    kv_in_use_ -= r.projected;
    ++m_.requests_finished;
  }
  r.sink(ev);
}

// Top-k log-softmax of raw logits, most likely first (ties: lower id), from
// the whole row or from the largest logits and log-sum-exp the step
// delivered for it.
static std::vector<TopLogprob> top_logprobs(const model::RowLogits& row, size_t k) {
  std::vector<TopLogprob> out;
  if (k == 0) return out;
  std::vector<model::TopLogit> top;
  model::LogSumExp lse = row.lse;
  std::span<const model::TopLogit> best = row.top;
  if (!row.full.empty()) {
    model::select_from_row(row.full, static_cast<uint32_t>(k), top, &lse);
    best = top;
  }
  const double log_z = lse.max + std::log(lse.sum);
  for (size_t i = 0; i < std::min(k, best.size()); ++i)
    out.push_back({best[i].id, static_cast<float>(best[i].value - log_z)});
  return out;
}

bool Scheduler::step() {
  // 1. Under the lock: drop cancelled requests, admit newcomers.
  std::vector<size_t> keep;
  std::vector<std::shared_ptr<Request>> admitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!cancelled_.empty()) {
      auto is_cancelled = [&](uint64_t id) {
        return std::find(cancelled_.begin(), cancelled_.end(), id) != cancelled_.end();
      };
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (is_cancelled((*it)->id)) {
          ++m_.requests_cancelled;
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      std::vector<std::shared_ptr<Request>> next;
      for (size_t b = 0; b < running_.size(); ++b) {
        if (is_cancelled(running_[b]->id)) {
          kv_in_use_ -= running_[b]->projected;
          ++m_.requests_cancelled;
        } else {
          keep.push_back(b);
          next.push_back(running_[b]);
        }
      }
      cancelled_.clear();
      if (keep.size() != running_.size()) {
        batch_.filter(keep);
        running_ = std::move(next);
      }
    }
    // First come, first served: the head of the queue waits until it fits.
    while (!waiting_.empty() && running_.size() + admitted.size() < opts_.max_batch &&
           kv_in_use_ + waiting_.front()->projected <= opts_.kv_budget_bytes) {
      kv_in_use_ += waiting_.front()->projected;
      admitted.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
  }
  if (!admitted.empty()) {
    std::vector<size_t> lengths;
    for (auto& r : admitted) lengths.push_back(r->req.prompt.size());
    batch_.add_rows(lengths);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : admitted) running_.push_back(std::move(r));
  }
  if (running_.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    m_.running = 0;
    cv_.notify_all();
    return false;
  }

  // 2. Plan the step: decode rows take one token each, then prompts take
  //    chunks in arrival order while the token budget lasts, and while
  //    rows decode, the step-time policy's allowance.
  const double t0 = step_seconds();
  const size_t B = running_.size();
  std::vector<model::RowInput> rows(B);
  std::vector<int32_t> feed(B);
  size_t budget = opts_.step_token_budget, decode_rows = 0, prefill_tokens = 0;
  for (size_t b = 0; b < B; ++b) {
    Request& r = *running_[b];
    if (r.decoding()) {
      feed[b] = r.seq->last_token();
      rows[b] = model::RowInput{std::span<const int32_t>(&feed[b], 1), false, true};
      --budget;
      ++decode_rows;
    }
  }
  budget = step_budget_.prefill_allowance(decode_rows, budget);
  for (size_t b = 0; b < B && budget > 0; ++b) {
    Request& r = *running_[b];
    if (r.decoding()) continue;
    const size_t n = std::min({opts_.prefill_chunk, r.req.prompt.size() - r.prefilled, budget});
    const bool last = r.prefilled + n == r.req.prompt.size();
    rows[b] = model::RowInput{std::span<const int32_t>(r.req.prompt).subspan(r.prefilled, n), false,
                              last};
    budget -= n;
    prefill_tokens += n;
  }

  // 3. One forward for every row; each output brings back what its
  //    sampler needs (on a GPU, greedy reduces and sampling draws on the
  //    device).
  needs_.clear();
  for (size_t b = 0; b < B; ++b) {
    if (!rows[b].want_logits || rows[b].tokens.empty()) continue;
    const Request& r = *running_[b];
    model::OutputNeed n = r.seq->need();
    if (r.top_logprobs > 0) {
      n.top_n = std::max<uint32_t>(n.top_n, static_cast<uint32_t>(r.top_logprobs));
      n.lse = true;
    }
    needs_.push_back(n);
  }
  model_.step(ctx_, batch_, rows, needs_, outputs_);

  // 4. Sample, stream, retire.
  const auto now = Clock::now();
  size_t o = 0;
  keep.clear();
  std::vector<std::shared_ptr<Request>> next;
  uint64_t prompt_tokens = 0, generated = 0;
  std::vector<double> ttfts, itls;
  for (size_t b = 0; b < B; ++b) {
    Request& r = *running_[b];
    bool done = false;
    const bool was_prefilling = !r.decoding();
    if (was_prefilling) {
      r.prefilled += rows[b].tokens.size();
      prompt_tokens += rows[b].tokens.size();
      if (r.decoding()) batch_.finalize_row(b);
    }
    if (rows[b].want_logits && !rows[b].tokens.empty()) {
      const model::RowLogits l = outputs_.row(o++);
      StreamEvent ev;
      ev.top_logprobs = top_logprobs(l, r.top_logprobs);
      r.text.clear();
      done = r.seq->on_logits(l);
      const GenerationResult& res = r.seq->result();
      ++generated;
      (was_prefilling ? ttfts : itls)
          .push_back(
              std::chrono::duration<double>(now - (was_prefilling ? r.submitted : r.last_token))
                  .count());
      r.last_token = now;
      const bool eog = done && res.finish == FinishReason::Stop && !r.req.ignore_eos &&
                       tok_.is_end_of_generation(res.tokens.back());
      if (!eog) {
        ev.kind = StreamEvent::Kind::Token;
        ev.text = r.text;
        ev.token = res.tokens.back();
        ev.logprob = res.logprobs.back();
        r.sink(ev);
      } else if (!r.text.empty()) {
        // Text a stop held back is released at the end: send it with no token.
        StreamEvent t;
        t.text = r.text;
        r.sink(t);
      }
      if (done) {
        StreamEvent fin;
        fin.kind = StreamEvent::Kind::Finished;
        fin.finish = res.finish;
        fin.prompt_tokens = r.req.prompt.size();
        fin.completion_tokens = res.tokens.size();
        finish(r, fin);
      }
    }
    if (!done) {
      keep.push_back(b);
      next.push_back(running_[b]);
    }
  }
  if (keep.size() != B) batch_.filter(keep);
  step_budget_.observe(decode_rows, prefill_tokens, step_seconds() - t0);
  std::lock_guard<std::mutex> lock(mu_);
  running_ = std::move(next);
  m_.running = running_.size();
  m_.kv_bytes_allocated = batch_.allocated_bytes();
  m_.prompt_tokens_total += prompt_tokens;
  m_.generation_tokens_total += generated;
  for (double t : ttfts) m_.ttft.observe(t);
  for (double t : itls) m_.itl.observe(t);
  if (running_.empty()) {  // give the memory back
    batch_ = kv::BatchKv(spec_, model_.kv_allocator());
    outputs_ = {};
  }
  cv_.notify_all();
  return true;
}

}  // namespace ferry::engine
