// Internal: MatmulMode::Int8's matmul, one template for every path (included
// by path_impl.h, and by path_avx512vnni.cpp for the VNNI build).
//
// Arithmetic (docs/KERNELS.md, "Int8 mode"). A weight row is a sequence of
// 32-element blocks b, each with integer codes q_b,i, a float scale dw_b and
// (Q4_1, Q4_K, Q5_K) a float min term m_b, so that its decoded value is
// dw_b * (q_b,i - bias) + m_b. The activation row has codes c_b,i, scale
// dx_b, code sum S_b and dsum_b = float(S_b) * dx_b (QuantRows). Then
//   isum_b = sum_i q_b,i * c_b,i - bias * S_b           (exact int32)
//   lane[b % 16] = fma(dw_b * dx_b, float(isum_b), lane[b % 16])
//   lane[b % 16] = fma(m_b, dsum_b, lane[b % 16])        (types with a min)
// for b in increasing order, and y = Vec16 reduce() of the lanes. Q6_K has
// an int8 scale per 16 elements, so its blocks have two, sc_lo_b (elements
// 0-15) and sc_hi_b (16-31), and dw_b = d, its super-block's f16 scale; with
// its 6-bit codes q in 0..63 (standing for q - 32) and S_lo_b / S_hi_b the
// sums of the activation codes 0-15 / 16-31 of the block,
//   isum_b = sc_lo_b * (sum_{i<16} q_b,i * c_b,i - 32 * S_lo_b)
//          + sc_hi_b * (sum_{i>=16} q_b,i * c_b,i - 32 * S_hi_b)  (exact int32)
// (|isum_b| <= 2 * 128 * 16 * 32 * 127 < 2^24, so float(isum_b) is exact),
// then the same single fma per block. Every
// operation is exactly rounded and happens in that order on every path, so
// paths, row counts, tiles and threads all give the same bits. The kernel
// works in 16-block chunks and adds fma(0, 0, lane) for the padding blocks
// of a last partial chunk; that leaves the lane unchanged (a lane starts at
// +0 and a sum is -0 only if both terms are, so lanes are never -0), so y is
// exactly the formula over the row's real blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu.h"
#include "kernels/int8_dots.h"
#include "kernels/int8_qk.h"
#include "kernels/path_kernels.h"
#include "kernels/quant_blocks.h"
#include "kernels/vec16.h"

namespace ferry::kernels::FERRY_PATH_NAMESPACE {
namespace int8 {

// A chunk of up to 16 blocks of one weight row, unpacked for the dot
// kernel: one byte per code, float scales and mins (lanes past the chunk's
// blocks are 0; their codes are left stale, harmless as the activation's
// padding codes are 0).
struct Chunk {
  alignas(64) uint8_t natural[16 * 32];  // block k's codes at 32 k
  alignas(64) uint8_t codes[16 * 32];    // the same in the chunk layout
  alignas(64) float dw[16];
  alignas(64) float m[16];
  alignas(64) int32_t sc[2][16];  // Q6_K: sc_lo, sc_hi per block
};

inline void transpose(size_t n, Chunk& c) {
  switch (chunk_width(n)) {
    case 4:
      return transpose_chunk<4>(c.natural, c.codes);
    case 8:
      return transpose_chunk<8>(c.natural, c.codes);
    default:
      return transpose_chunk<16>(c.natural, c.codes);
  }
}

// The 32-element-block types: an f16 scale at byte 0 (and an f16 min at 2),
// then the codes. Unpacks blocks [b, b + n) of a row.
template <size_t Bytes, size_t CodeOffset, bool Min, bool Nibbles, uint8_t Flip = 0>
struct SimpleBlocks {
  static void unpack(const uint8_t* row, size_t b, size_t n, bool chunked, Chunk& c) {
    const uint8_t* first = row + Bytes * b;
    unpack_codes<Nibbles>(first + CodeOffset, Bytes, n, Flip, c.natural);
    if (chunked) transpose(n, c);
    scales_f16<Bytes, 0>(first, n).store(c.dw);
    if constexpr (Min) scales_f16<Bytes, 2>(first, n).store(c.m);
  }
  // For few_rows: the values unpack would put in c.dw and c.m (m only with
  // Min), and block_dots_natural of the codes it would unpack.
  static void scales(const uint8_t* row, size_t b, size_t n, Vec16& dw, Vec16& m) {
    const uint8_t* first = row + Bytes * b;
    if constexpr (Min)
      scales_f16_pair<Bytes>(first, n, dw, m);
    else
      dw = scales_f16<Bytes, 0>(first, n);
  }
  template <bool Signed>
  static I32x16 dots(const uint8_t* row, size_t b, size_t n, const int8_t* x) {
    return block_dots_direct<Nibbles, Signed>(row + Bytes * b + CodeOffset, Bytes, n, Flip, x);
  }
};

// How a weight type's blocks enter the formula above: kSigned (codes are
// int8, else uint8), kBiasShift (the bias is 1 << kBiasShift, or none if
// negative), kMin (a min term), kHalves (two scales per block: Q6_K).
struct UnpackQ8_0 : SimpleBlocks<34, 2, false, false, kQ8Unsigned ? 0x80 : 0> {
  static constexpr bool kSigned = !kQ8Unsigned, kMin = false, kHalves = false;
  static constexpr int kBiasShift = kQ8Unsigned ? 7 : -1;  // bias 128 or none
};
struct UnpackQ4_0 : SimpleBlocks<18, 2, false, true> {
  static constexpr bool kSigned = false, kMin = false, kHalves = false;
  static constexpr int kBiasShift = 3;  // q - 8
};
struct UnpackQ4_1 : SimpleBlocks<20, 4, true, true> {
  static constexpr bool kSigned = false, kMin = true, kHalves = false;
  static constexpr int kBiasShift = -1;
};
// Q4_K / Q5_K: sub-block s of a super-block has scale d * sc_s and min
// -(dmin * mn_s), the same products decode_q4_k forms. A chunk holds one or
// two super-blocks (n is a multiple of 8). The codes are built in
// registers (int8_qk.h); few_rows never stores them.
template <bool Five>
struct UnpackQK {
  static constexpr size_t kBytes = kQKBytes<Five>;
  static constexpr bool kSigned = false, kMin = true, kHalves = false;
  static constexpr int kBiasShift = -1;
  static void unpack(const uint8_t* row, size_t b, size_t n, bool chunked, Chunk& c) {
    const uint8_t* first = row + kBytes * (b / 8);
    for (size_t k0 = 0; k0 < n; k0 += 8)
      unpack_qk<Five>(first + kBytes * (k0 / 8), c.natural + 32 * k0);
    if (chunked) transpose(n, c);
    Vec16 dw, m;
    qk_scales<Five>(first, n, dw, m);
    dw.store(c.dw);
    m.store(c.m);
  }
  // For few_rows, as SimpleBlocks: unpack's c.dw and c.m, and
  // block_dots_natural of the codes it would unpack.
  static void scales(const uint8_t* row, size_t b, size_t n, Vec16& dw, Vec16& m) {
    qk_scales<Five>(row + kBytes * (b / 8), n, dw, m);
  }
  template <bool Signed>
  static I32x16 dots(const uint8_t* row, size_t b, size_t n, const int8_t* x) {
    static_assert(!Signed);
    return qk_dots_direct<Five>(row + kBytes * (b / 8), n, x);
  }
};

// Q6_K's isum_b (the formula above) from the half-block code sums lo, hi of
// the blocks at offset o of x (row * nb16 + block) and their sub-block
// scales. Every term is exact in int32.
inline I32x16 q6k_isum(I32x16 lo, I32x16 hi, I32x16 sc_lo, I32x16 sc_hi, const QuantRows& x,
                       size_t o) {
  const I32x16 s_lo = I32x16::load(x.sum_lo + o), s = I32x16::load(x.sum + o);
  return sc_lo * lo.minus_shifted<5>(s_lo) + sc_hi * hi.minus_shifted<5>(s - s_lo);
}

// Q6_K: 256-element super-blocks of 210 bytes (decode_q6_k); a chunk holds
// one or two (n is a multiple of 8). Codes unsigned (0..63): the bias 32
// is taken off per half block in q6k_isum.
struct UnpackQ6_K {
  static constexpr size_t kBytes = 210;
  static constexpr bool kSigned = false, kMin = false, kHalves = true;
  static constexpr int kBiasShift = -1;
  static void unpack(const uint8_t* row, size_t b, size_t n, bool chunked, Chunk& c) {
    const uint8_t* first = row + kBytes * (b / 8);
    for (size_t k0 = 0; k0 < n; k0 += 8) unpack_q6k(first + kBytes * (k0 / 8), c.natural + 32 * k0);
    if (chunked) transpose(n, c);
    q6k_d(first, n).store(c.dw);
    I32x16 lo, hi;
    q6k_scales(first, n, lo, hi);
    lo.store(c.sc[0]);
    hi.store(c.sc[1]);
  }
  // For few_rows: the dw unpack would store, and the isum of blocks
  // [b, b + n) against the natural-layout x at block offset o (row r:
  // r * nb16 + b) from the weight row in registers.
  static void scales(const uint8_t* row, size_t b, size_t n, Vec16& dw, Vec16&) {
    dw = q6k_d(row + kBytes * (b / 8), n);
  }
  static I32x16 isum_direct(const uint8_t* row, size_t b, size_t n, const QuantRows& x, size_t o) {
    const uint8_t* first = row + kBytes * (b / 8);
    I32x16 lo, hi, sc_lo, sc_hi;
    q6k_dots_direct(first, n, x.codes + 32 * o, lo, hi);
    q6k_scales(first, n, sc_lo, sc_hi);
    return q6k_isum(lo, hi, sc_lo, sc_hi, x, o);
  }
};

// Activation rows per pass: their accumulators stay in L1 while a weight
// row's chunks stream past them; each pass unpacks the weights again.
constexpr size_t kPassRows = 64;

// How far ahead few_rows asks for weight bytes (into L2, prefetcht1):
// decode_prefetch_bytes() (core/cpu.h), by vendor. Measured on the 2-vCPU
// Xeon of 2026-12-01, 2 threads, decode tok/s with nothing / 1 / 2 / 3 /
// 4 KiB: 1B-shaped Q4_K_M 21.9 / 23.6 / 25.8 / 25.7 / 24.3, its Q8_0 16.0
// / 15.9 / 17.9 / 18.4 / 18.1, SmolLM2 Q8_0 127.8 / 126.1 / 151.0 / 164.5 /
// 168.8, Q4_1 148.8 / 165.5 / 199.1 / 226.0 / 229.4. Without it the core
// and the memory took turns (hot, the kernel streams 42 GB/s of Q4_K on
// two threads; from DRAM it got 13-14 where a plain read gets 33). Into
// L1 (prefetcht0) was slower for Q8_0 and non-temporal much slower. The
// 2-vCPU AMD EPYC of 2026-12-07 wants it further ahead (docs/KERNELS.md).

// cols for NR <= kNaturalLayoutMaxRows activation rows in the natural
// layout (decode), for the types that build their codes in registers
// (U::dots: SimpleBlocks, Q4_K, Q5_K; U::isum_direct: Q6_K): the same
// operations on the same values in the same order as cols, minus the
// unpacked copy of each chunk. With 2 or 3 rows each row builds the codes
// again, from the weight bytes the first row brought into L1: cheaper than
// storing them and loading them back.

template <class U, size_t NR>
void few_rows(const WeightView& w, const QuantRows& x, float* y, size_t j0, size_t j1) {
  const size_t nb = x.nb, nb16 = x.nb16, N = w.n_out, rb = w.row_bytes();
  // One column at a time, so the weights are read in address order, with a
  // software prefetch `ahead` bytes on (interleaving two columns was
  // measured slower from DRAM).
  [[maybe_unused]] const size_t ahead = decode_prefetch_bytes();  // (the reference path has none)
  for (size_t j = j0; j < j1; ++j) {
    const uint8_t* row = w.data + j * rb;
    Vec16 a[NR];
    for (size_t r = 0; r < NR; ++r) a[r] = Vec16::zero();
    for (size_t b = 0; b < nb; b += 16) {
      const size_t n = std::min<size_t>(16, nb - b);
#if defined(FERRY_VEC_AVX512) || defined(FERRY_VEC_AVX2)
      // This chunk's bytes, `ahead` further on, towards L2.
      const uintptr_t p0 = reinterpret_cast<uintptr_t>(row + b * rb / nb + ahead) & ~uintptr_t{63};
      const uintptr_t p1 = reinterpret_cast<uintptr_t>(row + (b + n) * rb / nb + ahead);
      for (uintptr_t p = p0; p < p1; p += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
#endif
      Vec16 dw, m;
      U::scales(row, b, n, dw, m);
      for (size_t r = 0; r < NR; ++r) {
        const size_t o = r * nb16 + b;  // this chunk of row r
        I32x16 is;
        if constexpr (U::kHalves) {
          is = U::isum_direct(row, b, n, x, o);
        } else {
          is = U::template dots<U::kSigned>(row, b, n, x.codes + 32 * o);
          if constexpr (U::kBiasShift >= 0)
            is = is.template minus_shifted<(U::kBiasShift >= 0 ? U::kBiasShift : 0)>(
                I32x16::load(x.sum + o));
        }
        a[r].fma(dw * Vec16::load(x.d + o), is.to_float());
        if constexpr (U::kMin) a[r].fma(m, Vec16::load(x.dsum + o));
      }
    }
    for (size_t r = 0; r < NR; ++r) y[r * N + j] = a[r].reduce();
  }
}

#if defined(FERRY_VEC_AVX512)
// The chunk layout (more than 3 rows) on AVX-512: a register-blocked tile
// of MC weight rows x NR activation rows. Each 64-byte step of a chunk loads
// MC weight registers and NR activation registers and accumulates MC * NR
// block-sum registers (vpdpbusd with VNNI), so a load feeds several dot
// steps instead of one. The integer sums are those of block_dots<W> (exact,
// whatever the order), and each output element then sees the same float
// operations in the same order as the generic loop below: per chunk,
// fma(dw * dx, float(isum), lane) (and fma(m, dsum, lane)), lanes starting
// at +0, then reduce().
template <bool Signed>
inline __m512i dot4_acc(__m512i acc, __m512i w, __m512i x) {
#if defined(FERRY_INT8_VNNI)
  static_assert(!Signed, "the VNNI path takes Q8_0 codes unsigned");
  return _mm512_dpbusd_epi32(acc, w, x);
#else
  return _mm512_add_epi32(acc, dot4<Signed>(w, x));
#endif
}

// One chunk (width W) of MC weight rows against NR activation rows; o is
// the chunk's offset (in blocks) in activation row 0 of the tile.
template <class U, int MC, int NR, int W>
inline void tile_chunk(const Chunk* const (&c)[MC], const QuantRows& x, size_t o,
                       Vec16 (&a)[MC][NR]) {
  const size_t nb16 = x.nb16;
  // acc[1]: Q6_K's sums of codes 16-31 (registers k >= W / 4 hold them).
  constexpr int kParts = U::kHalves ? 2 : 1;
  __m512i acc[kParts][MC][NR];
#pragma GCC unroll 2
  for (int h = 0; h < kParts; ++h)
#pragma GCC unroll 4
    for (int m = 0; m < MC; ++m)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[h][m][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int k = 0; k < W / 2; ++k) {
    const int h = kParts == 2 && k >= W / 4;
    __m512i wv[MC];
#pragma GCC unroll 4
    for (int m = 0; m < MC; ++m) wv[m] = _mm512_load_si512(c[m]->codes + 64 * k);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512i xv = _mm512_loadu_si512(x.codes + 32 * (o + r * nb16) + 64 * k);
#pragma GCC unroll 4
      for (int m = 0; m < MC; ++m) acc[h][m][r] = dot4_acc<U::kSigned>(acc[h][m][r], wv[m], xv);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
    const size_t orow = o + r * nb16;
    const Vec16 dx = Vec16::load(x.d + orow);
#pragma GCC unroll 4
    for (int m = 0; m < MC; ++m) {
      I32x16 is{fold_rows<W>(acc[0][m][r])};
      if constexpr (U::kHalves)
        is = q6k_isum(is, I32x16{fold_rows<W>(acc[kParts - 1][m][r])}, I32x16::load(c[m]->sc[0]),
                      I32x16::load(c[m]->sc[1]), x, orow);
      if constexpr (U::kBiasShift >= 0)
        is = is.template minus_shifted<(U::kBiasShift >= 0 ? U::kBiasShift : 0)>(
            I32x16::load(x.sum + orow));
      a[m][r].fma(Vec16::load(c[m]->dw) * dx, is.to_float());
      if constexpr (U::kMin) a[m][r].fma(Vec16::load(c[m]->m), Vec16::load(x.dsum + orow));
    }
  }
}

// Rows [r0, r0 + NR) x columns [j, j + MC); cw[m]: column j + m's chunks.
template <class U, int MC, int NR>
inline void tile(const Chunk* const (&cw)[MC], size_t n_chunks, const QuantRows& x, size_t r0,
                 float* y, size_t N, size_t j) {
  Vec16 a[MC][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MC; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) a[m][r] = Vec16::zero();
  const size_t nb = x.nb;
  for (size_t t = 0; t < n_chunks; ++t) {
    const Chunk* c[MC];
#pragma GCC unroll 4
    for (int m = 0; m < MC; ++m) c[m] = cw[m] + t;
    const size_t b = 16 * t, o = r0 * x.nb16 + b;
    switch (chunk_width(nb - b)) {
      case 4:
        tile_chunk<U, MC, NR, 4>(c, x, o, a);
        break;
      case 8:
        tile_chunk<U, MC, NR, 8>(c, x, o, a);
        break;
      default:
        tile_chunk<U, MC, NR, 16>(c, x, o, a);
        break;
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int m = 0; m < MC; ++m) y[(r0 + r) * N + j + m] = a[m][r].reduce();
}

constexpr int kTileRows = 4, kTileCols = 4;
// Activation code bytes per pass: they stay in L2 while each group of
// kTileCols weight rows is unpacked once and used by every row of the pass.
constexpr size_t kPassBytes = 256 << 10;

template <class U, int MC>
inline void tile_rows(const Chunk* const (&cw)[MC], size_t n_chunks, const QuantRows& x, size_t r0,
                      size_t r1, float* y, size_t N, size_t j) {
  size_t r = r0;
  for (; r + kTileRows <= r1; r += kTileRows) tile<U, MC, kTileRows>(cw, n_chunks, x, r, y, N, j);
  switch (r1 - r) {
    case 3:
      return tile<U, MC, 3>(cw, n_chunks, x, r, y, N, j);
    case 2:
      return tile<U, MC, 2>(cw, n_chunks, x, r, y, N, j);
    case 1:
      return tile<U, MC, 1>(cw, n_chunks, x, r, y, N, j);
    default:
      return;
  }
}

template <class U>
void cols_tiled(const WeightView& w, const QuantRows& x, size_t n_rows, float* y, size_t j0,
                size_t j1) {
  const size_t nb = x.nb, nb16 = x.nb16, N = w.n_out, rb = w.row_bytes();
  const size_t n_chunks = nb16 / 16;
  if (n_chunks == 0) return;
  thread_local std::vector<Chunk> buf;
  if (buf.size() < kTileCols * n_chunks) buf.resize(kTileCols * n_chunks);
  const size_t pass =
      std::max<size_t>(kTileRows, kPassBytes / (32 * nb16) / kTileRows * kTileRows);
  for (size_t r0 = 0; r0 < n_rows; r0 += pass) {
    const size_t r1 = std::min(n_rows, r0 + pass);
    for (size_t j = j0; j < j1; j += kTileCols) {
      const size_t mc = std::min<size_t>(kTileCols, j1 - j);
      for (size_t m = 0; m < mc; ++m)
        for (size_t t = 0; t < n_chunks; ++t) {
          const size_t b = 16 * t;
          U::unpack(w.data + (j + m) * rb, b, std::min<size_t>(16, nb - b), true,
                    buf[m * n_chunks + t]);
        }
      if (mc == kTileCols) {
        const Chunk* const cw[kTileCols] = {&buf[0], &buf[n_chunks], &buf[2 * n_chunks],
                                            &buf[3 * n_chunks]};
        tile_rows<U, kTileCols>(cw, n_chunks, x, r0, r1, y, N, j);
      } else {
        for (size_t m = 0; m < mc; ++m) {
          const Chunk* const cw[1] = {&buf[m * n_chunks]};
          tile_rows<U, 1>(cw, n_chunks, x, r0, r1, y, N, j + m);
        }
      }
    }
  }
}
#endif

// Columns [j0, j1): each weight row is read once per pass, one 16-block
// chunk at a time, and each chunk is unpacked once and used by every row of
// the pass. Row r's lanes see the chunks in block order, as the formula
// says, whatever the pass, the row count or the column range. The next
// chunk is unpacked before the current one is used, so its stores (some
// narrower than the vector loads that read them back, which would defeat
// store-to-load forwarding) have retired by the time the kernel loads them.
template <class U>
void cols(const WeightView& w, const QuantRows& x, size_t n_rows, float* y, size_t j0, size_t j1) {
  static_assert(kNaturalLayoutMaxRows == 3);
  if constexpr (U::kHalves || requires { &U::template dots<U::kSigned>; }) {
    if (!x.chunked) switch (n_rows) {
        case 1:
          return few_rows<U, 1>(w, x, y, j0, j1);
        case 2:
          return few_rows<U, 2>(w, x, y, j0, j1);
        case 3:
          return few_rows<U, 3>(w, x, y, j0, j1);
        default:
          break;
      }
  }
#if defined(FERRY_VEC_AVX512)
  static_assert(kTileCols == 4);
  if (x.chunked) return cols_tiled<U>(w, x, n_rows, y, j0, j1);
#endif
  const size_t nb = x.nb, nb16 = x.nb16, N = w.n_out, rb = w.row_bytes();
  const size_t n_chunks = nb16 / 16, n_items = (j1 - j0) * n_chunks;
  Chunk buf[2];
  auto unpack = [&](size_t t) {
    const size_t b = 16 * (t % n_chunks);
    U::unpack(w.data + (j0 + t / n_chunks) * rb, b, std::min<size_t>(16, nb - b), x.chunked,
              buf[t % 2]);
  };
  Vec16 acc[kPassRows];
  for (size_t r0 = 0; r0 < n_rows; r0 += kPassRows) {
    const size_t nr = std::min(kPassRows, n_rows - r0);
    if (n_items) unpack(0);
    for (size_t t = 0; t < n_items; ++t) {
      if (t + 1 < n_items) unpack(t + 1);
      const Chunk& c = buf[t % 2];
      const size_t j = j0 + t / n_chunks, b = 16 * (t % n_chunks);
      const bool first = b == 0, last = b + 16 >= nb;
      const size_t width = chunk_width(nb - b);
      const Vec16 dw = Vec16::load(c.dw);
      for (size_t i = 0; i < nr; ++i) {
        const size_t o = (r0 + i) * nb16 + b;  // this chunk of row r0 + i
        const int8_t* xc = x.codes + 32 * o;
        I32x16 is;
        if constexpr (U::kHalves) {
          I32x16 lo, hi;
          if (!x.chunked)
            block_dots_natural_halves(c.natural, xc, std::min<size_t>(16, nb - b), lo, hi);
          else if (width == 16)
            block_dots_halves<16>(c.codes, xc, lo, hi);
          else
            block_dots_halves<8>(c.codes, xc, lo, hi);  // Q6_K chunks: 8 or 16 blocks
          is = q6k_isum(lo, hi, I32x16::load(c.sc[0]), I32x16::load(c.sc[1]), x, o);
        } else {
          is = !x.chunked
                   ? block_dots_natural<U::kSigned>(c.natural, xc, std::min<size_t>(16, nb - b))
               : width == 16 ? block_dots<U::kSigned, 16>(c.codes, xc)
               : width == 8  ? block_dots<U::kSigned, 8>(c.codes, xc)
                             : block_dots<U::kSigned, 4>(c.codes, xc);
        }
        if constexpr (U::kBiasShift >= 0)
          is = is.template minus_shifted<(U::kBiasShift >= 0 ? U::kBiasShift : 0)>(
              I32x16::load(x.sum + o));
        Vec16 a = first ? Vec16::zero() : acc[i];
        a.fma(dw * Vec16::load(x.d + o), is.to_float());
        if constexpr (U::kMin) a.fma(Vec16::load(c.m), Vec16::load(x.dsum + o));
        if (last)
          y[(r0 + i) * N + j] = a.reduce();
        else
          acc[i] = a;
      }
    }
  }
}

inline void matmul_cols(const WeightView& w, const QuantRows& x, size_t n_rows, float* y, size_t j0,
                        size_t j1) {
  switch (w.type) {
    case DType::Q8_0:
      return cols<UnpackQ8_0>(w, x, n_rows, y, j0, j1);
    case DType::Q4_0:
      return cols<UnpackQ4_0>(w, x, n_rows, y, j0, j1);
    case DType::Q4_1:
      return cols<UnpackQ4_1>(w, x, n_rows, y, j0, j1);
    case DType::Q4_K:
      return cols<UnpackQK<false>>(w, x, n_rows, y, j0, j1);
    case DType::Q5_K:
      return cols<UnpackQK<true>>(w, x, n_rows, y, j0, j1);
    case DType::Q6_K:
      return cols<UnpackQ6_K>(w, x, n_rows, y, j0, j1);
    default:
      return;  // ops.cpp routes only int8_matmul_supported types here
  }
}

}  // namespace int8
}  // namespace ferry::kernels::FERRY_PATH_NAMESPACE
