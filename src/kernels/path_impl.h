// Internal: the body of every kernel path. Included once per path by a
// translation unit that first defines FERRY_VEC_AVX2 / FERRY_VEC_AVX512 (or
// nothing, for the reference) and FERRY_PATH_NAMESPACE.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/path_kernels.h"
#include "kernels/kv_decode.h"
#include "kernels/quant_blocks.h"
#include "kernels/vec16.h"

namespace ferry::kernels::FERRY_PATH_NAMESPACE {

inline float dot(const float* a, const float* b, size_t n) { return dot16(a, b, n); }

// Rows of W are decoded 4 at a time into a scratch buffer and dotted with
// each x row; four independent accumulators hide FMA latency, and each one
// follows the canonical dot16 order, so y[r, j] is the same as dot16 alone.
constexpr size_t kRowsPerTile = 4;

inline void matmul_cols(const WeightView& w, const float* x, size_t n_rows, float* y, size_t j0,
                        size_t j1) {
  const size_t K = w.n_in, N = w.n_out, rb = w.row_bytes();
  thread_local std::vector<float> scratch;
  const bool plain = w.type == DType::F32;
  if (!plain && scratch.size() < kRowsPerTile * K) scratch.resize(kRowsPerTile * K);
  for (size_t j = j0; j < j1; j += kRowsPerTile) {
    size_t nj = std::min(kRowsPerTile, j1 - j);
    const float* wr[kRowsPerTile];
    for (size_t u = 0; u < nj; ++u) {
      const uint8_t* src = w.data + (j + u) * rb;
      if (plain) {
        wr[u] = reinterpret_cast<const float*>(src);
      } else {
        decode_row(w.type, src, scratch.data() + u * K, K);
        wr[u] = scratch.data() + u * K;
      }
    }
    for (size_t r = 0; r < n_rows; ++r) {
      const float* xr = x + r * K;
      if (nj == kRowsPerTile) {
        Vec16 a0 = Vec16::zero(), a1 = Vec16::zero(), a2 = Vec16::zero(), a3 = Vec16::zero();
        for (size_t k = 0; k < K; k += 16) {
          Vec16 xv = Vec16::load(xr + k);
          a0.fma(Vec16::load(wr[0] + k), xv);
          a1.fma(Vec16::load(wr[1] + k), xv);
          a2.fma(Vec16::load(wr[2] + k), xv);
          a3.fma(Vec16::load(wr[3] + k), xv);
        }
        float* yr = y + r * N + j;
        yr[0] = a0.reduce();
        yr[1] = a1.reduce();
        yr[2] = a2.reduce();
        yr[3] = a3.reduce();
      } else {
        for (size_t u = 0; u < nj; ++u) y[r * N + j + u] = dot16(wr[u], xr, K);
      }
    }
  }
}

// Pointer to the float32 row of (head h, slot j), decoding into `tmp` when
// the side is not stored as plain f32.
inline const float* kv_row(const KvSide& side, size_t D, size_t h, size_t j, float* tmp) {
  if (side.format.kind == KvFormat::Kind::F32)
    return reinterpret_cast<const float*>(side.plane[0] + h * side.head_stride[0] +
                                          j * side.unit[0]);
  decode_kv_side(side, D, h, j, tmp);
  return tmp;
}

// Scores in key order, max, exp, sum in key order, then the weighted sum of
// values accumulated in key order for every output lane.
inline void attention_head(const AttentionShape& s, const AttentionTask& t, size_t h,
                           float* scratch) {
  const size_t D = s.head_dim;
  const size_t kvh = h / (s.n_heads / s.n_kv_heads);
  const float* q = t.q + h * D;
  float* scores = scratch;
  float* tmp = scratch + t.n_keys();
  float mx = -INFINITY;
  size_t n = 0;
  for (const KeySegment& sg : t.seg)
    for (size_t j = sg.begin; j < sg.end; ++j, ++n) {
      scores[n] = dot16(q, kv_row(*t.k, D, kvh, j, tmp), D) * s.scale;
      mx = std::max(mx, scores[n]);
    }
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    scores[i] = std::exp(scores[i] - mx);
    sum += scores[i];
  }
  float* out = t.out + h * D;
  const float inv = 1.0f / sum;
  // Accumulators for all of head_dim live in `acc` (D <= 256 floats on the
  // stack would also do; scratch keeps it heap-sized).
  float* acc = tmp + D;
  for (size_t d = 0; d < D; ++d) acc[d] = 0.0f;
  n = 0;
  for (const KeySegment& sg : t.seg)
    for (size_t j = sg.begin; j < sg.end; ++j, ++n) {
      const float* vr = kv_row(*t.v, D, kvh, j, tmp);
      const Vec16 p = Vec16::splat(scores[n]);
      for (size_t d = 0; d < D; d += 16) {
        Vec16 a = Vec16::load(acc + d);
        a.fma(p, Vec16::load(vr + d));
        a.store(acc + d);
      }
    }
  for (size_t d = 0; d < D; ++d) out[d] = acc[d] * inv;
}

inline const PathKernels& table() {
  static const PathKernels k{&dot, &matmul_cols, &attention_head};
  return k;
}

}  // namespace ferry::kernels::FERRY_PATH_NAMESPACE
