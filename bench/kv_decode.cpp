// kv_decode: decode speed of SmolLM2 with each KV format at long context.
//
// For each context C: one prompt of C tokens (the evaluation text, repeated
// as needed) is prefilled once with f32 KV; its K/V are then stored into a
// one-row cache of each format through BatchKv::write, exactly as the model
// writes them (so the f16/q4 caches hold the same tokens at the same
// positions; only the K/V of layers above the first differ slightly from a
// prefill run natively in that format, which does not change the work a
// decode step does). A batch of B rows is B copies of that row (merge).
// Timed: `steps` one-token Model::forward calls per row, after
// reserve() made room for them, so no step reallocates. A speculative
// round around each repeat rolls the decoded tokens back (no bytes move),
// so every repeat decodes from the same C-token cache.
//
// Figures per (format, C, B): median wall seconds per step over all steps
// of all repeats, tokens/s = B / that, and the process CPU seconds per
// step (both threads), which other load on the machine disturbs less.
//
// Usage: kv_decode [--model PATH] [--text PATH] [--threads N]
//                  [--formats f16,q4g64] [--contexts 1024,4096]
//                  [--batches 1,8] [--steps N] [--repeats N]
#include <cstdio>
#include <cstdlib>
#include <sstream>
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
  std::string formats = "f16,q4g64";
  std::vector<size_t> contexts = {1024, 4096}, batches = {1, 8};
  size_t steps = 8, repeats = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  bench::parse_flags("kv_decode", argc, argv,
                     {bench::flag("--model", o.model), bench::flag("--text", o.text),
                      bench::flag("--threads", o.threads), bench::flag("--formats", o.formats),
                      bench::flag("--contexts", o.contexts), bench::flag("--batches", o.batches),
                      bench::flag("--steps", o.steps), bench::flag("--repeats", o.repeats)});
  return o;
}

// A one-row cache of `fmt` holding the same K/V as the one-row cache `src`
// (decoded from src's storage, encoded as BatchKv::write encodes).
kv::BatchKv transcode(const kv::BatchKv& src, const model::ModelConfig& cfg, KvFormat fmt) {
  const size_t len = src.table().row(0).length();
  const size_t D = cfg.head_dim, W = cfg.n_kv_heads * D;
  kv::BatchKv dst(cfg.kv_spec(fmt, fmt));
  dst.prepare_prefill(std::span<const size_t>(&len, 1));
  dst.reserve(std::span<const size_t>(&len, 1));
  std::vector<float> k(W), v(W);
  for (size_t l = 0; l < cfg.n_layers; ++l) {
    const kv::KvView view = src.capture(l);
    kernels::KvSide ks, vs;
    const size_t start = view.table().row(0).start;
    const kernels::AttentionTask t = view.task(0, start, start + len - 1, &ks, &vs);
    for (size_t j = 0; j < len; ++j) {
      for (size_t h = 0; h < cfg.n_kv_heads; ++h) {
        kernels::decode_kv(ks, D, h, t.seg[0].begin + j, &k[h * D]);
        kernels::decode_kv(vs, D, h, t.seg[0].begin + j, &v[h * D]);
      }
      dst.write(l, 0, j, k.data(), v.data());
    }
  }
  dst.commit(std::span<const size_t>(&len, 1));
  dst.finalize_prefill();
  return dst;
}

struct Result {
  double wall = 0, cpu = 0;  // median seconds per step
};

Result decode(const model::Model& m, const kernels::Context& ctx, kv::BatchKv& batch,
              const std::vector<int32_t>& feed, size_t steps, size_t repeats) {
  const size_t B = batch.rows();
  batch.reserve(std::vector<size_t>(B, steps));  // no step below reallocates
  std::vector<double> wall, cpu;
  std::vector<float> logits;
  for (size_t r = 0; r < repeats; ++r) {
    batch.spec_begin();
    for (size_t s = 0; s < steps; ++s) {
      std::vector<model::RowInput> rows(B);
      for (size_t b = 0; b < B; ++b)
        rows[b].tokens = std::span<const int32_t>(&feed[(s + b) % feed.size()], 1);
      const double w0 = bench::wall_seconds(), c0 = bench::cpu_seconds();
      m.forward(ctx, batch, rows, logits);
      wall.push_back(bench::wall_seconds() - w0);
      cpu.push_back(bench::cpu_seconds() - c0);
    }
    batch.spec_rollback(std::vector<size_t>(B, 0));
  }
  return {bench::median(wall), bench::median(cpu)};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    ThreadPool pool(o.threads);
    const kernels::Context ctx{&pool, best_cpu_path()};
    bench::print_machine("kv_decode", pool.size());
    auto model = model::load_model(o.model);
    const model::ModelConfig& cfg = model->config();
    const std::vector<int32_t> text = bench::eval_tokens(model->file(), o.text);
    const std::vector<KvFormat> fmts = bench::parse_formats(o.formats);
    std::printf("# steps %zu x repeats %zu per point; path %s\n", o.steps, o.repeats,
                std::string(cpu_path_name(ctx.path)).c_str());
    std::printf("%-7s %6s %3s %12s %10s %12s %6s\n", "format", "ctx", "B", "s/step(med)", "tok/s",
                "cpu_s/step", "load1");
    for (size_t C : o.contexts) {
      std::vector<int32_t> prompt(C);
      for (size_t i = 0; i < C; ++i) prompt[i] = text[i % text.size()];
      kv::BatchKv src(cfg.kv_spec(KvFormat::f32(), KvFormat::f32()));
      src.prepare_prefill(std::span<const size_t>(&C, 1));
      std::vector<float> logits;
      const double t0 = bench::wall_seconds();
      for (size_t s = 0; s < C; s += 256) {
        const model::RowInput in{
            std::span<const int32_t>(prompt).subspan(s, std::min<size_t>(256, C - s)), false};
        model->forward(ctx, src, std::span<const model::RowInput>(&in, 1), logits);
      }
      src.finalize_prefill();
      std::printf("# context %zu: f32 prefill %.1f s (load %s)\n", C, bench::wall_seconds() - t0,
                  bench::load_average().c_str());
      // The tokens fed while decoding: the text continuing after the prompt.
      std::vector<int32_t> feed(o.steps + 64);
      for (size_t i = 0; i < feed.size(); ++i) feed[i] = text[(C + i) % text.size()];
      for (const KvFormat& f : fmts) {
        const kv::BatchKv row = transcode(src, cfg, f);
        for (size_t B : o.batches) {
          std::vector<const kv::BatchKv*> parts(B, &row);
          kv::BatchKv batch = kv::BatchKv::merge(parts);
          const Result r = decode(*model, ctx, batch, feed, o.steps, o.repeats);
          std::string load = bench::load_average();
          std::printf("%-7s %6zu %3zu %12.4f %10.2f %12.4f %6s\n", f.name().c_str(), C, B, r.wall,
                      static_cast<double>(B) / r.wall, r.cpu,
                      load.substr(0, load.find(' ')).c_str());
          std::fflush(stdout);
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_decode: %s\n", e.what());
    return 1;
  }
}
