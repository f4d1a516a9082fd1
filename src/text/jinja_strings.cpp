#include "text/jinja_strings.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "text/jinja_value.h"

namespace ferry::text::jinja::pystr {

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    char32_t c = b;
    if (b >= 0x80) {
      if ((b >> 5) == 6) {
        n = 1, c = b & 0x1F;
      } else if ((b >> 4) == 14) {
        n = 2, c = b & 0x0F;
      } else if ((b >> 3) == 30) {
        n = 3, c = b & 0x07;
      } else {
        throw EvalError("invalid UTF-8 in string");
      }
      if (s.size() - i <= n) throw EvalError("invalid UTF-8 in string");
      for (std::size_t k = 1; k <= n; ++k) {
        auto cb = static_cast<unsigned char>(s[i + k]);
        if ((cb & 0xC0) != 0x80) throw EvalError("invalid UTF-8 in string");
        c = (c << 6) | (cb & 0x3F);
      }
    }
    out.push_back(c);
    i += n + 1;
  }
  return out;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    std::size_t n = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : 4;
    if (n == 4 || s.size() - i <= n) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n + 1;
  }
  return true;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

std::size_t length(std::string_view s) {
  std::size_t n = 0;
  for (char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string strip(std::string_view s, bool left, bool right,
                  const std::optional<std::string>& chars) {
  std::u32string u = decode(s);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : is_space(c);
  };
  std::size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip_it(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(u[e - 1])) --e;
  }
  return encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               std::int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw EvalError("empty separator");
    std::size_t pos = 0;
    while (maxsplit < 0 || static_cast<std::int64_t>(out.size()) < maxsplit) {
      std::size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string u = decode(s);
  std::size_t i = 0;
  while (true) {
    while (i < u.size() && is_space(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) {
      std::size_t e = u.size();
      while (e > i && is_space(u[e - 1])) --e;
      out.push_back(encode(std::u32string_view(u).substr(i, e - i)));
      break;
    }
    std::size_t j = i;
    while (j < u.size() && !is_space(u[j])) ++j;
    out.push_back(encode(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                std::int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw EvalError("empty separator");
    std::size_t end = s.size();
    while (static_cast<std::int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      std::size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    std::u32string u = decode(s);
    std::size_t e = u.size();
    while (true) {
      while (e > 0 && is_space(u[e - 1])) --e;
      if (e == 0) break;
      if (static_cast<std::int64_t>(out.size()) == maxsplit) {
        std::size_t b = 0;
        while (b < e && is_space(u[b])) ++b;
        out.push_back(encode(std::u32string_view(u).substr(b, e - b)));
        break;
      }
      std::size_t b = e;
      while (b > 0 && !is_space(u[b - 1])) --b;
      out.push_back(encode(std::u32string_view(u).substr(b, e - b)));
      e = b;
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::u32string u = decode(s);
  std::vector<std::string> out;
  std::size_t start = 0, i = 0;
  while (i < u.size()) {
    char32_t c = u[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
               c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++i;
      continue;
    }
    std::size_t eol = i + ((c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ? 2 : 1);
    out.push_back(encode(std::u32string_view(u).substr(start, (keepends ? eol : i) - start)));
    start = i = eol;
  }
  if (start < u.size()) out.push_back(encode(std::u32string_view(u).substr(start)));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    std::int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` between every character (and at both ends).
    std::u32string u = decode(s);
    std::int64_t done = 0;
    for (std::size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < u.size()) append_utf8(out, u[i]);
    }
    return out;
  }
  std::size_t pos = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    std::size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(with);
    pos = hit + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

std::int64_t find(std::string_view s, std::string_view sub, bool reverse) {
  std::size_t hit = reverse ? s.rfind(sub) : s.find(sub);
  if (hit == std::string_view::npos) return -1;
  return static_cast<std::int64_t>(length(s.substr(0, hit)));
}

std::int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<std::int64_t>(length(s)) + 1;
  std::int64_t n = 0;
  for (std::size_t pos = s.find(sub); pos != std::string_view::npos;
       pos = s.find(sub, pos + sub.size())) {
    ++n;
  }
  return n;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci looks like "-1.2345e+17": split sign, digits and exponent.
  std::string out;
  std::size_t i = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    i = 1;
  }
  std::size_t e_pos = sci.find('e');
  std::string digits;
  for (std::size_t k = i; k < e_pos; ++k) {
    if (sci[k] != '.') digits.push_back(sci[k]);
  }
  int exp = std::atoi(sci.c_str() + e_pos + 1);
  int decpt = exp + 1;  // digits[0..decpt) are the integer part
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<std::size_t>(-decpt), '0');
      out += digits;
    } else if (static_cast<std::size_t>(decpt) >= digits.size()) {
      out += digits;
      out.append(static_cast<std::size_t>(decpt) - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(decpt));
      out += '.';
      out += digits.substr(static_cast<std::size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  out += ebuf;
  return out;
}

namespace {

// Python's str.isprintable() is false for controls, format characters,
// separators other than ' ', surrogates and private-use characters; repr()
// escapes those. (Unassigned code points are not known here.)
bool repr_escapes(char32_t c) {
  static constexpr char32_t kRanges[][2] = {
      {0x00, 0x1F},     {0x7F, 0xA0},     {0xAD, 0xAD},       {0x600, 0x605},   {0x61C, 0x61C},
      {0x6DD, 0x6DD},   {0x70F, 0x70F},   {0x1680, 0x1680},   {0x180E, 0x180E}, {0x2000, 0x200F},
      {0x2028, 0x202F}, {0x205F, 0x2064}, {0x2066, 0x206F},   {0x3000, 0x3000}, {0xD800, 0xF8FF},
      {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB}, {0xF0000, 0x10FFFF}};
  for (const auto& r : kRanges) {
    if (c >= r[0] && c <= r[1]) return true;
  }
  return false;
}

}  // namespace

std::string repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode(s)) {
    char buf[16];
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!repr_escapes(c)) {
      append_utf8(out, c);
    } else {
      auto v = static_cast<unsigned>(c);
      if (c <= 0xFF) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", v);
      } else if (c <= 0xFFFF) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", v);
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", v);
      }
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

std::string escape_html(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

namespace {

// Strips Python whitespace and validates/removes '_' digit separators
// (allowed only between digits). Returns nullopt on a misplaced '_'.
std::optional<std::string> clean_number(std::string_view s) {
  std::string t = strip(s, true, true, std::nullopt);
  std::string out;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '_') {
      out.push_back(t[i]);
      continue;
    }
    auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
    if (i == 0 || i + 1 == t.size() || !alnum(t[i - 1]) || !alnum(t[i + 1])) return std::nullopt;
  }
  return out;
}

}  // namespace

std::optional<std::int64_t> parse_int(std::string_view s, int base) {
  std::optional<std::string> t = clean_number(s);
  if (!t || t->empty()) return std::nullopt;
  std::string_view v = *t;
  bool neg = false;
  if (v[0] == '+' || v[0] == '-') {
    neg = v[0] == '-';
    v.remove_prefix(1);
  }
  if (v.size() > 2 && v[0] == '0') {
    char p = static_cast<char>(std::tolower(static_cast<unsigned char>(v[1])));
    int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed != 0 && (base == prefixed || base == 0)) {
      base = prefixed;
      v.remove_prefix(2);
    }
  }
  if (base == 0) base = 10;
  if (v.empty()) return std::nullopt;
  std::uint64_t mag = 0;
  auto res = std::from_chars(v.data(), v.data() + v.size(), mag, base);
  if (res.ec != std::errc() || res.ptr != v.data() + v.size()) {
    if (res.ec == std::errc::result_out_of_range) throw EvalError("integer too large");
    return std::nullopt;
  }
  if (mag > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + (neg ? 1 : 0)) {
    throw EvalError("integer too large");
  }
  return neg ? static_cast<std::int64_t>(0 - mag) : static_cast<std::int64_t>(mag);
}

std::optional<double> parse_float(std::string_view s) {
  std::optional<std::string> t = clean_number(s);
  if (!t || t->empty()) return std::nullopt;
  std::string low;
  for (char c : *t) low.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  std::string_view body = low;
  bool neg = false;
  if (body[0] == '+' || body[0] == '-') {
    neg = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") return neg ? -INFINITY : INFINITY;
  if (body == "nan") return NAN;
  for (char c : body) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' ||
          c == '-')) {
      return std::nullopt;
    }
  }
  double d = 0;
  auto res = std::from_chars(body.data(), body.data() + body.size(), d);
  if (res.ec != std::errc() || res.ptr != body.data() + body.size()) return std::nullopt;
  return neg ? -d : d;
}

}  // namespace ferry::text::jinja::pystr
