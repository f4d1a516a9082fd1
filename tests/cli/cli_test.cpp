// End-to-end tests of the ferry executable on the default model.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

struct Result {
  int code;
  std::string out;
};

// Runs the ferry binary with `args` (shell-quoted by the caller); stdout
// only unless merge_stderr.
Result ferry(const std::string& args, bool merge_stderr = false) {
  std::string cmd =
      std::string(FERRY_BINARY) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string temp_file(const std::string& name, const std::string& content) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << content;
  return path;
}

TEST(Cli, HelpOnEverySubcommand) {
  Result top = ferry("--help");
  EXPECT_EQ(top.code, 0);
  EXPECT_NE(top.out.find("run"), std::string::npos);
  Result run = ferry("run --help");
  EXPECT_EQ(run.code, 0);
  for (const char* flag : {"--max-tokens", "--temperature", "--top-p", "--top-k", "--min-p",
                           "--seed", "--stop", "--json", "--prompts", "--batch", "--kv-bits"})
    EXPECT_NE(run.out.find(flag), std::string::npos) << flag;
}

TEST(Cli, BadArgumentsGiveUsageErrorsNotCrashes) {
  for (const char* args : {"run --max-tokens notanumber hi", "run --kv-bits 3 hi",
                           "run --no-such-flag hi", "nosuchcommand", ""}) {
    Result r = ferry(args, true);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_LT(r.code, 128) << args;  // not killed by a signal
    EXPECT_FALSE(r.out.empty()) << args;
  }
  Result r = ferry("run --top-p 0 hi", true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("top_p"), std::string::npos) << r.out;
}

TEST(Cli, MissingOrCorruptModelIsAClearError) {
  Result r = ferry("run -m /nonexistent/model.gguf hi", true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/model.gguf"), std::string::npos) << r.out;
  std::string bad = temp_file("bad.gguf", "GGUF but not really a gguf file");
  r = ferry("run -m " + bad + " hi", true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("bad.gguf"), std::string::npos) << r.out;
}

TEST(Cli, GreedyJsonIsDeterministicAndWellFormed) {
  Result a = ferry("run -q --temperature 0 --max-tokens 12 --json 'What is 2+2?'");
  ASSERT_EQ(a.code, 0);
  auto j = nlohmann::json::parse(a.out);
  EXPECT_GT(j["prompt_tokens"].size(), 5u);
  EXPECT_LE(j["tokens"].size(), 12u);
  EXPECT_EQ(j["tokens"].size(), j["logprobs"].size());
  for (const auto& lp : j["logprobs"]) EXPECT_LE(lp.get<double>(), 0.0);
  Result b = ferry("run -q --temperature 0 --max-tokens 12 --json 'What is 2+2?'");
  EXPECT_EQ(a.out, b.out);
}

TEST(Cli, SameSeedSameText) {
  const std::string args =
      "run -q --seed 11 --temperature 0.9 --max-tokens 16 --json 'Tell a story'";
  Result a = ferry(args), b = ferry(args);
  ASSERT_EQ(a.code, 0);
  EXPECT_EQ(a.out, b.out);
}

TEST(Cli, StopStringEndsGenerationAndIsNotEmitted) {
  Result r = ferry(
      "run -q --raw --temperature 0 --max-tokens 40 --ignore-eos --stop ' ' --json "
      "'The capital of France is'");
  ASSERT_EQ(r.code, 0);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["text"].get<std::string>().find(' '), std::string::npos) << j["text"];
}

// Issue 3, item 13: --batch 1 (solo) and --batch 8 give byte-identical
// output, rows joining and leaving as others finish; also with 4-bit KV.
TEST(Cli, BatchOutputIsByteIdenticalToSolo) {
  std::ostringstream jsonl;
  const char* prompts[] = {"Hello",
                           "Write a poem about the sea.",
                           "1, 2, 3, 4,",
                           "Explain gravity to a child.",
                           "def fib(n):",
                           "Bonjour, je suis",
                           "List three colors.",
                           "The quick brown fox",
                           "Why is the sky blue?",
                           "Once upon a time"};
  for (int i = 0; i < 10; ++i) {
    nlohmann::json j;
    if (i % 3 == 0) {
      j["messages"] = {{{"role", "user"}, {"content", prompts[i]}}};
    } else {
      j["prompt"] = prompts[i];
    }
    j["max_tokens"] = 3 + (i * 7) % 17;
    if (i % 2) j["temperature"] = 0.8;
    if (i % 4 == 1) j["seed"] = 100 + i;
    if (i % 2 == 0) j["temperature"] = 0;
    jsonl << j.dump() << "\n";
  }
  std::string file = temp_file("batch.jsonl", jsonl.str());
  for (std::string kv : {"", "--kv-bits 4 --kv-group 32 "}) {
    Result solo = ferry("run -q " + kv + "--prompts " + file + " --batch 1");
    Result batched = ferry("run -q " + kv + "--prompts " + file + " --batch 8");
    ASSERT_EQ(solo.code, 0);
    EXPECT_EQ(solo.out, batched.out) << kv;
    size_t lines = 0;
    std::istringstream in(solo.out);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      EXPECT_EQ(j["index"], lines);
      ++lines;
    }
    EXPECT_EQ(lines, 10u);
  }
}

TEST(Cli, BadJsonlLineNamesTheLine) {
  std::string file = temp_file("bad.jsonl", "{\"prompt\": \"hi\"}\n{not json}\n");
  Result r = ferry("run -q --prompts " + file, true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("bad.jsonl:2"), std::string::npos) << r.out;
}

}  // namespace
