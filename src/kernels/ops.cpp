#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

MatmulInt8Cols int8_cols_for(CpuPath p) {
  if (p == CpuPath::Avx512 && cpu_features().avx512vnni) return avx512vnni_matmul_int8_cols();
  return kernels_for(p).matmul_int8_cols;
}

std::string_view matmul_mode_name(MatmulMode m) {
  return m == MatmulMode::Int8 ? "int8" : "exact";
}

std::optional<MatmulMode> parse_matmul_mode(std::string_view name) {
  if (name == "exact") return MatmulMode::Exact;
  if (name == "int8") return MatmulMode::Int8;
  return std::nullopt;
}

bool int8_matmul_supported(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

namespace {
void run(const Context& ctx, size_t n, size_t grain, RangeFn fn) {
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

namespace {

// Owner of the QuantRows buffers (one per calling thread, reused).
struct QuantBuffer {
  std::vector<int8_t> codes;
  std::vector<float> d, dsum;
  std::vector<int32_t> sum, sum_lo;
  QuantRows view;
};

// Row r of x into the QuantRows layout (path_kernels.h): the path's
// quantizer (int8_quant.h) writes the row's blocks in the natural layout,
// then each block's codes go where the layout wants them, four at a time
// (every layout keeps codes 4i .. 4i + 3 of a block together).
void quantize_row(const PathKernels& k, const float* x, size_t r, QuantBuffer& q) {
  const size_t nb = q.view.nb, nb16 = q.view.nb16;
  const bool chunked = q.view.chunked;
  struct Scratch {
    std::vector<int8_t> codes;
    std::vector<float> d;
    std::vector<int32_t> sum, sum_lo;
  };
  thread_local Scratch row;
  row.codes.resize(32 * nb);
  row.d.resize(nb);
  row.sum.resize(nb);
  row.sum_lo.resize(nb);
  k.quantize_int8_row(x, nb, row.codes.data(), row.d.data(), row.sum.data(), row.sum_lo.data());
  for (size_t b = 0; b < nb16; ++b) {
    // Where block b's values and its codes 4i .. 4i + 3 go in the layout.
    const size_t i = r * nb16 + b;
    int8_t* c = chunked ? q.codes.data() + r * nb16 * 32 + 512 * (b / 16)
                        : q.codes.data() + r * nb16 * 32 + 32 * b;
    const size_t width = chunk_width(nb - b / 16 * 16);
    auto at = [&](size_t k4) {
      return chunked ? chunk_code_offset(b % 16, 4 * k4, width) : 4 * k4;
    };
    if (b >= nb) {
      if (!chunked || b % 16 < width)
        for (size_t k4 = 0; k4 < 8; ++k4) std::memset(c + at(k4), 0, 4);
      q.d[i] = q.dsum[i] = 0.0f;
      q.sum[i] = q.sum_lo[i] = 0;
      continue;
    }
    for (size_t k4 = 0; k4 < 8; ++k4) std::memcpy(c + at(k4), &row.codes[32 * b + 4 * k4], 4);
    q.d[i] = row.d[b];
    q.sum[i] = row.sum[b];
    q.sum_lo[i] = row.sum_lo[b];
    q.dsum[i] = static_cast<float>(row.sum[b]) * row.d[b];
  }
}

void quantize_rows(const Context& ctx, const float* x, size_t n_rows, size_t n_in, QuantBuffer& q) {
  const size_t nb = n_in / 32, nb16 = (nb + 15) / 16 * 16;
  q.codes.resize(n_rows * nb16 * 32);
  q.d.resize(n_rows * nb16);
  q.dsum.resize(n_rows * nb16);
  q.sum.resize(n_rows * nb16);
  q.sum_lo.resize(n_rows * nb16);
  q.view = {q.codes.data(), q.d.data(), q.sum.data(), q.sum_lo.data(), q.dsum.data(), nb, nb16};
  q.view.chunked = n_rows > kNaturalLayoutMaxRows;
  const PathKernels& k = kernels_for(ctx.path);
  run(ctx, n_rows, 4, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) quantize_row(k, x + r * n_in, r, q);
  });
}

}  // namespace

void matmul_int8_with(MatmulInt8Cols cols, const Context& ctx, const WeightView& w, const float* x,
                      size_t n_rows, float* y) {
  FERRY_CHECK(int8_matmul_supported(w.type), "matmul", "int8 mode does not support ",
              dtype_traits(w.type).name);
  FERRY_CHECK(w.n_in % 32 == 0, "matmul", "n_in=", w.n_in, " is not a multiple of 32");
  // Quantized once per call, shared read-only by the column threads.
  // (A lambda naming a thread_local sees the running thread's instance, so
  // the workers get the view by value.)
  thread_local QuantBuffer buffer;
  quantize_rows(ctx, x, n_rows, w.n_in, buffer);
  const QuantRows q = buffer.view;
  run(ctx, w.n_out, 16, [&, q](size_t j0, size_t j1) { cols(w, q, n_rows, y, j0, j1); });
}

void matmul(const Context& ctx, const WeightView& w, const float* x, size_t n_rows, float* y) {
  matmul_many(ctx, std::span<const WeightView>(&w, 1), x, n_rows, std::span<float* const>(&y, 1));
}

void matmul_many(const Context& ctx, std::span<const WeightView> w, const float* x, size_t n_rows,
                 std::span<float* const> y) {
  const size_t n = w.size();
  FERRY_CHECK(n == y.size() && n > 0 && n <= kMaxMatmulMany, "matmul", w.size(), " weights for ",
              y.size(), " outputs");
  // The weights' columns side by side: weight i owns [off[i], off[i + 1]).
  size_t off[kMaxMatmulMany + 1] = {0};
  bool int8[kMaxMatmulMany] = {}, any_int8 = false;
  for (size_t i = 0; i < n; ++i) {
    FERRY_CHECK(w[i].n_in % 16 == 0, "matmul", "n_in=", w[i].n_in, " is not a multiple of 16");
    FERRY_CHECK(w[i].n_in == w[0].n_in, "matmul", "weights of n_in ", w[0].n_in, " and ", w[i].n_in,
                " share an input");
    off[i + 1] = off[i] + w[i].n_out;
    int8[i] = ctx.matmul == MatmulMode::Int8 && int8_matmul_supported(w[i].type);
    any_int8 = any_int8 || int8[i];
  }
  QuantRows q;
  if (any_int8) {
    FERRY_CHECK(w[0].n_in % 32 == 0, "matmul", "n_in=", w[0].n_in, " is not a multiple of 32");
    // Quantized once per call, shared read-only by the column threads.
    // (A lambda naming a thread_local sees the running thread's instance,
    // so the workers get the view by value.)
    thread_local QuantBuffer buffer;
    quantize_rows(ctx, x, n_rows, w[0].n_in, buffer);
    q = buffer.view;
  }
  const PathKernels& k = kernels_for(ctx.path);
  const MatmulInt8Cols int8_cols = any_int8 ? int8_cols_for(ctx.path) : nullptr;
  // Grain of 16 output columns keeps each thread's tile a multiple of the
  // 4-row tile; neither the split nor which weight shares a chunk changes
  // any element's arithmetic (a column's result depends only on its weight
  // row and x).
  run(ctx, off[n], 16, [&, q](size_t c0, size_t c1) {
    for (size_t i = 0; i < n; ++i) {
      const size_t b = std::max(c0, off[i]), e = std::min(c1, off[i + 1]);
      if (b >= e) continue;
      if (int8[i])
        int8_cols(w[i], q, n_rows, y[i], b - off[i], e - off[i]);
      else
        k.matmul_cols(w[i], x, n_rows, y[i], b - off[i], e - off[i]);
    }
  });
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
  // The canonical dot takes whole 16-element runs (model loading checks
  // every width it is given).
  FERRY_CHECK(dim % 16 == 0, "rmsnorm", "dim=", dim, " is not a multiple of 16");
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

void silu_mul(const Context& ctx, float* gate, const float* up, size_t n) {
  const PathKernels& k = kernels_for(ctx.path);
  // Elements are independent: any split gives the same bits.
  constexpr size_t kChunk = 4096;
  run(ctx, (n + kChunk - 1) / kChunk, 1, [&](size_t b, size_t e) {
    const size_t lo = b * kChunk, hi = std::min(n, e * kChunk);
    k.silu_mul(gate + lo, up + lo, hi - lo);
  });
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
  const size_t group = shape.n_heads / shape.n_kv_heads;
  size_t scratch_size = 0;
  for (const auto& t : tasks) {
    FERRY_CHECK(t.n_keys() > 0, "attention", "a query with no visible keys");
    scratch_size = std::max(scratch_size, group * t.n_keys() + shape.head_dim);
  }
  // One item per (task, kv head): the group's query heads run together
  // (path_impl.h, attention_group), each with its own arithmetic.
  run(ctx, tasks.size() * shape.n_kv_heads, 1, [&](size_t b, size_t e) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_size) scratch.resize(scratch_size);
    for (size_t i = b; i < e; ++i)
      k.attention_group(shape, tasks[i / shape.n_kv_heads], i % shape.n_kv_heads, scratch.data());
  });
}

}  // namespace ferry::kernels
