// Internal: the per-path kernel table. Each path is one translation unit
// (path_reference.cpp, path_avx2.cpp, path_avx512.cpp) that includes
// path_impl.h compiled with that path's ISA.
#pragma once

#include "kernels/ops.h"

namespace ferry::kernels {

// The chunk layout of int8 codes. A row's blocks go in chunks of 16 (512
// bytes apart); a last chunk of n < 16 blocks has width W = 4 or 8 if n
// fits, else 16. Code e of block l of a chunk of width W is at byte
// 4 W (e / 4) + 4 l + e % 4: each of the 8 rows of 4 W bytes holds four
// codes of every block, so one vpdpbusd lane (or vpmaddubsw + vpmaddwd
// lane) per block accumulates that block's sum over the rows, with no
// horizontal sums, and a short last chunk costs a fraction of a full one.
constexpr size_t chunk_width(size_t n_blocks_left) {
  return n_blocks_left <= 4 ? 4 : n_blocks_left <= 8 ? 8 : 16;
}
constexpr size_t chunk_code_offset(size_t l, size_t e, size_t width) {
  return 4 * width * (e / 4) + 4 * l + e % 4;
}

// Calls of at most this many rows keep the activation codes in the natural
// layout (block b's 32 codes at 32 b): with few rows to share it, the
// transpose into the chunk layout costs more than summing each block's
// lanes with shuffles. Either way the block sums are the same integers.
constexpr size_t kNaturalLayoutMaxRows = 3;

// Activation rows quantized for MatmulMode::Int8 (filled by ops.cpp's
// quantize_rows). Per row, nb = n_in / 32 blocks, padded with zero blocks to
// nb16 = a multiple of 16. If `chunked`, codes are in whole chunks:
//   codes[(r * nb16 + 16 c) * 32 + chunk_code_offset(l, e, W)]  int8 code
//       of element 32 (16 c + l) + e of row r, W = chunk_width(nb - 16 c);
//       blocks nb .. 16 c + W - 1 of the last chunk have zero codes;
// else in the natural layout, codes[(r * nb16 + b) * 32 + e], padding
// blocks zero.
//   d[r * nb16 + b]     float scale (amax / 127)
//   sum[r * nb16 + b]   int32 sum of the block's 32 codes
//   sum_lo[r * nb16 + b] int32 sum of its codes 0-15 (Q6_K's half-block bias)
//   dsum[r * nb16 + b]  float(sum) * d (the Q4_1 / K-quant min term's factor)
// Padding blocks have zero codes and zero d, sum, sum_lo, dsum.
struct QuantRows {
  const int8_t* codes = nullptr;
  const float* d = nullptr;
  const int32_t* sum = nullptr;
  const int32_t* sum_lo = nullptr;
  const float* dsum = nullptr;
  size_t nb = 0, nb16 = 0;
  bool chunked = true;
};

// Columns [j0, j1) of y for all n_rows rows, MatmulMode::Int8; w.type must
// satisfy int8_matmul_supported.
using MatmulInt8Cols = void (*)(const WeightView& w, const QuantRows& x, size_t n_rows, float* y,
                                size_t j0, size_t j1);

struct PathKernels {
  float (*dot)(const float* a, const float* b, size_t n);
  // Columns [j0, j1) of y for all n_rows rows.
  void (*matmul_cols)(const WeightView& w, const float* x, size_t n_rows, float* y, size_t j0,
                      size_t j1);
  // The query heads of one kv head's GQA group, for one task; scratch
  // holds (n_heads / n_kv_heads) * n_keys + head_dim floats.
  void (*attention_group)(const AttentionShape& s, const AttentionTask& t, size_t kv_head,
                          float* scratch);
  MatmulInt8Cols matmul_int8_cols;
  // x[i] = e^(x[i] - shift) as the attention softmax takes it (vec16.h,
  // canonical_exp): the same bits on every path.
  void (*exp_shifted)(float* x, size_t n, float shift);
  // gate[i] = silu(gate[i]) * up[i] with canonical_exp: the same bits on
  // every path.
  void (*silu_mul)(float* gate, const float* up, size_t n);
  // Int8 mode's activation quantizer for the nb 32-element blocks at x
  // (int8_quant.h): codes in the natural layout, per-block d, sum, sum_lo.
  // The same bytes on every path.
  void (*quantize_int8_row)(const float* x, size_t nb, int8_t* codes, float* d, int32_t* sum,
                            int32_t* sum_lo);
};

const PathKernels& reference_kernels();
const PathKernels& avx2_kernels();
const PathKernels& avx512_kernels();
const PathKernels& kernels_for(CpuPath p);
// The AVX-512 int8 kernel built with VNNI (vpdpbusd), compiled in its own
// translation unit (path_avx512vnni.cpp); call only if
// cpu_features().avx512vnni. Bit-identical to avx512_kernels()'s.
MatmulInt8Cols avx512vnni_matmul_int8_cols();
// The int8 kernel matmul uses for path p on this CPU.
MatmulInt8Cols int8_cols_for(CpuPath p);
// matmul in MatmulMode::Int8 with a given kernel, for tests that run each
// kernel, VNNI or not (matmul and matmul_many use int8_cols_for(ctx.path)).
void matmul_int8_with(MatmulInt8Cols cols, const Context& ctx, const WeightView& w, const float* x,
                      size_t n_rows, float* y);

}  // namespace ferry::kernels
