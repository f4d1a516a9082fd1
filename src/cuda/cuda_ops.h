// ferry's own CUDA kernels: the ops no library does well (norms, RoPE with
// per-row positions, SwiGLU, embedding, GGUF quantized-weight products, KV
// encoding, attention over the batched KV layer). Plain C++ declarations so
// host code built by g++ can call them; definitions are in *.cu files.
//
// Conventions:
// - Every pointer is device memory unless its comment says host.
// - Every function enqueues on `stream` and returns without synchronising;
//   launch errors are checked (ferry::Error naming the kernel, file, line).
// - Activations are float32, row-major [rows, cols].
// - Determinism: every output element is reduced in one fixed order that
//   depends only on its own inputs, never on the number of rows in the call,
//   the row's position in it or the grid size (no atomics in reductions, no
//   split-K whose split depends on the batch). This is the GPU half of the
//   batch-invariance promise (docs/CUDA.md).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "core/dtype.h"
#include "kernels/ops.h"
#include "model/outputs.h"

namespace ferry::cuda {

// out[r, :] = decoded row tokens[r] of table ([n_out rows of n_in], GGUF
// type `type`, rows contiguous). Token ids must be in range (the caller
// checks on the host).
void embed(const uint8_t* table, DType type, size_t n_in, const int32_t* tokens, size_t n_tokens,
           float* out, cudaStream_t stream);

// An op's output as E4M3 codes with one scale per row, as
// quantize_fp8_rows makes them from the op's f32 output (the same bits),
// for the FP8 product that reads it next (--fp8).
struct Fp8RowsOut {
  uint8_t* codes = nullptr;  // [n_rows, n], 4-byte aligned
  float* scales = nullptr;   // [n_rows]
};

// out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w. out may alias x.
// With out_bf16, also out's values rounded to bf16 there (bit-identical to
// f32_to_bf16 of out), for the tensor-core product that reads them next;
// with out8, its FP8 codes (in the same launch for rows of up to 8,192).
void rmsnorm(const float* x, const float* w, size_t n_rows, size_t dim, float eps, float* out,
             cudaStream_t stream, uint16_t* out_bf16 = nullptr, Fp8RowsOut out8 = {});
// x += y, then rmsnorm(x) into out (and out_bf16, out8 if given): one
// launch, bit-identical to add_inplace followed by rmsnorm.
void add_rmsnorm(float* x, const float* y, const float* w, size_t n_rows, size_t dim, float eps,
                 float* out, uint16_t* out_bf16, cudaStream_t stream, Fp8RowsOut out8 = {});

// Rotary embedding, GGML's adjacent-pair layout, on x: [n_rows, n_heads,
// head_dim]; row r rotates by angle pos[r] * inv_freq[i] (inv_freq:
// head_dim / 2 floats). Angles, cos and sin in float32 (cosf/sinf, not the
// fast intrinsics).
void rope(float* x, size_t n_rows, size_t n_heads, size_t head_dim, const int32_t* pos,
          const float* inv_freq, cudaStream_t stream);
// rope of a [n_rows, a_heads, head_dim] and b [n_rows, b_heads, head_dim]
// (b may be null) by the same positions in one launch; each bit-identical
// to its own rope call.
void rope2(float* a, size_t a_heads, float* b, size_t b_heads, size_t n_rows, size_t head_dim,
           const int32_t* pos, const float* inv_freq, cudaStream_t stream);

// gate[i] = silu(gate[i]) * up[i] (and its bf16 rounding in gate_bf16 if
// given, as rmsnorm's out_bf16);  x[i] += y[i].
void silu_mul(float* gate, const float* up, size_t n, cudaStream_t stream,
              uint16_t* gate_bf16 = nullptr);
void add_inplace(float* x, const float* y, size_t n, cudaStream_t stream);

// y[r, j] = sum_k W[j, k] * x[r, k] for a GGUF-typed weight (any DType
// ferry loads: F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) used in
// place, rows of `row_bytes(type, n_in)` bytes. Weights are streamed once
// per group of rows. x: [n_rows, n_in], y: [n_rows, n_out]. Deterministic
// (see above) for any n_rows.
void matmul_gguf(const uint8_t* w, DType type, size_t n_in, size_t n_out, const float* x,
                 size_t n_rows, float* y, cudaStream_t stream);

// y[r, j] = sum_k W[j, k] * x[r, k] on the tensor cores, for dense weights:
// W [n_out, n_in] bf16 (f16 with w_f16), x [n_rows, n_in] bf16 (the caller
// converts activations), y f32 [n_rows, n_out]. n_in must be a multiple of
// 16; w and x 16-byte aligned. Deterministic and batch-invariant: every
// y[r, j] is one f32 accumulator updated by mma.sync m16n8k16 steps over
// k = 0, 16, 32, ... in order (f16 weights: two steps per k, the weight's
// exact bf16 high and low parts), whatever n_rows, r and the tile variant
// chosen for the shape (matmul_tc.cu). Fast at any n_rows: weight-streaming
// tiles for few rows, a tiled GEMM for many.
void matmul_tc(const uint16_t* w, bool w_f16, size_t n_in, size_t n_out, const uint16_t* x,
               size_t n_rows, float* y, cudaStream_t stream);
// matmul_tc for up to 4 weights of the same n_in and type against the same
// x (Q/K/V, gate/up) in one launch: y[i] = x W[i]^T, each bit-identical to
// its own matmul_tc call (the column tiles of all the weights share one
// grid, so small products keep more of the GPU busy).
void matmul_tc_many(std::span<const uint16_t* const> w, bool w_f16, size_t n_in,
                    std::span<const size_t> n_out, const uint16_t* x, size_t n_rows,
                    std::span<float* const> y, cudaStream_t stream);

// The FFN's SwiGLU input in one launch, for bf16 weights of the same shape
// where matmul_tc_swiglu_applies (a Hopper GPU and a step of more than 32
// rows, where the products take wgmma tiles): gate[r, j] = silu_mul of
// matmul_tc(w_gate)[r, j] and matmul_tc(w_up)[r, j], bit-identical to those
// two products followed by silu_mul, and gate_bf16 (if not null; not
// overlapping x) its bf16 rounding.
bool matmul_tc_swiglu_applies(size_t n_in, size_t n_out, size_t n_rows);
void matmul_tc_swiglu(const uint16_t* w_gate, const uint16_t* w_up, size_t n_in, size_t n_out,
                      const uint16_t* x, size_t n_rows, float* gate, uint16_t* gate_bf16,
                      cudaStream_t stream);

// A decode step's Q/K/V product with rope and the KV write in its epilogue,
// where matmul_tc_qkv_rope_applies (a Hopper GPU and a step the
// producer-fed tiles take, up to 8 rows): y[0..2] = matmul_tc_many of
// bf16 weights w[0..2] (q, k, v), then q and k rotated as rope2(y[0],
// y[1], pos, inv_freq) and, unless `kv` is Affine, the rows of y[1] and
// y[2] written to the cache as kv_store(writes, ...) encodes them (row r
// through writes[r]); every float and byte bit-identical to those calls.
struct KvWrite;
struct QkvEpilogue {
  const int32_t* pos = nullptr;
  const float* inv_freq = nullptr;
  size_t head_dim = 0;
  kernels::KvFormat::Kind kv = kernels::KvFormat::Kind::Affine;  // Affine: no store
  const KvWrite* writes = nullptr;  // [n_rows]; writes[r].token == r (as the backend builds it)
};
bool matmul_tc_qkv_rope_applies(size_t n_in, size_t n_out_total, size_t n_rows);
void matmul_tc_qkv_rope(const uint16_t* const (&w)[3], size_t n_in, const size_t (&n_out)[3],
                        const uint16_t* x, size_t n_rows, float* const (&y)[3],
                        const QkvEpilogue& ep, cudaStream_t stream);

// MatmulMode::Int8 on the GPU (docs/CUDA.md, "Int8 mode"): activations
// quantized per 32-element block as the CPU does (kernels/ops.h: d =
// amax / 127, codes round_even(x / d) clamped to [-127, 127]; a block with
// a non-finite element gets zero codes and a non-finite d), then integer
// dot products on the tensor cores against the weight's codes.
//
// quantize_q8: x [n_rows, n_in] (n_in % 32 == 0) into codes [n_rows, n_in]
// (int8, natural order), d [n_rows, n_in / 32] and dsum = float(sum of the
// block's codes) * d. Codes, d and dsum are bit-identical to the CPU's.
void quantize_q8(const float* x, size_t n_rows, size_t n_in, int8_t* codes, float* d, float* dsum,
                 cudaStream_t stream);
// The weight types matmul_q8 takes: Q4_K and Q6_K.
bool q8_supported(DType type);
// y[r, j] for a Q4_K or Q6_K weight against quantize_q8's output. The
// weight is read up to 15 bytes past its last row (the backend pads its
// weight copies; callers allocating their own must too); n_in % 256 == 0,
// w 16-byte aligned. Every y[r, j] is one fixed sequence of f32 steps:
// per super-block, in order, a chain over its pieces p (Q4_K: 32-element
// sub-blocks, Q6_K: 16-element ones) in order,
//   part = +0
//   part = fma(dw_p * dx_b, float(isum_p), part)   isum_p exact int32
//   part = fma(-(dmin * mn_p), dsum_b, part)        (Q4_K only)
// then y = y + part (y from +0), with dw_p = d * sc_p as the decoders form
// it and b the activation block holding piece p; so y does not depend on
// n_rows, r, or the kernel and tile chosen (matmul_q8.cu).
void matmul_q8(const uint8_t* w, DType type, size_t n_in, size_t n_out, const int8_t* codes,
               const float* d, const float* dsum, size_t n_rows, float* y, cudaStream_t stream);
// matmul_q8 for up to 4 weights of one type and n_in against the same rows
// in one launch, each output bit-identical to its own matmul_q8 call.
void matmul_q8_many(std::span<const uint8_t* const> w, DType type, size_t n_in,
                    std::span<const size_t> n_out, const int8_t* codes, const float* d,
                    const float* dsum, size_t n_rows, std::span<float* const> y,
                    cudaStream_t stream);

// Weight rows decoded to bf16 ([n_out, n_in]), for the cuBLAS path.
void dequantize_bf16(const uint8_t* w, DType type, size_t n_in, size_t n_out, uint16_t* out,
                     cudaStream_t stream);
// out[i] = bf16(x[i]) (round to nearest even).
void f32_to_bf16(const float* x, size_t n, uint16_t* out, cudaStream_t stream);

// One token's K and V rows written into the cache: encode src ([n_kv_heads,
// head_dim] floats at k + t * kv_dim, v + t * kv_dim) into the sides'
// planes at token slot `slot` (the layout of kernels::KvSide). Encoding is
// byte-identical to the CPU's (f16/bf16 round to nearest even; affine is
// kv/affine_quant.h's MLX arithmetic).
struct KvWrite {
  kernels::KvSide k, v;  // plane pointers are device memory
  uint32_t slot = 0;
  uint32_t token = 0;  // index of the source row in k/v
};
void kv_store(const KvWrite* writes, size_t n_writes, size_t n_kv_heads, size_t head_dim,
              const float* k, const float* v, cudaStream_t stream);

// Many byte copies in one launch (the KV layer's rebuilds: kv::KvAllocator::
// copy_batch): copy i moves `height` runs of `width` bytes from src + r *
// spitch to dst + r * dpitch. No copy may write bytes another reads or
// writes (they run together). `copies` is device memory; max_height the
// largest height among them.
struct KvCopy {
  uint8_t* dst = nullptr;
  const uint8_t* src = nullptr;
  uint64_t dpitch = 0, spitch = 0;
  uint32_t width = 0, height = 0;
};
void kv_copy(const KvCopy* copies, size_t n, uint32_t max_height, cudaStream_t stream);

// One query token's attention over one cache row, as kernels::AttentionTask
// but flattened for the device (the sides by value).
struct AttentionJob {
  const float* q = nullptr;  // [n_heads, head_dim]
  float* out = nullptr;      // [n_heads, head_dim]
  // Optional: out's values rounded to bf16 here too (f32_to_bf16 of out),
  // for the tensor-core product that reads them next.
  uint16_t* out_bf16 = nullptr;
  kernels::KvSide k, v;
  kernels::KeySegment seg[2];
  // Keys [0, settled) in visit order hold values no operation of the call's
  // step writes (written by earlier steps): with AttentionFormats::
  // jobs_settled the kernels may stage them before their dependency wait.
  uint32_t settled = 0;
};
// softmax(q . K^T * scale) V over exactly the task's key slots, for every
// job and head; query head h reads kv head h / (n_heads / n_kv_heads).
// Keys are visited in slot order (seg[0], then seg[1]) with a fixed
// blocking, so the result does not depend on the other jobs or on which
// kernel runs them (attention.cu). `workspace` (device, at least
// attention_workspace_floats(n_jobs, shape) floats, or null) lets steps of
// few jobs split each job's keys over many blocks; without it they run
// unsplit, with the same results. `affine`: whether the jobs' K or V are
// affine (all jobs of a call share their formats): it selects the kernels
// compiled with the factored affine decode (attention.cu); dense calls use
// kernels without it.
struct AttentionFormats {
  kernels::KvFormat k, v;
  // A hint: most consecutive jobs are consecutive queries of one cache row
  // (a prefill step's prompt chunks), so steps of many jobs stage each key
  // tile once for a block of them (attention.cu). Results are the same
  // bits either way.
  bool prompt_chunks = false;
  // The job list was written before the operation just ahead of this call
  // in the stream, so the kernels may read it, and each job's settled keys,
  // while that operation still runs (before their dependency wait). Same
  // bits either way.
  bool jobs_settled = false;
  // With jobs_settled: the queries were also written before that operation
  // (it is one that writes neither them nor the settled keys: the affine
  // cache's kv_store), so the kernels may fold the settled keys into their
  // states before the wait too. Same bits either way.
  bool query_settled = false;
};
size_t attention_workspace_floats(size_t n_jobs, const kernels::AttentionShape& shape);
void attention(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& shape,
               const AttentionFormats& formats, float* workspace, cudaStream_t stream);

// Per row r of logits [n_rows, vocab], as jobs[r] asks: the top_n (at most
// model::kMaxTopN) largest logits, value desc then id asc (-0 as +0, NaN
// never chosen), into top[r * stride ...] with count[r] filled; and with
// lse, the row's max (lse_max[r]) and sum of exp(l - max) in double
// (lse_sum[r]). Ids and values are those of model::select_from_row; the sum
// differs from it only by summation order. Rows asking nothing are left.
struct SelectJob {
  uint32_t top_n = 0;
  uint32_t lse = 0;
};
void select_logits(const float* logits, size_t n_rows, size_t vocab, const SelectJob* jobs,
                   size_t stride, model::TopLogit* top, uint32_t* count, float* lse_max,
                   double* lse_sum, cudaStream_t stream);

// Per row r of logits [n_rows, vocab] whose jobs[r].active is set: the token
// model::draw_from_row draws with jobs[r].spec from the row after
// model::apply_draw_penalties(row, spec.repetition, penalties[pen_begin,
// pen_begin + pen_count)), as {raw logit, id} into out[r] (id -1 when
// every logit is NaN); the same token as the host's, bit for bit. The
// penalties are applied to the row in place (logits is the step's scratch;
// raw[pen_begin + j] keeps the j-th token's raw logit). Other rows' out[r]
// is left.
struct DrawJob {
  model::DrawSpec spec;
  uint32_t active = 0;
  uint32_t pen_begin = 0, pen_count = 0;
};
void draw_logits(float* logits, size_t n_rows, size_t vocab, const DrawJob* jobs,
                 const model::DrawPenalty* penalties, float* raw, model::TopLogit* out,
                 cudaStream_t stream);

// Throws ferry::Error("[cuda] <what>: <error string> at file:line") if err
// is not cudaSuccess.
void check(cudaError_t err, const char* what, const char* file, int line);

// Programmatic dependent launch (Hopper and later): whether ferry's kernels
// may start while the kernel before them in the stream finishes (each
// waits for its inputs inside; docs/CUDA.md, "Launches"). On by default on
// devices of compute capability 9.0 and up; FERRY_CUDA_PDL=0 turns it off,
// and set_dependent_launch overrides both until called with nullopt (for
// tests and A/B timing). Results are the same bits either way.
void set_dependent_launch(std::optional<bool> on);
bool dependent_launch(int device);

}  // namespace ferry::cuda

#define FERRY_CUDA_CHECK(expr) ::ferry::cuda::check((expr), #expr, __FILE__, __LINE__)
