// FERRY_CUDA_* environment variables (knobs.h).
#include "cuda/knobs.h"

#include <cstdlib>
#include <cstring>

#include "core/parse.h"

namespace ferry::cuda {

bool knob_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

size_t knob_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : parse_decimal(v).value_or(fallback);
}

}  // namespace ferry::cuda
