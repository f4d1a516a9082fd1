// `ferry run -m MODEL "prompt"`: streams one generation to stdout.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/model_loading.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/batch_engine.h"
#include "engine/generate.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace ferry::cli {

std::string default_model_path() {
  if (const char* env = std::getenv("FERRY_MODEL")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/ferry/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

namespace {

struct RunOptions {
  std::string model;
  std::string prompt;
  std::string system;
  bool chat = false, raw = false, json = false, quiet = false, ignore_eos = false;
  size_t max_tokens = 256;
  size_t threads = 0;
  size_t prefill_chunk = 256;
  std::string prompts_file;  // JSONL batch mode
  size_t batch = 8;
  DeviceOptions device;
  KvOptions kv{"f32"};
  engine::SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;
};

using Loaded = LoadedModel;

Loaded load(const RunOptions& o) {
  return load_model_files(o.model, o.quiet, o.device);
}

// Token ids of a chat conversation (rendered with the model's template) or
// of raw text.
std::vector<int32_t> encode(const Loaded& l, const std::string& text,
                            const std::vector<text::ChatMessage>* messages) {
  std::string prompt = text;
  if (messages) {
    if (!l.chat) fail("run", "chat input, but the model has no tokenizer.chat_template");
    auto tok_text = [&](int32_t id) { return id >= 0 ? l.tok->token_bytes(id) : std::string(); };
    prompt = l.chat->render(*messages, true, tok_text(l.tok->bos()), tok_text(l.tok->eos()));
  }
  std::vector<int32_t> ids = l.tok->encode(prompt, /*parse_special=*/true);
  if (l.tok->add_bos() && (ids.empty() || ids.front() != l.tok->bos()))
    ids.insert(ids.begin(), l.tok->bos());
  return ids;
}

engine::GenerationRequest base_request(const RunOptions& o) {
  engine::GenerationRequest req;
  req.max_tokens = o.max_tokens;
  req.sampling = o.sampling;
  req.stop = o.stop;
  req.ignore_eos = o.ignore_eos;
  req.prefill_chunk = o.prefill_chunk;
  req.kv_k = req.kv_v = o.kv.format();
  return req;
}

void report(const RunOptions& o, size_t prompt_tokens, size_t generated, double prefill_s,
            double decode_s, size_t threads, CpuPath path, const char* finish) {
  if (o.quiet) return;
  size_t n_dec = generated > 1 ? generated - 1 : 0;
  std::fprintf(stderr,
               "[%zu prompt tokens, %.1f tok/s prefill | %zu generated, %.1f tok/s decode | "
               "%zu threads, %s%s%s]\n",
               prompt_tokens, prefill_s > 0 ? prompt_tokens / prefill_s : 0.0, generated,
               decode_s > 0 ? n_dec / decode_s : 0.0, threads,
               std::string(cpu_path_name(path)).c_str(), finish ? ", finish: " : "",
               finish ? finish : "");
}

int run_single(RunOptions& o, const Loaded& l, const kernels::Context& ctx) {
  const bool chat = o.chat || (!o.raw && l.chat.has_value());
  std::vector<text::ChatMessage> msgs;
  if (!o.system.empty()) msgs.push_back({"system", o.system});
  msgs.push_back({"user", o.prompt});
  engine::GenerationRequest req = base_request(o);
  req.prompt = encode(l, o.prompt, chat ? &msgs : nullptr);
  // Text output shows no logprobs: skip the vocabulary-wide pass per token
  // (0.4-0.8 ms a token on this machine's 49k-128k vocabularies).
  req.logprobs = o.json;
  auto on_text = [&](std::string_view s) {
    if (o.json) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  engine::GenerationResult res = engine::generate(*l.model, *l.tok, ctx, req, on_text);
  if (o.json) {
    nlohmann::json j;
    j["prompt_tokens"] = req.prompt;
    j["tokens"] = res.tokens;
    j["logprobs"] = res.logprobs;
    j["text"] = res.text;
    j["finish_reason"] = engine::finish_reason_name(res.finish);
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fputs("\n", stdout);
  }
  report(o, req.prompt.size(), res.tokens.size(), res.prefill_seconds, res.decode_seconds,
         ctx.pool->size(), ctx.path, engine::finish_reason_name(res.finish));
  return 0;
}

// One JSONL line to a request. Fields follow OpenAI's request names.
engine::GenerationRequest parse_line(const RunOptions& o, const Loaded& l, const std::string& line,
                                     size_t index) {
  auto where = [&] { return o.prompts_file + ":" + std::to_string(index + 1); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    fail("run", where(), ": invalid JSON: ", e.what());
  }
  if (!j.is_object()) fail("run", where(), ": each line must be a JSON object");
  engine::GenerationRequest req = base_request(o);
  // Without a seed, a line's seed is its index: reruns and any --batch give
  // the same text.
  req.sampling.seed = o.sampling.seed ? *o.sampling.seed + index : index;
  try {
    if (j.contains("messages")) {
      std::vector<text::ChatMessage> msgs;
      for (const auto& m : j.at("messages"))
        msgs.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
      req.prompt = encode(l, "", &msgs);
    } else if (j.contains("prompt")) {
      req.prompt = encode(l, j.at("prompt").get<std::string>(), nullptr);
    } else {
      fail("run", where(), ": needs \"prompt\" or \"messages\"");
    }
    auto num = [&](const char* k, auto& field) {
      if (j.contains(k)) field = j.at(k).get<std::decay_t<decltype(field)>>();
    };
    num("max_tokens", req.max_tokens);
    num("temperature", req.sampling.temperature);
    num("top_p", req.sampling.top_p);
    num("top_k", req.sampling.top_k);
    num("min_p", req.sampling.min_p);
    num("presence_penalty", req.sampling.presence_penalty);
    num("frequency_penalty", req.sampling.frequency_penalty);
    num("repetition_penalty", req.sampling.repetition_penalty);
    num("ignore_eos", req.ignore_eos);
    if (j.contains("seed")) req.sampling.seed = j.at("seed").get<uint64_t>();
    if (j.contains("stop")) {
      const auto& st = j.at("stop");
      req.stop = st.is_string() ? std::vector<std::string>{st.get<std::string>()}
                                : st.get<std::vector<std::string>>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail("run", where(), ": ", e.what());
  }
  try {
    req.sampling.validate();
  } catch (const Error& e) {
    fail("run", where(), ": ", e.what());
  }
  return req;
}

int run_batch(RunOptions& o, const Loaded& l, const kernels::Context& ctx) {
  std::ifstream in(o.prompts_file);
  if (!in) fail("run", "cannot open --prompts file '", o.prompts_file, "'");
  engine::BatchEngine eng(*l.model, *l.tok, ctx, o.batch, o.kv.format(), o.kv.format());
  std::vector<engine::GenerationRequest> reqs;
  std::string line;
  for (size_t n = 0; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    reqs.push_back(parse_line(o, l, line, n));
    eng.submit(reqs.back());
  }
  std::vector<std::optional<engine::GenerationResult>> done(reqs.size());
  size_t printed = 0, generated = 0, prompt_tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  eng.run([&](size_t id, engine::GenerationResult&& r) {
    generated += r.tokens.size();
    done[id] = std::move(r);
    // Print in input order as soon as the next one is ready.
    while (printed < done.size() && done[printed]) {
      const auto& res = *done[printed];
      nlohmann::json j;
      j["index"] = printed;
      j["text"] = res.text;
      j["prompt_tokens"] = reqs[printed].prompt.size();
      j["tokens"] = res.tokens;
      j["logprobs"] = res.logprobs;
      j["finish_reason"] = engine::finish_reason_name(res.finish);
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      done[printed].reset();
      ++printed;
    }
  });
  std::cout.flush();
  for (const auto& r : reqs) prompt_tokens += r.prompt.size();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.quiet)
    std::fprintf(stderr,
                 "[%zu requests, %zu prompt tokens, %zu generated in %.2f s: %.1f tok/s | "
                 "batch %zu (peak %zu), KV %s, peak KV %.1f MiB]\n",
                 reqs.size(), prompt_tokens, generated, secs, secs > 0 ? generated / secs : 0.0,
                 o.batch, eng.peak_batch(), o.kv.format().name().c_str(),
                 eng.peak_kv_bytes() / 1048576.0);
  return 0;
}

int run(RunOptions& o, bool seed_given) {
  if (o.model.empty()) o.model = default_model_path();
  if (o.chat && o.raw) fail("run", "--chat and --raw exclude each other");
  if (o.prompts_file.empty() == o.prompt.empty())
    fail("run", "give either a prompt or --prompts FILE.jsonl");
  if (seed_given) o.sampling.seed = o.seed;
  o.sampling.validate();
  Loaded l = load(o);
  ThreadPool pool(o.threads);
  kernels::Context ctx{&pool, best_cpu_path(), o.device.matmul_mode()};
  return o.prompts_file.empty() ? run_single(o, l, ctx) : run_batch(o, l, ctx);
}

}  // namespace

Action add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt (streams to stdout)");
  auto o = std::make_shared<RunOptions>();
  auto& s = o->sampling;
  s.temperature = 0.7f;
  cmd->add_option("-m,--model", o->model,
                  "GGUF model file (default: $FERRY_MODEL or the cached SmolLM2)");
  cmd->add_option("prompt", o->prompt, "The prompt (or use --prompts)");
  cmd->add_option("--prompts", o->prompts_file,
                  "JSONL file of requests ({\"prompt\" or \"messages\", \"max_tokens\", sampling "
                  "fields}); writes one JSON line per request, in input order");
  cmd->add_option("--batch", o->batch, "Rows decoded together in --prompts mode")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  o->kv.add_to(cmd);
  o->device.add_to(cmd);
  cmd->add_flag("--chat", o->chat, "Apply the model's chat template (default when it has one)");
  cmd->add_flag("--raw", o->raw, "Use the prompt as is, without the chat template");
  cmd->add_option("--system", o->system, "System message in chat mode");
  cmd->add_option("--max-tokens", o->max_tokens, "Maximum tokens to generate")
      ->capture_default_str();
  cmd->add_option("--temperature", s.temperature, "Sampling temperature; 0 is greedy")
      ->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Keep the k most likely tokens (0: off)")
      ->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "Drop tokens below min_p * p(top)")->capture_default_str();
  cmd->add_option("--presence-penalty", s.presence_penalty, "OpenAI presence penalty")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "OpenAI frequency penalty")
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", s.repetition_penalty, "HF-style repetition penalty")
      ->capture_default_str();
  auto* seed =
      cmd->add_option("--seed", o->seed, "Sampling seed (same seed and prompt: same text)");
  cmd->add_option("--stop", o->stop, "Stop string (repeatable); not included in the output");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--json", o->json,
                "Print a JSON object with prompt/generated token ids and logprobs");
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prompt tokens per forward step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("-q,--quiet", o->quiet, "No progress or speed report on stderr");
  return [o, seed] { return run(*o, seed->count() > 0); };
}

}  // namespace ferry::cli
