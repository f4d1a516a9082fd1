// Tokenizer for Jinja templates, following jinja2's lexer: newlines are
// normalized to "\n" and one trailing newline is dropped
// (keep_trailing_newline=False); whitespace control ('-' / '+') and
// trim_blocks / lstrip_blocks are applied to the text tokens here, exactly
// where jinja2 applies them. Comments vanish; {% raw %} bodies become text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::text::jinja {

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

enum class Tok : std::uint8_t {
  kText,
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // text holds the unescaped value
  kInt,
  kFloat,
  kOp,  // text holds the operator
  kEof,
};

struct Token {
  Tok kind;
  std::string text;
  std::size_t offset;  // byte offset in the normalized source
  std::int64_t int_value = 0;
  double float_value = 0;
};

// Source after newline normalization; positions refer to it.
std::string normalize_source(std::string_view source);

// Throws ferry::Error("[op] line:col: ...") for lexical errors.
std::vector<Token> tokenize(const std::string& normalized, const LexOptions& options,
                            const std::string& op);

// 1-based line and column (in code points) of a byte offset.
struct LineCol {
  int line;
  int col;
};
LineCol line_col(std::string_view source, std::size_t offset);

}  // namespace ferry::text::jinja
