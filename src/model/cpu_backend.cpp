#include <algorithm>

#include "core/error.h"
#include "model/backend.h"

namespace ferry::model {

CpuBackend::CpuBackend(const kernels::Context& ctx)
    : ctx_(ctx), scratch_([]() -> Scratch& {
        thread_local Scratch s;
        return s;
      }()) {}

void CpuBackend::activations(std::span<const size_t> sizes, std::span<float*> out) {
  FERRY_CHECK(sizes.size() == out.size(), "cpu", "activations: ", sizes.size(), " sizes for ",
              out.size(), " buffers");
  // Each buffer starts on a 64-byte boundary of the arena.
  auto rounded = [](size_t n) { return (n + 15) / 16 * 16; };
  size_t total = 16;
  for (size_t n : sizes) total += rounded(n);
  std::vector<float>& arena = scratch_.arena;
  if (arena.size() < total) arena.assign(total, 0.0f);
  float* p = arena.data();
  p += (16 - (reinterpret_cast<uintptr_t>(p) / sizeof(float)) % 16) % 16;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out[i] = p;
    p += rounded(sizes[i]);
  }
}

void CpuBackend::embed(const kernels::WeightView& table, std::span<const int32_t> host_tokens,
                       float* out) {
  kernels::embed(table, host_tokens, out);
}

void CpuBackend::rmsnorm(const float* x, const float* w, size_t n_rows, size_t dim, float eps,
                         float* out) {
  kernels::rmsnorm(ctx_, x, w, n_rows, dim, eps, out);
}

void CpuBackend::matmul(const kernels::WeightView& w, const float* x, size_t n_rows, float* y) {
  kernels::matmul(ctx_, w, x, n_rows, y);
}

void CpuBackend::matmul_many(std::span<const kernels::WeightView> w, const float* x, size_t n_rows,
                             std::span<float* const> y) {
  kernels::matmul_many(ctx_, w, x, n_rows, y);
}

void CpuBackend::rope(float* x, size_t n_heads, size_t head_dim, std::span<const int32_t> host_pos,
                      const float* inv_freq) {
  const size_t dim = n_heads * head_dim;
  for (size_t t = 0; t < host_pos.size(); ++t)
    kernels::rope(x + t * dim, n_heads, head_dim, host_pos[t], inv_freq);
}

void CpuBackend::silu_mul(float* gate, const float* up, size_t n) {
  kernels::silu_mul(ctx_, gate, up, n);
}

void CpuBackend::add_inplace(float* x, const float* y, size_t n) {
  kernels::add_inplace(x, y, n);
}

void CpuBackend::gather_rows(const float* x, std::span<const size_t> host_rows, size_t dim,
                             float* out) {
  for (size_t i = 0; i < host_rows.size(); ++i)
    std::copy_n(x + host_rows[i] * dim, dim, out + i * dim);
}

void CpuBackend::kv_write(kv::BatchKv& kv, size_t layer, std::span<const TokenPlace> places,
                          const float* k, const float* v) {
  const size_t kv_dim = kv.spec().n_kv_heads * kv.spec().head_dim;
  for (size_t t = 0; t < places.size(); ++t)
    kv.write(layer, places[t].row, places[t].i, k + t * kv_dim, v + t * kv_dim);
}

void CpuBackend::attention(const kv::BatchKv& kv, size_t layer, std::span<const TokenPlace> places,
                           const kernels::AttentionShape& shape, const float* q, float* out) {
  const size_t T = places.size(), q_dim = shape.n_heads * shape.head_dim;
  std::vector<kernels::AttentionTask>& tasks = scratch_.tasks;
  std::vector<kernels::KvSide>& sides = scratch_.sides;
  tasks.resize(T);
  sides.resize(2 * T);
  for (size_t t = 0; t < T; ++t) {
    tasks[t] =
        kv.attention_task(layer, places[t].row, places[t].i, &sides[2 * t], &sides[2 * t + 1]);
    tasks[t].q = q + t * q_dim;
    tasks[t].out = out + t * q_dim;
  }
  kernels::attention(ctx_, shape, tasks);
}

void CpuBackend::to_host(const float* x, size_t n, float* host_out) {
  if (x != host_out) std::copy_n(x, n, host_out);
}

}  // namespace ferry::model
