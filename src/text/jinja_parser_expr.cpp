// Expression grammar, mirroring jinja2/parser.py (parse_tuple down to
// parse_primary). Precedence, loosest first: inline if/else, or, and, not,
// comparisons (chained, incl. in / not in), + -, ~, * / // %, **, unary
// - +, then postfix (.attr, [item], call) and filters/tests, which bind
// tighter than any binary operator: `a + b | trim` is `a + (b | trim)`.
#include "text/jinja_builtins.h"
#include "text/jinja_parser_impl.h"

namespace ferry::text::jinja {
namespace {

ExprPtr make(Expr::Kind kind, std::size_t offset) {
  return std::make_unique<Expr>(kind, offset);
}

// Binary nodes sit at their operator, where errors point.
ExprPtr make_binary(Expr::Kind kind, const Token& op, ExprPtr a, ExprPtr b) {
  auto e = make(kind, op.offset);
  e->name = op.text;
  e->items.push_back(std::move(a));
  e->items.push_back(std::move(b));
  return e;
}

}  // namespace

ExprPtr Parser::parse_tuple(bool with_condexpr, bool explicit_parens, std::string_view extra_end) {
  std::size_t offset = cur().offset;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    Tok k = cur().kind;
    if (k == Tok::kVarEnd || k == Tok::kBlockEnd || is_op(")") ||
        (!extra_end.empty() && is_name(extra_end))) {
      break;
    }
    items.push_back(parse_expression(with_condexpr));
    if (!is_op(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) fail(cur().offset, "expected an expression, got " + describe(cur()));
  }
  auto e = make(Expr::Kind::kTuple, offset);
  e->items = std::move(items);
  return e;
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr Parser::parse_condexpr() {
  ExprPtr expr = parse_or();
  while (is_name("if")) {
    std::size_t offset = advance().offset;
    auto cond = make(Expr::Kind::kCondition, offset);
    cond->items.push_back(parse_or());
    cond->items.push_back(std::move(expr));
    cond->items.push_back(skip_name("else") ? parse_condexpr() : nullptr);
    expr = std::move(cond);
  }
  return expr;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    const Token& op = advance();
    left = make_binary(Expr::Kind::kOr, op, std::move(left), parse_and());
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    const Token& op = advance();
    left = make_binary(Expr::Kind::kAnd, op, std::move(left), parse_not());
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard guard(*this, cur().offset);
    auto e = make(Expr::Kind::kNot, advance().offset);
    e->items.push_back(parse_not());
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  ExprPtr expr = parse_math1();
  ExprPtr cmp;
  while (true) {
    std::string op;
    std::size_t op_offset = cur().offset;
    if (cur().kind == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      op = advance().text;
    } else if (skip_name("in")) {
      op = "in";
    } else if (is_name("not") && look().kind == Tok::kName && look().text == "in") {
      advance();
      advance();
      op = "notin";
    } else {
      break;
    }
    if (!cmp) {
      cmp = make(Expr::Kind::kCompare, op_offset);
      cmp->items.push_back(std::move(expr));
    }
    cmp->ops.push_back(op);
    cmp->items.push_back(parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(expr);
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token& op = advance();
    left = make_binary(Expr::Kind::kBinary, op, std::move(left), parse_concat());
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (is_op("~")) {
    const Token& op = advance();
    left = make_binary(Expr::Kind::kBinary, op, std::move(left), parse_math2());
  }
  return left;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token& op = advance();
    left = make_binary(Expr::Kind::kBinary, op, std::move(left), parse_pow());
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    const Token& op = advance();
    left = make_binary(Expr::Kind::kBinary, op, std::move(left), parse_unary(true));
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    DepthGuard guard(*this, cur().offset);
    const Token& t = advance();
    node = make(t.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, t.offset);
    node->items.push_back(parse_unary(false));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  return with_filter ? parse_filter_expr(std::move(node)) : std::move(node);
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  std::size_t offset = t.offset;
  switch (t.kind) {
    case Tok::kName: {
      auto e = make(Expr::Kind::kConst, offset);
      if (t.text == "true" || t.text == "True") {
        e->constant = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->constant = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->constant = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      advance();
      return e;
    }
    case Tok::kString: {
      // Adjacent string literals concatenate, as in Python.
      std::string s;
      while (cur().kind == Tok::kString) s += advance().text;
      auto e = make(Expr::Kind::kConst, offset);
      e->constant = Value(std::move(s));
      return e;
    }
    case Tok::kInt:
    case Tok::kFloat: {
      auto e = make(Expr::Kind::kConst, offset);
      e->constant = t.kind == Tok::kInt ? Value(t.int_value) : Value(t.float_value);
      advance();
      return e;
    }
    case Tok::kOp:
      if (t.text == "(") {
        DepthGuard guard(*this, offset);
        advance();
        ExprPtr e = parse_tuple(true, true);
        expect_op(")");
        return e;
      }
      if (t.text == "[") return parse_list();
      if (t.text == "{") return parse_dict();
      break;
    default:
      break;
  }
  fail(offset, "unexpected " + describe(t));
}

ExprPtr Parser::parse_list() {
  DepthGuard guard(*this, cur().offset);
  auto e = make(Expr::Kind::kList, advance().offset);
  while (!is_op("]")) {
    if (!e->items.empty()) expect_op(",");
    if (is_op("]")) break;
    e->items.push_back(parse_expression());
  }
  advance();
  return e;
}

ExprPtr Parser::parse_dict() {
  DepthGuard guard(*this, cur().offset);
  auto e = make(Expr::Kind::kDict, advance().offset);
  while (!is_op("}")) {
    if (!e->items.empty()) expect_op(",");
    if (is_op("}")) break;
    e->items.push_back(parse_expression());
    expect_op(":");
    e->items.push_back(parse_expression());
  }
  advance();
  return e;
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      node = parse_filter(std::move(node));
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const Token& t = advance();
  std::size_t offset = t.offset;
  if (t.text == ".") {
    const Token& attr = advance();
    if (attr.kind == Tok::kName) {
      auto e = make(Expr::Kind::kAttr, offset);
      e->name = attr.text;
      e->items.push_back(std::move(node));
      return e;
    }
    if (attr.kind != Tok::kInt) fail(attr.offset, "expected name or number after '.'");
    auto e = make(Expr::Kind::kItem, offset);
    auto key = make(Expr::Kind::kConst, attr.offset);
    key->constant = Value(attr.int_value);
    e->items.push_back(std::move(node));
    e->items.push_back(std::move(key));
    return e;
  }
  DepthGuard guard(*this, offset);
  std::vector<ExprPtr> args;
  while (!is_op("]")) {
    if (!args.empty()) expect_op(",");
    args.push_back(parse_subscribed());
  }
  advance();
  if (args.size() != 1) fail(offset, "tuple subscripts are not supported");
  ExprPtr arg = std::move(args[0]);
  if (arg->kind == Expr::Kind::kSlice) {
    arg->items.insert(arg->items.begin(), std::move(node));
    arg->offset = offset;
    return arg;
  }
  auto e = make(Expr::Kind::kItem, offset);
  e->items.push_back(std::move(node));
  e->items.push_back(std::move(arg));
  return e;
}

// An index or a slice a:b:c (any part may be missing). A slice comes back as
// kSlice with items [start, stop, step]; parse_subscript prepends the target.
ExprPtr Parser::parse_subscribed() {
  std::size_t offset = cur().offset;
  auto slice = make(Expr::Kind::kSlice, offset);
  if (skip_op(":")) {
    slice->items.push_back(nullptr);
  } else {
    ExprPtr e = parse_expression();
    if (!skip_op(":")) return e;
    slice->items.push_back(std::move(e));
  }
  auto part_ends = [&] { return is_op(":") || is_op("]") || is_op(","); };
  slice->items.push_back(part_ends() ? nullptr : parse_expression());
  if (skip_op(":")) {
    slice->items.push_back(is_op("]") || is_op(",") ? nullptr : parse_expression());
  } else {
    slice->items.push_back(nullptr);
  }
  return slice;
}

ExprPtr Parser::parse_call(ExprPtr node) {
  auto e = make(Expr::Kind::kCall, cur().offset);
  e->items.push_back(std::move(node));
  parse_call_args(*e);
  return e;
}

void Parser::parse_call_args(Expr& call) {
  DepthGuard guard(*this, cur().offset);
  expect_op("(");
  bool need_comma = false;
  while (!is_op(")")) {
    if (need_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**"))
      fail(cur().offset, "*args and **kwargs in calls are not supported");
    if (cur().kind == Tok::kName && look().kind == Tok::kOp && look().text == "=") {
      std::string key = advance().text;
      advance();
      call.keywords.push_back(Keyword{std::move(key), parse_expression()});
    } else {
      if (!call.keywords.empty())
        fail(cur().offset, "positional argument follows keyword argument");
      call.items.push_back(parse_expression());
    }
    need_comma = true;
  }
  advance();
}

ExprPtr Parser::parse_filter(ExprPtr node) {
  advance();  // '|'
  const Token& t = cur();
  std::string name = expect_identifier();
  if (is_op(".")) fail(cur().offset, "dotted filter names are not supported");
  if (!find_filter(name)) fail(t.offset, "unsupported filter '" + name + "'");
  auto e = make(Expr::Kind::kFilter, t.offset);
  e->name = std::move(name);
  e->items.push_back(std::move(node));
  if (is_op("(")) parse_call_args(*e);
  return e;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  std::size_t offset = advance().offset;  // 'is'
  bool negated = skip_name("not");
  const Token& t = cur();
  std::string name = expect_identifier();
  if (is_op(".")) fail(cur().offset, "dotted test names are not supported");
  if (!find_test(name)) fail(t.offset, "unsupported test '" + name + "'");
  auto e = make(Expr::Kind::kTest, offset);
  e->name = std::move(name);
  e->items.push_back(std::move(node));
  if (is_op("(")) {
    parse_call_args(*e);
  } else if ((cur().kind == Tok::kName || cur().kind == Tok::kString || cur().kind == Tok::kInt ||
              cur().kind == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    // One argument without parentheses: `x is divisibleby 3`.
    if (is_name("is")) fail(cur().offset, "you cannot chain multiple tests with is");
    e->items.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return e;
  auto n = make(Expr::Kind::kNot, offset);
  n->items.push_back(std::move(e));
  return n;
}

}  // namespace ferry::text::jinja
