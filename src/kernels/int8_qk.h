// Int8 mode's Q4_K / Q5_K weights (decode_q4_k, decode_q5_k), per path like
// int8_dots.h, whose I32x16, dot4 and block-sum trees they use.
//
// A super-block is 144 (Q4_K) or 176 (Q5_K) bytes: f16 d and dmin at 0 and
// 2, 12 bytes of 6-bit scales and mins at 4 (k_scale_min), Q5_K's 32 bytes
// of fifth bits qh at 16, then 128 bytes of nibbles: block 2g's codes are
// the low nibbles of bytes 32g .. 32g + 31, block 2g + 1's the high ones
// (plus, Q5_K, bit 2g or 2g + 1 of qh[i] as bit 4 of code i). A chunk of
// n = 8 or 16 blocks is one or two super-blocks; `first` is the first.
//
//   unpack_qk<Five>(sb, dst)       the super-block's 256 codes to dst
//                                  (64-byte aligned), natural layout;
//   qk_dots_direct<Five>(first, n, x)
//                                  block_dots_natural<false> of the codes
//                                  unpack_qk would write, built in registers
//                                  (few_rows never stores them);
//   qk_scales<Five>(first, n, dw, m)
//                                  lane l < n: dw = d * sc_l and
//                                  m = -(dmin * mn_l), the two float products
//                                  decode_q4_k forms (sc, mn widened exactly);
//                                  lanes >= n +0.
// The same integers and the same floats on every path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/int8_dots.h"
#include "kernels/quant_blocks.h"
#include "kernels/vec16.h"

namespace ferry::kernels {
namespace {

template <bool Five>
constexpr size_t kQKBytes = Five ? 176 : 144;
template <bool Five>
constexpr size_t kQKCodes = Five ? 48 : 16;  // offset of the nibbles

#if defined(FERRY_VEC_AVX512) || defined(FERRY_VEC_AVX2)
// The 6-bit scales (bytes 0-15) and mins (bytes 16-31) of blocks 0-15 of
// the one or two super-blocks at first; blocks >= n zero. With s the 12
// bytes at sb + 4, k_scale_min gives block j
//   j < 4:  sc = s[j] & 63,                       mn = s[j + 4] & 63
//   j >= 4: sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4,
//           mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4.
// Per 128-bit lane (one super-block), p gathers the bytes that give the low
// bits (scales in bytes 0-7, mins in 8-15) and q those whose top two bits
// are bits 4-5 (zero where there are none, j < 4).
inline __m256i qk_scale_bytes(const uint8_t* first, size_t n, size_t stride) {
  const __m128i s0 = _mm_loadu_si128((const __m128i*)(first + 4));  // bytes 4-19
  const __m128i s1 =
      n > 8 ? _mm_loadu_si128((const __m128i*)(first + stride + 4)) : _mm_setzero_si128();
  const __m256i s = _mm256_inserti128_si256(_mm256_castsi128_si256(s0), s1, 1);
  const __m256i ip = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m256i iq = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m256i p = _mm256_shuffle_epi8(s, ip), q = _mm256_shuffle_epi8(s, iq);
  // Low bits: & 63 (j < 4), & 15 (scales j >= 4), >> 4 (mins j >= 4).
  const __m256i keep = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  const __m256i high = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  // The 16-bit shifts move across bytes only bits the masks drop.
  const __m256i low =
      _mm256_or_si256(_mm256_and_si256(p, keep), _mm256_and_si256(_mm256_srli_epi16(p, 4), high));
  const __m256i top =
      _mm256_srli_epi16(_mm256_and_si256(q, _mm256_set1_epi8(static_cast<char>(0xc0))), 2);
  // Qwords [sc 0-7, mn 0-7 | sc 8-15, mn 8-15] -> [sc 0-15 | mn 0-15].
  return _mm256_permute4x64_epi64(_mm256_or_si256(low, top), _MM_SHUFFLE(3, 1, 2, 0));
}

// d and dmin of the one or two super-blocks at first, as f16 words
// [d0, dmin0, d1, dmin1] (the second pair zero if n <= 8).
inline __m128i qk_d_dmin(const uint8_t* first, size_t n, size_t stride) {
  uint32_t a = 0, b = 0;
  std::memcpy(&a, first, 4);
  if (n > 8) std::memcpy(&b, first + stride, 4);
  return _mm_setr_epi32(static_cast<int>(a), static_cast<int>(b), 0, 0);
}
#endif

#if defined(FERRY_VEC_AVX512)
// Q5_K's fifth bits of the super-block at sb in both 256-bit halves.
template <bool Five>
inline __m512i qk_qh(const uint8_t* sb) {
  if constexpr (Five)
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(sb + 16)));
  else
    return _mm512_setzero_si512();
}

// Blocks 2g (lower half) and 2g + 1 (upper half) of the super-block at sb:
// one broadcast load of their 32 nibble bytes, the upper half shifted.
template <bool Five>
inline __m512i qk_pair(const uint8_t* sb, int g, __m512i qh) {
  const __m512i q =
      _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(sb + kQKCodes<Five> + 32 * g)));
  __m512i z = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xffff0000u, q, 4), _mm512_set1_epi8(15));
  if constexpr (Five) {
    const __m512i bit =
        _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * g))),
                           _mm256_set1_epi8(static_cast<char>(1 << (2 * g + 1))), 1);
    z = _mm512_mask_add_epi8(z, _mm512_test_epi8_mask(qh, bit), z, _mm512_set1_epi8(16));
  }
  return z;
}

template <bool Five>
inline void unpack_qk(const uint8_t* sb, uint8_t* dst) {
  const __m512i qh = qk_qh<Five>(sb);
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) _mm512_store_si512(dst + 64 * g, qk_pair<Five>(sb, g, qh));
}

template <bool Five>
inline I32x16 qk_dots_direct(const uint8_t* first, size_t n, const int8_t* x) {
  __m512i v[8];
  if (n > 8) {
#pragma GCC unroll 2
    for (int s = 0; s < 2; ++s) {
      const uint8_t* sb = first + kQKBytes<Five> * s;
      const __m512i qh = qk_qh<Five>(sb);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g)
        v[4 * s + g] =
            dot4<false>(qk_pair<Five>(sb, g, qh), _mm512_loadu_si512(x + 256 * s + 64 * g));
    }
    return {sum_blocks(v)};
  }
  const __m512i qh = qk_qh<Five>(first);
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g)
    v[g] = dot4<false>(qk_pair<Five>(first, g, qh), _mm512_loadu_si512(x + 64 * g));
  return {sum_blocks_half(v)};
}

template <bool Five>
inline void qk_scales(const uint8_t* first, size_t n, Vec16& dw, Vec16& m) {
  constexpr size_t kB = kQKBytes<Five>;
  const __m256i bytes = qk_scale_bytes(first, n, kB);
  const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(bytes)));
  const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(bytes, 1)));
  const __m512 h = _mm512_castps128_ps512(_mm_cvtph_ps(qk_d_dmin(first, n, kB)));
  const __m512 d =
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), h);
  const __m512 dmin =
      _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), h);
  dw = {_mm512_mul_ps(d, sc)};
  // The sign flip is the exact negation; lanes >= n stay +0.
  m = {
      _mm512_maskz_xor_ps(n > 8 ? 0xffff : 0x00ff, _mm512_mul_ps(dmin, mn), _mm512_set1_ps(-0.0f))};
}

#elif defined(FERRY_VEC_AVX2)
template <bool Five>
inline __m256i qk_qh(const uint8_t* sb) {
  if constexpr (Five)
    return _mm256_loadu_si256((const __m256i*)(sb + 16));
  else
    return _mm256_setzero_si256();
}

// Block j (0-7) of the super-block at sb.
template <bool Five>
inline __m256i qk_block(const uint8_t* sb, int j, __m256i qh) {
  const __m256i q = _mm256_loadu_si256((const __m256i*)(sb + kQKCodes<Five> + 32 * (j / 2)));
  __m256i z = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(15));
  if constexpr (Five) {
    // Bit j of each qh byte to bit 4; 16-bit shifts of at most 4 move
    // across bytes only bits the mask drops.
    const __m256i t = j <= 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
    z = _mm256_or_si256(z, _mm256_and_si256(t, _mm256_set1_epi8(16)));
  }
  return z;
}

template <bool Five>
inline void unpack_qk(const uint8_t* sb, uint8_t* dst) {
  const __m256i qh = qk_qh<Five>(sb);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j)
    _mm256_store_si256((__m256i*)(dst + 32 * j), qk_block<Five>(sb, j, qh));
}

template <bool Five>
inline I32x16 qk_dots_direct(const uint8_t* first, size_t n, const int8_t* x) {
  // The block sums of super-block s (blocks 8s .. 8s + 7).
  auto sums = [&](size_t s) {
    const uint8_t* sb = first + kQKBytes<Five> * s;
    const __m256i qh = qk_qh<Five>(sb);
    __m256i v[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      v[j] = dot4<false>(qk_block<Five>(sb, j, qh),
                         _mm256_loadu_si256((const __m256i*)(x + 256 * s + 32 * j)));
    return sum_blocks8(v);
  };
  return {sums(0), n > 8 ? sums(1) : _mm256_setzero_si256()};
}

template <bool Five>
inline void qk_scales(const uint8_t* first, size_t n, Vec16& dw, Vec16& m) {
  constexpr size_t kB = kQKBytes<Five>;
  const __m256i bytes = qk_scale_bytes(first, n, kB);
  const Vec16 sc = Vec16::u8x16(_mm256_castsi256_si128(bytes));
  const Vec16 mn = Vec16::u8x16(_mm256_extracti128_si256(bytes, 1));
  const __m128 h = _mm_cvtph_ps(qk_d_dmin(first, n, kB));  // [d0, dmin0, d1, dmin1]
  const __m256 d0 = _mm256_set1_ps(_mm_cvtss_f32(h));
  const __m256 m0 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(h), _mm256_set1_epi32(1));
  const __m256 d1 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(h), _mm256_set1_epi32(2));
  const __m256 m1 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(h), _mm256_set1_epi32(3));
  const __m256 neg = _mm256_set1_ps(-0.0f);  // the sign flip is the exact negation
  dw = {_mm256_mul_ps(d0, sc.lo), _mm256_mul_ps(d1, sc.hi)};
  m = {_mm256_xor_ps(_mm256_mul_ps(m0, mn.lo), neg),
       n > 8 ? _mm256_xor_ps(_mm256_mul_ps(m1, mn.hi), neg) : _mm256_setzero_ps()};
}

#else
template <bool Five>
inline void unpack_qk(const uint8_t* sb, uint8_t* dst) {
  const uint8_t* qh = sb + 16;
  const uint8_t* q = sb + kQKCodes<Five>;
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 32; ++i) {
      const uint8_t nib = (j % 2) ? q[32 * (j / 2) + i] >> 4 : q[32 * (j / 2) + i] & 0xf;
      dst[32 * j + i] = Five ? static_cast<uint8_t>(nib | ((qh[i] >> j) & 1) << 4) : nib;
    }
}

template <bool Five>
inline I32x16 qk_dots_direct(const uint8_t* first, size_t n, const int8_t* x) {
  alignas(64) uint8_t natural[16 * 32];
  for (size_t k = 0; k < n; k += 8)
    unpack_qk<Five>(first + kQKBytes<Five> * (k / 8), natural + 32 * k);
  return block_dots_natural<false>(natural, x, n);
}

template <bool Five>
inline void qk_scales(const uint8_t* first, size_t n, Vec16& dw, Vec16& m) {
  float fdw[16] = {}, fm[16] = {};
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* sb = first + kQKBytes<Five> * (k / 8);
    uint8_t sc, mn;
    k_scale_min(static_cast<int>(k % 8), sb + 4, &sc, &mn);
    fdw[k] = Vec16::h2f(load_u16(sb)) * sc;
    fm[k] = -(Vec16::h2f(load_u16(sb + 2)) * mn);
  }
  dw = Vec16::load(fdw);
  m = Vec16::load(fm);
}
#endif

}  // namespace
}  // namespace ferry::kernels
