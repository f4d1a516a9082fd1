// Paths of the models tests use: the default SmolLM2 (fetched by the
// README's set-up into ~/.cache/ferry/models) and the tiny random models
// committed under tests/data/models.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ferry::test {

inline std::string smollm2_path() {
  if (const char* env = std::getenv("FERRY_MODEL")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/ferry/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// $FERRY_TEST_DATA (set by ctest, and by tools/cuda/test.sh on a machine
// where the checkout lives elsewhere), else the path at build time.
inline std::string data_path(const std::string& rel) {
  const char* env = std::getenv("FERRY_TEST_DATA");
  return std::string(env ? env : FERRY_TEST_DATA) + "/" + rel;
}

}  // namespace ferry::test
