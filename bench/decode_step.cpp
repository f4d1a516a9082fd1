// decode_step: where a single-stream decode step's time goes.
//
// Prefills a short prompt into a one-row cache, then times `steps`
// one-token Model::forward calls (greedy: each feeds the previous step's
// argmax, as `ferry run --temperature 0` does), `repeats` times from the
// same cache (a speculative round rolls the tokens back, no bytes move).
// Prints the median ms/step and tokens/s of the forward alone, plus:
//  - with --ops: the model runs on a Backend that wraps the CPU backend and
//    times every op call, so the table splits a step by op and by matmul
//    weight (named from the call order of model/llama.cpp). The wrapper's
//    clock reads add ~50 ns per op; the arithmetic is the CPU backend's.
//  - the cost of one empty ThreadPool::parallel_for (the dispatch and
//    wake-up every parallel op pays), back to back and after a 200 us gap
//    (a worker that went to sleep must be woken);
//  - the sampler: greedy with the raw-distribution logprob, as `ferry run`
//    samples each token.
//
// Usage: decode_step [--model PATH] [--threads N] [--matmul exact|int8]
//                    [--kv f32] [--prompt-tokens 4] [--steps 64]
//                    [--repeats 5] [--ops 0|1]
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cpu.h"
#include "core/thread_pool.h"
#include "engine/sampler.h"
#include "kv/batch_kv.h"
#include "model/backend.h"
#include "model/model.h"

namespace {

using namespace ferry;
using kernels::KvFormat;

struct Options {
  std::string model = bench::default_model();
  size_t threads = 0;
  std::string matmul = "int8", kv = "f32";
  size_t prompt_tokens = 4, steps = 64, repeats = 5;
  bool ops = false;
};

Options parse(int argc, char** argv) {
  Options o;
  bench::parse_flags(
      "decode_step", argc, argv,
      {bench::flag("--model", o.model), bench::flag("--threads", o.threads),
       bench::flag("--matmul", o.matmul), bench::flag("--kv", o.kv),
       bench::flag("--prompt-tokens", o.prompt_tokens), bench::flag("--steps", o.steps),
       bench::flag("--repeats", o.repeats), bench::flag("--ops", o.ops)});
  return o;
}

// Seconds per label, summed over the timed steps.
struct OpTimes {
  std::map<std::string, double> seconds;
  std::map<std::string, size_t> calls;
  bool on = false;
  void add(const std::string& label, double s) {
    if (!on) return;
    seconds[label] += s;
    ++calls[label];
  }
};

// The CPU backend with a clock around every op. Matmuls are named by their
// place in a layer (llama.cpp's order: q k v o gate up down, then the head).
class TimingBackend final : public model::Backend {
 public:
  TimingBackend(const kernels::Context& ctx, size_t n_layers, OpTimes& t)
      : cpu_(ctx), n_layers_(n_layers), t_(t) {}
  std::string name() const override { return "cpu"; }
  kernels::WeightView weight(const kernels::WeightView& h) override { return cpu_.weight(h); }
  const float* vector(const float* h, size_t n) override { return cpu_.vector(h, n); }
  std::shared_ptr<kv::KvAllocator> kv_allocator() const override { return cpu_.kv_allocator(); }
  void activations(std::span<const size_t> sizes, std::span<float*> out) override {
    matmul_index_ = 0;
    timed("activations", [&] { cpu_.activations(sizes, out); });
  }
  void embed(const kernels::WeightView& table, std::span<const int32_t> tokens,
             float* out) override {
    timed("embed", [&] { cpu_.embed(table, tokens, out); });
  }
  void rmsnorm(const float* x, const float* w, size_t n_rows, size_t dim, float eps,
               float* out) override {
    timed("rmsnorm", [&] { cpu_.rmsnorm(x, w, n_rows, dim, eps, out); });
  }
  void matmul(const kernels::WeightView& w, const float* x, size_t n_rows, float* y) override {
    timed(matmul_label(1), [&] { cpu_.matmul(w, x, n_rows, y); });
  }
  void matmul_many(std::span<const kernels::WeightView> w, const float* x, size_t n_rows,
                   std::span<float* const> y) override {
    timed(matmul_label(w.size()), [&] { cpu_.matmul_many(w, x, n_rows, y); });
  }
  void rope(float* x, size_t n_heads, size_t head_dim, std::span<const int32_t> pos,
            const float* inv_freq) override {
    timed("rope", [&] { cpu_.rope(x, n_heads, head_dim, pos, inv_freq); });
  }
  void silu_mul(float* gate, const float* up, size_t n) override {
    timed("silu_mul", [&] { cpu_.silu_mul(gate, up, n); });
  }
  void add_inplace(float* x, const float* y, size_t n) override {
    timed("add", [&] { cpu_.add_inplace(x, y, n); });
  }
  void gather_rows(const float* x, std::span<const size_t> rows, size_t dim, float* out) override {
    timed("gather", [&] { cpu_.gather_rows(x, rows, dim, out); });
  }
  void kv_write(kv::BatchKv& kv, size_t layer, std::span<const model::TokenPlace> places,
                const float* k, const float* v) override {
    timed("kv_write", [&] { cpu_.kv_write(kv, layer, places, k, v); });
  }
  void attention(const kv::BatchKv& kv, size_t layer, std::span<const model::TokenPlace> places,
                 const kernels::AttentionShape& shape, const float* q, float* out) override {
    timed("attention", [&] { cpu_.attention(kv, layer, places, shape, q, out); });
  }
  void to_host(const float* x, size_t n, float* host_out) override {
    timed("to_host", [&] { cpu_.to_host(x, n, host_out); });
  }

 private:
  template <class F>
  void timed(const std::string& label, F&& f) {
    const double t0 = bench::wall_seconds();
    f();
    t_.add(label, bench::wall_seconds() - t0);
  }
  // The next `n` weights in llama.cpp's per-layer order.
  std::string matmul_label(size_t n) {
    static const char* kNames[] = {"q", "k", "v", "o", "gate", "up", "down"};
    std::string label = "matmul ";
    for (size_t i = 0; i < n; ++i, ++matmul_index_) {
      if (i) label += "+";
      label += matmul_index_ >= 7 * n_layers_ ? "output" : kNames[matmul_index_ % 7];
    }
    return label;
  }

  model::CpuBackend cpu_;
  size_t n_layers_, matmul_index_ = 0;
  OpTimes& t_;
};

// Microseconds per empty parallel_for over n items, `gap_us` apart.
double dispatch_us(ThreadPool& pool, size_t n, double gap_us, size_t reps) {
  std::vector<double> t;
  volatile size_t sink = 0;
  for (size_t i = 0; i < reps; ++i) {
    const double until = bench::wall_seconds() + gap_us * 1e-6;
    while (bench::wall_seconds() < until) {
    }
    const double t0 = bench::wall_seconds();
    pool.parallel_for(n, 1, [&](size_t b, size_t e) { sink = sink + e - b; });
    t.push_back(bench::wall_seconds() - t0);
  }
  return bench::median(t) * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    ThreadPool pool(o.threads);
    const auto mode = kernels::parse_matmul_mode(o.matmul);
    if (!mode) fail("decode_step", "--matmul must be exact or int8");
    const kernels::Context ctx{&pool, best_cpu_path(), *mode};
    bench::print_machine("decode_step", pool.size());
    auto model = model::load_model(o.model);
    const model::ModelConfig& cfg = model->config();
    OpTimes times;
    if (o.ops) model->set_backend(std::make_unique<TimingBackend>(ctx, cfg.n_layers, times));
    const KvFormat fmt = kernels::parse_kv_format(o.kv);
    std::printf("# %s, matmul %s, kv %s, path %s, prompt %zu tokens, %zu steps x %zu repeats\n",
                o.model.c_str(), o.matmul.c_str(), fmt.name().c_str(),
                std::string(cpu_path_name(ctx.path)).c_str(), o.prompt_tokens, o.steps, o.repeats);

    kv::BatchKv batch(cfg.kv_spec(fmt, fmt), model->kv_allocator());
    const size_t P = o.prompt_tokens;
    std::vector<int32_t> prompt(P);
    for (size_t i = 0; i < P; ++i) prompt[i] = static_cast<int32_t>(100 + 37 * i);
    batch.prepare_prefill(std::span<const size_t>(&P, 1));
    std::vector<float> logits;
    const model::RowInput in{prompt, false};
    model->forward(ctx, batch, std::span<const model::RowInput>(&in, 1), logits);
    batch.finalize_prefill();
    const size_t steps = o.steps;
    batch.reserve(std::span<const size_t>(&steps, 1));  // no step below reallocates

    std::vector<double> wall, cpu;
    engine::Sampler sampler(engine::SamplingParams{0.0f}, prompt);
    std::vector<double> sample_s;
    for (size_t r = 0; r <= o.repeats; ++r) {  // repeat 0 warms up
      times.on = r > 0;
      batch.spec_begin();
      int32_t token = prompt.back();
      for (size_t s = 0; s < steps; ++s) {
        const model::RowInput row{std::span<const int32_t>(&token, 1)};
        const double w0 = bench::wall_seconds(), c0 = bench::cpu_seconds();
        model->forward(ctx, batch, std::span<const model::RowInput>(&row, 1), logits);
        const double w1 = bench::wall_seconds();
        token = sampler.sample(logits).token;
        if (r > 0) {
          wall.push_back(w1 - w0);
          cpu.push_back(bench::cpu_seconds() - c0);
          sample_s.push_back(bench::wall_seconds() - w1);
        }
      }
      batch.spec_rollback(std::vector<size_t>(1, 0));
    }
    const double med = bench::median(wall);
    std::printf("forward  %.3f ms/step (median)  %.1f tok/s  cpu %.3f ms/step  load %s\n",
                med * 1e3, 1.0 / med, bench::median(cpu) * 1e3, bench::load_average().c_str());
    std::printf("sampler  %.3f ms/token (greedy + logprob)\n", bench::median(sample_s) * 1e3);
    std::printf("dispatch %.2f us back to back, %.2f us after a 200 us gap (empty parallel_for)\n",
                dispatch_us(pool, 64, 0, 2000), dispatch_us(pool, 64, 200, 500));
    if (o.ops) {
      const double n = static_cast<double>(wall.size());
      double total = 0;
      for (const auto& [label, s] : times.seconds) total += s;
      std::printf("%-28s %9s %7s %9s\n", "op (sum over layers)", "ms/step", "%", "calls/step");
      for (const auto& [label, s] : times.seconds)
        std::printf("%-28s %9.3f %6.1f%% %9.1f\n", label.c_str(), s / n * 1e3, 100 * s / total,
                    static_cast<double>(times.calls[label]) / n);
      std::printf("%-28s %9.3f (mean; the median step above excludes outliers)\n", "all ops",
                  total / n * 1e3);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_step: %s\n", e.what());
    return 1;
  }
}
