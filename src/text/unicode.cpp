#include "text/unicode.h"

#include <algorithm>

namespace ferry::text {

namespace detail {

CpClass cp_class_slow(uint32_t cp) {
  const CpRange* end = kCpRanges + kCpRangeCount;
  // First range with hi >= cp; cp is in it iff lo <= cp.
  const CpRange* r =
      std::lower_bound(kCpRanges, end, cp, [](const CpRange& a, uint32_t v) { return a.hi < v; });
  return (r != end && r->lo <= cp) ? r->cls : CpClass::kOther;
}

}  // namespace detail

Utf8Unit utf8_decode(std::string_view s) {
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) return {Utf8Unit::kValid, 1, b0};
  // Sequence length and the allowed range of the second byte (Unicode Table
  // 3-7); later bytes are always 80..BF.
  int n;
  uint8_t lo = 0x80, hi = 0xBF;
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return {Utf8Unit::kInvalid, 1, 0};
  }
  for (int i = 1; i < n; ++i) {
    if (static_cast<size_t>(i) >= s.size()) {
      return {Utf8Unit::kIncomplete, static_cast<uint8_t>(i), 0};
    }
    const auto b = static_cast<uint8_t>(s[i]);
    if (b < lo || b > hi) return {Utf8Unit::kInvalid, static_cast<uint8_t>(i), 0};
    cp = (cp << 6) | (b & 0x3F);
    lo = 0x80, hi = 0xBF;
  }
  return {Utf8Unit::kValid, static_cast<uint8_t>(n), cp};
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t utf8_append_lossy(std::string& out, std::string_view bytes, bool final) {
  size_t i = 0;
  size_t run = 0;  // start of the pending run of valid bytes, copied in bulk
  while (i < bytes.size()) {
    const Utf8Unit u = utf8_decode(bytes.substr(i));
    if (u.status == Utf8Unit::kValid) {
      i += u.len;
      continue;
    }
    out.append(bytes.substr(run, i - run));
    if (u.status == Utf8Unit::kIncomplete && !final) return i;
    utf8_append(out, kReplacementChar);
    i += u.len;
    run = i;
  }
  out.append(bytes.substr(run, i - run));
  return i;
}

bool utf8_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Unit u = utf8_decode(s.substr(i));
    if (u.status != Utf8Unit::kValid) return false;
    i += u.len;
  }
  return true;
}

}  // namespace ferry::text
