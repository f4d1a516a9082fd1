// Internal to the gguf layer: names read from a file, made safe for messages.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace ferry::gguf::internal {

// Quotes `s` for an error message: printable ASCII kept, other bytes (and the
// quote and backslash) as \xNN, cut after 96 bytes since a corrupt key can be
// megabytes long.
inline std::string quoted(std::string_view s) {
  constexpr size_t kMaxShown = 96;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > kMaxShown) out += "...";
  out += "'";
  return out;
}

}  // namespace ferry::gguf::internal
