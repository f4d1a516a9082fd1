// MLX's affine quantization (mlx.core.quantize, mode "affine") of one
// (head, token) vector along head_dim, per group of `group` values:
//   scale = max((max - min) / (2^bits - 1), 1e-7), signed toward the edge of
//   larger magnitude (the max on a tie); q0 = rint(edge / scale); if q0 != 0
//   the scale is re-fit so the edge is exact (scale = edge / q0, bias = edge),
//   else bias = 0; code = clamp(rint((x - bias) / scale), 0, 2^bits - 1).
// Codes are packed little-endian into uint32 words, element k of a word at
// bits [k*bits, (k+1)*bits); scales and biases are stored as f16 (the format
// MLX uses for f16 activations).
//
// What MLX's arithmetic is, established against mlx 0.32.4 (CPU) by
// tools/goldens/kv_quant_goldens.py, whose goldens tests/kv pins bit for bit:
// - Everything is float32 for f16 input: the group's min and max are widened
//   before w_max - w_min is taken (never an f16 subtraction, which would
//   round, or overflow for groups spanning +-65504), and scale, q0, bias are
//   float32.
// - Codes use the float32 scale and bias, not the f16-rounded ones that are
//   stored; rounding to f16 happens only on store. (Codes from the stored
//   values would differ from MLX in over a thousand of the goldens' words.)
// - rint is round-half-to-even; eps is the float nearest 1e-7.
// - mx.dequantize with f16 scales returns f16 computed as
//   f16(f16(scale * q) + bias): the product is rounded to f16 before the bias
//   is added. That is not f16 of affine_dequantize's float result (one
//   rounding, at the add, since scale * q is exact in float32): the two differ
//   in a third to a half of values on random data, and MLX's f16 product
//   overflows to inf for groups spanning near +-65504.
//   affine_dequantize_f16 reproduces MLX; affine_dequantize is the more exact
//   value (and equals mx.dequantize's output with scales and biases widened to
//   float32).
// Inputs must be finite: for NaN MLX casts NaN to an integer (undefined);
// ferry stores code 0 there.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::kv {

// Preconditions (unchecked, hot path): bits is 4 or 8; group divides head_dim
// and is a multiple of 32 / bits.
// x: head_dim floats. packed: head_dim * bits / 32 words; scales, biases:
// head_dim / group f16 values each.
void affine_quantize(const float* x, size_t head_dim, int bits, int group, uint32_t* packed,
                     uint16_t* scales, uint16_t* biases);

// out[e] = scale * code + bias in float32, scale and bias widened from f16.
void affine_dequantize(const uint32_t* packed, const uint16_t* scales, const uint16_t* biases,
                       size_t head_dim, int bits, int group, float* out);

// out[e] = f16(f16(scale * code) + bias): mx.dequantize's f16 output, bit for
// bit (f16 bit patterns).
void affine_dequantize_f16(const uint32_t* packed, const uint16_t* scales, const uint16_t* biases,
                           size_t head_dim, int bits, int group, uint16_t* out);

}  // namespace ferry::kv
