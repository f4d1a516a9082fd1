#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/kv_decode.h"
#include "kernels/path_kernels.h"
#include "kernels/quant_blocks.h"

namespace ferry::kernels {

const PathKernels& kernels_for(CpuPath p) {
  switch (p) {
    case CpuPath::Reference:
      return reference_kernels();
    case CpuPath::Avx2:
      return avx2_kernels();
    case CpuPath::Avx512:
      return avx512_kernels();
  }
  fail("kernels", "unknown cpu path");
}

namespace {
void run(const Context& ctx, size_t n, size_t grain,
         const std::function<void(size_t, size_t)>& fn) {
  if (ctx.pool) {
    ctx.pool->parallel_for(n, grain, fn);
  } else {
    fn(0, n);
  }
}
}  // namespace

float dot(CpuPath path, const float* a, const float* b, size_t n) {
  return kernels_for(path).dot(a, b, n);
}

void matmul(const Context& ctx, const WeightView& w, const float* x, size_t n_rows, float* y) {
  FERRY_CHECK(w.n_in % 16 == 0, "matmul", "n_in=", w.n_in, " is not a multiple of 16");
  const PathKernels& k = kernels_for(ctx.path);
  // Grain of 16 output columns keeps each thread's tile a multiple of the
  // 4-row tile; the split never changes any element's arithmetic.
  run(ctx, w.n_out, 16, [&](size_t j0, size_t j1) { k.matmul_cols(w, x, n_rows, y, j0, j1); });
}

void embed(const WeightView& table, std::span<const int32_t> tokens, float* out) {
  for (size_t r = 0; r < tokens.size(); ++r) {
    int32_t t = tokens[r];
    if (t < 0 || static_cast<size_t>(t) >= table.n_out)
      fail("embed", "token id ", t, " is outside the vocabulary of ", table.n_out);
    decode_row(table.type, table.data + static_cast<size_t>(t) * table.row_bytes(),
               out + r * table.n_in, table.n_in);
  }
}

void rmsnorm(const Context& ctx, const float* x, const float* w, size_t n_rows, size_t dim,
             float eps, float* out) {
  const PathKernels& k = kernels_for(ctx.path);
  for (size_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float ss = k.dot(xr, xr, dim);
    float scale = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    float* o = out + r * dim;
    for (size_t i = 0; i < dim; ++i) o[i] = (xr[i] * scale) * w[i];
  }
}

void rope(float* x, size_t n_heads, size_t head_dim, int64_t pos, const float* inv_freq) {
  const size_t half = head_dim / 2;
  const float p = static_cast<float>(pos);
  for (size_t i = 0; i < half; ++i) {
    float theta = p * inv_freq[i];
    float c = std::cos(theta), s = std::sin(theta);
    for (size_t h = 0; h < n_heads; ++h) {
      float* v = x + h * head_dim + 2 * i;
      float a = v[0], b = v[1];
      v[0] = a * c - b * s;
      v[1] = a * s + b * c;
    }
  }
}

void silu_mul(float* gate, const float* up, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float g = gate[i];
    gate[i] = (g / (1.0f + std::exp(-g))) * up[i];
  }
}

void add_inplace(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

void decode_kv(const KvSide& side, size_t head_dim, size_t h, size_t j, float* out) {
  decode_kv_side(side, head_dim, h, j, out);
}

void attention(const Context& ctx, const AttentionShape& shape,
               std::span<const AttentionTask> tasks) {
  FERRY_CHECK(shape.head_dim % 16 == 0, "attention", "head_dim=", shape.head_dim);
  FERRY_CHECK(shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0, "attention",
              "n_heads=", shape.n_heads, " n_kv_heads=", shape.n_kv_heads);
  const PathKernels& k = kernels_for(ctx.path);
  size_t scratch_size = 0;
  for (const auto& t : tasks) {
    FERRY_CHECK(t.n_keys() > 0, "attention", "a query with no visible keys");
    scratch_size = std::max(scratch_size, t.n_keys() + 2 * shape.head_dim);
  }
  run(ctx, tasks.size() * shape.n_heads, 1, [&](size_t b, size_t e) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_size) scratch.resize(scratch_size);
    for (size_t i = b; i < e; ++i)
      k.attention_head(shape, tasks[i / shape.n_heads], i % shape.n_heads, scratch.data());
  });
}

}  // namespace ferry::kernels
