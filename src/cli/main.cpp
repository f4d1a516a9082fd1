// ferry: LLM inference on GGUF models. Subcommands live in src/cli/*.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"ferry: continuous-batching LLM inference engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ferry 0.1.0");
  ferry::cli::Action run = ferry::cli::add_run_command(app);
  ferry::cli::Action serve = ferry::cli::add_serve_command(app);
  ferry::cli::Action bench = ferry::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (app.got_subcommand("run")) return run();
    if (app.got_subcommand("serve")) return serve();
    if (app.got_subcommand("bench")) return bench();
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
