// Python string semantics the Jinja interpreter needs: UTF-8 code points,
// str.isspace, case mapping, strip/split/splitlines, and float repr.
//
// Case mapping (jinja_case.cpp) covers ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic and
// fullwidth Latin exactly (including Python's multi-character results such as
// 'ß'.upper() == 'SS' and the final-sigma rule of str.lower()). Code points in
// scripts without case pass through. Anything else with case (e.g. Armenian,
// Latin Extended-B) throws EvalError instead of guessing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::text::jinja::pystr {

bool valid_utf8(std::string_view s);
// Decodes UTF-8; throws EvalError on malformed input.
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);
// Number of code points (Python len()).
std::size_t length(std::string_view s);

// Python str.isspace() for one code point (also what re's \s matches).
bool is_space(char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
// Python str.capitalize(): first character upper, the rest lower.
std::string capitalize(std::string_view s);
// Python str.title(): upper after an uncased character, lower after a cased one.
std::string title(std::string_view s);
// Jinja's `title` filter: upper-cases the first character of each piece split
// at runs of whitespace, '-', '(', '{', '[' and '<', lower-cases the rest.
std::string jinja_title(std::string_view s);
bool is_lower(std::string_view s);
bool is_upper(std::string_view s);

// Python str.strip/lstrip/rstrip; chars == nullopt strips whitespace.
std::string strip(std::string_view s, bool left, bool right,
                  const std::optional<std::string>& chars);
// Python str.split / str.rsplit; sep == nullopt splits on whitespace runs.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               std::int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                std::int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
// Python str.replace with count < 0 meaning all.
std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    std::int64_t count);
// Python str.find (code point index) or -1.
std::int64_t find(std::string_view s, std::string_view sub, bool reverse);
std::int64_t count(std::string_view s, std::string_view sub);

// Python repr(float) / str(float): shortest round-trip digits, scientific
// notation outside 1e-4 <= |x| < 1e16, and a trailing ".0" for integers.
std::string float_repr(double d);
// Python repr(str): single quotes unless the text holds ' and no ".
std::string repr(std::string_view s);
// markupsafe.escape for a plain string.
std::string escape_html(std::string_view s);

// Python int(str, base) / float(str); nullopt where Python raises ValueError.
std::optional<std::int64_t> parse_int(std::string_view s, int base);
std::optional<double> parse_float(std::string_view s);

}  // namespace ferry::text::jinja::pystr
