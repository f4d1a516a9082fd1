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

// Median seconds per launch of fn(i) (i = launch counter, for rotation).
inline double time_launches(const std::function<void(size_t)>& fn, int samples) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  size_t i = 0;
  for (int w = 0; w < 3; ++w) fn(i++);
  CK(cudaEventRecord(a));
  fn(i++);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  const int reps = std::clamp(static_cast<int>(2.0 / std::max(ms, 1e-3f)), 1, 50);
  std::vector<double> t;
  for (int s = 0; s < samples; ++s) {
    CK(cudaEventRecord(a));
    for (int r = 0; r < reps; ++r) fn(i++);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3 / reps);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median seconds of one call of fn(i) on an idle device, from the event
// before its kernels to the event after them: what a chain of dependent
// kernels pays for it, which back-to-back launches (time_launches) hide
// when one launch's tail overlaps the next one's start. The stream is held
// by a host function until the call is enqueued, so the host's launch
// calls are not counted (a graph-replayed step does not pay them either).
inline double time_alone(const std::function<void(size_t)>& fn, int samples) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  size_t i = 0;
  for (int w = 0; w < 3; ++w) fn(i++);
  CK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int s = 0; s < samples; ++s) {
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
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace ferry::bench
