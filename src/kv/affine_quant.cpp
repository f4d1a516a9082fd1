#include "kv/affine_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/half.h"

namespace ferry::kv {

namespace {

// Code of element e of a packed vector.
inline uint32_t code_at(const uint32_t* packed, size_t e, int bits) {
  const size_t per_word = static_cast<size_t>(32 / bits);
  const uint32_t mask = (1u << bits) - 1;
  return (packed[e / per_word] >> ((e % per_word) * bits)) & mask;
}

}  // namespace

void affine_quantize(const float* x, size_t head_dim, int bits, int group, uint32_t* packed,
                     uint16_t* scales, uint16_t* biases) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const int per_word = 32 / bits;
  for (size_t w = 0; w < head_dim * bits / 32; ++w) packed[w] = 0;
  for (size_t g = 0; g < head_dim / group; ++g) {
    const float* v = x + g * group;
    // Seeded from +-inf with the running value first, as MLX's loop is, so a
    // NaN is skipped and a zero extremum keeps the same sign as in MLX.
    float w_min = std::numeric_limits<float>::infinity();
    float w_max = -w_min;
    for (int i = 0; i < group; ++i) {
      w_max = std::max(w_max, v[i]);
      w_min = std::min(w_min, v[i]);
    }
    const bool min_edge = std::fabs(w_min) > std::fabs(w_max);
    float scale = std::max((w_max - w_min) / n_bins, 1e-7f);
    if (!min_edge) scale = -scale;
    const float edge = min_edge ? w_min : w_max;
    const float q0 = std::rint(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = edge / q0;
      bias = edge;
    }
    // Codes from the float32 scale and bias; only the stored copies are f16.
    scales[g] = f32_to_f16(scale);
    biases[g] = f32_to_f16(bias);
    for (int i = 0; i < group; ++i) {
      float q = std::rint((v[i] - bias) / scale);
      q = std::isnan(q) ? 0.0f : std::min(std::max(q, 0.0f), n_bins);
      size_t e = g * group + i;
      packed[e / per_word] |= static_cast<uint32_t>(q) << ((e % per_word) * bits);
    }
  }
}

void affine_dequantize(const uint32_t* packed, const uint16_t* scales, const uint16_t* biases,
                       size_t head_dim, int bits, int group, float* out) {
  for (size_t e = 0; e < head_dim; ++e) {
    const size_t g = e / group;
    const float q = static_cast<float>(code_at(packed, e, bits));
    out[e] = f16_to_f32(scales[g]) * q + f16_to_f32(biases[g]);
  }
}

void affine_dequantize_f16(const uint32_t* packed, const uint16_t* scales, const uint16_t* biases,
                           size_t head_dim, int bits, int group, uint16_t* out) {
  for (size_t e = 0; e < head_dim; ++e) {
    const size_t g = e / group;
    const float q = static_cast<float>(code_at(packed, e, bits));
    // Two roundings, as MLX's f16 arithmetic: the product, then the sum.
    const float prod = f16_to_f32(f32_to_f16(f16_to_f32(scales[g]) * q));
    out[e] = f32_to_f16(prod + f16_to_f32(biases[g]));
  }
}

}  // namespace ferry::kv
