// The ferry executable's subcommands. Each registers its options on a
// CLI11 sub-app and returns the action to run once arguments parsed.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace ferry::cli {

using Action = std::function<int()>;

// `ferry run`: generate from one prompt (or a JSONL batch).
Action add_run_command(CLI::App& app);

// `ferry serve`: the OpenAI-compatible HTTP server.
Action add_serve_command(CLI::App& app);

// `ferry bench`: a synthetic workload through the serving scheduler.
Action add_bench_command(CLI::App& app);

// The default model: $FERRY_MODEL, else the file the README's set-up
// fetches into ~/.cache/ferry/models/.
std::string default_model_path();

}  // namespace ferry::cli
