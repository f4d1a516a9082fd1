#include "core/dtype.h"

#include "core/error.h"

namespace ferry {

std::optional<DTypeTraits> dtype_traits(uint32_t ggml_type) {
  switch (static_cast<DType>(ggml_type)) {
    case DType::F32:
      return DTypeTraits{"F32", 1, 4};
    case DType::F16:
      return DTypeTraits{"F16", 1, 2};
    case DType::BF16:
      return DTypeTraits{"BF16", 1, 2};
    case DType::Q4_0:
      return DTypeTraits{"Q4_0", 32, 18};  // f16 d, 16 B nibbles
    case DType::Q4_1:
      return DTypeTraits{"Q4_1", 32, 20};  // f16 d, f16 m, 16 B nibbles
    case DType::Q8_0:
      return DTypeTraits{"Q8_0", 32, 34};  // f16 d, 32 int8
    case DType::Q4_K:
      return DTypeTraits{"Q4_K", 256, 144};  // 2 f16, 12 B scales, 128 B
    case DType::Q5_K:
      return DTypeTraits{"Q5_K", 256, 176};  // + 32 B high bits
    case DType::Q6_K:
      return DTypeTraits{"Q6_K", 256, 210};  // 128+64 B, 16 int8, f16 d
  }
  return std::nullopt;
}

DTypeTraits dtype_traits(DType t) {
  auto tr = dtype_traits(static_cast<uint32_t>(t));
  FERRY_CHECK(tr.has_value(), "dtype", "unknown dtype ", static_cast<uint32_t>(t));
  return *tr;
}

std::string_view ggml_type_name(uint32_t t) {
  static constexpr std::string_view names[] = {
      "F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
      "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
      "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
  if (t < sizeof(names) / sizeof(names[0])) return names[t];
  return "unknown";
}

}  // namespace ferry
