// Internal: the body of every kernel path. Included once per path by a
// translation unit that first defines FERRY_VEC_AVX2 / FERRY_VEC_AVX512 (or
// nothing, for the reference) and FERRY_PATH_NAMESPACE.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/int8_impl.h"
#include "kernels/int8_quant.h"
#include "kernels/kv_decode.h"
#include "kernels/path_kernels.h"
#include "kernels/quant_blocks.h"
#include "kernels/vec16.h"

namespace ferry::kernels::FERRY_PATH_NAMESPACE {

inline float dot(const float* a, const float* b, size_t n) {
  return dot16(a, b, n);
}

// Row decoders: load16(row, k) returns elements [k, k+16) of a weight row
// and block32(row, k, lo, hi) elements [k, k+32) (k a multiple of 32), as
// float32, bit-identical to decode_row (same multiply, then add).
template <class Self>
struct By16 {
  static void block32(const uint8_t* row, size_t k, Vec16& lo, Vec16& hi) {
    lo = Self::load16(row, k);
    hi = Self::load16(row, k + 16);
  }
};
struct DecF32 : By16<DecF32> {
  static Vec16 load16(const uint8_t* row, size_t k) {
    return Vec16::load(reinterpret_cast<const float*>(row) + k);
  }
};
struct DecF16 : By16<DecF16> {
  static Vec16 load16(const uint8_t* row, size_t k) { return Vec16::from_f16(row + 2 * k); }
};
struct DecBF16 : By16<DecBF16> {
  static Vec16 load16(const uint8_t* row, size_t k) { return Vec16::from_bf16(row + 2 * k); }
};
struct DecQ8_0 {
  static void block32(const uint8_t* row, size_t k, Vec16& lo, Vec16& hi) {
    const uint8_t* b = row + 34 * (k / 32);
    const Vec16 d = Vec16::splat(Vec16::h2f(load_u16(b)));
    lo = Vec16::from_i8(b + 2) * d;
    hi = Vec16::from_i8(b + 18) * d;
  }
  static Vec16 load16(const uint8_t* row, size_t k) {
    const uint8_t* b = row + 34 * (k / 32);
    return Vec16::from_i8(b + 2 + (k % 32)) * Vec16::splat(Vec16::h2f(load_u16(b)));
  }
};
struct DecQ4_0 {
  static void block32(const uint8_t* row, size_t k, Vec16& lo, Vec16& hi) {
    const uint8_t* b = row + 18 * (k / 32);
    const Vec16 d = Vec16::splat(Vec16::h2f(load_u16(b))), eight = Vec16::splat(8.0f);
    lo = d * (Vec16::from_lo4(b + 2) - eight);
    hi = d * (Vec16::from_hi4(b + 2) - eight);
  }
  static Vec16 load16(const uint8_t* row, size_t k) {
    const uint8_t* b = row + 18 * (k / 32);
    Vec16 q = (k % 32) ? Vec16::from_hi4(b + 2) : Vec16::from_lo4(b + 2);
    return Vec16::splat(Vec16::h2f(load_u16(b))) * (q - Vec16::splat(8.0f));
  }
};
struct DecQ4_1 {
  static void block32(const uint8_t* row, size_t k, Vec16& lo, Vec16& hi) {
    const uint8_t* b = row + 20 * (k / 32);
    const Vec16 d = Vec16::splat(Vec16::h2f(load_u16(b)));
    const Vec16 m = Vec16::splat(Vec16::h2f(load_u16(b + 2)));
    lo = d * Vec16::from_lo4(b + 4) + m;
    hi = d * Vec16::from_hi4(b + 4) + m;
  }
  static Vec16 load16(const uint8_t* row, size_t k) {
    const uint8_t* b = row + 20 * (k / 32);
    Vec16 q = (k % 32) ? Vec16::from_hi4(b + 4) : Vec16::from_lo4(b + 4);
    return Vec16::splat(Vec16::h2f(load_u16(b))) * q + Vec16::splat(Vec16::h2f(load_u16(b + 2)));
  }
};

// Q6_K (decode_q6_k): elements [k, k + 16) lie in one 32-run of one half
// of a super-block and share one scale; their 6-bit codes are assembled 8
// at a time in 64-bit words (nibbles of ql, bit pairs of qh), then
// (d * sc) * (q - 32) as decode_q6_k forms it.
struct DecQ6_K : By16<DecQ6_K> {
  [[gnu::always_inline]] static Vec16 load16(const uint8_t* row, size_t k) {
    const uint8_t* b = row + 210 * (k / 256);
    const size_t e = k % 256, half = e / 128, run = (e % 128) / 32, i0 = e % 32;
    const uint8_t* l = b + 64 * half + i0 + (run & 1) * 32;  // ql[i] or ql[i + 32]
    const uint8_t* h = b + 128 + 32 * half + i0;
    const int lshift = run < 2 ? 0 : 4, hshift = 2 * static_cast<int>(run);
    alignas(16) uint8_t q[16];
    for (int w = 0; w < 2; ++w) {
      uint64_t lw, hw;
      std::memcpy(&lw, l + 8 * w, 8);
      std::memcpy(&hw, h + 8 * w, 8);
      const uint64_t v = ((lw >> lshift) & 0x0f0f0f0f0f0f0f0full) |
                         (((hw >> hshift) & 0x0303030303030303ull) << 4);
      std::memcpy(q + 8 * w, &v, 8);
    }
    const int8_t sc = static_cast<int8_t>(b[192 + 8 * half + i0 / 16 + 2 * run]);
    const float ds = Vec16::h2f(load_u16(b + 208)) * static_cast<float>(sc);
    return Vec16::splat(ds) * (Vec16::from_u8(q) - Vec16::splat(32.0f));
  }
};

// Rows of W are handled 4 at a time with four independent accumulators
// (hiding FMA latency); each accumulator follows the canonical dot16 order
// of its own output element, so y[r, j] equals dot16(decoded row j, x[r]).
constexpr size_t kRowsPerTile = 4;

// How far ahead of the tile it decodes matmul_cols prefetches weights (8 KB
// measured better than 4-9 KB of whole tiles and than 16 KB).
constexpr size_t kPrefetchBytes = 8192;

// Few activation rows (decode): weights are decoded in registers.
template <class Dec>
void tile_fused(const uint8_t* const* wr, size_t nj, const float* x, size_t n_rows, size_t K,
                float* y, size_t ldy) {
  for (size_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * K;
    if (nj == kRowsPerTile && K % 32 == 0) {
      // Per 32-element block: elements k..k+15 then k+16..k+31 into each
      // accumulator, the canonical order.
      Vec16 a0 = Vec16::zero(), a1 = Vec16::zero(), a2 = Vec16::zero(), a3 = Vec16::zero();
      Vec16 lo, hi;
      for (size_t k = 0; k < K; k += 32) {
        const Vec16 x0 = Vec16::load(xr + k), x1 = Vec16::load(xr + k + 16);
        Dec::block32(wr[0], k, lo, hi);
        a0.fma(lo, x0);
        a0.fma(hi, x1);
        Dec::block32(wr[1], k, lo, hi);
        a1.fma(lo, x0);
        a1.fma(hi, x1);
        Dec::block32(wr[2], k, lo, hi);
        a2.fma(lo, x0);
        a2.fma(hi, x1);
        Dec::block32(wr[3], k, lo, hi);
        a3.fma(lo, x0);
        a3.fma(hi, x1);
      }
      y[r * ldy + 0] = a0.reduce();
      y[r * ldy + 1] = a1.reduce();
      y[r * ldy + 2] = a2.reduce();
      y[r * ldy + 3] = a3.reduce();
    } else {
      for (size_t u = 0; u < nj; ++u) {
        Vec16 a = Vec16::zero();
        for (size_t k = 0; k < K; k += 16) a.fma(Dec::load16(wr[u], k), Vec16::load(xr + k));
        y[r * ldy + u] = a.reduce();
      }
    }
  }
}

template <class Dec>
void decode_with(const uint8_t* row, size_t K, float* out) {
  for (size_t k = 0; k < K; k += 16) Dec::load16(row, k).store(out + k);
}

// Calls f(Dec{}) with the register decoder of type t; false for the types
// without one (Q4_K, Q5_K: decode_row).
template <class F>
bool with_decoder(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(DecF32{}), true;
    case DType::F16:
      return f(DecF16{}), true;
    case DType::BF16:
      return f(DecBF16{}), true;
    case DType::Q8_0:
      return f(DecQ8_0{}), true;
    case DType::Q4_0:
      return f(DecQ4_0{}), true;
    case DType::Q4_1:
      return f(DecQ4_1{}), true;
    case DType::Q6_K:
      return f(DecQ6_K{}), true;
    default:
      return false;
  }
}

// Many activation rows (prefill): a panel of up to kPanelRows weight rows
// is decoded to float32 in scratch once, then every activation row runs
// the canonical dot against each of them (dot16's order, so the bits are
// those of the fused tile). On AVX-512 four activation rows meet four
// weight rows at a time in 16 accumulators: each x load feeds four FMAs
// and each weight load four, where a row at a time loaded more than it
// multiplied; the panel and a group of x rows stay in L1.
constexpr size_t kPanelRows = 16;

#if defined(FERRY_VEC_AVX512)
// y[r * ldy + u] = dot16(w[u], x + r * K) for r, u < 4.
inline void dots_4x4(const float* const* w, const float* x, size_t K, float* y, size_t ldy) {
  Vec16 a[4][4];
  for (auto& row : a)
    for (auto& v : row) v = Vec16::zero();
  for (size_t k = 0; k < K; k += 16) {
    const Vec16 x0 = Vec16::load(x + k), x1 = Vec16::load(x + K + k),
                x2 = Vec16::load(x + 2 * K + k), x3 = Vec16::load(x + 3 * K + k);
    for (int u = 0; u < 4; ++u) {
      const Vec16 wu = Vec16::load(w[u] + k);
      a[u][0].fma(wu, x0);
      a[u][1].fma(wu, x1);
      a[u][2].fma(wu, x2);
      a[u][3].fma(wu, x3);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < 4; ++u) y[r * ldy + u] = a[u][r].reduce();
}
#endif

// y[r * ldy + u] = dot16(w[u], x + r * K) for r < n_rows, u < nw.
inline void panel_dots(const float* const* w, size_t nw, const float* x, size_t n_rows, size_t K,
                       float* y, size_t ldy) {
  size_t r = 0;
#if defined(FERRY_VEC_AVX512)
  for (; r + 4 <= n_rows; r += 4)
    for (size_t u = 0; u < nw; u += 4) {
      if (u + 4 <= nw) {
        dots_4x4(w + u, x + r * K, K, y + r * ldy + u, ldy);
        continue;
      }
      for (size_t rr = r; rr < r + 4; ++rr)
        for (size_t v = u; v < nw; ++v) y[rr * ldy + v] = dot16(w[v], x + rr * K, K);
    }
#endif
  for (; r < n_rows; ++r)
    for (size_t u = 0; u < nw; ++u) y[r * ldy + u] = dot16(w[u], x + r * K, K);
}

inline void matmul_panels(const WeightView& w, const float* x, size_t n_rows, float* y, size_t j0,
                          size_t j1) {
  const size_t K = w.n_in, N = w.n_out, rb = w.row_bytes();
  thread_local std::vector<float> scratch;
  if (w.type != DType::F32 && scratch.size() < kPanelRows * K) scratch.resize(kPanelRows * K);
  for (size_t j = j0; j < j1; j += kPanelRows) {
    const size_t np = std::min(kPanelRows, j1 - j);
    const float* wf[kPanelRows];
    for (size_t u = 0; u < np; ++u) {
      const uint8_t* row = w.data + (j + u) * rb;
      float* dst = scratch.data() + u * K;
      if (w.type == DType::F32) {
        wf[u] = reinterpret_cast<const float*>(row);
        continue;
      }
      if (!with_decoder(w.type, [&](auto d) { decode_with<decltype(d)>(row, K, dst); }))
        decode_row(w.type, row, dst, K);
      wf[u] = dst;
    }
    panel_dots(wf, np, x, n_rows, K, y + j, N);
  }
}

inline void matmul_cols(const WeightView& w, const float* x, size_t n_rows, float* y, size_t j0,
                        size_t j1) {
  const size_t K = w.n_in, N = w.n_out, rb = w.row_bytes();
  // Decoding into scratch pays off once the tile is reused by a few rows.
  const bool fused = n_rows <= 2 && w.type != DType::Q4_K && w.type != DType::Q5_K;
  if (!fused) return matmul_panels(w, x, n_rows, y, j0, j1);
  for (size_t j = j0; j < j1; j += kRowsPerTile) {
    const size_t nj = std::min(kRowsPerTile, j1 - j);
    const uint8_t* wr[kRowsPerTile];
    for (size_t u = 0; u < nj; ++u) wr[u] = w.data + (j + u) * rb;
    float* yt = y + j;
    // Decode streams the weights from DRAM: ask for the bytes
    // kPrefetchBytes ahead of this tile, as the hardware prefetchers alone
    // keep too few lines in flight for four interleaved rows (measured
    // 1.5-2.8x from DRAM for F16 and Q8_0; no effect on the arithmetic).
    const size_t from = j * rb + kPrefetchBytes;
    const size_t to = std::min(j1 * rb, from + nj * rb);
    for (size_t o = from; o < to; o += 64) __builtin_prefetch(w.data + o);
    with_decoder(w.type, [&](auto d) { tile_fused<decltype(d)>(wr, nj, x, n_rows, K, yt, N); });
  }
}

// x[i] = canonical_exp(x[i] - shift) for i < n, sixteen at a time (canonical_exp:
// the same bits in every lane and on every path).
inline void exp_shifted(float* x, size_t n, float shift) {
  const Vec16 s16 = Vec16::splat(shift);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) canonical_exp(Vec16::load(x + i) - s16).store(x + i);
  for (; i < n; ++i) x[i] = canonical_exp(x[i] - shift);
}

// gate[i] = (g / (1 + canonical_exp(-g))) * up[i] with g = gate[i],
// sixteen at a time (the same bits on every path).
inline void silu_mul(float* gate, const float* up, size_t n) {
  const Vec16 zero = Vec16::zero(), one = Vec16::splat(1.0f);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const Vec16 g = Vec16::load(gate + i);
    ((g / (one + canonical_exp(zero - g))) * Vec16::load(up + i)).store(gate + i);
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    gate[i] = (g / (1.0f + canonical_exp(0.0f - g))) * up[i];
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

// p_j * v_j accumulated in key order into NH heads x NC Vec16 of lanes
// [16 c0, 16 (c0 + NC)): for each key, one decoded V row feeds every head,
// and the NH * NC accumulator chains are independent (the per-lane
// arithmetic is each head's own: one fma per key, in key order).
template <size_t NH, size_t NC>
inline void accumulate_values(const AttentionTask& t, size_t D, size_t kvh, const float* scores,
                              size_t nk, size_t c0, Vec16* acc, float* tmp) {
  Vec16 a[NH][NC];
  for (size_t h = 0; h < NH; ++h)
    for (size_t c = 0; c < NC; ++c) a[h][c] = Vec16::zero();
  size_t n = 0;
  for (const KeySegment& sg : t.seg)
    for (size_t j = sg.begin; j < sg.end; ++j, ++n) {
      const float* vr = kv_row(*t.v, D, kvh, j, tmp) + 16 * c0;
      Vec16 v[NC];
      for (size_t c = 0; c < NC; ++c) v[c] = Vec16::load(vr + 16 * c);
      for (size_t h = 0; h < NH; ++h) {
        const Vec16 p = Vec16::splat(scores[h * nk + n]);
        for (size_t c = 0; c < NC; ++c) a[h][c].fma(p, v[c]);
      }
    }
  for (size_t h = 0; h < NH; ++h)
    for (size_t c = 0; c < NC; ++c) acc[h * NC + c] = a[h][c];
}

// The query heads of kv head kvh's GQA group (n_heads / n_kv_heads of
// them) over the task's keys. Per head: scores in key order (canonical
// dots), max, exp, sum in key order, then the weighted sum of values
// accumulated in key order for every output lane, divided by the sum. The
// heads share each decoded K and V row, and their independent chains (the
// sums, the value accumulators) interleave instead of waiting on one
// another; each head's operations and their order are those it would have
// alone. scratch holds heads * n_keys + head_dim floats.
inline void attention_group(const AttentionShape& s, const AttentionTask& t, size_t kvh,
                            float* scratch) {
  const size_t D = s.head_dim, G = s.n_heads / s.n_kv_heads, nk = t.n_keys();
  float* scores = scratch;  // [G][nk]
  float* tmp = scratch + G * nk;
  const float* q = t.q + kvh * G * D;
  float* out = t.out + kvh * G * D;
  constexpr size_t kMaxHeads = 16;
  float mx[kMaxHeads], sum[kMaxHeads];
  for (size_t g0 = 0; g0 < G; g0 += kMaxHeads) {
    const size_t ng = std::min(kMaxHeads, G - g0);
    for (size_t g = 0; g < ng; ++g) mx[g] = -INFINITY;
    size_t n = 0;
    for (const KeySegment& sg : t.seg)
      for (size_t j = sg.begin; j < sg.end; ++j, ++n) {
        const float* kr = kv_row(*t.k, D, kvh, j, tmp);
        for (size_t g = 0; g < ng; ++g) {
          const float sc = dot16(q + (g0 + g) * D, kr, D) * s.scale;
          scores[(g0 + g) * nk + n] = sc;
          mx[g] = std::max(mx[g], sc);
        }
      }
    // e^(score - max), then summed in key order.
    for (size_t g = 0; g < ng; ++g) exp_shifted(scores + (g0 + g) * nk, n, mx[g]);
    for (size_t g = 0; g < ng; ++g) sum[g] = 0.0f;
    for (size_t i = 0; i < n; ++i)
      for (size_t g = 0; g < ng; ++g) sum[g] += scores[(g0 + g) * nk + i];
    // Values: at most 8 accumulators at a time (two heads of 64 lanes, or
    // one head of 128).
    const size_t nv = D / 16;
    for (size_t c0 = 0; c0 < nv; c0 += 8) {
      const size_t nc = std::min<size_t>(8, nv - c0);
      for (size_t g = 0; g < ng;) {
        Vec16 acc[8];
        const float* head_scores = scores + (g0 + g) * nk;
        size_t nh = 1;
        if (nc == 4 && g + 1 < ng) {
          nh = 2;
          accumulate_values<2, 4>(t, D, kvh, head_scores, nk, c0, acc, tmp);
        } else if (nc == 4) {
          accumulate_values<1, 4>(t, D, kvh, head_scores, nk, c0, acc, tmp);
        } else if (nc == 8) {
          accumulate_values<1, 8>(t, D, kvh, head_scores, nk, c0, acc, tmp);
        } else {
          for (size_t c = 0; c < nc; ++c)
            accumulate_values<1, 1>(t, D, kvh, head_scores, nk, c0 + c, acc + c, tmp);
        }
        for (size_t h = 0; h < nh; ++h) {
          const float inv = 1.0f / sum[g + h];
          float* o = out + (g0 + g + h) * D;
          for (size_t c = 0; c < nc; ++c) {
            float lanes[16];
            acc[h * nc + c].store(lanes);
            for (int l = 0; l < 16; ++l) o[16 * (c0 + c) + l] = lanes[l] * inv;
          }
        }
        g += nh;
      }
    }
  }
}

inline const PathKernels& table() {
  static const PathKernels k{&dot,        &matmul_cols, &attention_group,  &int8::matmul_cols,
                             &exp_shifted, &silu_mul,    &quantize_int8_row};
  return k;
}

}  // namespace ferry::kernels::FERRY_PATH_NAMESPACE
