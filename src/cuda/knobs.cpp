// FERRY_CUDA_* environment variables (knobs.h).
#include "cuda/knobs.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ferry::cuda {

bool knob_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

size_t knob_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v < '0' || *v > '9') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return errno == 0 && *end == '\0' ? static_cast<size_t>(n) : fallback;
}

}  // namespace ferry::cuda
