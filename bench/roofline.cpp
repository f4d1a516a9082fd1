// The machine's roofline, measured: streaming-read memory bandwidth and peak
// FMA throughput, on one core and on all cores. A plain program (not Google
// Benchmark): both figures are "best of N" over runs in which every thread
// works at once, which Benchmark's per-iteration timing does not express.
//
//   roofline [--json] [--mib N] [--reps N] [--threads N]
//
// Bandwidth: a buffer of --mib MiB (default 1024, far past any LLC) is split
// into one contiguous slice per thread, first-touched by its own thread, then
// read with 64-byte (AVX-512) or 32-byte (AVX2) loads summed into several
// accumulators so that loads, not adds, are the limit. GB/s are 1e9 bytes/s.
// Three ways of reading, because the hardware prefetchers alone do not keep
// enough lines in flight for one sequential stream on every core:
//   plain      one sequential stream per thread;
//   prefetch   the same with a software prefetch 8 KiB ahead (what ferry's
//              decode tiles do);
//   4 streams  four sequential streams per thread, a quarter of the slice
//              each, read in step (as a kernel reading four weight rows).
// "read bandwidth" is the best of the three: a decode that streams W bytes
// of weights per token cannot beat bandwidth / W tokens/s, and
// docs/BENCHMARKS.md uses this figure. (Before the two extra ways were
// measured, one plain stream gave 32.8 GB/s on the 2-core dev machine while
// a Q8_0 decode moved 45 GB/s: the roofline was too low.)
//
// FMA: each thread runs independent chains of vfmadd (12 accumulators, more
// than latency x issue width on current x86 cores) on registers only.
// GFLOP/s count 2 flops per lane per FMA.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

// Horizontal sum through memory: GCC 12's _mm512_reduce_add_ps trips
// -Wuninitialized (a false positive inside its header).
__attribute__((target("avx512f"))) float hsum512(__m512 v) {
  alignas(64) float x[16];
  _mm512_store_ps(x, v);
  float s = 0;
  for (float f : x) s += f;
  return s;
}

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------ kernels

enum class Way { kPlain, kPrefetch, kStreams };
constexpr Way kWays[] = {Way::kPlain, Way::kPrefetch, Way::kStreams};
const char* way_name(Way w) {
  return w == Way::kPlain ? "plain" : w == Way::kPrefetch ? "prefetch" : "4 streams";
}

// Sum of n floats at p (n a multiple of 256), read the given way with
// vectors of L floats; the result only defeats dead-code elimination.
// kStreams reads the four quarters of [p, p + n) in step.
#define READ_BODY(T, L, ZERO, LOAD, ADD)                                     \
  constexpr size_t kAhead = 8192 / sizeof(float);                          \
  T a0 = ZERO, a1 = a0, a2 = a0, a3 = a0;                                  \
  if (way == Way::kStreams) {                                              \
    const size_t q = n / 4;                                                \
    for (size_t i = 0; i < q; i += L) {                                    \
      a0 = ADD(a0, LOAD(p + i));                                           \
      a1 = ADD(a1, LOAD(p + q + i));                                       \
      a2 = ADD(a2, LOAD(p + 2 * q + i));                                   \
      a3 = ADD(a3, LOAD(p + 3 * q + i));                                   \
    }                                                                      \
  } else {                                                                 \
    const bool pf = way == Way::kPrefetch;                                 \
    for (size_t i = 0; i < n; i += 4 * L) {                                \
      if (pf)                                                              \
        for (size_t l = 0; l < 4 * L; l += 16)                             \
          _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead + l),  \
                       _MM_HINT_T0);                                       \
      a0 = ADD(a0, LOAD(p + i));                                           \
      a1 = ADD(a1, LOAD(p + i + L));                                       \
      a2 = ADD(a2, LOAD(p + i + 2 * L));                                   \
      a3 = ADD(a3, LOAD(p + i + 3 * L));                                   \
    }                                                                      \
  }                                                                        \
  const T s = ADD(ADD(a0, a1), ADD(a2, a3));

__attribute__((target("avx512f"))) float read_avx512(const float* p, size_t n, Way way) {
  READ_BODY(__m512, 16, _mm512_setzero_ps(), _mm512_load_ps, _mm512_add_ps)
  return hsum512(s);
}

__attribute__((target("avx2"))) float read_avx2(const float* p, size_t n, Way way) {
  READ_BODY(__m256, 8, _mm256_setzero_ps(), _mm256_load_ps, _mm256_add_ps)
  float v[8];
  _mm256_storeu_ps(v, s);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

// 12 independent FMA chains, `iters` steps each: 12 * iters FMAs of
// 16 (AVX-512) or 8 (AVX2) lanes.
#define FMA_CHAINS(T, SET1, FMA, ADD)                                               \
  T x = SET1(1.0000001f), y = SET1(0.9999999f);                                     \
  T c0 = SET1(0.f), c1 = SET1(.1f), c2 = SET1(.2f), c3 = SET1(.3f), c4 = SET1(.4f), \
    c5 = SET1(.5f), c6 = SET1(.6f), c7 = SET1(.7f), c8 = SET1(.8f), c9 = SET1(.9f), \
    c10 = SET1(1.f), c11 = SET1(1.1f);                                              \
  for (long i = 0; i < iters; ++i) {                                                \
    c0 = FMA(c0, x, y);                                                             \
    c1 = FMA(c1, x, y);                                                             \
    c2 = FMA(c2, x, y);                                                             \
    c3 = FMA(c3, x, y);                                                             \
    c4 = FMA(c4, x, y);                                                             \
    c5 = FMA(c5, x, y);                                                             \
    c6 = FMA(c6, x, y);                                                             \
    c7 = FMA(c7, x, y);                                                             \
    c8 = FMA(c8, x, y);                                                             \
    c9 = FMA(c9, x, y);                                                             \
    c10 = FMA(c10, x, y);                                                           \
    c11 = FMA(c11, x, y);                                                           \
  }                                                                                 \
  T s = ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7)));          \
  s = ADD(s, ADD(ADD(c8, c9), ADD(c10, c11)));

__attribute__((target("avx512f"))) float fma_avx512(long iters) {
  FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps)
  return hsum512(s);
}

__attribute__((target("avx2,fma"))) float fma_avx2(long iters) {
  FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps)
  float v[8];
  _mm256_storeu_ps(v, s);
  return v[0] + v[7];
}

// ------------------------------------------------------------------ harness

// Runs body(thread_index) on `threads` threads at once, `reps` times, and
// returns the shortest wall time of one rep in seconds. Threads are started
// once and meet at a barrier before and after each rep, so thread start-up is
// never timed.
double best_of(int threads, int reps, const std::function<void(int)>& body) {
  std::barrier sync(threads + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int r = 0; r < reps; ++r) {
        sync.arrive_and_wait();
        body(t);
        sync.arrive_and_wait();
      }
    });
  }
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    sync.arrive_and_wait();
    const auto t0 = Clock::now();
    sync.arrive_and_wait();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  for (auto& th : pool) th.join();
  return best;
}

std::atomic<float> g_sink{0};  // keeps every kernel's result alive

struct Result {
  std::string name;
  int threads;
  double value;  // GB/s or GFLOP/s
  const char* unit;
};

// Read bandwidth with `threads` threads over a buffer of `bytes`.
double bandwidth(float* buf, size_t bytes, int threads, int reps, bool avx512, Way way) {
  const size_t n = bytes / sizeof(float);
  const size_t per = n / threads / 256 * 256;
  auto slice = [&](int t) { return buf + static_cast<size_t>(t) * per; };
  // First touch by the reading thread (pages then sit near it on NUMA).
  best_of(threads, 1, [&](int t) {
    float* p = slice(t);
    for (size_t i = 0; i < per; ++i) p[i] = static_cast<float>(i & 7);
  });
  const double s = best_of(threads, reps, [&](int t) {
    g_sink += avx512 ? read_avx512(slice(t), per, way) : read_avx2(slice(t), per, way);
  });
  return static_cast<double>(per * threads * sizeof(float)) / s / 1e9;
}

double gflops(int threads, int reps, bool avx512) {
  const long iters = 20'000'000;
  const int lanes = avx512 ? 16 : 8;
  const double s =
      best_of(threads, reps, [&](int) { g_sink += avx512 ? fma_avx512(iters) : fma_avx2(iters); });
  return 2.0 * 12 * lanes * static_cast<double>(iters) * threads / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  size_t mib = 1024;
  int reps = 10;
  int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "[roofline] %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atol(argv[++i]);
    };
    if (a == "--json") {
      json = true;
    } else if (a == "--mib") {
      mib = static_cast<size_t>(std::max(16L, next()));
    } else if (a == "--reps") {
      reps = static_cast<int>(std::max(1L, next()));
    } else if (a == "--threads") {
      all = static_cast<int>(std::max(1L, next()));
    } else {
      std::fprintf(stderr,
                   "usage: roofline [--json] [--mib N] [--reps N] [--threads N]\n"
                   "  memory read bandwidth and peak FMA GFLOP/s, 1 thread and all\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }

  __builtin_cpu_init();
  const bool has512 = __builtin_cpu_supports("avx512f");
  const bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!has2) {
    std::fprintf(stderr, "[roofline] this CPU has no AVX2+FMA; nothing to measure\n");
    return 1;
  }
  const size_t bytes = mib << 20;
  float* buf = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!buf) {
    std::fprintf(stderr, "[roofline] cannot allocate %zu MiB\n", mib);
    return 1;
  }

  std::vector<Result> out;
  std::vector<int> counts = {1};
  if (all > 1) counts.push_back(all);
  for (int t : counts) {
    double best = 0;
    for (Way w : kWays) {
      const double gbs = bandwidth(buf, bytes, t, reps, has512, w);
      out.push_back({std::string("read bandwidth, ") + way_name(w), t, gbs, "GB/s"});
      best = std::max(best, gbs);
    }
    out.push_back({"read bandwidth", t, best, "GB/s"});
  }
  for (int t : counts) {
    if (has512) out.push_back({"fma avx512 fp32", t, gflops(t, reps / 2 + 1, true), "GFLOP/s"});
    out.push_back({"fma avx2 fp32", t, gflops(t, reps / 2 + 1, false), "GFLOP/s"});
  }
  std::free(buf);

  if (json) {
    std::printf("{\"buffer_mib\": %zu, \"reps\": %d, \"results\": [", mib, reps);
    for (size_t i = 0; i < out.size(); ++i) {
      std::printf("%s{\"name\": \"%s\", \"threads\": %d, \"value\": %.2f, \"unit\": \"%s\"}",
                  i ? ", " : "", out[i].name.c_str(), out[i].threads, out[i].value, out[i].unit);
    }
    std::printf("]}\n");
  } else {
    std::printf("roofline (best of %d; buffer %zu MiB)\n", reps, mib);
    std::printf("%-18s %8s %12s\n", "measure", "threads", "value");
    for (const Result& r : out) {
      std::printf("%-18s %8d %9.2f %s\n", r.name.c_str(), r.threads, r.value, r.unit);
    }
  }
  return g_sink.load() == 12345.f ? 3 : 0;  // never true; reads the sink
}
