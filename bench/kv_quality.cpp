// kv_quality: what quantized KV storage costs in model quality.
//
// Runs SmolLM2 over a fixed text once per KV format, in lockstep chunk by
// chunk (chunk tokens per forward, logits for every token), and compares
// each format's next-token distributions with the f16 baseline's:
//   perplexity  exp(mean over positions t of -log p(token[t+1] | ..t))
//   KL          KL(p_f16 || p_fmt) = sum_v p_f16(v) (log p_f16(v) - log p_fmt(v))
//               per position, in nats; mean, p99 and max over positions
//   top-1       fraction of positions whose argmax equals f16's
// Every position that has a next token counts (N - 1 of them). The forward
// is batch-invariant (docs/KERNELS.md), so these numbers are exact and do
// not depend on threads or load; only the seconds column does.
//
// --matmul picks the matmul mode (kernels::MatmulMode, docs/KERNELS.md
// "Int8 mode") of every format's forward; --reference-matmul that of the
// f16 baseline (default: the same). When the two differ the baseline is a
// run of its own, named "f16@<mode>", every other run is named
// "<format>@<mode>", and "f16@int8" against "f16@exact" is what int8 mode
// costs with the KV unchanged.
//
// Usage: kv_quality [--model PATH] [--text PATH] [--chunk N] [--threads N]
//                   [--formats f16,q8g64,q8g64:q4g64,...]   (K:V when they differ)
//                   [--matmul exact|int8] [--reference-matmul exact|int8]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cpu.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kv/batch_kv.h"
#include "model/model.h"

namespace {

using namespace ferry;

struct Options {
  std::string model = bench::default_model();
  std::string text = FERRY_BENCH_TEXT;
  size_t chunk = 128;
  size_t threads = 0;
  std::string formats = "f16,f32,bf16,q8g32,q8g64,q8g128,q4g32,q4g64,q4g128";
  kernels::MatmulMode matmul = kernels::MatmulMode::Exact;
  kernels::MatmulMode reference_matmul = kernels::MatmulMode::Exact;
};

kernels::MatmulMode matmul_mode(const std::string& flag, const std::string& name) {
  const auto m = kernels::parse_matmul_mode(name);
  if (!m) fail("kv_quality", flag, " must be exact or int8, not '", name, "'");
  return *m;
}

Options parse(int argc, char** argv) {
  Options o;
  std::string matmul = "exact", reference_matmul;
  bench::parse_flags("kv_quality", argc, argv,
                     {bench::flag("--model", o.model), bench::flag("--text", o.text),
                      bench::flag("--chunk", o.chunk), bench::flag("--threads", o.threads),
                      bench::flag("--formats", o.formats), bench::flag("--matmul", matmul),
                      bench::flag("--reference-matmul", reference_matmul)});
  o.matmul = matmul_mode("--matmul", matmul);
  o.reference_matmul =
      reference_matmul.empty() ? o.matmul : matmul_mode("--reference-matmul", reference_matmul);
  return o;
}

// log-softmax of one logits row, in double.
void log_softmax(const float* x, size_t n, std::vector<double>& out) {
  out.resize(n);
  double mx = x[0];
  for (size_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(x[i]) - lse;
}

size_t argmax(const std::vector<double>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// KV storage of one run: K and V formats ("q8g64" for both sides,
// "q8g64:q4g64" for K in q8g64 and V in q4g64).
struct KvPair {
  kernels::KvFormat k, v;
  std::string name() const { return k == v ? k.name() : k.name() + ":" + v.name(); }
  bool operator==(const KvPair&) const = default;
};

std::vector<KvPair> parse_pairs(const std::string& list, size_t head_dim) {
  std::vector<KvPair> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const std::string ks = item.substr(0, colon);
    const std::string vs = colon == std::string::npos ? ks : item.substr(colon + 1);
    const auto k = bench::usable_formats(ks, head_dim);
    const auto v = vs == ks ? k : bench::usable_formats(vs, head_dim);
    if (k.size() == 1 && v.size() == 1) out.push_back(KvPair{k[0], v[0]});
  }
  return out;
}

struct Run {
  KvPair fmt;
  kernels::MatmulMode matmul;
  std::string name;
  kv::BatchKv kv;
  std::vector<float> logits;
  double nll = 0.0, seconds = 0.0;
  std::vector<double> kl;    // per position
  std::vector<double> nlls;  // per position
  size_t top1_same = 0;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

double mean(const std::vector<double>& v, size_t begin, size_t end) {
  end = std::min(end, v.size());
  if (begin >= end) return 0.0;
  double s = 0.0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

// Standard error of the mean of a[i] - b[i] (positions taken as
// independent, which they are not quite: a rough error bar on dPPL).
double paired_se(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = a.size();
  if (n < 2) return 0.0;
  double m = 0.0, ss = 0.0;
  for (size_t i = 0; i < n; ++i) m += a[i] - b[i];
  m /= static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) ss += (a[i] - b[i] - m) * (a[i] - b[i] - m);
  return std::sqrt(ss / static_cast<double>(n - 1) / static_cast<double>(n));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    ThreadPool pool(o.threads);
    const kernels::Context ctx{&pool, best_cpu_path(), o.matmul};
    bench::print_machine("kv_quality", pool.size());
    auto model = model::load_model(o.model);
    const std::vector<int32_t> ids = bench::eval_tokens(model->file(), o.text);
    const size_t N = ids.size(), V = model->config().vocab_size;
    const std::string mode = std::string(kernels::matmul_mode_name(o.matmul));
    const std::string ref_mode = std::string(kernels::matmul_mode_name(o.reference_matmul));
    std::printf(
        "# model %s, text %s: %zu tokens, chunk %zu, path %s, matmul %s, reference matmul %s\n",
        o.model.c_str(), o.text.c_str(), N, o.chunk, std::string(cpu_path_name(ctx.path)).c_str(),
        mode.c_str(), ref_mode.c_str());

    std::vector<KvPair> fmts = parse_pairs(o.formats, model->config().head_dim);
    const KvPair f16{kernels::KvFormat::f16(), kernels::KvFormat::f16()};
    // Run names carry the matmul mode only when there are two of them.
    const bool two_modes = o.matmul != o.reference_matmul;
    std::vector<Run> runs;
    auto add_run = [&](const KvPair& f, kernels::MatmulMode m) {
      const std::string name =
          two_modes ? f.name() + "@" + std::string(kernels::matmul_mode_name(m)) : f.name();
      runs.push_back(
          Run{f, m, name, kv::BatchKv(model->config().kv_spec(f.k, f.v)), {}, 0.0, 0.0, {}, {}, 0});
      runs.back().kv.prepare_prefill(std::span<const size_t>(&N, 1));
    };
    // f16 with the reference mode first: it is the baseline every other run
    // is compared with.
    add_run(f16, o.reference_matmul);
    if (!two_modes) std::erase(fmts, f16);
    for (const auto& f : fmts) add_run(f, o.matmul);

    std::vector<double> ref, lp;
    for (size_t s = 0; s < N; s += o.chunk) {
      const size_t n = std::min(o.chunk, N - s);
      const model::RowInput in{std::span<const int32_t>(ids).subspan(s, n), true};
      for (Run& r : runs) {
        kernels::Context run_ctx = ctx;
        run_ctx.matmul = r.matmul;
        const double t0 = bench::wall_seconds();
        model->forward(run_ctx, r.kv, std::span<const model::RowInput>(&in, 1), r.logits);
        r.seconds += bench::wall_seconds() - t0;
      }
      for (size_t i = 0; i < n && s + i + 1 < N; ++i) {
        const int32_t target = ids[s + i + 1];
        log_softmax(&runs[0].logits[i * V], V, ref);
        const size_t ref_top = argmax(ref);
        for (Run& r : runs) {
          log_softmax(&r.logits[i * V], V, lp);
          double kl = 0.0;
          for (size_t v = 0; v < V; ++v) kl += std::exp(ref[v]) * (ref[v] - lp[v]);
          r.kl.push_back(std::max(kl, 0.0));  // exact zero for the baseline; rounding below 0
          r.nll -= lp[static_cast<size_t>(target)];
          r.nlls.push_back(-lp[static_cast<size_t>(target)]);
          r.top1_same += argmax(lp) == ref_top;
        }
      }
    }
    for (Run& r : runs) r.kv.finalize_prefill();

    const double P = static_cast<double>(N - 1);
    const double ppl_ref = std::exp(runs[0].nll / P);
    std::printf("# positions scored: %zu; KL in nats; dPPL, KL and top1 relative to %s; load %s\n",
                N - 1, runs[0].name.c_str(), bench::load_average().c_str());
    std::printf("%-11s %10s %9s %8s %11s %11s %11s %8s %31s %8s\n", "format", "ppl", "dppl%",
                "2se%", "mean_kl", "p99_kl", "max_kl", "top1%", "mean_kl[<128|<512|<1k|1k+]",
                "sec");
    for (const Run& r : runs) {
      const double ppl = std::exp(r.nll / P);
      // Two standard errors of the mean per-token NLL change, as a
      // percentage of perplexity (exp(x) - 1 ~ x for small x).
      const double se2 = 200.0 * paired_se(r.nlls, runs[0].nlls);
      std::printf(
          "%-11s %10.4f %+9.3f %8.3f %11.3e %11.3e %11.3e %8.2f %.1e|%.1e|%.1e|%.1e %8.1f\n",
          r.name.c_str(), ppl, 100.0 * (ppl / ppl_ref - 1.0), se2, mean(r.kl, 0, r.kl.size()),
          percentile(r.kl, 0.99), percentile(r.kl, 1.0),
          100.0 * static_cast<double>(r.top1_same) / P, mean(r.kl, 0, 128), mean(r.kl, 128, 512),
          mean(r.kl, 512, 1024), mean(r.kl, 1024, r.kl.size()), r.seconds);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_quality: %s\n", e.what());
    return 1;
  }
}
