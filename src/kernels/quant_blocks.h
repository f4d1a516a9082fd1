// Block layouts of GGML's quantized types and their scalar decoders.
//
// Decoding is exact and path-independent: every value is computed with the
// same float operations (a multiply, then an add; -ffp-contract=off keeps
// them unfused), so the reference, AVX2 and AVX-512 builds of this header
// produce identical floats. Shapes: one block decodes to block_elems floats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"

namespace ferry::kernels {
// Internal linkage: each kernel path's translation unit compiles its own copy
// with its own ISA; sharing one definition across them would break the ODR.
namespace {

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Q8_0: f16 d; int8 q[32]. x = d * q.
inline void decode_q8_0(const uint8_t* b, float* out) {
  float d = f16_to_f32(load_u16(b));
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < 32; ++i) out[i] = d * static_cast<float>(q[i]);
}

// Q4_0: f16 d; 16 bytes; element i < 16 is the low nibble of byte i, element
// i + 16 its high nibble. x = d * (q - 8).
inline void decode_q4_0(const uint8_t* b, float* out) {
  float d = f16_to_f32(load_u16(b));
  const uint8_t* q = b + 2;
  for (int i = 0; i < 16; ++i) {
    out[i] = d * static_cast<float>((q[i] & 0xf) - 8);
    out[i + 16] = d * static_cast<float>((q[i] >> 4) - 8);
  }
}

// Q4_1: f16 d, f16 m; 16 bytes as Q4_0. x = d * q + m.
inline void decode_q4_1(const uint8_t* b, float* out) {
  float d = f16_to_f32(load_u16(b));
  float m = f16_to_f32(load_u16(b + 2));
  const uint8_t* q = b + 4;
  for (int i = 0; i < 16; ++i) {
    out[i] = d * static_cast<float>(q[i] & 0xf) + m;
    out[i + 16] = d * static_cast<float>(q[i] >> 4) + m;
  }
}

// The 12-byte packed 6-bit (scale, min) pairs of Q4_K and Q5_K, 8 sub-blocks.
inline void k_scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K: f16 d, f16 dmin, 12 B scales, 128 B nibbles; 8 sub-blocks of 32.
// Sub-blocks 2g and 2g+1 share 32 bytes: low nibbles, then high nibbles.
// x = (d * sc) * q - (dmin * mn).
inline void decode_q4_k(const uint8_t* b, float* out) {
  float d = f16_to_f32(load_u16(b));
  float dmin = f16_to_f32(load_u16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int g = 0; g < 4; ++g) {
    uint8_t sc0, m0, sc1, m1;
    k_scale_min(2 * g, scales, &sc0, &m0);
    k_scale_min(2 * g + 1, scales, &sc1, &m1);
    float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
    for (int i = 0; i < 32; ++i) {
      out[64 * g + i] = d0 * static_cast<float>(q[32 * g + i] & 0xf) - mm0;
      out[64 * g + 32 + i] = d1 * static_cast<float>(q[32 * g + i] >> 4) - mm1;
    }
  }
}

// Q5_K: as Q4_K plus 32 B of fifth bits (qh) before the nibbles; bit
// (2g) of qh[i] extends sub-block 2g's element i, bit (2g+1) sub-block 2g+1's.
inline void decode_q5_k(const uint8_t* b, float* out) {
  float d = f16_to_f32(load_u16(b));
  float dmin = f16_to_f32(load_u16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + 48;
  for (int g = 0; g < 4; ++g) {
    uint8_t sc0, m0, sc1, m1;
    k_scale_min(2 * g, scales, &sc0, &m0);
    k_scale_min(2 * g + 1, scales, &sc1, &m1);
    float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
    for (int i = 0; i < 32; ++i) {
      int lo = (q[32 * g + i] & 0xf) | (((qh[i] >> (2 * g)) & 1) << 4);
      int hi = (q[32 * g + i] >> 4) | (((qh[i] >> (2 * g + 1)) & 1) << 4);
      out[64 * g + i] = d0 * static_cast<float>(lo) - mm0;
      out[64 * g + 32 + i] = d1 * static_cast<float>(hi) - mm1;
    }
  }
}

// Q6_K: 128 B low nibbles (ql), 64 B high 2 bits (qh), 16 int8 scales, f16 d.
// Two halves of 128; in each, element l (0..31) of the four 32-runs takes
// ql[l], ql[l+32] nibbles and qh[l] bit pairs. x = d * sc * (q - 32).
inline void decode_q6_k(const uint8_t* b, float* out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = f16_to_f32(load_u16(b + 208));
  for (int half = 0; half < 2; ++half) {
    const uint8_t* l = ql + 64 * half;
    const uint8_t* h = qh + 32 * half;
    const int8_t* s = sc + 8 * half;
    float* o = out + 128 * half;
    for (int i = 0; i < 32; ++i) {
      int is = i / 16;
      int q1 = ((l[i] & 0xf) | (((h[i] >> 0) & 3) << 4)) - 32;
      int q2 = ((l[i + 32] & 0xf) | (((h[i] >> 2) & 3) << 4)) - 32;
      int q3 = ((l[i] >> 4) | (((h[i] >> 4) & 3) << 4)) - 32;
      int q4 = ((l[i + 32] >> 4) | (((h[i] >> 6) & 3) << 4)) - 32;
      o[i] = (d * static_cast<float>(s[is + 0])) * static_cast<float>(q1);
      o[i + 32] = (d * static_cast<float>(s[is + 2])) * static_cast<float>(q2);
      o[i + 64] = (d * static_cast<float>(s[is + 4])) * static_cast<float>(q3);
      o[i + 96] = (d * static_cast<float>(s[is + 6])) * static_cast<float>(q4);
    }
  }
}

// Decodes n elements (a multiple of the type's block size) of a row.
inline void decode_row(DType t, const uint8_t* src, float* out, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(out, src, n * 4);
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::Q8_0:
      for (size_t i = 0; i < n / 32; ++i) decode_q8_0(src + 34 * i, out + 32 * i);
      return;
    case DType::Q4_0:
      for (size_t i = 0; i < n / 32; ++i) decode_q4_0(src + 18 * i, out + 32 * i);
      return;
    case DType::Q4_1:
      for (size_t i = 0; i < n / 32; ++i) decode_q4_1(src + 20 * i, out + 32 * i);
      return;
    case DType::Q4_K:
      for (size_t i = 0; i < n / 256; ++i) decode_q4_k(src + 144 * i, out + 256 * i);
      return;
    case DType::Q5_K:
      for (size_t i = 0; i < n / 256; ++i) decode_q5_k(src + 176 * i, out + 256 * i);
      return;
    case DType::Q6_K:
      for (size_t i = 0; i < n / 256; ++i) decode_q6_k(src + 210 * i, out + 256 * i);
      return;
  }
}

}  // namespace
}  // namespace ferry::kernels
