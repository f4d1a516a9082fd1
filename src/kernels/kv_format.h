// How K or V of one (head, token) is stored. Dense formats store head_dim
// values; the affine format stores MLX-style codes along head_dim in three
// planes (packed codes, scales, biases), so every plane is token-granular
// and rows move along the token axis as plain bytes, never requantized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::kernels {

struct KvFormat {
  enum class Kind : uint8_t { F32, F16, BF16, Affine };
  Kind kind = Kind::F32;
  uint8_t bits = 0;    // Affine: 4 or 8
  uint16_t group = 0;  // Affine: 32, 64 or 128 values per scale/bias pair

  static KvFormat f32() { return {Kind::F32, 0, 0}; }
  static KvFormat f16() { return {Kind::F16, 0, 0}; }
  static KvFormat bf16() { return {Kind::BF16, 0, 0}; }
  static KvFormat affine(int bits, int group) {
    return {Kind::Affine, static_cast<uint8_t>(bits), static_cast<uint16_t>(group)};
  }
  bool quantized() const { return kind == Kind::Affine; }
  // Throws ferry::Error("[kv] ...") if the format cannot store head_dim.
  void validate(size_t head_dim) const;
  std::string name() const;  // "f32", "f16", "bf16", "q4g64", ...

  // Bytes of each plane for one (head, token): dense formats have one plane;
  // affine has packed (head_dim * bits / 8), scales and biases (f16 each,
  // head_dim / group of them).
  std::vector<size_t> plane_units(size_t head_dim) const;
  size_t bytes_per_head_token(size_t head_dim) const;

  bool operator==(const KvFormat&) const = default;
};

// Parses "f32", "f16", "bf16", "q8", "q4", "q8g32", "q4g128", ... (default
// group 64). Throws ferry::Error naming the text.
KvFormat parse_kv_format(const std::string& text);

}  // namespace ferry::kernels
