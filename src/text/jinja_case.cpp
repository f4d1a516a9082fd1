// Python case mapping for the Jinja interpreter (str.upper/lower/title/...).
// The supported ranges are listed in jinja_strings.h.
#include <cstdio>
#include <string>

#include "text/jinja_strings.h"
#include "text/jinja_value.h"

namespace ferry::text::jinja::pystr {
namespace {

std::string hex_cp(char32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "U+%04X", static_cast<unsigned>(c));
  return buf;
}

// Ranges of code points that have no case mapping in Unicode: characters
// from these blocks pass through upper()/lower() unchanged.
struct Range {
  char32_t lo, hi;
};
constexpr Range kCaseless[] = {
    {0x0080, 0x00BF},   {0x02B0, 0x0344},   {0x0346, 0x036F},    {0x0590, 0x109F},
    {0x1100, 0x139F},   {0x1400, 0x1C7F},   {0x2000, 0x20FF},    {0x2190, 0x24B5},
    {0x24EA, 0x2BFF},   {0x2D30, 0xA63F},   {0xA6A0, 0xA71F},    {0xA800, 0xAB2F},
    {0xABC0, 0xFAFF},   {0xFB1D, 0xFF20},   {0xFF3B, 0xFF40},    {0xFF5B, 0xFFFF},
    {0x10000, 0x103FF}, {0x10500, 0x1056F}, {0x105C0, 0x10C7F},  {0x10D00, 0x1189F},
    {0x11900, 0x16E3F}, {0x16EA0, 0x1E8FF}, {0x1E960, 0x10FFFF},
};

bool caseless(char32_t c) {
  for (const Range& r : kCaseless) {
    if (c >= r.lo && c <= r.hi) return true;
  }
  return false;
}

// One-to-one mappings; returns false where the code point is outside the
// supported tables. `out` receives the mapped code point.
bool map_simple(char32_t c, bool to_upper, char32_t& out) {
  out = c;
  auto pair_even_upper = [&](char32_t lo, char32_t hi) {
    if (c < lo || c > hi) return false;
    bool is_upper = ((c - lo) % 2) == 0;
    if (to_upper && !is_upper) out = c - 1;
    if (!to_upper && is_upper) out = c + 1;
    return true;
  };
  if (c < 0x80) {
    if (to_upper && c >= 'a' && c <= 'z') out = c - 32;
    if (!to_upper && c >= 'A' && c <= 'Z') out = c + 32;
    return true;
  }
  if (c >= 0xC0 && c <= 0xFE && c != 0xD7 && c != 0xF7 && c != 0xDF) {
    if (to_upper && c >= 0xE0) out = c - 32;
    if (!to_upper && c <= 0xDE) out = c + 32;
    return true;
  }
  switch (c) {
    case 0xB5:
      out = to_upper ? 0x39C : c;
      return true;
    case 0xFF:
      out = to_upper ? 0x178 : c;
      return true;
    case 0x178:
      out = to_upper ? c : 0xFF;
      return true;
    case 0x131:
      out = to_upper ? 'I' : c;
      return true;
    case 0x138:
      return true;
    case 0x17F:
      out = to_upper ? 'S' : c;
      return true;
    case 0x3C2:
      out = to_upper ? 0x3A3 : c;
      return true;
    case 0x386:
      out = to_upper ? c : 0x3AC;
      return true;
    case 0x3AC:
      out = to_upper ? 0x386 : c;
      return true;
    case 0x38C:
      out = to_upper ? c : 0x3CC;
      return true;
    case 0x3CC:
      out = to_upper ? 0x38C : c;
      return true;
    case 0x4C0:
      out = to_upper ? c : 0x4CF;
      return true;
    case 0x4CF:
      out = to_upper ? 0x4C0 : c;
      return true;
    default:
      break;
  }
  if (pair_even_upper(0x100, 0x12F) || pair_even_upper(0x132, 0x137) ||
      pair_even_upper(0x14A, 0x177) || pair_even_upper(0x460, 0x481) ||
      pair_even_upper(0x48A, 0x4BF) || pair_even_upper(0x4D0, 0x52F)) {
    return true;
  }
  // Odd code point is upper case in these runs.
  auto pair_odd_upper = [&](char32_t lo, char32_t hi) {
    if (c < lo || c > hi) return false;
    bool is_upper = ((c - lo) % 2) == 0;  // lo is odd
    if (to_upper && !is_upper) out = c - 1;
    if (!to_upper && is_upper) out = c + 1;
    return true;
  };
  if (pair_odd_upper(0x139, 0x148) || pair_odd_upper(0x179, 0x17E) ||
      pair_odd_upper(0x4C1, 0x4CE)) {
    return true;
  }
  auto shift = [&](char32_t ulo, char32_t uhi, char32_t llo) {
    char32_t lhi = llo + (uhi - ulo);
    if (c >= ulo && c <= uhi) {
      if (!to_upper) out = c - ulo + llo;
      return true;
    }
    if (c >= llo && c <= lhi) {
      if (to_upper) out = c - llo + ulo;
      return true;
    }
    return false;
  };
  if (c != 0x3A2 && shift(0x391, 0x3A9, 0x3B1)) return true;
  if (shift(0x388, 0x38A, 0x3AD) || shift(0x38E, 0x38F, 0x3CD) || shift(0x410, 0x42F, 0x430) ||
      shift(0x400, 0x40F, 0x450) || shift(0xFF21, 0xFF3A, 0xFF41)) {
    return true;
  }
  return caseless(c);
}

bool is_cased(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (c == 0xAA || c == 0xBA || c == 0xDF || c == 0x138 || c == 0x149) return true;
  if (caseless(c)) return false;
  char32_t u = 0, l = 0;
  if (!map_simple(c, true, u) || !map_simple(c, false, l)) return true;
  return u != c || l != c;
}

bool case_ignorable(char32_t c) {
  return c == '\'' || c == '.' || c == ':' || c == '^' || c == '`' || c == 0xA8 || c == 0xAD ||
         c == 0xAF || c == 0xB4 || c == 0xB7 || c == 0xB8 || (c >= 0x2B0 && c <= 0x36F) ||
         c == 0x2018 || c == 0x2019 || c == 0x2024 || c == 0x2027 || (c >= 0x200B && c <= 0x200F);
}

// Appends the full case mapping of s[i] (Python semantics) to out.
void map_full(const std::u32string& s, std::size_t i, bool to_upper, std::u32string& out) {
  char32_t c = s[i];
  if (to_upper) {
    if (c == 0xDF) {
      out.append(U"SS");
      return;
    }
    if (c == 0x149) {
      out.append(U"\u02BCN");
      return;
    }
  } else {
    if (c == 0x130) {
      out.append(U"i\u0307");
      return;
    }
    if (c == 0x3A3) {
      // Final sigma: preceded by a cased letter and not followed by one.
      bool before = false, after = false;
      for (std::size_t j = i; j-- > 0;) {
        if (case_ignorable(s[j])) continue;
        before = is_cased(s[j]);
        break;
      }
      for (std::size_t j = i + 1; j < s.size(); ++j) {
        if (case_ignorable(s[j])) continue;
        after = is_cased(s[j]);
        break;
      }
      out.push_back(before && !after ? 0x3C2 : 0x3C3);
      return;
    }
  }
  char32_t m = 0;
  if (!map_simple(c, to_upper, m)) {
    throw EvalError(std::string(to_upper ? "upper" : "lower") + "-casing " + hex_cp(c) +
                    " is not supported");
  }
  out.push_back(m);
}

// Python's titlecase of one character (str.title, str.capitalize): the
// upper case, except where Unicode's titlecase differs ('ß' -> "Ss").
void map_title(const std::u32string& s, std::size_t i, std::u32string& out) {
  if (s[i] == 0xDF) {
    out.append(U"Ss");
    return;
  }
  map_full(s, i, true, out);
}

std::u32string map_range(const std::u32string& s, std::size_t from, std::size_t to, bool to_upper) {
  std::u32string out;
  out.reserve(to - from);
  for (std::size_t i = from; i < to; ++i) map_full(s, i, to_upper, out);
  return out;
}

}  // namespace

std::string upper(std::string_view s) {
  std::u32string u = decode(s);
  return encode(map_range(u, 0, u.size(), true));
}

std::string lower(std::string_view s) {
  std::u32string u = decode(s);
  return encode(map_range(u, 0, u.size(), false));
}

std::string capitalize(std::string_view s) {
  std::u32string u = decode(s);
  if (u.empty()) return {};
  std::u32string out;
  map_title(u, 0, out);
  out += map_range(u, 1, u.size(), false);
  return encode(out);
}

std::string title(std::string_view s) {
  std::u32string u = decode(s);
  std::u32string out;
  bool prev_cased = false;
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (prev_cased) {
      map_full(u, i, false, out);
    } else {
      map_title(u, i, out);
    }
    prev_cased = is_cased(u[i]);
  }
  return encode(out);
}

std::string jinja_title(std::string_view s) {
  std::u32string u = decode(s);
  auto is_sep = [](char32_t c) {
    return is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::u32string out;
  std::size_t i = 0;
  while (i < u.size()) {
    // Pieces alternate: a run of separators, then a run of other characters.
    std::size_t j = i;
    bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    out += map_range(u, i, i + 1, true);
    out += map_range(u, i + 1, j, false);
    i = j;
  }
  return encode(out);
}

bool is_lower(std::string_view s) {
  std::u32string u = decode(s);
  bool any = false;
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (!is_cased(u[i])) continue;
    std::u32string low;
    map_full(u, i, false, low);
    if (low != std::u32string(1, u[i])) return false;
    any = true;
  }
  return any;
}

bool is_upper(std::string_view s) {
  std::u32string u = decode(s);
  bool any = false;
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (!is_cased(u[i])) continue;
    std::u32string up;
    map_full(u, i, true, up);
    if (up != std::u32string(1, u[i])) return false;
    any = true;
  }
  return any;
}

}  // namespace ferry::text::jinja::pystr
