// Vec16: sixteen float lanes, the unit of every reduction in ferry.
//
// The canonical dot product of two length-K vectors (K a multiple of 16) is
//   lane[l] = fma(a[k], b[k], lane[l]) for k = l, l+16, l+32, ... in order,
// then the fixed tree  ((l0+l8) ...)  of reduce() below. The reference path
// emulates the lanes with std::fma; AVX2 holds them in two ymm registers and
// AVX-512 in one zmm, so all paths round identically and give the same bits.
// This header is included by one translation unit per path, each compiled
// with that path's ISA flags (FERRY_VEC_ISA selects the implementation).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/half.h"

#if defined(FERRY_VEC_AVX512) || defined(FERRY_VEC_AVX2)
#include <immintrin.h>
#endif

namespace ferry::kernels {
// Internal linkage: each kernel path's translation unit compiles its own copy
// with its own ISA; sharing one definition across them would break the ODR.
namespace {

// e^x for the attention softmax and SwiGLU, the same bits on every path and
// in every lane (canonical_exp(Vec16) below, sixteen at a time, runs the
// same steps, canonical_exp_steps, with its ISA's pieces): x = n ln2 + r with
// n = round(x log2 e) (the 1.5 * 2^23 shifter, ties to even), r reduced by
// ln2 in two parts with FMA, e^r by its Taylor polynomial of degree 7
// (Horner, FMA; truncation under 2^-27 for |r| <= ln2 / 2), times 2^n as
// two powers of two (exact unless the result is subnormal). About 1 ulp
// from e^x. NaN stays NaN; below -104 gives 0, above 88 gives inf.
namespace canonical_exp_c {
constexpr float kLog2e = 1.44269504f, kShift = 12582912.0f, kLn2Hi = 0.693145751953125f,
                kLn2Lo = 1.42860677e-6f, kMin = -104.0f, kMax = 88.0f;
constexpr float kC[8] = {1.0f,         1.0f,          0.5f,           1.0f / 6.0f,
                         1.0f / 24.0f, 1.0f / 120.0f, 1.0f / 720.0f, 1.0f / 5040.0f};
}  // namespace canonical_exp_c

namespace canonical_exp_c {
// 2^n as two factors, each a normal float (n integral, |n| <= 150; other
// n, whose results limits() replaces, are clamped so the cast is defined).
inline void pow2_halves(float n, float& s1, float& s2) {
  n = n != n ? 0.0f : std::fmin(std::fmax(n, -150.0f), 150.0f);
  const int32_t ni = static_cast<int32_t>(n), h = ni >> 1;
  s1 = std::bit_cast<float>(static_cast<uint32_t>(h + 127) << 23);
  s2 = std::bit_cast<float>(static_cast<uint32_t>(ni - h + 127) << 23);
}
// y, except: 0 below kMin, inf above kMax, x itself when NaN.
inline float limits(float x, float y) {
  return x != x ? x : x < kMin ? 0.0f : x > kMax ? INFINITY : y;
}
}  // namespace canonical_exp_c

// The arithmetic of canonical_exp for one float or a Vec16 (V: float or
// Vec16, with fmadd, pow2_halves and limits): one sequence of IEEE steps.
template <class V, class Fma, class Pow2, class Limits>
V canonical_exp_steps(V x, V (*splat)(float), Fma fmadd, Pow2 pow2_halves, Limits limits) {
  using namespace canonical_exp_c;
  const V n = fmadd(x, splat(kLog2e), splat(kShift)) - splat(kShift);
  const V r = fmadd(n, splat(-kLn2Lo), fmadd(n, splat(-kLn2Hi), x));
  V p = splat(kC[7]);
  for (int i = 6; i >= 0; --i) p = fmadd(p, r, splat(kC[i]));
  V s1, s2;
  pow2_halves(n, s1, s2);
  return limits(x, (p * s1) * s2);
}

inline float canonical_exp(float x) {
  return canonical_exp_steps<float>(
      x, +[](float v) { return v; }, [](float a, float b, float c) { return std::fma(a, b, c); },
      [](float n, float& s1, float& s2) { canonical_exp_c::pow2_halves(n, s1, s2); },
      [](float v, float y) { return canonical_exp_c::limits(v, y); });
}

#if defined(FERRY_VEC_AVX512)
struct Vec16 {
  __m512 v;
  static Vec16 zero() { return {_mm512_setzero_ps()}; }
  static Vec16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static Vec16 splat(float x) { return {_mm512_set1_ps(x)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  // this = a * b + this, one rounding per lane.
  void fma(Vec16 a, Vec16 b) { v = _mm512_fmadd_ps(a.v, b.v, v); }
  Vec16 operator*(Vec16 o) const { return {_mm512_mul_ps(v, o.v)}; }
  Vec16 operator+(Vec16 o) const { return {_mm512_add_ps(v, o.v)}; }
  Vec16 operator-(Vec16 o) const { return {_mm512_sub_ps(v, o.v)}; }
  Vec16 operator/(Vec16 o) const { return {_mm512_div_ps(v, o.v)}; }
  // 16 int8 / low nibbles / high nibbles of 16 bytes, widened exactly.
  static Vec16 from_i8(const uint8_t* p) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)))};
  }
  static Vec16 from_lo4(const uint8_t* p) {
    __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
    return {_mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(0xf)))};
  }
  static Vec16 from_hi4(const uint8_t* p) {
    __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
    return {_mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4))};
  }
  static Vec16 from_f16(const uint8_t* p) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p))};
  }
  // One f16 to float (exact; the same value f16_to_f32 gives).
  static float h2f(uint16_t h) { return _cvtsh_ss(h); }
  // 16 unsigned bytes; 16 packed 4-bit codes in 8 bytes, low nibble first.
  static Vec16 from_u8(const uint8_t* p) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)))};
  }
  static Vec16 from_u4i(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64((const __m128i*)p), m = _mm_set1_epi8(0xf);
    const __m128i q =
        _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q))};
  }
  static Vec16 from_bf16(const uint8_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
  }
  // canonical_exp's ISA pieces: 2^n as two factors (n integral, |n| <= 150)
  // and the special lanes (below kMin 0, above kMax inf, NaN kept).
  static void pow2_halves(Vec16 n, Vec16& s1, Vec16& s2) {
    const __m512i ni = _mm512_cvtps_epi32(n.v), h = _mm512_srai_epi32(ni, 1);
    const __m512i b = _mm512_set1_epi32(127);
    s1.v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(h, b), 23));
    s2.v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, h), b), 23));
  }
  static Vec16 exp_limits(Vec16 x, Vec16 y) {
    using namespace canonical_exp_c;
    __m512 r = _mm512_mask_mov_ps(y.v, _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(kMin), _CMP_LT_OQ),
                                  _mm512_setzero_ps());
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(kMax), _CMP_GT_OQ),
                           _mm512_set1_ps(INFINITY));
    return {_mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q), x.v)};
  }
  float reduce() const {
    // extractf32x8(v, 0) rather than castps512_ps256: GCC 12 warns on the cast.
    __m256 s8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
  }
};
#elif defined(FERRY_VEC_AVX2)
struct Vec16 {
  __m256 lo, hi;  // lanes 0-7, 8-15
  static Vec16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Vec16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static Vec16 splat(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  void store(float* p) const {
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p + 8, hi);
  }
  void fma(Vec16 a, Vec16 b) {
    lo = _mm256_fmadd_ps(a.lo, b.lo, lo);
    hi = _mm256_fmadd_ps(a.hi, b.hi, hi);
  }
  Vec16 operator*(Vec16 o) const { return {_mm256_mul_ps(lo, o.lo), _mm256_mul_ps(hi, o.hi)}; }
  Vec16 operator+(Vec16 o) const { return {_mm256_add_ps(lo, o.lo), _mm256_add_ps(hi, o.hi)}; }
  Vec16 operator-(Vec16 o) const { return {_mm256_sub_ps(lo, o.lo), _mm256_sub_ps(hi, o.hi)}; }
  Vec16 operator/(Vec16 o) const { return {_mm256_div_ps(lo, o.lo), _mm256_div_ps(hi, o.hi)}; }
  static __m256 cvt8(__m128i bytes8) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes8)); }
  static Vec16 from_i8(const uint8_t* p) {
    return {cvt8(_mm_loadl_epi64((const __m128i*)p)),
            cvt8(_mm_loadl_epi64((const __m128i*)(p + 8)))};
  }
  static Vec16 nib(const uint8_t* p, int shift) {
    __m128i b = _mm_loadu_si128((const __m128i*)p);
    __m256i lo8 = _mm256_cvtepu8_epi32(b), hi8 = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
    const __m256i m = _mm256_set1_epi32(0xf);
    if (shift) {
      lo8 = _mm256_srli_epi32(lo8, 4);
      hi8 = _mm256_srli_epi32(hi8, 4);
    }
    return {_mm256_cvtepi32_ps(_mm256_and_si256(lo8, m)),
            _mm256_cvtepi32_ps(_mm256_and_si256(hi8, m))};
  }
  static Vec16 from_lo4(const uint8_t* p) { return nib(p, 0); }
  static float h2f(uint16_t h) { return _cvtsh_ss(h); }
  static Vec16 u8x16(__m128i q) {
    return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)))};
  }
  static Vec16 from_u8(const uint8_t* p) { return u8x16(_mm_loadu_si128((const __m128i*)p)); }
  static Vec16 from_u4i(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64((const __m128i*)p), m = _mm_set1_epi8(0xf);
    return u8x16(_mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m)));
  }
  static Vec16 from_hi4(const uint8_t* p) { return nib(p, 4); }
  static Vec16 from_f16(const uint8_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)),
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 16)))};
  }
  static __m256 bf8(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static Vec16 from_bf16(const uint8_t* p) {
    return {bf8(_mm_loadu_si128((const __m128i*)p)),
            bf8(_mm_loadu_si128((const __m128i*)(p + 16)))};
  }
  static void pow2_halves(Vec16 n, Vec16& s1, Vec16& s2) {
    auto half = [](__m256 n8, __m256& a, __m256& b) {
      const __m256i ni = _mm256_cvtps_epi32(n8), h = _mm256_srai_epi32(ni, 1);
      const __m256i k = _mm256_set1_epi32(127);
      a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, k), 23));
      b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), k), 23));
    };
    half(n.lo, s1.lo, s2.lo);
    half(n.hi, s1.hi, s2.hi);
  }
  static Vec16 exp_limits(Vec16 x, Vec16 y) {
    auto half = [](__m256 x8, __m256 y8) {
      using namespace canonical_exp_c;
      y8 = _mm256_blendv_ps(y8, _mm256_setzero_ps(),
                            _mm256_cmp_ps(x8, _mm256_set1_ps(kMin), _CMP_LT_OQ));
      y8 = _mm256_blendv_ps(y8, _mm256_set1_ps(INFINITY),
                            _mm256_cmp_ps(x8, _mm256_set1_ps(kMax), _CMP_GT_OQ));
      return _mm256_blendv_ps(y8, x8, _mm256_cmp_ps(x8, x8, _CMP_UNORD_Q));
    };
    return {half(x.lo, y.lo), half(x.hi, y.hi)};
  }
  float reduce() const {
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
  }
};
#else
struct Vec16 {
  float l[16];
  static Vec16 zero() { return Vec16{}; }
  static Vec16 load(const float* p) {
    Vec16 r;
    for (int i = 0; i < 16; ++i) r.l[i] = p[i];
    return r;
  }
  static Vec16 splat(float x) {
    Vec16 r;
    for (int i = 0; i < 16; ++i) r.l[i] = x;
    return r;
  }
  void store(float* p) const {
    for (int i = 0; i < 16; ++i) p[i] = l[i];
  }
  void fma(Vec16 a, Vec16 b) {
    for (int i = 0; i < 16; ++i) l[i] = std::fma(a.l[i], b.l[i], l[i]);
  }
  template <class F>
  static Vec16 make(F f) {
    Vec16 r;
    for (int i = 0; i < 16; ++i) r.l[i] = f(i);
    return r;
  }
  Vec16 operator*(Vec16 o) const {
    return make([&](int i) { return l[i] * o.l[i]; });
  }
  Vec16 operator+(Vec16 o) const {
    return make([&](int i) { return l[i] + o.l[i]; });
  }
  Vec16 operator-(Vec16 o) const {
    return make([&](int i) { return l[i] - o.l[i]; });
  }
  Vec16 operator/(Vec16 o) const {
    return make([&](int i) { return l[i] / o.l[i]; });
  }
  static Vec16 from_i8(const uint8_t* p) {
    return make([&](int i) { return static_cast<float>(static_cast<int8_t>(p[i])); });
  }
  static float h2f(uint16_t h) { return f16_to_f32(h); }
  static Vec16 from_u8(const uint8_t* p) {
    return make([&](int i) { return static_cast<float>(p[i]); });
  }
  static Vec16 from_u4i(const uint8_t* p) {
    return make([&](int i) { return static_cast<float>((p[i / 2] >> (4 * (i % 2))) & 0xf); });
  }
  static Vec16 from_lo4(const uint8_t* p) {
    return make([&](int i) { return static_cast<float>(p[i] & 0xf); });
  }
  static Vec16 from_hi4(const uint8_t* p) {
    return make([&](int i) { return static_cast<float>(p[i] >> 4); });
  }
  static Vec16 from_f16(const uint8_t* p) {
    return make(
        [&](int i) { return f16_to_f32(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8))); });
  }
  static Vec16 from_bf16(const uint8_t* p) {
    return make(
        [&](int i) { return bf16_to_f32(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8))); });
  }
  static void pow2_halves(Vec16 n, Vec16& s1, Vec16& s2) {
    for (int i = 0; i < 16; ++i) canonical_exp_c::pow2_halves(n.l[i], s1.l[i], s2.l[i]);
  }
  static Vec16 exp_limits(Vec16 x, Vec16 y) {
    return make([&](int i) { return canonical_exp_c::limits(x.l[i], y.l[i]); });
  }
  float reduce() const {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; ++i) s8[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
  }
};
#endif

// canonical_exp of sixteen lanes: each lane the bits of the scalar one.
inline Vec16 canonical_exp(Vec16 x) {
  return canonical_exp_steps<Vec16>(
      x, &Vec16::splat,
      [](Vec16 a, Vec16 b, Vec16 c) {
        c.fma(a, b);
        return c;
      },
      [](Vec16 n, Vec16& s1, Vec16& s2) { Vec16::pow2_halves(n, s1, s2); },
      [](Vec16 v, Vec16 y) { return Vec16::exp_limits(v, y); });
}

// Canonical dot product; n % 16 == 0.
inline float dot16(const float* a, const float* b, size_t n) {
  Vec16 acc = Vec16::zero();
  for (size_t k = 0; k < n; k += 16) acc.fma(Vec16::load(a + k), Vec16::load(b + k));
  return acc.reduce();
}

}  // namespace
}  // namespace ferry::kernels
