// `ferry bench`: offline throughput and latency of a synthetic workload run
// through the same Scheduler as `ferry serve` (its engine thread; requests
// submitted from this thread, at most --concurrency in flight), without
// HTTP. Figures are defined in docs/BENCHMARKS.md ("ferry bench").
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/commands.h"
#include "cli/model_loading.h"
#include "core/error.h"
#include "engine/scheduler.h"

namespace ferry::cli {

namespace {

using Clock = std::chrono::steady_clock;

// A length: fixed, or uniform over [lo, hi] (inclusive).
struct LengthDist {
  size_t lo = 0, hi = 0;
  size_t draw(std::mt19937_64& rng) const { return lo + rng() % (hi - lo + 1); }
  double mean() const { return (static_cast<double>(lo) + static_cast<double>(hi)) / 2; }
  std::string name() const {
    return lo == hi ? std::to_string(lo)
                    : "uniform:" + std::to_string(lo) + ":" + std::to_string(hi);
  }
};

// "N" or "uniform:A:B" (1 <= A <= B).
LengthDist parse_dist(const std::string& flag, const std::string& s) {
  auto number = [&](const std::string& t) -> size_t {
    size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size() || t.empty() || t[0] == '-' || v == 0)
      fail("bench", flag, " '", s, "': expected N or uniform:A:B with 1 <= A <= B");
    return static_cast<size_t>(v);
  };
  const std::string prefix = "uniform:";
  if (s.rfind(prefix, 0) != 0) return {number(s), number(s)};
  const std::string rest = s.substr(prefix.size());
  const size_t colon = rest.find(':');
  if (colon == std::string::npos)
    fail("bench", flag, " '", s, "': expected N or uniform:A:B with 1 <= A <= B");
  LengthDist d{number(rest.substr(0, colon)), number(rest.substr(colon + 1))};
  if (d.lo > d.hi) fail("bench", flag, " '", s, "': A must not exceed B");
  return d;
}

struct BenchOptions {
  std::string model;
  size_t requests = 16, concurrency = 16, warmup = 1;
  size_t prompt_tokens = 128, output_tokens = 128;
  std::string prompt_dist, output_dist;  // override the fixed lengths
  uint64_t seed = 0;
  float temperature = 0, top_p = 1, repetition_penalty = 1, frequency_penalty = 0;
  int32_t top_k = 0;
  DeviceOptions device;
  KvOptions kv{"f16"};
  size_t kv_budget_mb = 0;
  size_t threads = 0;
  engine::SchedulerOptions sched;
  bool json = false, quiet = false;
};

// Percentile by linear interpolation between closest ranks (numpy's
// default, as tools/bench/serve_bench.py).
double percentile(std::vector<double> xs, double p) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const double k = static_cast<double>(xs.size() - 1) * p / 100;
  const size_t lo = static_cast<size_t>(k), hi = std::min(lo + 1, xs.size() - 1);
  return xs[lo] + (xs[hi] - xs[lo]) * (k - static_cast<double>(lo));
}

double mean(const std::vector<double>& xs) {
  double s = 0;
  for (double x : xs) s += x;
  return xs.empty() ? 0 : s / static_cast<double>(xs.size());
}

// Token ids a random prompt may use: normal tokens that are not BOS, EOS,
// padding or an end-of-generation token.
std::vector<int32_t> prompt_alphabet(const text::Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const text::TokenType t = tok.token_type(id);
    if (t != text::TokenType::kNormal && t != text::TokenType::kUndefined) continue;
    if (id == tok.bos() || id == tok.eos() || id == tok.pad() || tok.is_end_of_generation(id))
      continue;
    ids.push_back(id);
  }
  if (ids.empty()) fail("bench", "the vocabulary has no normal tokens to build prompts from");
  return ids;
}

struct Workload {
  std::vector<engine::GenerationRequest> reqs;
  size_t prompt_tokens = 0, output_tokens = 0;
};

// `n` requests whose lengths and prompts come from `seed` alone. A prompt
// is exactly its drawn length, BOS first when the model adds one.
Workload make_workload(const BenchOptions& o, const LoadedModel& l,
                       const std::vector<int32_t>& alphabet, const LengthDist& pd,
                       const LengthDist& od, size_t n, uint64_t seed) {
  Workload w;
  std::mt19937_64 rng(seed);
  const size_t ctx = l.model->config().context_length;
  for (size_t i = 0; i < n; ++i) {
    engine::GenerationRequest r;
    const size_t p = pd.draw(rng), out = od.draw(rng);
    if (p + out > ctx)
      fail("bench", "a request of ", p, " prompt + ", out, " output tokens exceeds the context of ",
           ctx, " tokens");
    if (l.tok->add_bos() && l.tok->bos() >= 0) r.prompt.push_back(l.tok->bos());
    while (r.prompt.size() < p) r.prompt.push_back(alphabet[rng() % alphabet.size()]);
    r.max_tokens = out;
    r.ignore_eos = true;
    r.logprobs = false;  // as a client that does not ask for them
    r.sampling.temperature = o.temperature;
    r.sampling.top_p = o.top_p;
    r.sampling.top_k = o.top_k;
    r.sampling.repetition_penalty = o.repetition_penalty;
    r.sampling.frequency_penalty = o.frequency_penalty;
    r.sampling.seed = seed + i;
    r.prefill_chunk = o.sched.prefill_chunk;
    r.kv_k = r.kv_v = o.sched.kv_k;
    w.prompt_tokens += p;
    w.output_tokens += out;
    w.reqs.push_back(std::move(r));
  }
  return w;
}

// What one request's sink saw.
struct Trace {
  Clock::time_point submitted, finished;
  std::vector<Clock::time_point> tokens;
  size_t completion_tokens = 0;
  bool done = false;
  std::string error;
};

struct RunResult {
  std::vector<Trace> traces;
  double wall_s = 0;
  size_t kv_peak_bytes = 0;
};

// Runs the workload with at most `concurrency` requests in flight: a new
// one is submitted as soon as one finishes.
RunResult drive(engine::Scheduler& sched, const Workload& w, size_t concurrency) {
  RunResult res;
  res.traces.resize(w.reqs.size());
  std::mutex mu;
  std::condition_variable cv;
  size_t finished = 0;
  size_t kv_peak = 0;
  size_t next = 0, in_flight = 0, seen = 0;
  const Clock::time_point t0 = Clock::now();
  while (seen < w.reqs.size()) {
    while (in_flight < concurrency && next < w.reqs.size()) {
      Trace& t = res.traces[next];
      {
        std::lock_guard<std::mutex> lock(mu);
        t.submitted = Clock::now();
      }
      // Sinks run on the engine thread. The KV figure of metrics() is the
      // batch's allocation after the previous step, sampled every event.
      // If a submit throws (a request over the KV budget), the ones in
      // flight must stop calling sinks that point into this frame.
      struct CancelOnThrow {
        engine::Scheduler& s;
        bool armed = true;
        ~CancelOnThrow() {
          if (armed) s.shutdown(/*drain=*/false);
        }
      } guard{sched};
      sched.submit(w.reqs[next], [&, i = next](const engine::StreamEvent& ev) {
        const auto now = Clock::now();
        const size_t kv = sched.metrics().kv_bytes_allocated;
        std::lock_guard<std::mutex> lock(mu);
        Trace& tr = res.traces[i];
        kv_peak = std::max(kv_peak, kv);
        if (ev.kind == engine::StreamEvent::Kind::Token) {
          if (ev.token >= 0) tr.tokens.push_back(now);
          return;
        }
        if (ev.kind == engine::StreamEvent::Kind::Error) tr.error = ev.error;
        tr.completion_tokens = ev.completion_tokens;
        tr.finished = now;
        tr.done = true;
        ++finished;
        cv.notify_all();
      });
      guard.armed = false;
      ++next;
      ++in_flight;
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished > seen; });
    in_flight -= finished - seen;
    seen = finished;
  }
  std::lock_guard<std::mutex> lock(mu);
  Clock::time_point end = t0;
  for (const Trace& t : res.traces) {
    if (!t.error.empty()) fail("bench", "a request failed: ", t.error);
    end = std::max(end, t.finished);
  }
  res.wall_s = std::chrono::duration<double>(end - t0).count();
  res.kv_peak_bytes = std::max(kv_peak, sched.metrics().kv_bytes_allocated);
  return res;
}

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

nlohmann::json report(const BenchOptions& o, const LoadedModel& l, const Workload& w,
                      const RunResult& r, const LengthDist& pd, const LengthDist& od) {
  std::vector<double> ttft, itl, prefill_rate, decode_rate;
  size_t output_tokens = 0, prompt_tokens = 0;
  for (size_t i = 0; i < r.traces.size(); ++i) {
    const Trace& t = r.traces[i];
    const size_t p = w.reqs[i].prompt.size();
    prompt_tokens += p;
    output_tokens += t.completion_tokens;
    if (t.tokens.empty()) continue;
    const double first = secs(t.submitted, t.tokens.front());
    ttft.push_back(first);
    if (first > 0) prefill_rate.push_back(static_cast<double>(p) / first);
    for (size_t k = 1; k < t.tokens.size(); ++k) itl.push_back(secs(t.tokens[k - 1], t.tokens[k]));
    const double span = secs(t.tokens.front(), t.tokens.back());
    if (t.tokens.size() > 1 && span > 0)
      decode_rate.push_back(static_cast<double>(t.tokens.size() - 1) / span);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const engine::SchedulerOptions& so = o.sched;
  const size_t in_flight = std::min(o.concurrency, w.reqs.size());
  const size_t bytes_per_token =
      kv::BatchKv(l.model->config().kv_spec(so.kv_k, so.kv_v)).bytes_per_token();
  const double held_tokens = static_cast<double>(in_flight) * (pd.mean() + od.mean());
  auto ms = [](double s) { return s * 1000; };
  nlohmann::json j;
  j["model"] = std::filesystem::path(o.model).filename().string();
  j["requests"] = r.traces.size();
  j["concurrency"] = o.concurrency;
  j["warmup"] = o.warmup;
  j["prompt_dist"] = pd.name();
  j["output_dist"] = od.name();
  j["seed"] = o.seed;
  j["temperature"] = o.temperature;
  j["top_p"] = o.top_p;
  j["top_k"] = o.top_k;
  j["repetition_penalty"] = o.repetition_penalty;
  j["frequency_penalty"] = o.frequency_penalty;
  j["threads"] = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  j["kv"] = so.kv_k.name();
  j["matmul"] = std::string(kernels::matmul_mode_name(so.matmul));
  j["device"] = l.model->device();
  j["max_batch"] = so.max_batch;
  j["prefill_chunk"] = so.prefill_chunk;
  j["step_tokens"] = so.step_token_budget;
  j["step_target_ms"] = so.step_target_ms;
  j["prompt_tokens"] = prompt_tokens;
  j["output_tokens"] = output_tokens;
  j["wall_s"] = r.wall_s;
  const double wall = r.wall_s > 0 ? r.wall_s : 1;
  j["requests_per_s"] = static_cast<double>(r.traces.size()) / wall;
  j["output_tok_s"] = static_cast<double>(output_tokens) / wall;
  j["total_tok_s"] = static_cast<double>(output_tokens + prompt_tokens) / wall;
  j["ttft_ms"] = {{"mean", ms(mean(ttft))},
                  {"p50", ms(percentile(ttft, 50))},
                  {"p99", ms(percentile(ttft, 99))}};
  j["itl_ms"] = {
      {"mean", ms(mean(itl))}, {"p50", ms(percentile(itl, 50))}, {"p99", ms(percentile(itl, 99))}};
  j["prefill_tok_s"] = percentile(prefill_rate, 50);
  j["decode_tok_s"] = percentile(decode_rate, 50);
  j["peak_rss_bytes"] = static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // ru_maxrss is in KiB
  j["kv_peak_bytes"] = r.kv_peak_bytes;
  j["kv_bytes_per_token"] = bytes_per_token;
  j["kv_peak_bytes_per_token"] = held_tokens > 0 ? r.kv_peak_bytes / held_tokens : 0.0;
  return j;
}

void print_table(const nlohmann::json& j) {
  const double mib = 1048576.0;
  auto d = [&](const char* k) { return j[k].get<double>(); };
  std::printf("ferry bench: %s | %zu requests, concurrency %zu, prompt %s, output %s\n",
              j["model"].get<std::string>().c_str(), j["requests"].get<size_t>(),
              j["concurrency"].get<size_t>(), j["prompt_dist"].get<std::string>().c_str(),
              j["output_dist"].get<std::string>().c_str());
  char target[32] = "off";
  if (d("step_target_ms") > 0) std::snprintf(target, sizeof target, "%g ms", d("step_target_ms"));
  std::printf(
      "  KV %s, %zu threads, max batch %zu, prefill chunk %zu, step tokens %zu, "
      "step target %s\n",
      j["kv"].get<std::string>().c_str(), j["threads"].get<size_t>(), j["max_batch"].get<size_t>(),
      j["prefill_chunk"].get<size_t>(), j["step_tokens"].get<size_t>(), target);
  std::printf("  %-34s %zu prompt + %zu output\n", "tokens", j["prompt_tokens"].get<size_t>(),
              j["output_tokens"].get<size_t>());
  std::printf("  %-34s %.3f s\n", "wall time", d("wall_s"));
  std::printf("  %-34s %.1f\n", "output tok/s", d("output_tok_s"));
  std::printf("  %-34s %.1f\n", "total tok/s (prompt + output)", d("total_tok_s"));
  std::printf("  %-34s %.2f\n", "requests/s", d("requests_per_s"));
  std::printf("  %-34s %.1f / %.1f ms\n", "TTFT p50 / p99", j["ttft_ms"]["p50"].get<double>(),
              j["ttft_ms"]["p99"].get<double>());
  std::printf("  %-34s %.1f / %.1f ms\n", "ITL p50 / p99", j["itl_ms"]["p50"].get<double>(),
              j["itl_ms"]["p99"].get<double>());
  std::printf("  %-34s %.1f tok/s\n", "prefill, per request (P / TTFT)", d("prefill_tok_s"));
  std::printf("  %-34s %.1f tok/s\n", "decode, per request", d("decode_tok_s"));
  std::printf("  %-34s %.1f MiB\n", "peak RSS", d("peak_rss_bytes") / mib);
  std::printf("  %-34s %.1f MiB (%.0f B/token allocated, %.0f B/token stored)\n", "peak KV",
              d("kv_peak_bytes") / mib, d("kv_peak_bytes_per_token"), d("kv_bytes_per_token"));
}

int bench(BenchOptions& o) {
  if (o.model.empty()) o.model = default_model_path();
  const LengthDist pd = o.prompt_dist.empty() ? LengthDist{o.prompt_tokens, o.prompt_tokens}
                                              : parse_dist("--prompt-dist", o.prompt_dist);
  const LengthDist od = o.output_dist.empty() ? LengthDist{o.output_tokens, o.output_tokens}
                                              : parse_dist("--output-dist", o.output_dist);
  LoadedModel l = load_model_files(o.model, o.quiet, o.device);
  o.sched.kv_k = o.sched.kv_v = o.kv.format();
  o.sched.kv_k.validate(l.model->config().head_dim);
  o.sched.kv_budget_bytes = o.kv_budget_mb << 20;
  o.sched.threads = o.threads;
  o.sched.matmul = o.device.matmul_mode();
  const std::vector<int32_t> alphabet = prompt_alphabet(*l.tok);
  // The warm-up requests come from another seed, so the measured ones are
  // the same whatever --warmup is.
  const Workload warm =
      make_workload(o, l, alphabet, pd, od, o.warmup, o.seed ^ 0x9e3779b97f4a7c15ull);
  const Workload w = make_workload(o, l, alphabet, pd, od, o.requests, o.seed);
  engine::Scheduler sched(*l.model, *l.tok, o.sched);
  if (!warm.reqs.empty()) {
    if (!o.quiet) std::fprintf(stderr, "warm-up: %zu requests\n", warm.reqs.size());
    drive(sched, warm, o.concurrency);
  }
  if (!o.quiet) std::fprintf(stderr, "measuring: %zu requests\n", w.reqs.size());
  const RunResult r = drive(sched, w, o.concurrency);
  sched.shutdown();
  const nlohmann::json j = report(o, l, w, r, pd, od);
  if (o.json) {
    std::cout << j.dump() << "\n";
  } else {
    print_table(j);
  }
  return 0;
}

}  // namespace

Action add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "Throughput and latency of a synthetic workload through the serving scheduler");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("-m,--model", o->model,
                  "GGUF model file (default: $FERRY_MODEL or the cached SmolLM2)");
  cmd->add_option("--requests", o->requests, "Measured requests")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--concurrency", o->concurrency,
                  "Requests in flight at most (a new one is submitted as one finishes)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length in tokens (BOS included)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--output-tokens", o->output_tokens,
                  "Tokens generated per request (end-of-generation tokens ignored)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prompt-dist", o->prompt_dist,
                  "Prompt lengths drawn from uniform:A:B (inclusive; overrides --prompt-tokens)");
  cmd->add_option("--output-dist", o->output_dist,
                  "Output lengths drawn from uniform:A:B (overrides --output-tokens)");
  cmd->add_option("--seed", o->seed, "Seed of prompts, lengths and sampling")
      ->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 2.0));
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass (1: off)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", o->top_k, "Sample among the k most likely tokens (0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--repetition-penalty", o->repetition_penalty,
                  "Penalty on prompt and generated tokens (1: off)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 10.0));
  cmd->add_option("--frequency-penalty", o->frequency_penalty,
                  "Penalty per occurrence of a generated token (0: off)")
      ->capture_default_str()
      ->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--warmup", o->warmup, "Unmeasured requests run first, at the same concurrency")
      ->capture_default_str();
  o->kv.add_to(cmd);
  o->device.add_to(cmd);
  cmd->add_option("--kv-budget-mb", o->kv_budget_mb,
                  "KV cache budget for admission (0: a third of RAM)")
      ->capture_default_str();
  add_scheduler_options(cmd, o->sched);
  cmd->add_option("-t,--threads", o->threads, "Kernel threads (default: all cores)");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->add_flag("-q,--quiet", o->quiet, "No progress on stderr");
  return [o] { return bench(*o); };
}

}  // namespace ferry::cli
