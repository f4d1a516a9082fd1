// GPU sampling timing: cuda::draw_logits (a token drawn per row by
// model/draw.h's definition) against cuda::select_logits' argmax (greedy's
// reduction) on rows of a 128,256-token vocabulary, for 1 to 256 rows and
// the usual sampling settings, with the blocks per row chosen as the
// backend does and fixed at 1 (FERRY_CUDA_DRAW_CLUSTER).
//
// Logits: normal with standard deviation 3 (a spread like a model's: the
// largest about 15 above the mean), a fresh uniform per launch. Each figure
// is the median over CUDA-event timings of back-to-back launches
// (bench/gpu_bench_util.h), in µs per launch.
//   gpu_draw_bench
// Built with -DFERRY_CUDA=ON (tests/CMakeLists.txt); needs a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda/cuda_ops.h"
#include "gpu_bench_util.h"

using namespace ferry;
using ferry::bench::time_launches;

int main() {
  constexpr size_t kVocab = 128256, kMaxRows = 256;
  std::vector<float> host(kMaxRows * kVocab);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : host) x = normal(gen);
  float* logits = nullptr;
  CK(cudaMalloc(&logits, host.size() * sizeof(float)));
  CK(cudaMemcpy(logits, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  cuda::DrawJob* jobs = nullptr;
  model::TopLogit* out = nullptr;
  cuda::SelectJob* sel = nullptr;
  uint32_t* count = nullptr;
  CK(cudaMalloc(&jobs, kMaxRows * sizeof(cuda::DrawJob)));
  CK(cudaMalloc(&out, kMaxRows * sizeof(model::TopLogit)));
  CK(cudaMalloc(&sel, kMaxRows * sizeof(cuda::SelectJob)));
  CK(cudaMalloc(&count, kMaxRows * sizeof(uint32_t)));
  const std::vector<cuda::SelectJob> greedy(kMaxRows, cuda::SelectJob{1, 0});
  CK(cudaMemcpy(sel, greedy.data(), kMaxRows * sizeof(cuda::SelectJob), cudaMemcpyHostToDevice));

  struct Setting {
    const char* name;
    float temp, top_p;
    uint32_t top_k;
    float min_p;
  };
  const Setting settings[] = {{"T 1", 1.0f, 1.0f, 0, 0.0f},
                              {"T 0.8 top_p 0.95", 0.8f, 0.95f, 0, 0.0f},
                              {"T 0.8 top_k 40", 0.8f, 1.0f, 40, 0.0f},
                              {"T 0.7 top_k 50 top_p 0.9 min_p 0.05", 0.7f, 0.9f, 50, 0.05f}};
  std::printf("%-38s %5s %10s %10s %10s\n", "setting", "rows", "auto us", "1 block", "argmax");
  for (size_t rows : {1, 8, 64, 256}) {
    const double argmax = time_launches(
        [&](size_t) {
          cuda::select_logits(logits, rows, kVocab, sel, 1, out, count, nullptr, nullptr, nullptr);
        },
        15);
    for (const Setting& s : settings) {
      std::vector<cuda::DrawJob> h(rows);
      for (size_t r = 0; r < rows; ++r) {
        h[r].active = 1;
        h[r].spec.inv_temp = 1.0f / s.temp;
        h[r].spec.top_p = s.top_p;
        h[r].spec.top_k = s.top_k;
        h[r].spec.log_min_p = s.min_p > 0 ? std::log(s.min_p) : -INFINITY;
        h[r].spec.u = (r + 0.5) / static_cast<double>(rows);
      }
      CK(cudaMemcpy(jobs, h.data(), rows * sizeof(cuda::DrawJob), cudaMemcpyHostToDevice));
      double t[2];
      for (int fixed = 0; fixed < 2; ++fixed) {
        if (fixed)
          setenv("FERRY_CUDA_DRAW_CLUSTER", "1", 1);
        else
          unsetenv("FERRY_CUDA_DRAW_CLUSTER");
        t[fixed] = time_launches(
            [&](size_t) {
              cuda::draw_logits(logits, rows, kVocab, jobs, nullptr, nullptr, out, nullptr);
            },
            15);
      }
      std::printf("%-38s %5zu %10.1f %10.1f %10.1f\n", s.name, rows, t[0] * 1e6, t[1] * 1e6,
                  argmax * 1e6);
    }
  }
  return 0;
}
