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

inline std::string data_path(const std::string& rel) {
  return std::string(FERRY_TEST_DATA) + "/" + rel;
}

}  // namespace ferry::test
