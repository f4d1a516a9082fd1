// The CPU op interface that model code is written against.
//
// Invariant the whole project relies on (docs/KERNELS.md): every output
// element is reduced in one fixed order that depends only on the element's
// own inputs: not on the number of rows in the call, their position in it,
// the thread count or the kernel path. So a token gets bit-identical results
// alone or in a batch of 16, and the reference, AVX2 and AVX-512 paths agree
// bit for bit. Threads split outputs, never reductions.
//
// Shapes are row-major; "rows" are token rows of a step (all sequences'
// new tokens concatenated). All reduction lengths are multiples of 16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/kv_format.h"

namespace ferry::kernels {

// How matmul multiplies a quantized weight (docs/KERNELS.md, "Int8 mode").
//  - Exact: decode the weight to float32 and run the canonical float dot.
//  - Int8: quantize each activation row per 32-element block to int8
//    (Q8_0-style: d = amax / 127, codes round(x / d)) and take integer dot
//    products against the weight's codes, then scale per block and sum the
//    block terms in a fixed 16-lane order. About 2x faster; differs from
//    Exact by the activation rounding (error bound in docs/KERNELS.md), but
//    keeps every promise above: paths, threads and batch make no difference
//    to the bits. Applies to Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K weights
//    (Q6_K: the integer sums of its two 16-element sub-blocks are scaled
//    by their int8 scales before the block's one float step); other types
//    (F32, F16, BF16) always run Exact.
enum class MatmulMode { Exact, Int8 };
std::string_view matmul_mode_name(MatmulMode m);
// "exact" or "int8"; nullopt for anything else.
std::optional<MatmulMode> parse_matmul_mode(std::string_view name);
// Whether MatmulMode::Int8 changes how a weight of type t is multiplied.
bool int8_matmul_supported(DType t);

// Explicit per-call context: where to run, which path, which matmul mode.
struct Context {
  ThreadPool* pool = nullptr;  // null: run on the calling thread
  CpuPath path = CpuPath::Reference;
  MatmulMode matmul = MatmulMode::Exact;
};

// A weight matrix of n_out rows of n_in elements each (GGUF shape [n_in,
// n_out]), stored in `type` with rows contiguous.
struct WeightView {
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  size_t n_in = 0;
  size_t n_out = 0;
  size_t row_bytes() const { return ferry::row_bytes(type, n_in); }
};

// y[r, j] = sum_k W[j, k] * x[r, k]   x: [n_rows, n_in], y: [n_rows, n_out].
// ctx.matmul picks the arithmetic (MatmulMode); either way y[r, j] depends
// only on row r of x and row j of W.
void matmul(const Context& ctx, const WeightView& w, const float* x, size_t n_rows, float* y);

// y[i] = matmul(ctx, w[i], x, n_rows) for up to kMaxMatmulMany weights of
// the same n_in (Q/K/V, gate/up), each y[i] bit-identical to that call.
// Cheaper than the separate calls: one thread-pool dispatch over all the
// weights' output columns and, in Int8 mode, x quantized once.
constexpr size_t kMaxMatmulMany = 8;
void matmul_many(const Context& ctx, std::span<const WeightView> w, const float* x, size_t n_rows,
                 std::span<float* const> y);

// out[r, :] = decoded row tokens[r] of the embedding table.
void embed(const WeightView& table, std::span<const int32_t> tokens, float* out);

// out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w. Sum of squares in the
// canonical dot order. out may alias x.
void rmsnorm(const Context& ctx, const float* x, const float* w, size_t n_rows, size_t dim,
             float eps, float* out);

// Rotary embedding in GGML's "normal" layout: pairs (2i, 2i+1) of each head
// rotate by angle pos * inv_freq[i]. x: [n_heads, head_dim], in place.
// inv_freq has head_dim / 2 entries (any rope scaling already folded in).
void rope(float* x, size_t n_heads, size_t head_dim, int64_t pos, const float* inv_freq);

// gate[i] = silu(gate[i]) * up[i] = (g / (1 + e^-g)) * up[i], e^-g by the
// canonical exponential (kernels/vec16.h: the same bits on every path).
void silu_mul(const Context& ctx, float* gate, const float* up, size_t n);

// x[i] += y[i].
void add_inplace(float* x, const float* y, size_t n);

// One query token's attention over one cache row's keys.
//
// A cache side (K or V) is up to three byte planes (kv_format.h); the bytes
// of (kv head h, token slot j) in plane p are at
//   plane[p] + h * head_stride[p] + j * unit[p].
// Query head h reads kv head h / (n_heads / n_kv_heads). The task lists
// exactly the key slots this query may see, in position order (two
// segments when a sliding-window ring wraps): masked or padded keys are
// never part of the reduction, so they cannot change its order.
struct KvSide {
  KvFormat format;
  const uint8_t* plane[3] = {nullptr, nullptr, nullptr};
  size_t head_stride[3] = {0, 0, 0};
  size_t unit[3] = {0, 0, 0};
};
struct KeySegment {
  size_t begin = 0, end = 0;  // token slots [begin, end)
};
struct AttentionTask {
  const float* q = nullptr;  // [n_heads, head_dim]
  float* out = nullptr;      // [n_heads, head_dim]
  const KvSide* k = nullptr;
  const KvSide* v = nullptr;
  KeySegment seg[2];
  size_t n_keys() const { return (seg[0].end - seg[0].begin) + (seg[1].end - seg[1].begin); }
};
struct AttentionShape {
  size_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
};
// Decodes token slot j of kv head h into head_dim floats (exact: the same
// bits on every path).
void decode_kv(const KvSide& side, size_t head_dim, size_t h, size_t j, float* out);
// Runs every task × head, threads split over (task, kv head) pairs.
void attention(const Context& ctx, const AttentionShape& shape,
               std::span<const AttentionTask> tasks);

// Dispatched primitive (exposed for the op-consistency test).
float dot(CpuPath path, const float* a, const float* b, size_t n);

}  // namespace ferry::kernels
