#include "text/jinja_lexer.h"

#include <cctype>
#include <charconv>

#include "core/error.h"
#include "text/jinja_strings.h"
#include "text/jinja_value.h"

namespace ferry::text::jinja {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// Length of the whitespace code point at s[pos], or 0.
std::size_t space_len(const std::string& s, std::size_t pos) {
  auto b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) return pystr::is_space(b) ? 1 : 0;
  std::size_t n = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (pos + n > s.size()) return 0;
  std::u32string c = pystr::decode(std::string_view(s).substr(pos, n));
  return c.size() == 1 && pystr::is_space(c[0]) ? n : 0;
}

std::string rstrip_space(const std::string& s) {
  return pystr::strip(s, false, true, std::nullopt);
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (char32_t c : pystr::decode(s)) {
    if (!pystr::is_space(c)) return false;
  }
  return true;
}

class Lexer {
 public:
  Lexer(const std::string& src, const LexOptions& opt, const std::string& op)
      : src_(src), opt_(opt), op_(op) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      std::size_t start = find_opener(pos_);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      char kind = src_[start + 1];
      std::size_t after = start + 2;
      char sign =
          after < src_.size() && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
      std::size_t raw_end = kind == '%' ? match_raw_begin(start) : std::string::npos;
      emit_text(strip_before(src_.substr(pos_, start - pos_), sign, kind != '{'), pos_);
      pos_ = after + (sign ? 1 : 0);
      if (raw_end != std::string::npos) {
        pos_ = raw_end;
        lex_raw(start);
      } else if (kind == '#') {
        lex_comment(start);
      } else {
        lex_tag(kind == '{', start);
      }
    }
    out_.push_back(Token{Tok::kEof, "", src_.size()});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(std::size_t offset, const std::string& msg) {
    LineCol lc = line_col(src_, offset);
    throw Error("[" + op_ + "] " + std::to_string(lc.line) + ":" + std::to_string(lc.col) + ": " +
                msg);
  }

  std::size_t find_opener(std::size_t from) const {
    for (std::size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
    }
    return std::string::npos;
  }

  // Text before a tag: '-' strips all trailing whitespace; otherwise
  // lstrip_blocks removes the indentation of a line that holds only the tag.
  std::string strip_before(std::string text, char sign, bool block_or_comment) {
    if (sign == '-') return rstrip_space(text);
    if (sign != '+' && opt_.lstrip_blocks && block_or_comment) {
      std::size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos))) {
        text.resize(l_pos);
      }
    }
    return text;
  }

  void emit_text(std::string text, std::size_t offset) {
    if (!text.empty()) out_.push_back(Token{Tok::kText, std::move(text), offset});
  }

  // After a tag's closing marker at p: consumes the '-' whitespace or the
  // trim_blocks newline and updates line_starting_.
  void close_tag(std::size_t end_len, char sign, bool block_or_comment) {
    pos_ += end_len;
    line_starting_ = false;
    if (sign == '-') {
      while (pos_ < src_.size()) {
        std::size_t n = space_len(src_, pos_);
        if (n == 0) break;
        line_starting_ = src_[pos_] == '\n';
        pos_ += n;
      }
    } else if (sign != '+' && block_or_comment && opt_.trim_blocks && pos_ < src_.size() &&
               src_[pos_] == '\n') {
      ++pos_;
      line_starting_ = true;
    }
  }

  void lex_comment(std::size_t start) {
    // jinja2 quirk: a comment opener that ends the template is dropped
    // silently (its failure rule needs one more character to fire).
    if (pos_ == src_.size()) return;
    std::size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail(start, "missing end of comment tag");
    char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    pos_ = end;
    close_tag(2, sign, true);
  }

  // Matches "{%[-+]?\s*raw\s*(-%}\s*|%})" at start; returns the offset after
  // it (without the '-' whitespace, consumed below) or npos.
  std::size_t match_raw_begin(std::size_t start) {
    std::size_t p = start + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    while (p < src_.size() && space_len(src_, p)) p += space_len(src_, p);
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) {
      return std::string::npos;
    }
    p += 3;
    while (p < src_.size() && space_len(src_, p)) p += space_len(src_, p);
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && space_len(src_, p)) p += space_len(src_, p);
      return p;
    }
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  void lex_raw(std::size_t start) {
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
    for (std::size_t p = src_.find("{%", pos_); p != std::string::npos;
         p = src_.find("{%", p + 1)) {
      std::size_t q = p + 2;
      char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      while (q < src_.size() && space_len(src_, q)) q += space_len(src_, q);
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && space_len(src_, q)) q += space_len(src_, q);
      char end_sign = 0;
      std::size_t end_len = 2;
      if (src_.compare(q, 3, "+%}") == 0 || src_.compare(q, 3, "-%}") == 0) {
        end_sign = src_[q];
        end_len = 3;
      } else if (src_.compare(q, 2, "%}") != 0) {
        continue;
      }
      emit_text(strip_before(src_.substr(pos_, p - pos_), sign, true), pos_);
      pos_ = q;
      close_tag(end_len, end_sign, true);
      return;
    }
    fail(start, "missing end of raw directive");
  }

  void lex_tag(bool variable, std::size_t start) {
    out_.push_back(Token{variable ? Tok::kVarBegin : Tok::kBlockBegin, "", start});
    std::vector<char> balance;
    while (true) {
      if (pos_ >= src_.size()) {
        fail(start, variable ? "unexpected end of template, expected '}}'"
                             : "unexpected end of template, expected '%}'");
      }
      if (balance.empty() && try_close(variable)) return;
      if (std::size_t n = space_len(src_, pos_)) {
        pos_ += n;
        continue;
      }
      lex_operand_or_op(balance);
    }
  }

  bool try_close(bool variable) {
    const char* end = variable ? "}}" : "%}";
    if (src_.compare(pos_, 3, std::string("-") + end) == 0) {
      out_.push_back(Token{variable ? Tok::kVarEnd : Tok::kBlockEnd, "", pos_});
      close_tag(3, '-', !variable);
      return true;
    }
    if (!variable && src_.compare(pos_, 3, "+%}") == 0) {
      out_.push_back(Token{Tok::kBlockEnd, "", pos_});
      close_tag(3, '+', true);
      return true;
    }
    if (src_.compare(pos_, 2, end) == 0) {
      out_.push_back(Token{variable ? Tok::kVarEnd : Tok::kBlockEnd, "", pos_});
      close_tag(2, 0, !variable);
      return true;
    }
    return false;
  }

  // Consumes (\d+_)*\d+ at p; returns the end or p when no digit is there.
  std::size_t scan_digits(std::size_t p) const {
    std::size_t q = p;
    while (q < src_.size() && is_digit(src_[q])) {
      ++q;
      if (q + 1 < src_.size() && src_[q] == '_' && is_digit(src_[q + 1])) ++q;
    }
    return q;
  }

  void lex_operand_or_op(std::vector<char>& balance) {
    std::size_t start = pos_;
    char c = src_[pos_];
    if (is_digit(c)) return lex_number();
    if (is_name_start(c)) {
      while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
      out_.push_back(Token{Tok::kName, src_.substr(start, pos_ - start), start});
      return;
    }
    if (c == '\'' || c == '"') return lex_string();
    if (static_cast<unsigned char>(c) >= 0x80) fail(start, "unsupported character in tag");
    static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* two : kTwo) {
      if (src_.compare(pos_, 2, two) == 0) {
        out_.push_back(Token{Tok::kOp, two, start});
        pos_ += 2;
        return;
      }
    }
    static const std::string kOne = "+-/*%~[](){}><=.:|,;";
    if (kOne.find(c) == std::string::npos) fail(start, std::string("unexpected char '") + c + "'");
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail(start, std::string("unexpected '") + c + "'");
      if (balance.back() != c) {
        fail(start, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
      }
      balance.pop_back();
    }
    out_.push_back(Token{Tok::kOp, std::string(1, c), start});
    ++pos_;
  }

  void lex_number() {
    std::size_t start = pos_;
    bool after_dot = start > 0 && src_[start - 1] == '.';
    std::size_t int_end = scan_digits(start);
    std::size_t end = int_end;
    bool is_float = false;
    if (!after_dot) {
      std::size_t p = int_end;
      if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
        p = scan_digits(p + 1);
        is_float = true;
        end = p;
      }
      if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
        std::size_t q = p + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        std::size_t r = scan_digits(q);
        if (r > q) {
          is_float = true;
          end = r;
        }
      }
    }
    std::string digits;
    if (is_float) {
      for (std::size_t i = start; i < end; ++i) {
        if (src_[i] != '_') digits.push_back(src_[i]);
      }
      Token t{Tok::kFloat, src_.substr(start, end - start), start};
      std::from_chars(digits.data(), digits.data() + digits.size(), t.float_value);
      out_.push_back(std::move(t));
      pos_ = end;
      return;
    }
    int base = 10;
    std::size_t p = start;
    char x = start + 1 < src_.size() ? static_cast<char>(std::tolower(src_[start + 1])) : 0;
    if (src_[start] == '0' && (x == 'x' || x == 'o' || x == 'b')) {
      base = x == 'x' ? 16 : x == 'o' ? 8 : 2;
      p = start + 2;
      auto ok = [&](char d) {
        return base == 16 ? std::isxdigit(static_cast<unsigned char>(d)) != 0
                          : d >= '0' && d < static_cast<char>('0' + base);
      };
      end = p;
      while (end < src_.size() &&
             (ok(src_[end]) || (src_[end] == '_' && end + 1 < src_.size() && ok(src_[end + 1])))) {
        ++end;
      }
      if (end == p) fail(start, "invalid integer literal");
    } else if (src_[start] == '0') {
      // 0(_?0)*: "0123" is "0" followed by "123", as in jinja2.
      end = start + 1;
      while (end < src_.size() && (src_[end] == '0' || (src_[end] == '_' && end + 1 < src_.size() &&
                                                        src_[end + 1] == '0'))) {
        ++end;
      }
    } else {
      end = int_end;
    }
    for (std::size_t i = p; i < end; ++i) {
      if (src_[i] != '_') digits.push_back(src_[i]);
    }
    Token t{Tok::kInt, src_.substr(start, end - start), start};
    auto res = std::from_chars(digits.data(), digits.data() + digits.size(), t.int_value, base);
    if (res.ec != std::errc()) fail(start, "integer literal too large");
    out_.push_back(std::move(t));
    pos_ = end;
  }

  void lex_string() {
    std::size_t start = pos_;
    char quote = src_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) fail(start, "unterminated string literal");
      char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        value.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) fail(start, "unterminated string literal");
      unescape(start, value);
    }
    out_.push_back(Token{Tok::kString, std::move(value), start});
  }

  // Python's unicode-escape rules for the escape at pos_ (a backslash).
  void unescape(std::size_t start, std::string& value) {
    char e = src_[pos_ + 1];
    pos_ += 2;
    auto hex = [&](int n) {
      if (pos_ + n > src_.size()) fail(start, "truncated \\x/\\u escape in string literal");
      std::uint32_t v = 0;
      auto res = std::from_chars(src_.data() + pos_, src_.data() + pos_ + n, v, 16);
      if (res.ptr != src_.data() + pos_ + n)
        fail(start, "truncated \\x/\\u escape in string literal");
      pos_ += n;
      if (v > 0x10FFFF) fail(start, "illegal Unicode character in string literal");
      if (v >= 0xD800 && v <= 0xDFFF) fail(start, "surrogate escapes are not supported");
      pystr::append_utf8(value, v);
    };
    switch (e) {
      case '\n':
        return;  // line continuation
      case '\\':
        value.push_back('\\');
        return;
      case '\'':
        value.push_back('\'');
        return;
      case '"':
        value.push_back('"');
        return;
      case 'a':
        value.push_back('\a');
        return;
      case 'b':
        value.push_back('\b');
        return;
      case 'f':
        value.push_back('\f');
        return;
      case 'n':
        value.push_back('\n');
        return;
      case 'r':
        value.push_back('\r');
        return;
      case 't':
        value.push_back('\t');
        return;
      case 'v':
        value.push_back('\v');
        return;
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      case 'N':
        fail(start, "\\N{...} escapes are not supported");
      default:
        break;
    }
    if (e >= '0' && e <= '7') {
      std::uint32_t v = static_cast<std::uint32_t>(e - '0');
      for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++k) {
        v = v * 8 + static_cast<std::uint32_t>(src_[pos_++] - '0');
      }
      pystr::append_utf8(value, v);
      return;
    }
    // Unknown escapes keep their backslash.
    value.push_back('\\');
    --pos_;
  }

  const std::string& src_;
  const LexOptions& opt_;
  const std::string& op_;
  std::vector<Token> out_;
  std::size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::vector<Token> tokenize(const std::string& normalized, const LexOptions& options,
                            const std::string& op) {
  return Lexer(normalized, options, op).run();
}

LineCol line_col(std::string_view source, std::size_t offset) {
  offset = std::min(offset, source.size());
  int line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < offset; ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return {line,
          static_cast<int>(pystr::length(source.substr(line_start, offset - line_start))) + 1};
}

}  // namespace ferry::text::jinja
