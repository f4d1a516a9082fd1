// Whole unsigned decimal numbers from text (environment knobs).
#pragma once

#include <charconv>
#include <cstddef>
#include <optional>
#include <string_view>
#include <system_error>

namespace ferry {

// text as an unsigned decimal number of digits only (no sign, space or
// suffix), or nullopt when it is empty, holds anything else, or does not
// fit a size_t.
inline std::optional<size_t> parse_decimal(std::string_view text) {
  // (from_chars takes no sign, space or prefix for an unsigned type.)
  size_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc{} || ptr != end) return std::nullopt;
  return v;
}

}  // namespace ferry
