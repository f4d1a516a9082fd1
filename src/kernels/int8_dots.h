// Int8 block dot products, the integer core of MatmulMode::Int8.
//
// Codes travel in chunks of W = 16, 8 or 4 blocks in the chunk layout
// (path_kernels.h, chunk_code_offset). block_dots<Signed, W>(w, x) returns
// sixteen int32 lanes: lane l < W is sum_{e < 32} w(l, e) * x(l, e) for
// block l of the chunk, lanes >= W are 0, with x
// signed int8 codes and w unsigned (Signed = false) or signed (Signed = true)
// 8-bit codes. The sums are exact integers (|lane| <= 32 * 255 * 127 < 2^24,
// so the later conversion to float is exact too), hence the same on every
// path whatever instructions compute them. Blocks past the end of a row
// have zero activation codes (QuantRows padding), so they sum to 0.
//
// block_dots_natural<Signed>(w, x, n) is the same for n <= 16 blocks in the
// natural layout (block l's codes at 32 l, as QuantRows holds them for
// calls of few rows), lanes >= n zero.
//
// Q6_K needs the two half-block sums (codes 0-15 and 16-31) instead, for
// unsigned codes: block_dots_halves<W>(w, x, lo, hi) (chunk layout) and
// block_dots_natural_halves(w, x, n, lo, hi); lo + hi is block_dots. Its
// weights: unpack_q6k(sb, dst) writes a super-block's 256 codes (0..63) in
// the natural layout, q6k_scales(first, n, lo, hi) the int8 sub-block
// scales of codes 0-15 / 16-31 of each of n = 8 or 16 blocks as int32
// lanes, q6k_d(first, n) the f16 super-block scale per block lane, and
// q6k_dots_direct(first, n, x, lo, hi) block_dots_natural_halves of the
// codes unpack_q6k would write, from registers (first: the chunk's first
// super-block; a second one follows at first + 210).
//
// unpack_codes<Nibbles>(src, stride, n, flip, dst) writes the 32 one-byte
// codes of n blocks, block k's from src + k * stride, to dst + 32 k (the
// natural layout): 32 bytes XOR flip (Q8_0), or 16 bytes of nibbles, low
// nibbles first (Q4_0, Q4_1). transpose_chunk<W>(natural, out) turns W such
// blocks into the chunk layout.
// scales_f16<Stride, Off>(first, n): lane k < n the f16 at
// first + Off + k * Stride, as float (exact); lanes >= n are 0. Reads only
// the n blocks' bytes [first, first + n * Stride).
//
// Per path (the including translation unit defines the ISA, as for vec16.h):
//   reference    scalar loops;
//   AVX2         vpmaddubsw + vpmaddwd, a ymm per 8 blocks x 4 codes;
//   AVX-512      a zmm per 16 blocks x 4 codes, vpdpbusd with FERRY_INT8_VNNI, else
//                vpmaddubsw + vpmaddwd.
// vpmaddubsw saturates int16 pair sums: unsigned codes must stay below 129
// (4-, 5- and 6-bit codes do), and signed weights use |w| * (x * sign w), whose
// pairs stay within 2 * 128 * 127. kQ8Unsigned says how this path wants Q8_0
// codes: VNNI has no saturation, so it takes w + 128 as unsigned and the
// caller subtracts 128 * sum(x); the others take them signed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/path_kernels.h"
#include "kernels/quant_blocks.h"
#include "kernels/vec16.h"

namespace ferry::kernels {
namespace {

#if defined(FERRY_VEC_AVX512)
#if defined(FERRY_INT8_VNNI)
constexpr bool kQ8Unsigned = true;
#else
constexpr bool kQ8Unsigned = false;
#endif

struct I32x16 {
  __m512i v;
  static I32x16 load(const int32_t* p) { return {_mm512_loadu_si512(p)}; }
  // this - (s << Shift)
  template <int Shift>
  I32x16 minus_shifted(I32x16 s) const {
    return {_mm512_sub_epi32(v, _mm512_slli_epi32(s.v, Shift))};
  }
  Vec16 to_float() const { return {_mm512_cvtepi32_ps(v)}; }
  void store(int32_t* p) const { _mm512_storeu_si512(p, v); }
  I32x16 operator+(I32x16 o) const { return {_mm512_add_epi32(v, o.v)}; }
  I32x16 operator-(I32x16 o) const { return {_mm512_sub_epi32(v, o.v)}; }
  I32x16 operator*(I32x16 o) const { return {_mm512_mullo_epi32(v, o.v)}; }
};

// Per 32-bit lane, the sum of four adjacent u8 x s8 products.
template <bool Signed>
inline __m512i dot4(__m512i w, __m512i x) {
  if constexpr (Signed) {
    // (|w| unsigned) * (x with w's sign); w = -128 gives |w| = 128 as u8.
    x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    w = _mm512_abs_epi8(w);
  }
#if defined(FERRY_INT8_VNNI)
  static_assert(!Signed, "the VNNI path takes Q8_0 codes unsigned");
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1));
#endif
}

// Weight unpacking (see unpack_codes / gather_f16 below), with stores as
// wide as the loads that read them back (a narrower store would block
// store-to-load forwarding).
template <bool Nibbles>
inline __m512i unpack_pair_reg(const uint8_t* src, size_t stride, size_t k, bool two,
                               uint8_t flip) {
  __m512i z;
  if constexpr (Nibbles) {
    const __m128i a = _mm_loadu_si128((const __m128i*)(src + k * stride));
    const __m128i b =
        two ? _mm_loadu_si128((const __m128i*)(src + (k + 1) * stride)) : _mm_setzero_si128();
    const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);  // [A | B]
    z = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);
    z = _mm512_and_si512(z, _mm512_set1_epi8(0xf));  // [A lo, B lo, A hi, B hi]
    z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
  } else {
    const __m256i a = _mm256_loadu_si256((const __m256i*)(src + k * stride));
    const __m256i b =
        two ? _mm256_loadu_si256((const __m256i*)(src + (k + 1) * stride)) : _mm256_setzero_si256();
    z = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1),
                         _mm512_set1_epi8(static_cast<char>(flip)));
  }
  return z;
}

template <bool Nibbles>
inline void unpack_pair(const uint8_t* src, size_t stride, size_t k, bool two, uint8_t flip,
                        uint8_t* dst) {
  _mm512_store_si512(dst + 32 * k, unpack_pair_reg<Nibbles>(src, stride, k, two, flip));
}

template <bool Nibbles>
inline void unpack_codes(const uint8_t* src, size_t stride, size_t n, uint8_t flip, uint8_t* dst) {
  if (n == 16) {
#pragma GCC unroll 8
    for (size_t k = 0; k < 16; k += 2) unpack_pair<Nibbles>(src, stride, k, true, flip, dst);
  } else {
    for (size_t k = 0; k < n; k += 2) unpack_pair<Nibbles>(src, stride, k, k + 1 < n, flip, dst);
  }
}

// Word permutes for scales_f16: for the 64-word window p (words 64p ..
// 64p+63 of the chunk), idx[p][k] = word of lane k inside it and mask[p]
// the lanes whose word is there.
template <size_t Stride, size_t Off>
struct ScaleGather {
  static constexpr size_t kWindows = ((Off + 15 * Stride) / 2) / 64 + 1;
  struct Tables {
    alignas(64) uint16_t idx[kWindows][32] = {};
    uint32_t mask[kWindows] = {};
  };
  static constexpr Tables make() {
    Tables t;
    for (size_t k = 0; k < 16; ++k) {
      const size_t word = (Off + k * Stride) / 2;
      t.idx[word / 64][k] = static_cast<uint16_t>(word % 64);
      t.mask[word / 64] |= 1u << k;
    }
    return t;
  }
  static constexpr Tables kTables = make();
};

// The 128-byte window p of a chunk's bytes [0, bytes) as two zmm, bytes
// past the chunk read as zero (masked loads: nothing past it is touched).
inline void load_window(const uint8_t* first, size_t bytes, size_t p, __m512i z[2]) {
#pragma GCC unroll 2
  for (size_t h = 0; h < 2; ++h) {
    const size_t at = 128 * p + 64 * h;
    const size_t left = bytes > at ? bytes - at : 0;
    const __mmask64 m = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
    z[h] = _mm512_maskz_loadu_epi8(m, first + at);
  }
}

template <size_t Stride, size_t Off>
inline Vec16 scales_f16(const uint8_t* first, size_t n) {
  static_assert(Stride % 2 == 0 && Off % 2 == 0);
  using G = ScaleGather<Stride, Off>;
  const size_t bytes = n * Stride;  // the chunk's blocks; nothing past them
  __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (size_t p = 0; p < G::kWindows; ++p) {
    __m512i z[2];
    load_window(first, bytes, p, z);
    const __m512i idx = _mm512_load_si512(G::kTables.idx[p]);
    acc = _mm512_mask_blend_epi16(G::kTables.mask[p], acc,
                                  _mm512_permutex2var_epi16(z[0], idx, z[1]));
    if (128 * (p + 1) >= bytes) break;  // a short last chunk: no more blocks
  }
  // Lanes >= n read zero bytes (masked loads), so they are +0.
  return {_mm512_cvtph_ps(_mm512_castsi512_si256(acc))};
}

// Dword permutes for scales_f16_pair: for the 32-dword window p, idx[p][k]
// = dword of lane k inside it and mask[p] the lanes whose dword is there.
template <size_t Stride>
struct PairGather {
  static constexpr size_t kWindows = (15 * Stride / 4) / 32 + 1;
  struct Tables {
    alignas(64) int32_t idx[kWindows][16] = {};
    uint16_t mask[kWindows] = {};
  };
  static constexpr Tables make() {
    Tables t;
    for (size_t k = 0; k < 16; ++k) {
      const size_t dword = k * Stride / 4;
      t.idx[dword / 32][k] = static_cast<int32_t>(dword % 32);
      t.mask[dword / 32] = static_cast<uint16_t>(t.mask[dword / 32] | (1u << k));
    }
    return t;
  }
  static constexpr Tables kTables = make();
};

// scales_f16<Stride, 0> and scales_f16<Stride, 2> at once (Q4_1's d and m
// share a dword): one gather of each block's first dword.
template <size_t Stride>
inline void scales_f16_pair(const uint8_t* first, size_t n, Vec16& lo, Vec16& hi) {
  static_assert(Stride % 4 == 0);
  using G = PairGather<Stride>;
  const size_t bytes = n * Stride;
  __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (size_t p = 0; p < G::kWindows; ++p) {
    __m512i z[2];
    load_window(first, bytes, p, z);
    acc = _mm512_mask_blend_epi32(
        G::kTables.mask[p], acc,
        _mm512_permutex2var_epi32(z[0], _mm512_load_si512(G::kTables.idx[p]), z[1]));
    if (128 * (p + 1) >= bytes) break;
  }
  // Lanes >= n read zero bytes (masked loads), so they are +0.
  lo = {_mm512_cvtph_ps(_mm512_cvtepi32_epi16(acc))};
  hi = {_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(acc, 16)))};
}

// Stage s of the transpose (see transpose_chunk): registers hold 2^(s+1)
// blocks x 2^(3-s) dwords; kIdx[s][h] builds an output register of stage
// s + 1 from two of stage s, h = the parity of its dword group.
struct TransposeTables {
  alignas(64) int32_t idx[3][2][16] = {};
};
constexpr TransposeTables make_transpose_tables() {
  TransposeTables t;
  for (int s = 0; s < 3; ++s) {
    const int bs = 2 << s, ds = 8 >> s, ds2 = ds / 2;
    for (int h = 0; h < 2; ++h)
      for (int p = 0; p < 16; ++p) {
        const int l = p / ds2, i = h * ds2 + p % ds2;  // block, dword (relative)
        const bool from_b = l >= bs;
        t.idx[s][h][p] = (l % bs) * ds + (i % ds) + (from_b ? 16 : 0);
      }
  }
  return t;
}
constexpr TransposeTables kTranspose = make_transpose_tables();

// natural: 16 blocks of 32 codes; out: the chunk layout (dword i of block l
// at byte 64 i + 4 l). Three rounds of two-source dword permutes.
// One stage: register (bg, ig) of stage S+1 (index bg * 2^(S+1) + ig) from
// registers (2 bg, ig / 2) and (2 bg + 1, ig / 2) of stage S.
template <int S>
inline void transpose_stage(const __m512i* r, __m512i* q) {
  const __m512i i0 = _mm512_load_si512(kTranspose.idx[S][0]);
  const __m512i i1 = _mm512_load_si512(kTranspose.idx[S][1]);
  constexpr int kGroups = 1 << S;
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const int bg = k / (2 * kGroups), ig = k % (2 * kGroups);
    q[k] = _mm512_permutex2var_epi32(r[2 * bg * kGroups + ig / 2], ig % 2 ? i1 : i0,
                                     r[(2 * bg + 1) * kGroups + ig / 2]);
  }
}

inline void transpose16(const uint8_t* natural, uint8_t* out) {
  __m512i r[8], q[8];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) r[k] = _mm512_load_si512(natural + 64 * k);
  transpose_stage<0>(r, q);
  transpose_stage<1>(q, r);
  transpose_stage<2>(r, q);
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) _mm512_store_si512(out + 64 * k, q[k]);
}

// Width 4 or 8: output register o (dwords 16 o ..) takes dword (row i,
// block l) = natural dword 8 l + i, from the input pair p holding it.
template <int W>
struct NarrowTables {
  alignas(64) int32_t idx[W / 2][W / 4][16] = {};
  uint16_t mask[W / 2][W / 4] = {};
};
template <int W>
constexpr NarrowTables<W> make_narrow_tables() {
  NarrowTables<W> t;
  for (int o = 0; o < W / 2; ++o)
    for (int p = 0; p < 16; ++p) {
      const int d = 16 * o + p, i = d / W, l = d % W, src = 8 * l + i;  // natural dword
      t.idx[o][src / 32][p] = src % 32;
      t.mask[o][src / 32] = static_cast<uint16_t>(t.mask[o][src / 32] | (1u << p));
    }
  return t;
}
template <int W>
constexpr NarrowTables<W> kNarrow = make_narrow_tables<W>();

template <int W>
inline void transpose_chunk(const uint8_t* natural, uint8_t* out) {
  if constexpr (W == 16) {
    transpose16(natural, out);
  } else {
    __m512i r[W / 2];
#pragma GCC unroll 4
    for (int k = 0; k < W / 2; ++k) r[k] = _mm512_load_si512(natural + 64 * k);
#pragma GCC unroll 4
    for (int o = 0; o < W / 2; ++o) {
      __m512i v = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (int p = 0; p < W / 4; ++p)
        v = _mm512_mask_blend_epi32(
            kNarrow<W>.mask[o][p], v,
            _mm512_permutex2var_epi32(r[2 * p], _mm512_load_si512(kNarrow<W>.idx[o][p]),
                                      r[2 * p + 1]));
      _mm512_store_si512(out + 64 * o, v);
    }
  }
}

// Natural layout (block l's 32 codes at 32 l), for calls of few rows: no
// transpose, the block sums come from a shuffle tree instead.
// v[i] holds blocks 2i (128-bit lanes 0, 1) and 2i+1 (lanes 2, 3) as
// partial sums; a block's lanes 0 and 2 hold its codes 0-15, lanes 1 and 3
// its codes 16-31. sum_halves returns the sixteen half-block sums of codes
// 0-15 (lo) and of codes 16-31 (hi) in block order; sum_blocks their sum.
inline void sum_halves(const __m512i v[8], __m512i& lo, __m512i& hi) {
  __m512i u[4], w[2];
  // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] for a = v[2i], b = v[2i+1].
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                            _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    // w[k] element 4q + i: the sum of 128-bit lane q of v[4k + i].
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k)
    w[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2 * k], u[2 * k + 1]),
                            _mm512_unpackhi_epi64(u[2 * k], u[2 * k + 1]));
  // Block 2i's halves = lanes 0, 1 of v[i], block 2i+1's = lanes 2, 3.
  const __m512i ia = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27);
  const __m512i ib = _mm512_setr_epi32(4, 12, 5, 13, 6, 14, 7, 15, 20, 28, 21, 29, 22, 30, 23, 31);
  lo = _mm512_permutex2var_epi32(w[0], ia, w[1]);
  hi = _mm512_permutex2var_epi32(w[0], ib, w[1]);
}

inline __m512i sum_blocks(const __m512i v[8]) {
  __m512i lo, hi;
  sum_halves(v, lo, hi);
  return _mm512_add_epi32(lo, hi);
}

// sum_halves for blocks 0-7 only (v[0..3]): half the tree, lanes 8-15 zero.
inline void sum_halves_half(const __m512i v[4], __m512i& lo, __m512i& hi) {
  const __m512i u0 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
  const __m512i u1 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
  const __m512i w0 = _mm512_add_epi32(_mm512_unpacklo_epi64(u0, u1), _mm512_unpackhi_epi64(u0, u1));
  const __m512i ia = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i ib = _mm512_setr_epi32(4, 12, 5, 13, 6, 14, 7, 15, 0, 0, 0, 0, 0, 0, 0, 0);
  lo = _mm512_maskz_permutexvar_epi32(0xff, ia, w0);
  hi = _mm512_maskz_permutexvar_epi32(0xff, ib, w0);
}

inline __m512i sum_blocks_half(const __m512i v[4]) {
  __m512i lo, hi;
  sum_halves_half(v, lo, hi);
  return _mm512_add_epi32(lo, hi);
}

// Lanes l < n: block l's sum; blocks past n in the read pairs must have
// zero activation codes (QuantRows padding).
template <bool Signed>
inline I32x16 block_dots_natural(const uint8_t* w, const int8_t* x, size_t n) {
  __m512i v[8];
  if (n > 8) {
#pragma GCC unroll 8
    for (size_t i = 0; i < 8; ++i)
      v[i] = 2 * i < n ? dot4<Signed>(_mm512_load_si512(w + 64 * i), _mm512_loadu_si512(x + 64 * i))
                       : _mm512_setzero_si512();
    return {sum_blocks(v)};
  }
#pragma GCC unroll 4
  for (size_t i = 0; i < 4; ++i)
    v[i] = 2 * i < n ? dot4<Signed>(_mm512_load_si512(w + 64 * i), _mm512_loadu_si512(x + 64 * i))
                     : _mm512_setzero_si512();
  return {sum_blocks_half(v)};
}

// block_dots_natural of the codes unpack_codes would write, taken from the
// weight row in registers: no unpacked copy, for the one-row call that has
// no other row to share one with. The same integers.
template <bool Nibbles, bool Signed>
inline I32x16 block_dots_direct(const uint8_t* src, size_t stride, size_t n, uint8_t flip,
                                const int8_t* x) {
  __m512i v[8];
  if (n == 16) {
#pragma GCC unroll 8
    for (size_t i = 0; i < 8; ++i)
      v[i] = dot4<Signed>(unpack_pair_reg<Nibbles>(src, stride, 2 * i, true, flip),
                          _mm512_loadu_si512(x + 64 * i));
    return {sum_blocks(v)};
  }
  const size_t pairs = n > 8 ? 8 : 4;
  for (size_t i = 0; i < pairs; ++i)
    v[i] = 2 * i < n
               ? dot4<Signed>(unpack_pair_reg<Nibbles>(src, stride, 2 * i, 2 * i + 1 < n, flip),
                              _mm512_loadu_si512(x + 64 * i))
               : _mm512_setzero_si512();
  return {n > 8 ? sum_blocks(v) : sum_blocks_half(v)};
}

template <bool Signed, int W>
inline I32x16 block_dots(const uint8_t* w, const int8_t* x) {
  // Each 64-byte register holds 16 / W rows of W blocks' dwords.
  __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 8
  for (int k = 0; k < W / 2; ++k) {
    const __m512i p = dot4<Signed>(_mm512_load_si512(w + 64 * k), _mm512_loadu_si512(x + 64 * k));
    acc[k % 2] = _mm512_add_epi32(acc[k % 2], p);
  }
  const __m512i a = _mm512_add_epi32(acc[0], acc[1]);
  if constexpr (W == 16) return {a};
  // Fold the rows: lanes l, l + W, ... hold block l.
  __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
  if constexpr (W == 4) {
    const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    return {_mm512_zextsi128_si512(q)};
  } else {
    return {_mm512_zextsi256_si512(h)};
  }
}

// Lanes l, l + W, ... of a W-wide chunk's partial sums into lane l (as
// block_dots<Signed, W> folds them); lanes >= W zero.
template <int W>
inline __m512i fold_rows(__m512i a) {
  if constexpr (W == 16) {
    return a;
  } else {
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    if constexpr (W == 4) {
      const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      return _mm512_zextsi128_si512(q);
    } else {
      return _mm512_zextsi256_si512(h);
    }
  }
}

// Unsigned codes. In the chunk layout, registers k < W / 4 hold codes
// 0-15 of every block, the others codes 16-31.
template <int W>
inline void block_dots_halves(const uint8_t* w, const int8_t* x, I32x16& lo, I32x16& hi) {
  __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 8
  for (int k = 0; k < W / 2; ++k)
    acc[k >= W / 4] = _mm512_add_epi32(
        acc[k >= W / 4],
        dot4<false>(_mm512_load_si512(w + 64 * k), _mm512_loadu_si512(x + 64 * k)));
  lo = {fold_rows<W>(acc[0])};
  hi = {fold_rows<W>(acc[1])};
}

inline void block_dots_natural_halves(const uint8_t* w, const int8_t* x, size_t n, I32x16& lo,
                                      I32x16& hi) {
  __m512i v[8];
  const size_t pairs = n > 8 ? 8 : 4;
  for (size_t i = 0; i < pairs; ++i)
    v[i] = 2 * i < n ? dot4<false>(_mm512_load_si512(w + 64 * i), _mm512_loadu_si512(x + 64 * i))
                     : _mm512_setzero_si512();
  if (n > 8)
    sum_halves(v, lo.v, hi.v);
  else
    sum_halves_half(v, lo.v, hi.v);
}

// Q6_K (decode_q6_k): the codes (0-63) of half h of the super-block at sb
// in the natural layout, z[0] = blocks 4h, 4h + 1 (runs 0, 1), z[1] =
// blocks 4h + 2, 4h + 3 (runs 2, 3). ql[64h .. 64h + 63] gives the low
// nibbles of runs 0, 1 and the high nibbles of runs 2, 3; qh[32h ..] bit
// pairs 0-1, 2-3, 4-5, 6-7 give bits 4-5 of runs 0-3. The 16-bit shifts
// move bits across bytes only into bits the masks drop.
inline void q6k_half(const uint8_t* sb, int h, __m512i z[2]) {
  const __m512i l = _mm512_loadu_si512(sb + 64 * h);
  const __m512i qh =
      _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(sb + 128 + 32 * h)));
  const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x30);
  const __m512i lo_shift =  // run 0: qh << 4, run 1: qh << 2
      _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i hi_shift =  // run 2: qh, run 3: qh >> 2
      _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  // a | (b & c): imm 0xf8 with a, b, c = 0xf0, 0xcc, 0xaa.
  z[0] =
      _mm512_ternarylogic_epi32(_mm512_and_si512(l, m4), _mm512_sllv_epi16(qh, lo_shift), m2, 0xf8);
  z[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                   _mm512_srlv_epi16(qh, hi_shift), m2, 0xf8);
}

// The 256 codes of the super-block at sb to dst (64-byte aligned), natural layout.
inline void unpack_q6k(const uint8_t* sb, uint8_t* dst) {
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m512i z[2];
    q6k_half(sb, h, z);
    _mm512_store_si512(dst + 128 * h, z[0]);
    _mm512_store_si512(dst + 128 * h + 64, z[1]);
  }
}

// Q6_K's sub-block scales for the n = 8 or 16 blocks of the one or two
// super-blocks at first: lane l of lo / hi = the int8 scale of codes 0-15 /
// 16-31 of block l (sub-blocks 2 (l % 8) and 2 (l % 8) + 1 of super-block
// l / 8); lanes >= n zero.
inline void q6k_scales(const uint8_t* first, size_t n, I32x16& lo, I32x16& hi) {
  const __m128i a = _mm_loadu_si128((const __m128i*)(first + 192));
  const __m128i b =
      n > 8 ? _mm_loadu_si128((const __m128i*)(first + 210 + 192)) : _mm_setzero_si128();
  // Word k = sub-block scale k of the chunk; dword l = words 2l, 2l + 1.
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
  lo = {_mm512_srai_epi32(_mm512_slli_epi32(w, 16), 16)};
  hi = {_mm512_srai_epi32(w, 16)};
}

// Lanes 0-7: super-block 0's d; lanes 8-15: super-block 1's if n > 8, else 0.
inline Vec16 q6k_d(const uint8_t* first, size_t n) {
  const __m256 d0 = _mm256_set1_ps(Vec16::h2f(load_u16(first + 208)));
  const __m256 d1 =
      n > 8 ? _mm256_set1_ps(Vec16::h2f(load_u16(first + 210 + 208))) : _mm256_setzero_ps();
  return {_mm512_insertf32x8(_mm512_castps256_ps512(d0), d1, 1)};
}

// block_dots_natural_halves of the codes unpack_q6k would write for the n
// blocks (8 or 16) of the super-blocks at first, from registers.
inline void q6k_dots_direct(const uint8_t* first, size_t n, const int8_t* x, I32x16& lo,
                            I32x16& hi) {
  __m512i v[8];
  if (n > 8) {
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      __m512i z[2];
      q6k_half(first + 210 * (p / 2), p % 2, z);
      v[2 * p] = dot4<false>(z[0], _mm512_loadu_si512(x + 128 * p));
      v[2 * p + 1] = dot4<false>(z[1], _mm512_loadu_si512(x + 128 * p + 64));
    }
    return sum_halves(v, lo.v, hi.v);
  }
#pragma GCC unroll 2
  for (int p = 0; p < 2; ++p) {
    __m512i z[2];
    q6k_half(first, p, z);
    v[2 * p] = dot4<false>(z[0], _mm512_loadu_si512(x + 128 * p));
    v[2 * p + 1] = dot4<false>(z[1], _mm512_loadu_si512(x + 128 * p + 64));
  }
  sum_halves_half(v, lo.v, hi.v);
}

#elif defined(FERRY_VEC_AVX2)
constexpr bool kQ8Unsigned = false;

struct I32x16 {
  __m256i lo, hi;  // lanes 0-7, 8-15
  static I32x16 load(const int32_t* p) {
    return {_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)(p + 8))};
  }
  template <int Shift>
  I32x16 minus_shifted(I32x16 s) const {
    return {_mm256_sub_epi32(lo, _mm256_slli_epi32(s.lo, Shift)),
            _mm256_sub_epi32(hi, _mm256_slli_epi32(s.hi, Shift))};
  }
  Vec16 to_float() const { return {_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi)}; }
  void store(int32_t* p) const {
    _mm256_storeu_si256((__m256i*)p, lo);
    _mm256_storeu_si256((__m256i*)(p + 8), hi);
  }
  I32x16 operator+(I32x16 o) const {
    return {_mm256_add_epi32(lo, o.lo), _mm256_add_epi32(hi, o.hi)};
  }
  I32x16 operator-(I32x16 o) const {
    return {_mm256_sub_epi32(lo, o.lo), _mm256_sub_epi32(hi, o.hi)};
  }
  I32x16 operator*(I32x16 o) const {
    return {_mm256_mullo_epi32(lo, o.lo), _mm256_mullo_epi32(hi, o.hi)};
  }
};

template <bool Signed>
inline __m256i dot4(__m256i w, __m256i x) {
  if constexpr (Signed) {
    x = _mm256_sign_epi8(x, w);  // x * sign(w); 0 where w = 0
    w = _mm256_abs_epi8(w);
  }
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

template <bool Nibbles>
inline void unpack_codes(const uint8_t* src, size_t stride, size_t n, uint8_t flip, uint8_t* dst) {
  for (size_t k = 0; k < n; ++k) {
    __m256i z;
    if constexpr (Nibbles) {
      const __m128i a = _mm_loadu_si128((const __m128i*)(src + k * stride));
      z = _mm256_inserti128_si256(_mm256_castsi128_si256(a), _mm_srli_epi16(a, 4), 1);
      z = _mm256_and_si256(z, _mm256_set1_epi8(0xf));
    } else {
      z = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(src + k * stride)),
                           _mm256_set1_epi8(static_cast<char>(flip)));
    }
    _mm256_storeu_si256((__m256i*)(dst + 32 * k), z);
  }
}

template <size_t Stride, size_t Off>
inline Vec16 scales_f16(const uint8_t* first, size_t n) {
  float f[16];
  for (size_t k = 0; k < 16; ++k)
    f[k] = k < n ? Vec16::h2f(load_u16(first + Off + k * Stride)) : 0.0f;
  return {_mm256_setr_ps(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]),
          _mm256_setr_ps(f[8], f[9], f[10], f[11], f[12], f[13], f[14], f[15])};
}

// 8 x 8 dword transpose: out[i] dword l = in[l] dword i.
inline void transpose8(const __m256i in[8], __m256i out[8]) {
  __m256i t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_epi32(in[2 * k], in[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_epi32(in[2 * k], in[2 * k + 1]);
  }
  for (int k = 0; k < 2; ++k) {
    u[4 * k + 0] = _mm256_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm256_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm256_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm256_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    out[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
    out[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
  }
}

template <int W>
inline void transpose_chunk(const uint8_t* natural, uint8_t* out) {
  for (int half = 0; half < (W == 16 ? 2 : 1); ++half) {
    __m256i in[8], o[8];
    for (int l = 0; l < 8; ++l)
      in[l] = l < W ? _mm256_load_si256((const __m256i*)(natural + 32 * (8 * half + l)))
                    : _mm256_setzero_si256();
    transpose8(in, o);
    for (int i = 0; i < 8; ++i) {
      if constexpr (W == 4)
        _mm_store_si128((__m128i*)(out + 16 * i), _mm256_castsi256_si128(o[i]));
      else
        _mm256_store_si256((__m256i*)(out + 4 * W * i + 32 * half), o[i]);
    }
  }
}

// v[i]: partial sums of block i (128-bit lane 0: codes 0-15, lane 1: codes
// 16-31); sum_halves8 returns the eight blocks' half sums in order,
// sum_blocks8 their sum.
inline void sum_halves8(const __m256i v[8], __m256i& lo, __m256i& hi) {
  __m256i u[4], w[2];
  for (int i = 0; i < 4; ++i)
    u[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                            _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  // w[k] element 4q + i: the sum of 128-bit lane q of v[4k + i].
  for (int k = 0; k < 2; ++k)
    w[k] = _mm256_add_epi32(_mm256_unpacklo_epi64(u[2 * k], u[2 * k + 1]),
                            _mm256_unpackhi_epi64(u[2 * k], u[2 * k + 1]));
  lo = _mm256_permute2x128_si256(w[0], w[1], 0x20);
  hi = _mm256_permute2x128_si256(w[0], w[1], 0x31);
}

inline __m256i sum_blocks8(const __m256i v[8]) {
  __m256i lo, hi;
  sum_halves8(v, lo, hi);
  return _mm256_add_epi32(lo, hi);
}

template <bool Signed>
inline I32x16 block_dots_natural(const uint8_t* w, const int8_t* x, size_t n) {
  __m256i v[16];
  for (size_t i = 0; i < 16; ++i)
    v[i] = i < n ? dot4<Signed>(_mm256_load_si256((const __m256i*)(w + 32 * i)),
                                _mm256_loadu_si256((const __m256i*)(x + 32 * i)))
                 : _mm256_setzero_si256();
  return {sum_blocks8(v), n > 8 ? sum_blocks8(v + 8) : _mm256_setzero_si256()};
}

template <bool Signed, int W>
inline I32x16 block_dots(const uint8_t* w, const int8_t* x) {
  auto at = [](const void* p, int off) {
    return _mm256_loadu_si256((const __m256i*)((const uint8_t*)p + off));
  };
  __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
  // 32-byte registers: W = 16, one half row each; W = 8, a row; W = 4, two rows.
  for (int k = 0; k < (W == 4 ? 4 : 8); ++k) {
    const int off = W == 16 ? 64 * k : 32 * k;
    lo = _mm256_add_epi32(lo, dot4<Signed>(at(w, off), at(x, off)));
    if constexpr (W == 16)
      hi = _mm256_add_epi32(hi, dot4<Signed>(at(w, off + 32), at(x, off + 32)));
  }
  if constexpr (W == 4) {
    const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    lo = _mm256_zextsi128_si256(q);
  }
  return {lo, hi};
}

// Unsigned codes; the chunk layout's rows 0-3 hold codes 0-15 of every
// block, rows 4-7 codes 16-31 (W = 4: two rows per register).
template <int W>
inline void block_dots_halves(const uint8_t* w, const int8_t* x, I32x16& lo, I32x16& hi) {
  auto at = [](const void* p, int off) {
    return _mm256_loadu_si256((const __m256i*)((const uint8_t*)p + off));
  };
  __m256i s[2][2] = {{_mm256_setzero_si256(), _mm256_setzero_si256()},
                     {_mm256_setzero_si256(), _mm256_setzero_si256()}};  // [half][blocks 0-7, 8-15]
  for (int k = 0; k < (W == 4 ? 4 : 8); ++k) {
    const int off = W == 16 ? 64 * k : 32 * k, h = (W == 4 ? 2 * k : k) >= 4;
    s[h][0] = _mm256_add_epi32(s[h][0], dot4<false>(at(w, off), at(x, off)));
    if constexpr (W == 16)
      s[h][1] = _mm256_add_epi32(s[h][1], dot4<false>(at(w, off + 32), at(x, off + 32)));
  }
  if constexpr (W == 4)
    for (int h = 0; h < 2; ++h)
      s[h][0] = _mm256_zextsi128_si256(
          _mm_add_epi32(_mm256_castsi256_si128(s[h][0]), _mm256_extracti128_si256(s[h][0], 1)));
  lo = {s[0][0], s[0][1]};
  hi = {s[1][0], s[1][1]};
}

inline void block_dots_natural_halves(const uint8_t* w, const int8_t* x, size_t n, I32x16& lo,
                                      I32x16& hi) {
  __m256i v[16];
  for (size_t i = 0; i < 16; ++i)
    v[i] = i < n ? dot4<false>(_mm256_load_si256((const __m256i*)(w + 32 * i)),
                               _mm256_loadu_si256((const __m256i*)(x + 32 * i)))
                 : _mm256_setzero_si256();
  sum_halves8(v, lo.lo, hi.lo);
  if (n > 8) {
    sum_halves8(v + 8, lo.hi, hi.hi);
  } else {
    lo.hi = hi.hi = _mm256_setzero_si256();
  }
}

// Q6_K: see the AVX-512 versions. q6k_half: blocks 4h .. 4h + 3 (runs 0-3).
inline void q6k_half(const uint8_t* sb, int h, __m256i run[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
  const __m256i l0 = _mm256_loadu_si256((const __m256i*)(sb + 64 * h));
  const __m256i l1 = _mm256_loadu_si256((const __m256i*)(sb + 64 * h + 32));
  const __m256i qh = _mm256_loadu_si256((const __m256i*)(sb + 128 + 32 * h));
  run[0] =
      _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
  run[1] =
      _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
  run[2] =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
  run[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
}

inline void unpack_q6k(const uint8_t* sb, uint8_t* dst) {
  for (int h = 0; h < 2; ++h) {
    __m256i run[4];
    q6k_half(sb, h, run);
    for (int r = 0; r < 4; ++r) _mm256_store_si256((__m256i*)(dst + 128 * h + 32 * r), run[r]);
  }
}

inline void q6k_dots_direct(const uint8_t* first, size_t n, const int8_t* x, I32x16& lo,
                            I32x16& hi) {
  // Super-block s (blocks 8s .. 8s + 7); the second only if n > 8, tested
  // the same way for both uses so the compiler sees v[8..15] written.
  __m256i v[16];
  auto half_sums = [&](size_t s, __m256i& l, __m256i& h) {
    for (size_t p = 2 * s; p < 2 * s + 2; ++p) {  // blocks 4p .. 4p + 3
      q6k_half(first + 210 * s, static_cast<int>(p % 2), v + 4 * p);
      for (size_t i = 4 * p; i < 4 * p + 4; ++i)
        v[i] = dot4<false>(v[i], _mm256_loadu_si256((const __m256i*)(x + 32 * i)));
    }
    sum_halves8(v + 8 * s, l, h);
  };
  half_sums(0, lo.lo, hi.lo);
  if (n > 8) {
    half_sums(1, lo.hi, hi.hi);
  } else {
    lo.hi = hi.hi = _mm256_setzero_si256();
  }
}

inline void q6k_scales(const uint8_t* first, size_t n, I32x16& lo, I32x16& hi) {
  // Word k = sub-block scale k of a super-block; dword l = words 2l, 2l + 1.
  const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(first + 192)));
  const __m256i b = n > 8 ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(first + 402)))
                          : _mm256_setzero_si256();
  lo = {_mm256_srai_epi32(_mm256_slli_epi32(a, 16), 16),
        _mm256_srai_epi32(_mm256_slli_epi32(b, 16), 16)};
  hi = {_mm256_srai_epi32(a, 16), _mm256_srai_epi32(b, 16)};
}

inline Vec16 q6k_d(const uint8_t* first, size_t n) {
  return {_mm256_set1_ps(Vec16::h2f(load_u16(first + 208))),
          n > 8 ? _mm256_set1_ps(Vec16::h2f(load_u16(first + 418))) : _mm256_setzero_ps()};
}

#else
constexpr bool kQ8Unsigned = false;

struct I32x16 {
  int32_t l[16];
  static I32x16 load(const int32_t* p) {
    I32x16 r;
    for (int i = 0; i < 16; ++i) r.l[i] = p[i];
    return r;
  }
  template <int Shift>
  I32x16 minus_shifted(I32x16 s) const {
    I32x16 r;
    for (int i = 0; i < 16; ++i) r.l[i] = l[i] - s.l[i] * (1 << Shift);
    return r;
  }
  Vec16 to_float() const {
    return Vec16::make([&](int i) { return static_cast<float>(l[i]); });
  }
  void store(int32_t* p) const {
    for (int i = 0; i < 16; ++i) p[i] = l[i];
  }
  template <class F>
  static I32x16 make(F f) {
    I32x16 r;
    for (int i = 0; i < 16; ++i) r.l[i] = f(i);
    return r;
  }
  I32x16 operator+(I32x16 o) const {
    return make([&](int i) { return l[i] + o.l[i]; });
  }
  I32x16 operator-(I32x16 o) const {
    return make([&](int i) { return l[i] - o.l[i]; });
  }
  I32x16 operator*(I32x16 o) const {
    return make([&](int i) { return l[i] * o.l[i]; });
  }
};

template <bool Nibbles>
inline void unpack_codes(const uint8_t* src, size_t stride, size_t n, uint8_t flip, uint8_t* dst) {
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* q = src + k * stride;
    uint8_t* o = dst + 32 * k;
    for (size_t i = 0; i < (Nibbles ? 16 : 32); ++i) {
      if constexpr (Nibbles) {
        o[i] = q[i] & 0xf;
        o[i + 16] = q[i] >> 4;
      } else {
        o[i] = q[i] ^ flip;
      }
    }
  }
}

template <size_t Stride, size_t Off>
inline Vec16 scales_f16(const uint8_t* first, size_t n) {
  return Vec16::make([&](int k) {
    const size_t i = static_cast<size_t>(k);
    return i < n ? f16_to_f32(load_u16(first + Off + i * Stride)) : 0.0f;
  });
}

template <bool Signed>
inline I32x16 block_dots_natural(const uint8_t* w, const int8_t* x, size_t n) {
  I32x16 r{};
  for (size_t l = 0; l < n; ++l)
    for (size_t e = 0; e < 32; ++e) {
      const int32_t wi = Signed ? static_cast<int8_t>(w[32 * l + e]) : w[32 * l + e];
      r.l[l] += wi * x[32 * l + e];
    }
  return r;
}

template <int W>
inline void transpose_chunk(const uint8_t* natural, uint8_t* out) {
  for (size_t l = 0; l < W; ++l)
    for (size_t e = 0; e < 32; ++e) out[chunk_code_offset(l, e, W)] = natural[32 * l + e];
}

template <bool Signed, int W>
inline I32x16 block_dots(const uint8_t* w, const int8_t* x) {
  I32x16 r{};
  for (size_t l = 0; l < W; ++l)
    for (size_t e = 0; e < 32; ++e) {
      const size_t o = chunk_code_offset(l, e, W);
      const int32_t wi = Signed ? static_cast<int8_t>(w[o]) : w[o];
      r.l[l] += wi * x[o];
    }
  return r;
}

template <int W>
inline void block_dots_halves(const uint8_t* w, const int8_t* x, I32x16& lo, I32x16& hi) {
  lo = hi = I32x16{};
  for (size_t l = 0; l < W; ++l)
    for (size_t e = 0; e < 32; ++e) {
      const size_t o = chunk_code_offset(l, e, W);
      (e < 16 ? lo : hi).l[l] += w[o] * x[o];
    }
}

inline void block_dots_natural_halves(const uint8_t* w, const int8_t* x, size_t n, I32x16& lo,
                                      I32x16& hi) {
  lo = hi = I32x16{};
  for (size_t l = 0; l < n; ++l)
    for (size_t e = 0; e < 32; ++e) (e < 16 ? lo : hi).l[l] += w[32 * l + e] * x[32 * l + e];
}

// Q6_K: see the AVX-512 versions (the element order of decode_q6_k).
inline void unpack_q6k(const uint8_t* sb, uint8_t* dst) {
  for (int h = 0; h < 2; ++h)
    for (int run = 0; run < 4; ++run)
      for (int i = 0; i < 32; ++i) {
        const uint8_t l = sb[64 * h + 32 * (run % 2) + i], qh = sb[128 + 32 * h + i];
        dst[128 * h + 32 * run + i] =
            static_cast<uint8_t>(((run < 2 ? l : l >> 4) & 0xf) | (((qh >> (2 * run)) & 3) << 4));
      }
}

inline void q6k_scales(const uint8_t* first, size_t n, I32x16& lo, I32x16& hi) {
  for (size_t l = 0; l < 16; ++l) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(first + 210 * (l / 8) + 192);
    lo.l[l] = l < n ? sc[2 * (l % 8)] : 0;
    hi.l[l] = l < n ? sc[2 * (l % 8) + 1] : 0;
  }
}

inline Vec16 q6k_d(const uint8_t* first, size_t n) {
  return Vec16::make([&](int k) {
    const size_t l = static_cast<size_t>(k);
    return l < n ? f16_to_f32(load_u16(first + 210 * (l / 8) + 208)) : 0.0f;
  });
}
#endif

#if !defined(FERRY_VEC_AVX512)
template <size_t Stride>
inline void scales_f16_pair(const uint8_t* first, size_t n, Vec16& lo, Vec16& hi) {
  lo = scales_f16<Stride, 0>(first, n);
  hi = scales_f16<Stride, 2>(first, n);
}

// block_dots_direct (see the AVX-512 one): unpack, then block_dots_natural.
// It reads only the n blocks unpack_codes wrote; GCC 12 cannot see that
// once few_rows inlines it, hence the pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <bool Nibbles, bool Signed>
inline I32x16 block_dots_direct(const uint8_t* src, size_t stride, size_t n, uint8_t flip,
                                const int8_t* x) {
  alignas(64) uint8_t natural[16 * 32];
  unpack_codes<Nibbles>(src, stride, n, flip, natural);
  return block_dots_natural<Signed>(natural, x, n);
}
#pragma GCC diagnostic pop

#endif

#if !defined(FERRY_VEC_AVX512) && !defined(FERRY_VEC_AVX2)
inline void q6k_dots_direct(const uint8_t* first, size_t n, const int8_t* x, I32x16& lo,
                            I32x16& hi) {
  uint8_t natural[16 * 32];
  for (size_t k = 0; k < n; k += 8) unpack_q6k(first + 210 * (k / 8), natural + 32 * k);
  block_dots_natural_halves(natural, x, n, lo, hi);
}
#endif

}  // namespace
}  // namespace ferry::kernels
