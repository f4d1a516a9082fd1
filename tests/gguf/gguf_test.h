// Helpers shared by the GGUF reader tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"

namespace ferry::test {

inline std::unique_ptr<gguf::File> parse_bytes(const std::vector<uint8_t>& b,
                                               std::string name = "test.gguf") {
  return gguf::File::parse(b, std::move(name));
}

// The message of the ferry::Error thrown by `f`, or a marker if none was.
// Any other exception escapes and fails the test.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ferry::Error& e) {
    return e.what();
  }
  return "<no ferry::Error thrown>";
}

inline void expect_contains(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const std::string& p : parts) {
    EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nlacks: " << p;
  }
}

}  // namespace ferry::test
