// Whole unsigned decimal numbers from text (environment knobs).
#pragma once

#include <cstddef>
#include <limits>
#include <optional>
#include <string_view>

namespace ferry {

// text as an unsigned decimal number of digits only (no sign, space or
// suffix), or nullopt when it is empty, holds anything else, or does not
// fit a size_t.
inline std::optional<size_t> parse_decimal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  size_t v = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return std::nullopt;
    const auto d = static_cast<size_t>(ch - '0');
    if (v > (std::numeric_limits<size_t>::max() - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

}  // namespace ferry
