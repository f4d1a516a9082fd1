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
  for (const char* args :
       {"run --max-tokens notanumber hi", "run --kv-bits 3 hi", "run --matmul fast hi",
        "bench --matmul fast", "bench --prompt-tokens 0", "bench --step-min-prefill 0",
        "serve --step-min-prefill x", "run --no-such-flag hi", "nosuchcommand", ""}) {
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

// --device names the problem: an unknown device, a build without CUDA, or
// (CUDA builds on machines without a GPU, as CI) no usable device.
TEST(Cli, UnavailableDeviceIsAClearError) {
  const std::string tiny = std::string(FERRY_TEST_DATA) + "/models/tiny-llama-f32.gguf";
  Result r = ferry("run -m " + tiny + " --device tpu hi", true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("[device] unknown device 'tpu'"), std::string::npos) << r.out;
  r = ferry("run -m " + tiny + " --device cuda:x hi", true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("cuda:x"), std::string::npos) << r.out;
  r = ferry("run -m " + tiny + " --device cuda --max-tokens 1 hi", true);
#ifdef FERRY_HAVE_CUDA
  if (r.code == 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("[cuda] no CUDA device is usable"), std::string::npos) << r.out;
#else
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("[device] this ferry was built without CUDA"), std::string::npos) << r.out;
#endif
}

// --fp8 is a GPU fast-mode option: on the CPU, or with the deterministic
// kernels, it is refused before anything runs.
TEST(Cli, Fp8OutsideItsModeIsAClearError) {
  const std::string tiny = std::string(FERRY_TEST_DATA) + "/models/tiny-llama-f32.gguf";
  Result r = ferry("run -m " + tiny + " --fp8 --no-deterministic hi", true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("[device] --fp8 needs --device cuda"), std::string::npos) << r.out;
  r = ferry("run -m " + tiny + " --device cuda --fp8 hi", true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("[device] --fp8 needs --no-deterministic"), std::string::npos) << r.out;
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

// `ferry bench` on the tiny test model: exact token counts and sane figures.
TEST(Cli, BenchJsonCountsAreExactAndFiguresSane) {
  const std::string model = std::string(FERRY_TEST_DATA) + "/models/tiny-llama-f32.gguf";
  const std::string args = "bench -q --json -m " + model +
                           " --requests 6 --concurrency 3 --prompt-tokens 9 --output-tokens 5 "
                           "--warmup 1 --prefill-chunk 4 -t 2";
  Result r = ferry(args);
  // (On failure, run again with stderr kept, to show why.)
  ASSERT_EQ(r.code, 0) << r.out << ferry(args, true).out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["requests"], 6);
  EXPECT_EQ(j["concurrency"], 3);
  EXPECT_EQ(j["prompt_tokens"], 6 * 9);
  EXPECT_EQ(j["output_tokens"], 6 * 5);
  for (const char* k : {"wall_s", "output_tok_s", "total_tok_s", "requests_per_s", "prefill_tok_s",
                        "decode_tok_s", "kv_peak_bytes_per_token"})
    EXPECT_GT(j[k].get<double>(), 0) << k;
  const double wall = j["wall_s"].get<double>();
  EXPECT_NEAR(j["output_tok_s"].get<double>(), 30 / wall, 1e-6 * 30 / wall);
  for (const char* k : {"ttft_ms", "itl_ms"}) {
    EXPECT_GT(j[k]["p50"].get<double>(), 0) << k;
    EXPECT_LE(j[k]["p50"].get<double>(), j[k]["p99"].get<double>()) << k;
    EXPECT_LE(j[k]["p99"].get<double>(), wall * 1000) << k;
  }
  EXPECT_GT(j["peak_rss_bytes"].get<double>(), 1 << 20);
  EXPECT_GT(j["kv_bytes_per_token"].get<size_t>(), 0u);
  // Three rows held at least their 9-token prompts at once.
  EXPECT_GE(j["kv_peak_bytes"].get<size_t>(), 3 * 9 * j["kv_bytes_per_token"].get<size_t>());

  // Drawn lengths: totals still exact sums, the same for the same seed.
  const std::string dist = "bench -q --json -m " + model +
                           " --requests 5 --concurrency 2 --prompt-dist uniform:3:12 "
                           "--output-dist uniform:1:4 --warmup 0 --seed 3";
  Result a = ferry(dist), b = ferry(dist);
  ASSERT_EQ(a.code, 0) << a.out;
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["prompt_tokens"], jb["prompt_tokens"]);
  EXPECT_EQ(ja["output_tokens"], jb["output_tokens"]);
  EXPECT_GE(ja["prompt_tokens"].get<size_t>(), 5u * 3);
  EXPECT_LE(ja["prompt_tokens"].get<size_t>(), 5u * 12);
  EXPECT_GE(ja["output_tokens"].get<size_t>(), 5u * 1);
  EXPECT_LE(ja["output_tokens"].get<size_t>(), 5u * 4);

  Result bad = ferry("bench -q -m " + model + " --prompt-dist uniform:9:3", true);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("--prompt-dist"), std::string::npos) << bad.out;
  Result help = ferry("bench --help");
  EXPECT_EQ(help.code, 0);
  for (const char* flag :
       {"--requests", "--concurrency", "--prompt-tokens", "--output-tokens", "--step-target-ms",
        "--step-min-prefill", "--kv-bits", "--warmup", "--json"})
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag;
}

}  // namespace
