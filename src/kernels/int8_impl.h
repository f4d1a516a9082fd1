// Internal: MatmulMode::Int8's matmul, one template for every path (included
// by path_impl.h, and by path_avx512vnni.cpp for the VNNI build).
//
// Arithmetic (docs/KERNELS.md, "Int8 mode"). A weight row is a sequence of
// 32-element blocks b, each with integer codes q_b,i, a float scale dw_b and
// (Q4_1, K-quants) a float min term m_b, so that its decoded value is
// dw_b * (q_b,i - bias) + m_b. The activation row has codes c_b,i, scale
// dx_b, code sum S_b and dsum_b = float(S_b) * dx_b (QuantRows). Then
//   isum_b = sum_i q_b,i * c_b,i - bias * S_b           (exact int32)
//   lane[b % 16] = fma(dw_b * dx_b, float(isum_b), lane[b % 16])
//   lane[b % 16] = fma(m_b, dsum_b, lane[b % 16])        (types with a min)
// for b in increasing order, and y = Vec16 reduce() of the lanes. Every
// operation is exactly rounded and happens in that order on every path, so
// paths, row counts, tiles and threads all give the same bits. The kernel
// works in 16-block chunks and adds fma(0, 0, lane) for the padding blocks
// of a last partial chunk; that leaves the lane unchanged (a lane starts at
// +0 and a sum is -0 only if both terms are, so lanes are never -0), so y is
// exactly the formula over the row's real blocks.
#pragma once

#include <algorithm>
#include <vector>

#include "kernels/int8_dots.h"
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
  // For one_row: the values unpack would put in c.dw and c.m (m only with
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
// negative), kMin (a min term).
struct UnpackQ8_0 : SimpleBlocks<34, 2, false, false, kQ8Unsigned ? 0x80 : 0> {
  static constexpr bool kSigned = !kQ8Unsigned, kMin = false;
  static constexpr int kBiasShift = kQ8Unsigned ? 7 : -1;  // bias 128 or none
};
struct UnpackQ4_0 : SimpleBlocks<18, 2, false, true> {
  static constexpr bool kSigned = false, kMin = false;
  static constexpr int kBiasShift = 3;  // q - 8
};
struct UnpackQ4_1 : SimpleBlocks<20, 4, true, true> {
  static constexpr bool kSigned = false, kMin = true;
  static constexpr int kBiasShift = -1;
};
// Q4_K / Q5_K: sub-block s of a super-block has scale d * sc_s and min
// -(dmin * mn_s), the same products decode_q4_k forms. A chunk holds one or
// two super-blocks (n is a multiple of 8).
template <bool Five>
struct UnpackQK {
  static constexpr size_t kBytes = Five ? 176 : 144;
  static constexpr bool kSigned = false, kMin = true;
  static constexpr int kBiasShift = -1;
  static void unpack(const uint8_t* row, size_t b, size_t n, bool chunked, Chunk& c) {
    std::fill(c.dw + n, c.dw + 16, 0.0f);
    std::fill(c.m + n, c.m + 16, 0.0f);
    for (size_t k0 = 0; k0 < n; k0 += 8) {
      const uint8_t* blk = row + kBytes * ((b + k0) / 8);
      const float d = Vec16::h2f(load_u16(blk)), dmin = Vec16::h2f(load_u16(blk + 2));
      const uint8_t* qh = blk + 16;
      const uint8_t* q = blk + (Five ? 48 : 16);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, mn;
        k_scale_min(s, blk + 4, &sc, &mn);
        c.dw[k0 + s] = d * sc;
        c.m[k0 + s] = -(dmin * mn);
        uint8_t* __restrict__ o = c.natural + 32 * (k0 + s);
        const uint8_t* __restrict__ qs = q + 32 * (s / 2);
        for (int i = 0; i < 32; ++i) {
          uint8_t v = (s % 2) ? qs[i] >> 4 : qs[i] & 0xf;
          if constexpr (Five) v |= ((qh[i] >> s) & 1) << 4;
          o[i] = v;
        }
      }
    }
    if (chunked) transpose(n, c);
  }
};

// Activation rows per pass: their accumulators stay in L1 while a weight
// row's chunks stream past them; each pass unpacks the weights again.
constexpr size_t kPassRows = 64;

// Columns [j0, j1): each weight row is read once per pass, one 16-block
// chunk at a time, and each chunk is unpacked once and used by every row of
// the pass. Row r's lanes see the chunks in block order, as the formula
// says, whatever the pass, the row count or the column range. The next
// chunk is unpacked before the current one is used, so its stores (some
// narrower than the vector loads that read them back, which would defeat
// store-to-load forwarding) have retired by the time the kernel loads them.
// cols for one activation row in the natural layout (decode), for the
// types whose codes block_dots_direct reads in place (SimpleBlocks): the
// same operations on the same values in the same order as cols, minus the
// unpacked copy of each chunk, which only pays off when rows share it.
template <class U>
void one_row(const WeightView& w, const QuantRows& x, float* y, size_t j0, size_t j1) {
  const size_t nb = x.nb, rb = w.row_bytes();
  // One column at a time, so the weights are read in address order (the
  // hardware prefetchers keep up: interleaving two columns, or software
  // prefetches as in path_impl.h, measured slower from DRAM).
  for (size_t j = j0; j < j1; ++j) {
    const uint8_t* row = w.data + j * rb;
    Vec16 a = Vec16::zero();
    for (size_t b = 0; b < nb; b += 16) {
      const size_t n = std::min<size_t>(16, nb - b);
      Vec16 dw, m;
      U::scales(row, b, n, dw, m);
      I32x16 is = U::template dots<U::kSigned>(row, b, n, x.codes + 32 * b);
      if constexpr (U::kBiasShift >= 0)
        is = is.template minus_shifted<(U::kBiasShift >= 0 ? U::kBiasShift : 0)>(
            I32x16::load(x.sum + b));
      a.fma(dw * Vec16::load(x.d + b), is.to_float());
      if constexpr (U::kMin) a.fma(m, Vec16::load(x.dsum + b));
    }
    y[j] = a.reduce();
  }
}

template <class U>
void cols(const WeightView& w, const QuantRows& x, size_t n_rows, float* y, size_t j0, size_t j1) {
  if constexpr (requires { &U::template dots<U::kSigned>; }) {
    if (n_rows == 1 && !x.chunked) return one_row<U>(w, x, y, j0, j1);
  }
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
        I32x16 is =
            !x.chunked ? block_dots_natural<U::kSigned>(c.natural, xc, std::min<size_t>(16, nb - b))
            : width == 16 ? block_dots<U::kSigned, 16>(c.codes, xc)
            : width == 8  ? block_dots<U::kSigned, 8>(c.codes, xc)
                          : block_dots<U::kSigned, 4>(c.codes, xc);
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
    default:
      return;  // ops.cpp routes only int8_matmul_supported types here
  }
}

}  // namespace int8
}  // namespace ferry::kernels::FERRY_PATH_NAMESPACE
