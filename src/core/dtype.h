// Element types of weights and activations, and the block layout of the
// quantized ones. Byte layouts follow GGML's published formats so GGUF
// tensors are used in place (memory-mapped, never converted at load).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ferry {

// Values equal GGML's type ids, the numbers stored in GGUF tensor infos.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
};

struct DTypeTraits {
  std::string_view name;
  uint32_t block_elems;  // elements per block (1 for plain floats)
  uint32_t block_bytes;  // bytes per block
};

// Traits of a GGML type id, or nullopt if ferry does not support it.
std::optional<DTypeTraits> dtype_traits(uint32_t ggml_type);
DTypeTraits dtype_traits(DType t);
// Name of any GGML type id, supported or not (for error messages).
std::string_view ggml_type_name(uint32_t ggml_type);

// Bytes used by one row of n elements; n must be a multiple of block_elems.
inline size_t row_bytes(DType t, size_t n) {
  DTypeTraits tr = dtype_traits(t);
  return n / tr.block_elems * tr.block_bytes;
}

}  // namespace ferry
