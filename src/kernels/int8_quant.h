// Int8 mode's activation quantizer, per path like vec16.h (each path's
// translation unit compiles its own copy with its ISA).
//
//   quantize_int8_row(x, nb, codes, d, sum, sum_lo)
//       blocks b < nb of 32 floats at x + 32 b: d[b] = amax / 127, codes
//       codes[32 b + k] = round_even(x / d) clamped to [-127, 127], sum[b]
//       their sum and sum_lo[b] the sum of codes 0-15 (docs/KERNELS.md,
//       "The arithmetic"). A zero block gets d = 0 and zero codes; a block
//       with a non-finite element gets zero codes and a non-finite d.
//
// The vector versions compute the same values with the same IEEE
// operations (a maximum, one division per element, the 1.5 * 2^23 rounding
// add and subtract, a clamp), so every path writes the same bytes; blocks
// with a non-finite element, and those whose d is 0, take the scalar code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(FERRY_VEC_AVX512) || defined(FERRY_VEC_AVX2)
#include <immintrin.h>
#endif

namespace ferry::kernels {
namespace {

// Rounds to the nearest integer, ties to even, for |v| <= 2^22: adding and
// removing 1.5 * 2^23 leaves no fraction bits (exact IEEE steps, the same
// on every path and compiler, no dependence on library rounding calls).
inline float round_even(float v) {
  constexpr float kMagic = 0x1.8p23f;
  return (v + kMagic) - kMagic;
}

// One block, scalar: the definition the vector versions follow.
inline void quantize_block_scalar(const float* xb, int8_t* c, float* d_out, int32_t* s_out,
                                  int32_t* s_lo_out) {
  float amax = 0.0f;
  for (size_t k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(xb[k]));
  for (size_t k = 0; k < 32; ++k) amax = std::isnan(xb[k]) ? xb[k] : amax;
  const float d = amax / 127.0f;
  int32_t s = 0, s_lo = 0;
  for (size_t k = 0; k < 32; ++k) {
    float v = d > 0.0f && std::isfinite(d) ? round_even(xb[k] / d) : 0.0f;
    v = std::min(127.0f, std::max(-127.0f, v));
    const int8_t code = static_cast<int8_t>(v);
    c[k] = code;
    s += code;
    if (k == 15) s_lo = s;
  }
  *d_out = d;
  *s_out = s;
  *s_lo_out = s_lo;
}

#if defined(FERRY_VEC_AVX512)
inline void quantize_int8_row(const float* x, size_t nb, int8_t* codes, float* d, int32_t* sum,
                              int32_t* sum_lo) {
  const __m512 magic = _mm512_set1_ps(0x1.8p23f), hi = _mm512_set1_ps(127.0f),
               lo = _mm512_set1_ps(-127.0f), inf = _mm512_set1_ps(INFINITY);
  for (size_t b = 0; b < nb; ++b) {
    const float* xb = x + 32 * b;
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
    // Non-finite (|x| >= inf, or NaN: the ordered compare is false).
    const bool finite = _mm512_cmp_ps_mask(a0, inf, _CMP_LT_OQ) == 0xffff &&
                        _mm512_cmp_ps_mask(a1, inf, _CMP_LT_OQ) == 0xffff;
    const float db = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)) / 127.0f;
    if (!finite || !(db > 0.0f)) {  // and zero blocks
      quantize_block_scalar(xb, codes + 32 * b, d + b, sum + b, sum_lo + b);
      continue;
    }
    d[b] = db;
    const __m512 dv = _mm512_set1_ps(db);
    auto code = [&](__m512 v) {
      const __m512 r = _mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(v, dv), magic), magic);
      return _mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, r)));
    };
    const __m512i c0 = code(v0), c1 = code(v1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 32 * b), _mm512_cvtepi32_epi8(c0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 32 * b + 16), _mm512_cvtepi32_epi8(c1));
    const int32_t s_lo = _mm512_reduce_add_epi32(c0);
    sum_lo[b] = s_lo;
    sum[b] = s_lo + _mm512_reduce_add_epi32(c1);
  }
}
#elif defined(FERRY_VEC_AVX2)
inline void quantize_int8_row(const float* x, size_t nb, int8_t* codes, float* d, int32_t* sum,
                              int32_t* sum_lo) {
  const __m256 magic = _mm256_set1_ps(0x1.8p23f), hi = _mm256_set1_ps(127.0f),
               lo = _mm256_set1_ps(-127.0f), inf = _mm256_set1_ps(INFINITY),
               sign = _mm256_set1_ps(-0.0f);
  for (size_t b = 0; b < nb; ++b) {
    const float* xb = x + 32 * b;
    __m256 v[4], m = _mm256_setzero_ps();
    bool finite = true;
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      const __m256 a = _mm256_andnot_ps(sign, v[i]);
      finite = finite && _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_LT_OQ)) == 0xff;
      m = _mm256_max_ps(m, a);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float db = _mm_cvtss_f32(m4) / 127.0f;
    if (!finite || !(db > 0.0f)) {  // and zero blocks
      quantize_block_scalar(xb, codes + 32 * b, d + b, sum + b, sum_lo + b);
      continue;
    }
    d[b] = db;
    const __m256 dv = _mm256_set1_ps(db);
    __m256i c[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 r = _mm256_sub_ps(_mm256_add_ps(_mm256_div_ps(v[i], dv), magic), magic);
      c[i] = _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, r)));
    }
    // int32 -> int8 with saturation (the values are in [-127, 127]); the
    // packs interleave 128-bit lanes, the permute puts them back in order.
    const __m256i p16 = _mm256_packs_epi32(c[0], c[1]), q16 = _mm256_packs_epi32(c[2], c[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, q16),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 32 * b), p8);
    auto hsum = [](__m256i a) {
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
      return _mm_cvtsi128_si32(s);
    };
    const int32_t s_lo = hsum(_mm256_add_epi32(c[0], c[1]));
    sum_lo[b] = s_lo;
    sum[b] = s_lo + hsum(_mm256_add_epi32(c[2], c[3]));
  }
}
#else
inline void quantize_int8_row(const float* x, size_t nb, int8_t* codes, float* d, int32_t* sum,
                              int32_t* sum_lo) {
  for (size_t b = 0; b < nb; ++b)
    quantize_block_scalar(x + 32 * b, codes + 32 * b, d + b, sum + b, sum_lo + b);
}
#endif

}  // namespace
}  // namespace ferry::kernels
