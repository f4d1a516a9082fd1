// Helpers shared by the GPU micro-benchmarks (gpu_matmul_bench,
// gpu_attention_bench): random device buffers and launch timing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "core/half.h"
#include "cuda/cuda_ops.h"

#define CK(expr) FERRY_CUDA_CHECK(expr)

namespace ferry::bench {

// A device buffer filled with random bf16 in [-1, 1] (a 16 MB random block
// repeated: the contents only need to be finite and non-zero).
inline uint16_t* random_bf16(size_t n) {
  static std::vector<uint16_t> block = [] {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<uint16_t> b(size_t{8} << 20);
    for (auto& v : b) v = f32_to_bf16(d(rng));
    return b;
  }();
  uint16_t* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n, 1) * 2));
  const size_t first = std::min(n, block.size());
  CK(cudaMemcpy(p, block.data(), first * 2, cudaMemcpyHostToDevice));
  for (size_t done = first; done < n;) {  // doubling device copies
    const size_t c = std::min(done, n - done);
    CK(cudaMemcpy(p + done, p, c * 2, cudaMemcpyDeviceToDevice));
    done += c;
  }
  return p;
}

// The median over `samples` of sample(a, b), which records the two events
// around what it times and returns elapsed(a, b) (or a share of it).
template <class Sample>
double median_sample(int samples, Sample&& sample) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int s = 0; s < samples; ++s) t.push_back(sample(a, b));
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
// Seconds from event a to event b, once b has happened.
inline double elapsed(cudaEvent_t a, cudaEvent_t b) {
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms * 1e-3;
}

// Median seconds per launch of fn(i) (i = launch counter, for rotation),
// launched back to back (about 2 ms of them per sample).
inline double time_launches(const std::function<void(size_t)>& fn, int samples) {
  size_t i = 0;
  for (int w = 0; w < 3; ++w) fn(i++);
  const double once = median_sample(1, [&](cudaEvent_t a, cudaEvent_t b) {
    CK(cudaEventRecord(a));
    fn(i++);
    CK(cudaEventRecord(b));
    return elapsed(a, b);
  });
  const int reps = std::clamp(static_cast<int>(2e-3 / std::max(once, 1e-6)), 1, 50);
  return median_sample(samples, [&](cudaEvent_t a, cudaEvent_t b) {
    CK(cudaEventRecord(a));
    for (int r = 0; r < reps; ++r) fn(i++);
    CK(cudaEventRecord(b));
    return elapsed(a, b) / reps;
  });
}

// Median seconds of one call of fn(i) on an idle device, from the event
// before its kernels to the event after them: what a chain of dependent
// kernels pays for it, which back-to-back launches (time_launches) hide
// when one launch's tail overlaps the next one's start. The stream is held
// by a host function until the call is enqueued, so the host's launch
// calls are not counted (a graph-replayed step does not pay them either).
inline double time_alone(const std::function<void(size_t)>& fn, int samples) {
  size_t i = 0;
  for (int w = 0; w < 3; ++w) fn(i++);
  CK(cudaDeviceSynchronize());
  return median_sample(samples, [&](cudaEvent_t a, cudaEvent_t b) {
    std::atomic<bool> go{false};
    CK(cudaLaunchHostFunc(
        nullptr,
        [](void* flag) {
          while (!static_cast<std::atomic<bool>*>(flag)->load()) {
          }
        },
        &go));
    CK(cudaEventRecord(a));
    fn(i++);
    CK(cudaEventRecord(b));
    go = true;
    return elapsed(a, b);
  });
}

}  // namespace ferry::bench
