// Internal to the parser: the token cursor and the recursive-descent methods,
// split between jinja_parser.cpp (statements) and jinja_parser_expr.cpp
// (expressions).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace ferry::text::jinja {

class Parser {
 public:
  Parser(const std::string& source, std::vector<Token> tokens, const std::string& op)
      : source_(source), tokens_(std::move(tokens)), op_(op) {}

  Body parse_template();

 private:
  // Cursor.
  const Token& cur() const { return tokens_[pos_]; }
  const Token& look(std::size_t ahead = 1) const;
  const Token& advance() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(std::string_view op) const { return cur().kind == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view name) const {
    return cur().kind == Tok::kName && cur().text == name;
  }
  bool skip_op(std::string_view op);
  bool skip_name(std::string_view name);
  void expect_op(std::string_view op);
  void expect_name(std::string_view name);
  std::string expect_identifier();
  void expect_block_end();
  [[noreturn]] void fail(std::size_t offset, const std::string& msg) const;
  std::string describe(const Token& t) const;

  // Statements (jinja_parser.cpp). parse_body stops at a {% <end> %} whose
  // name is in `ends`, leaving the cursor on that name.
  Body parse_body(const std::vector<std::string_view>& ends);
  NodePtr parse_statement();
  NodePtr parse_if(std::size_t offset);
  NodePtr parse_for(std::size_t offset);
  NodePtr parse_set(std::size_t offset);
  NodePtr parse_macro(std::size_t offset);
  Target parse_target(bool with_namespace);

  // Expressions (jinja_parser_expr.cpp), by increasing precedence.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens, std::string_view extra_end = {});
  ExprPtr parse_expression(bool with_condexpr = true);
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  ExprPtr parse_filter(ExprPtr node);
  ExprPtr parse_test(ExprPtr node);
  ExprPtr parse_call(ExprPtr node);
  void parse_call_args(Expr& call);
  ExprPtr parse_list();
  ExprPtr parse_dict();

  // Guards recursion depth (parentheses, brackets, nested blocks).
  struct DepthGuard {
    Parser& p;
    DepthGuard(Parser& parser, std::size_t offset);
    ~DepthGuard() { --p.depth_; }
  };

  const std::string& source_;
  std::vector<Token> tokens_;
  const std::string& op_;
  std::size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // break/continue are valid only inside a for body
};

}  // namespace ferry::text::jinja
