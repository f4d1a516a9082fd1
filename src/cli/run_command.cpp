// `ferry run -m MODEL "prompt"`: streams one generation to stdout.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/thread_pool.h"
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
  engine::SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;
};

int run(RunOptions& o, bool seed_given) {
  if (o.model.empty()) o.model = default_model_path();
  if (o.chat && o.raw) fail("run", "--chat and --raw exclude each other");
  if (seed_given) o.sampling.seed = o.seed;
  o.sampling.validate();

  const bool tty = isatty(STDERR_FILENO);
  if (!o.quiet) std::fprintf(stderr, "loading %s\n", o.model.c_str());
  int last_pct = -1;
  auto model = model::load_model(o.model, [&](double frac) {
    int pct = static_cast<int>(frac * 100);
    if (o.quiet || !tty || pct == last_pct) return;
    last_pct = pct;
    std::fprintf(stderr, "\rloading: %3d%%", pct);
  });
  if (!o.quiet && tty) std::fprintf(stderr, "\r\033[K");
  auto tok = text::Tokenizer::from_gguf(model->file());

  // Chat mode is the default when the model has a chat template.
  const std::string tmpl = model->file().get_string("tokenizer.chat_template", std::string());
  const bool chat = o.chat || (!o.raw && !tmpl.empty());
  std::string prompt_text = o.prompt;
  if (chat) {
    if (tmpl.empty()) fail("run", "--chat: the model has no tokenizer.chat_template");
    text::ChatTemplate ct(tmpl);
    std::vector<text::ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", o.prompt});
    auto tok_text = [&](int32_t id) { return id >= 0 ? tok->token_bytes(id) : std::string(); };
    prompt_text = ct.render(msgs, true, tok_text(tok->bos()), tok_text(tok->eos()));
  }

  engine::GenerationRequest req;
  req.prompt = tok->encode(prompt_text, /*parse_special=*/true);
  if (tok->add_bos() && (req.prompt.empty() || req.prompt.front() != tok->bos()))
    req.prompt.insert(req.prompt.begin(), tok->bos());
  req.max_tokens = o.max_tokens;
  req.sampling = o.sampling;
  req.stop = o.stop;
  req.ignore_eos = o.ignore_eos;
  req.prefill_chunk = o.prefill_chunk;

  ThreadPool pool(o.threads);
  kernels::Context ctx{&pool, best_cpu_path()};
  auto on_text = [&](std::string_view s) {
    if (o.json) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  engine::GenerationResult res = engine::generate(*model, *tok, ctx, req, on_text);

  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["prompt"] = prompt_text;
    j["prompt_tokens"] = req.prompt;
    j["tokens"] = res.tokens;
    j["logprobs"] = res.logprobs;
    j["text"] = res.text;
    j["finish_reason"] = engine::finish_reason_name(res.finish);
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fputs("\n", stdout);
  }
  if (!o.quiet) {
    double pre = res.prefill_seconds, dec = res.decode_seconds;
    size_t n_dec = res.tokens.size() > 1 ? res.tokens.size() - 1 : 0;
    std::fprintf(stderr,
                 "[%zu prompt tokens, %.1f tok/s prefill | %zu generated, %.1f tok/s decode | "
                 "%zu threads, %s, finish: %s]\n",
                 req.prompt.size(), pre > 0 ? req.prompt.size() / pre : 0.0, res.tokens.size(),
                 dec > 0 ? n_dec / dec : 0.0, pool.size(),
                 std::string(cpu_path_name(ctx.path)).c_str(),
                 engine::finish_reason_name(res.finish));
  }
  return 0;
}

}  // namespace

Action add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt (streams to stdout)");
  auto o = std::make_shared<RunOptions>();
  auto& s = o->sampling;
  s.temperature = 0.7f;
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: $FERRY_MODEL or the cached SmolLM2)");
  cmd->add_option("prompt", o->prompt, "The prompt")->required();
  cmd->add_flag("--chat", o->chat, "Apply the model's chat template (default when it has one)");
  cmd->add_flag("--raw", o->raw, "Use the prompt as is, without the chat template");
  cmd->add_option("--system", o->system, "System message in chat mode");
  cmd->add_option("--max-tokens", o->max_tokens, "Maximum tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", s.temperature, "Sampling temperature; 0 is greedy")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "Drop tokens below min_p * p(top)")->capture_default_str();
  cmd->add_option("--presence-penalty", s.presence_penalty, "OpenAI presence penalty")->capture_default_str();
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "OpenAI frequency penalty")->capture_default_str();
  cmd->add_option("--repetition-penalty", s.repetition_penalty, "HF-style repetition penalty")->capture_default_str();
  auto* seed = cmd->add_option("--seed", o->seed, "Sampling seed (same seed and prompt: same text)");
  cmd->add_option("--stop", o->stop, "Stop string (repeatable); not included in the output");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--json", o->json, "Print a JSON object with prompt/generated token ids and logprobs");
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prompt tokens per forward step")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("-q,--quiet", o->quiet, "No progress or speed report on stderr");
  return [o, seed] { return run(*o, seed->count() > 0); };
}

}  // namespace ferry::cli
