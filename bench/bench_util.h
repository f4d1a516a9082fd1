// Helpers shared by the measurement programs in bench/: the machine and
// its load (printed beside every figure, since this runs on shared cores),
// the evaluation text's tokens, process memory and clocks.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "gguf/gguf.h"
#include "kernels/kv_format.h"
#include "text/tokenizer.h"

namespace ferry::bench {

// The model the README's set-up fetches (what `ferry` uses without -m).
inline std::string default_model() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/ferry/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Command-line options of the measurement programs: "--key value" pairs,
// each bound to a field by flag(); an unknown key or a missing value fails
// naming the program.
struct Flag {
  const char* key;
  std::function<void(const std::string&)> set;
};
inline void assign(std::string& f, const std::string& v) {
  f = v;
}
inline void assign(size_t& f, const std::string& v) {
  f = std::stoul(v);
}
inline void assign(bool& f, const std::string& v) {
  f = v != "0";
}
// "1,2,3" into {1, 2, 3}.
inline void assign(std::vector<size_t>& f, const std::string& v) {
  f.clear();
  std::stringstream ss(v);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) f.push_back(std::stoul(item));
}
template <class T>
Flag flag(const char* key, T& field) {
  return {key, [&field](const std::string& v) { assign(field, v); }};
}
inline void parse_flags(const char* program, int argc, char** argv,
                        std::initializer_list<Flag> flags) {
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    const Flag* f = nullptr;
    for (const Flag& c : flags)
      if (k == c.key) f = &c;
    if (!f) fail(program, "unknown option ", k);
    if (i + 1 >= argc) fail(program, "option ", k, " needs a value");
    f->set(argv[i + 1]);
  }
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("bench", "cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first line of /proc/loadavg without its last two fields ("1m 5m 15m").
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// Prints the context every figure needs on a shared machine, and makes
// stdout line-buffered so progress shows when it is redirected to a file
// (bench/profile_decode.sh waits for the end of the prefill that way).
inline void print_machine(const char* program, size_t threads) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("# %s: cpu '%s', %u hw threads, %zu ferry threads, load %s\n", program,
              cpu_model().c_str(), std::thread::hardware_concurrency(), threads,
              load_average().c_str());
}

// Resident set size of this process in bytes (/proc/self/statm, field 2).
inline size_t rss_bytes() {
  std::ifstream in("/proc/self/statm");
  size_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Process CPU time (all threads) in seconds: less sensitive than wall time
// to other processes on the cores, though not to their cache pressure.
inline double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The evaluation text encoded by the model's own tokenizer (no BOS:
// SmolLM2's GGUF sets add_bos_token false).
inline std::vector<int32_t> eval_tokens(const gguf::File& file, const std::string& path) {
  const auto tok = text::Tokenizer::from_gguf(file);
  std::vector<int32_t> ids = tok->encode(read_text_file(path), /*parse_special=*/false);
  if (tok->add_bos()) ids.insert(ids.begin(), tok->bos());
  return ids;
}

// Comma-separated KV formats ("f16,q4g64").
inline std::vector<kernels::KvFormat> parse_formats(const std::string& list) {
  std::vector<kernels::KvFormat> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(kernels::parse_kv_format(item));
  return out;
}

// The formats of `list` that can store head_dim; prints why others are
// left out (an affine group wider than head_dim cannot be stored, since
// groups run along head_dim).
inline std::vector<kernels::KvFormat> usable_formats(const std::string& list, size_t head_dim) {
  std::vector<kernels::KvFormat> out;
  for (const kernels::KvFormat& f : parse_formats(list)) {
    try {
      f.validate(head_dim);
      out.push_back(f);
    } catch (const Error& e) {
      std::printf("# skipped %s: %s\n", f.name().c_str(), e.what());
    }
  }
  return out;
}

}  // namespace ferry::bench
