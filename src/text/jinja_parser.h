// Parser from tokens to the syntax tree, following jinja2's grammar and
// operator precedence (jinja2/parser.py). Unknown filters and tests and
// statements outside the supported subset are errors here, with line:col.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace ferry::text::jinja {

struct Program {
  std::string source;  // normalized; offsets in the tree refer to it
  std::string op;      // error prefix
  Body body;
};

// Nesting deeper than this (parentheses, brackets, blocks) is rejected so
// that hostile input cannot exhaust the stack.
inline constexpr int kMaxParseDepth = 100;

std::shared_ptr<const Program> parse(std::string_view source, const LexOptions& options,
                                     const std::string& op);

}  // namespace ferry::text::jinja
