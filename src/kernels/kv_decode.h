// Internal: decoding one (head, token) row of a KV cache side to float32.
// Exact and path-independent (widening conversions; affine values are
// scale * code + bias with one rounding each), compiled per path with
// internal linkage like quant_blocks.h.
#pragma once

#include <cstring>

#include "core/half.h"
#include "kernels/ops.h"

namespace ferry::kernels {
namespace {

inline void decode_kv_side(const KvSide& side, size_t D, size_t h, size_t j, float* out) {
  const uint8_t* p0 = side.plane[0] + h * side.head_stride[0] + j * side.unit[0];
  uint16_t u;
  switch (side.format.kind) {
    case KvFormat::Kind::F32:
      std::memcpy(out, p0, D * 4);
      return;
    case KvFormat::Kind::F16:
      for (size_t i = 0; i < D; ++i) {
        std::memcpy(&u, p0 + 2 * i, 2);
        out[i] = f16_to_f32(u);
      }
      return;
    case KvFormat::Kind::BF16:
      for (size_t i = 0; i < D; ++i) {
        std::memcpy(&u, p0 + 2 * i, 2);
        out[i] = bf16_to_f32(u);
      }
      return;
    case KvFormat::Kind::Affine: {
      const uint8_t* sc = side.plane[1] + h * side.head_stride[1] + j * side.unit[1];
      const uint8_t* bi = side.plane[2] + h * side.head_stride[2] + j * side.unit[2];
      const int bits = side.format.bits;
      const size_t group = side.format.group;
      const uint32_t mask = (1u << bits) - 1;
      const size_t per_word = 32 / bits;
      for (size_t g = 0; g < D / group; ++g) {
        uint16_t s16, b16;
        std::memcpy(&s16, sc + 2 * g, 2);
        std::memcpy(&b16, bi + 2 * g, 2);
        const float scale = f16_to_f32(s16), bias = f16_to_f32(b16);
        for (size_t i = g * group; i < (g + 1) * group; ++i) {
          uint32_t word;
          std::memcpy(&word, p0 + 4 * (i / per_word), 4);
          const uint32_t q = (word >> ((i % per_word) * bits)) & mask;
          out[i] = scale * static_cast<float>(q) + bias;
        }
      }
      return;
    }
  }
}

}  // namespace
}  // namespace ferry::kernels
