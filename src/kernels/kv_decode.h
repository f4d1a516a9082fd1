// Internal: decoding one (head, token) row of a KV cache side to float32.
// Exact and path-independent (widening conversions; affine values are
// scale * code + bias with one rounding each), compiled per path with
// internal linkage like quant_blocks.h.
#pragma once

#include <cstring>

#include "core/half.h"
#include "kernels/ops.h"
#include "kernels/vec16.h"

namespace ferry::kernels {
namespace {

// head_dim is a multiple of 16 and of the affine group (>= 32), so every
// 16-value chunk lies in one group. Codes are packed little-endian in
// uint32 words, element k of a word at bits k*bits: in bytes, 8-bit codes
// are consecutive and 4-bit codes go low nibble first.
inline void decode_kv_side(const KvSide& side, size_t D, size_t h, size_t j, float* out) {
  const uint8_t* p0 = side.plane[0] + h * side.head_stride[0] + j * side.unit[0];
  switch (side.format.kind) {
    case KvFormat::Kind::F32:
      std::memcpy(out, p0, D * 4);
      return;
    case KvFormat::Kind::F16:
      for (size_t i = 0; i < D; i += 16) Vec16::from_f16(p0 + 2 * i).store(out + i);
      return;
    case KvFormat::Kind::BF16:
      for (size_t i = 0; i < D; i += 16) Vec16::from_bf16(p0 + 2 * i).store(out + i);
      return;
    case KvFormat::Kind::Affine: {
      const uint8_t* sc = side.plane[1] + h * side.head_stride[1] + j * side.unit[1];
      const uint8_t* bi = side.plane[2] + h * side.head_stride[2] + j * side.unit[2];
      const bool four = side.format.bits == 4;
      const size_t group = side.format.group;
      for (size_t i = 0; i < D; i += 16) {
        const size_t g = i / group;
        uint16_t s16, b16;
        std::memcpy(&s16, sc + 2 * g, 2);
        std::memcpy(&b16, bi + 2 * g, 2);
        const Vec16 q = four ? Vec16::from_u4i(p0 + i / 2) : Vec16::from_u8(p0 + i);
        // scale * code, then + bias: one rounding each, as affine_dequantize.
        (Vec16::splat(Vec16::h2f(s16)) * q + Vec16::splat(Vec16::h2f(b16))).store(out + i);
      }
      return;
    }
  }
}

}  // namespace
}  // namespace ferry::kernels
