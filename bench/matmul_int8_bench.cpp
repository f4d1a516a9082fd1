// Matmul weight throughput, MatmulMode::Exact vs Int8 (docs/KERNELS.md, "Int8
// mode"): GB/s of weight bytes streamed per call, for SmolLM2-135M and
// 1B-like shapes, 1, 8 and 64 activation rows, 1 and 2 threads. Each figure is
// the median of `reps` timings of as many calls as fit in ~0.1 s (the
// machine is shared and noisy). Weights are random and finite.
//   matmul_int8_bench [reps=5] [types=Q8_0,Q4_1,Q4_0] [shape=all|576x1536|...] [hot|cold]
//                     [rows=1,8,64]
// A shape not in the built-in list (e.g. 2048x128256, a 1B model's output
// head) runs alone when named.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/thread_pool.h"
#include "kernels/kernel_test_util.h"
#include "kernels/ops.h"

using namespace ferry;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of one batch of calls lasting ~0.1 s.
// Calls cycle through the copies of the weight in `ws`.
double time_batch(const kernels::Context& ctx, const std::vector<kernels::WeightView>& ws,
                  const float* x, size_t rows, float* y) {
  size_t calls = 0;
  const auto t0 = Clock::now();
  double s = 0;
  do {
    kernels::matmul(ctx, ws[calls % ws.size()], x, rows, y);
    ++calls;
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (s < 0.1);
  return s / static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  std::vector<DType> types;
  std::string list = argc > 2 ? argv[2] : "Q8_0,Q4_1,Q4_0";
  for (size_t p = 0; p <= list.size();) {
    size_t e = list.find(',', p);
    if (e == std::string::npos) e = list.size();
    const std::string name = list.substr(p, e - p);
    for (DType t : test::kAllTypes)
      if (dtype_traits(t).name == name) types.push_back(t);
    p = e + 1;
  }
  const std::string only = argc > 3 && std::string(argv[3]) != "all" ? argv[3] : "";
  const bool cold = argc > 4 && std::string(argv[4]) == "cold";
  std::vector<size_t> row_counts;
  const std::string rows_list = argc > 5 ? argv[5] : "1,8,64";
  for (size_t p = 0; p < rows_list.size();) {
    size_t e = rows_list.find(',', p);
    if (e == std::string::npos) e = rows_list.size();
    row_counts.push_back(std::strtoull(rows_list.substr(p, e - p).c_str(), nullptr, 10));
    p = e + 1;
  }
  const CpuPath path = best_cpu_path();
  std::printf("# path %s, avx512vnni %d, median of %d, %s weights\n",
              std::string(cpu_path_name(path)).c_str(), cpu_features().avx512vnni ? 1 : 0, reps,
              cold ? "cold (DRAM)" : "hot (one copy)");
  std::printf("%-6s %-12s %4s %3s %9s %9s %7s\n", "type", "n_in x n_out", "rows", "thr", "exact",
              "int8", "speedup");
  struct Shape {
    size_t n_in, n_out;
  };
  std::vector<Shape> shapes = {{576, 1536}, {1536, 576}, {576, 49152}, {2048, 8192}, {8192, 2048}};
  if (size_t x = only.find('x'); x != std::string::npos) {
    const Shape named{std::strtoull(only.c_str(), nullptr, 10),
                      std::strtoull(only.c_str() + x + 1, nullptr, 10)};
    if (named.n_in > 0 && named.n_out > 0) shapes = {named};
  }
  ThreadPool pool1(1), pool2(2);
  for (DType t : types)
    for (const Shape& s : shapes) {
      if (!only.empty() && only != std::to_string(s.n_in) + "x" + std::to_string(s.n_out)) continue;
      auto wb = test::random_weights(t, s.n_in, s.n_out, 1);
      const double gb = static_cast<double>(wb.size()) / 1e9;
      // cold: enough copies (>= 96 MB, 3x L3) that every call streams its
      // weight from DRAM, as a decode step does; hot: one copy, cache-resident
      // when it fits.
      const size_t n_copies = cold ? std::max<size_t>(1, (96u << 20) / wb.size() + 1) : 1;
      std::vector<uint8_t> all(wb.size() * n_copies);
      std::vector<kernels::WeightView> ws;
      for (size_t c = 0; c < n_copies; ++c) {
        std::copy(wb.begin(), wb.end(), all.begin() + c * wb.size());
        ws.push_back({t, all.data() + c * wb.size(), s.n_in, s.n_out});
      }
      for (size_t rows : row_counts) {
        if (rows == 0) continue;
        auto x = test::random_floats(rows * s.n_in, 2);
        std::vector<float> y(rows * s.n_out);
        for (ThreadPool* pool : {&pool1, &pool2}) {
          // The two modes alternate batch by batch, so both see the same
          // load on the shared machine; each figure is a median.
          const kernels::Context ctx[2] = {{pool, path, kernels::MatmulMode::Exact},
                                           {pool, path, kernels::MatmulMode::Int8}};
          std::vector<double> times[2];
          for (int m = 0; m < 2; ++m) kernels::matmul(ctx[m], ws[0], x.data(), rows, y.data());
          for (int rep = 0; rep < reps; ++rep)
            for (int m = 0; m < 2; ++m)
              times[m].push_back(time_batch(ctx[m], ws, x.data(), rows, y.data()));
          const double gbs[2] = {gb / median(times[0]), gb / median(times[1])};
          std::printf("%-6s %5zux%-6zu %4zu %3zu %9.2f %9.2f %6.2fx\n",
                      std::string(dtype_traits(t).name).c_str(), s.n_in, s.n_out, rows,
                      pool->size(), gbs[0], gbs[1], gbs[1] / gbs[0]);
        }
      }
    }
  return 0;
}
