// `ferry serve -m MODEL`: the OpenAI-compatible HTTP server (docs/SERVER.md).
#include <pthread.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/model_loading.h"
#include "core/error.h"
#include "engine/scheduler.h"
#include "server/http_server.h"

namespace ferry::cli {

namespace {

struct ServeOptions {
  std::string model;
  std::string model_name;
  std::string chat_template;  // file overriding the model's template
  server::ServerOptions http;
  size_t max_body_kb = 1024;
  engine::SchedulerOptions sched;  // --max-batch, --prefill-chunk, --step-tokens, --step-target-ms
  size_t kv_budget_mb = 0;         // 0: a third of physical memory
  DeviceOptions device;
  KvOptions kv{"f16"};
  size_t default_max_tokens = 0;  // 0: the rest of the context
  size_t threads = 0;
  double shutdown_grace = 30;
  bool quiet = false;
};

// More connections than the default soft limit of 1024 descriptors may be
// open at once; raise it to the hard limit.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("serve", "cannot open --chat-template file '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int serve(ServeOptions& o) {
  if (o.model.empty()) o.model = default_model_path();
  // Signals are taken by one thread with sigtimedwait(); block them before
  // any thread starts so that every thread inherits the mask. A client
  // that hangs up must not kill the process with SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  raise_fd_limit();

  LoadedModel l = load_model_files(o.model, o.quiet, o.device);
  if (!o.chat_template.empty()) l.chat.emplace(read_file(o.chat_template));

  engine::SchedulerOptions so = o.sched;
  so.kv_budget_bytes = o.kv_budget_mb << 20;
  so.kv_k = so.kv_v = o.kv.format();
  so.kv_k.validate(l.model->config().head_dim);
  so.threads = o.threads;
  so.matmul = o.device.matmul_mode();
  engine::Scheduler scheduler(*l.model, *l.tok, so);

  server::ServedModel served;
  served.id = o.model_name.empty() ? std::filesystem::path(o.model).stem().string() : o.model_name;
  served.tokenizer = l.tok.get();
  served.chat = l.chat ? &*l.chat : nullptr;
  served.context_length = l.model->config().context_length;
  served.default_max_tokens = o.default_max_tokens;
  served.defaults.prefill_chunk = so.prefill_chunk;
  served.defaults.kv_k = served.defaults.kv_v = so.kv_k;
  o.http.max_body_bytes = o.max_body_kb << 10;

  server::HttpServer http(scheduler, served, o.http);
  const int port = http.bind();
  std::fprintf(stderr,
               "ferry: serving %s on http://%s:%d (%s chat template, KV %s, budget %.0f MiB)\n",
               served.id.c_str(), o.http.host.c_str(), port, served.chat ? "with" : "no",
               so.kv_k.name().c_str(), scheduler.options().kv_budget_bytes / 1048576.0);

  std::atomic<bool> done{false};
  std::thread watcher([&] {
    const timespec tick{0, 100 * 1000 * 1000};
    int received = 0;
    while (!done) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig < 0) continue;  // timeout or EINTR
      if (++received == 1) {
        std::fprintf(stderr,
                     "ferry: %s: no new connections; finishing requests in flight "
                     "(up to %.0f s; again to stop now)\n",
                     strsignal(sig), o.shutdown_grace);
        http.shutdown(std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_grace * 1000)));
      } else {
        http.shutdown(std::chrono::milliseconds(0));
      }
    }
  });
  http.serve();
  done = true;
  watcher.join();
  scheduler.shutdown(/*drain=*/false);
  if (!o.quiet) std::fprintf(stderr, "ferry: stopped\n");
  return 0;
}

}  // namespace

Action add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (see docs/SERVER.md)");
  auto o = std::make_shared<ServeOptions>();
  cmd->add_option("-m,--model", o->model,
                  "GGUF model file (default: $FERRY_MODEL or the cached SmolLM2)");
  cmd->add_option("--host", o->http.host, "Address to listen on (loopback by default)")
      ->capture_default_str();
  cmd->add_option("--port", o->http.port, "Port (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->http.api_key, "Require 'Authorization: Bearer KEY' on /v1/*")
      ->envname("FERRY_API_KEY");
  cmd->add_option("--model-name", o->model_name, "Model id in the API (default: the file name)");
  cmd->add_option("--chat-template", o->chat_template,
                  "Jinja chat template file (overrides the model's)");
  add_scheduler_options(cmd, o->sched);
  cmd->add_option("--kv-budget-mb", o->kv_budget_mb,
                  "KV cache budget for admission (0: a third of RAM)")
      ->capture_default_str();
  o->kv.add_to(cmd);
  o->device.add_to(cmd);
  cmd->add_option("--default-max-tokens", o->default_max_tokens,
                  "max_tokens of requests that set none (0: the rest of the context); admission "
                  "reserves KV for prompt + max_tokens")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Kernel threads (default: all cores)");
  cmd->add_option("--max-connections", o->http.max_connections,
                  "Connection threads (concurrent clients)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--max-body-kb", o->max_body_kb, "Largest request body; larger ones get 413")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--shutdown-grace", o->shutdown_grace,
                  "Seconds requests in flight may run after SIGINT/SIGTERM")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("-q,--quiet", o->quiet, "No progress on stderr");
  return [o] { return serve(*o); };
}

}  // namespace ferry::cli
