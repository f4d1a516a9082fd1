// kv_memory: bytes per token of each KV format, three ways.
//
//   accounting  BatchKv::bytes_per_token(): what admission reserves per
//               token (all 30 layers, K and V)
//   allocated   allocated_bytes() of a real cache after a batched prefill
//               of SmolLM2 (rows of different lengths, right-aligned), per
//               allocated slot (row_capacity * col_capacity) and per token
//               actually stored (padding and column rounding included)
//   rss         growth of the process's resident set when a large cache
//               (8 rows x 4096 tokens, every token written) is built, per
//               allocated slot; each format in a fresh child process so
//               memory freed by one format cannot hide another's growth
// Ratios are to f16's figure in the same column.
//
// Usage: kv_memory [--model PATH] [--text PATH] [--threads N]
//                  [--formats f32,f16,...] [--rss-rows N] [--rss-tokens N]
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cpu.h"
#include "core/thread_pool.h"
#include "kv/batch_kv.h"
#include "model/model.h"

namespace {

using namespace ferry;
using kernels::KvFormat;

struct Options {
  std::string model = bench::default_model();
  std::string text = FERRY_BENCH_TEXT;
  size_t threads = 0;
  std::string formats = "f32,f16,bf16,q8g32,q8g64,q8g128,q4g32,q4g64,q4g128";
  size_t rss_rows = 8, rss_tokens = 4096;
};

Options parse(int argc, char** argv) {
  Options o;
  bench::parse_flags(
      "kv_memory", argc, argv,
      {bench::flag("--model", o.model), bench::flag("--text", o.text),
       bench::flag("--threads", o.threads), bench::flag("--formats", o.formats),
       bench::flag("--rss-rows", o.rss_rows), bench::flag("--rss-tokens", o.rss_tokens)});
  return o;
}

struct Figures {
  size_t accounting = 0;
  double per_slot = 0, per_stored = 0;
  size_t allocated = 0, slots = 0, stored = 0;
  double rss_per_slot = 0;
  size_t rss_delta = 0, rss_slots = 0;
};

// Builds a rows x tokens cache in `spec` with every token written (values
// from a fixed generator) and returns the RSS growth and the slot count.
std::pair<size_t, size_t> rss_growth(const kv::KvSpec& spec, size_t rows, size_t tokens) {
  const size_t before = bench::rss_bytes();
  kv::BatchKv kv(spec);
  const std::vector<size_t> lengths(rows, tokens);
  kv.prepare_prefill(lengths);
  kv.reserve(lengths);
  const size_t W = spec.n_kv_heads * spec.head_dim;
  std::vector<float> k(W), v(W);
  uint32_t s = 777;
  for (size_t l = 0; l < spec.layers.size(); ++l)
    for (size_t b = 0; b < rows; ++b)
      for (size_t t = 0; t < tokens; ++t) {
        for (size_t i = 0; i < W; ++i) {
          s = s * 1664525u + 1013904223u;
          k[i] = static_cast<float>(s >> 8) * (1.0f / 8388608.0f) - 1.0f;
          v[i] = -k[i];
        }
        kv.write(l, b, t, k.data(), v.data());
      }
  kv.commit(lengths);
  kv.finalize_prefill();
  return {bench::rss_bytes() - before, kv.row_capacity() * kv.col_capacity()};
}

// Runs rss_growth in a child process; returns {delta, slots}.
std::pair<size_t, size_t> rss_growth_isolated(const kv::KvSpec& spec, size_t rows, size_t tokens) {
  int fd[2];
  if (pipe(fd) != 0) fail("kv_memory", "pipe failed");
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) fail("kv_memory", "fork failed");
  if (pid == 0) {
    close(fd[0]);
    size_t out[2] = {0, 0};
    try {
      const auto r = rss_growth(spec, rows, tokens);
      out[0] = r.first;
      out[1] = r.second;
    } catch (...) {
    }
    const ssize_t n = write(fd[1], out, sizeof out);
    _exit(n == static_cast<ssize_t>(sizeof out) ? 0 : 1);
  }
  close(fd[1]);
  size_t out[2] = {0, 0};
  const ssize_t n = read(fd[0], out, sizeof out);
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (n != static_cast<ssize_t>(sizeof out) || out[1] == 0)
    fail("kv_memory", "child measuring RSS failed");
  return {out[0], out[1]};
}

// A batched prefill of rows of different lengths taken from the text, in
// chunks of 128 tokens per row per step (rows without tokens sit out).
void prefill(const model::Model& m, const kernels::Context& ctx, kv::BatchKv& kv,
             const std::vector<int32_t>& ids, const std::vector<size_t>& lengths) {
  kv.prepare_prefill(lengths);
  constexpr size_t kChunk = 128;
  size_t longest = 0;
  for (size_t l : lengths) longest = std::max(longest, l);
  std::vector<float> logits;
  for (size_t s = 0; s < longest; s += kChunk) {
    std::vector<model::RowInput> rows(lengths.size());
    for (size_t b = 0; b < lengths.size(); ++b) {
      const size_t off = 97 * b;  // rows start at different places in the text
      if (s < lengths[b])
        rows[b].tokens =
            std::span<const int32_t>(ids).subspan(off + s, std::min(kChunk, lengths[b] - s));
    }
    m.forward(ctx, kv, rows, logits);
  }
  kv.finalize_prefill();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    ThreadPool pool(o.threads);
    const kernels::Context ctx{&pool, best_cpu_path()};
    bench::print_machine("kv_memory", pool.size());
    auto model = model::load_model(o.model);
    const model::ModelConfig& cfg = model->config();
    const std::vector<int32_t> ids = bench::eval_tokens(model->file(), o.text);
    const std::vector<size_t> lengths = {64, 128, 192, 256};
    FERRY_CHECK(ids.size() >= 97 * lengths.size() + 256, "kv_memory", "text too short");

    std::map<std::string, Figures> figs;
    const std::vector<KvFormat> fmts = bench::usable_formats(o.formats, model->config().head_dim);
    for (const KvFormat& f : fmts) {
      const kv::KvSpec spec = cfg.kv_spec(f, f);
      Figures& g = figs[f.name()];
      kv::BatchKv kv(spec);
      g.accounting = kv.bytes_per_token();
      prefill(*model, ctx, kv, ids, lengths);
      g.allocated = kv.allocated_bytes();
      g.slots = kv.row_capacity() * kv.col_capacity();
      for (size_t l : lengths) g.stored += l;
      g.per_slot = static_cast<double>(g.allocated) / static_cast<double>(g.slots);
      g.per_stored = static_cast<double>(g.allocated) / static_cast<double>(g.stored);
      const auto [delta, slots] = rss_growth_isolated(spec, o.rss_rows, o.rss_tokens);
      g.rss_delta = delta;
      g.rss_slots = slots;
      g.rss_per_slot = static_cast<double>(delta) / static_cast<double>(slots);
    }

    const Figures* ref = figs.count("f16") ? &figs["f16"] : nullptr;
    auto ratio = [&](double x, double r) { return ref ? x / r : 0.0; };
    std::printf("# prefill rows of 64/128/192/256 tokens; rss cache %zu x %zu tokens; load %s\n",
                o.rss_rows, o.rss_tokens, bench::load_average().c_str());
    std::printf("%-7s %10s %8s | %12s %8s %9s %9s | %10s %10s %8s\n", "format", "B/token", "x_f16",
                "alloc_bytes", "slots", "B/slot", "B/stored", "rss_MiB", "rss_B/slot", "x_f16");
    for (const KvFormat& f : fmts) {
      const Figures& g = figs[f.name()];
      std::printf(
          "%-7s %10zu %8.4f | %12zu %8zu %9.1f %9.1f | %10.1f %10.1f %8.4f\n", f.name().c_str(),
          g.accounting,
          ratio(static_cast<double>(g.accounting), ref ? static_cast<double>(ref->accounting) : 1),
          g.allocated, g.slots, g.per_slot, g.per_stored,
          static_cast<double>(g.rss_delta) / (1024.0 * 1024.0), g.rss_per_slot,
          ratio(g.rss_per_slot, ref ? ref->rss_per_slot : 1));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_memory: %s\n", e.what());
    return 1;
  }
}
