#include "text/jinja_parser.h"

#include <algorithm>

#include "core/error.h"
#include "text/jinja_parser_impl.h"
#include "text/jinja_strings.h"

namespace ferry::text::jinja {
namespace {

bool expr_uses(const Expr* e, std::string_view name) {
  if (!e) return false;
  if (e->kind == Expr::Kind::kName && e->name == name) return true;
  for (const ExprPtr& item : e->items) {
    if (expr_uses(item.get(), name)) return true;
  }
  for (const Keyword& k : e->keywords) {
    if (expr_uses(k.value.get(), name)) return true;
  }
  return false;
}

// Whether a macro body reads `name` (varargs, kwargs and caller are macro
// features this interpreter does not implement).
bool body_uses(const Body& body, std::string_view name) {
  for (const NodePtr& n : body) {
    if (expr_uses(n->expr.get(), name) || expr_uses(n->filter.get(), name)) return true;
    for (const ExprPtr& c : n->conditions) {
      if (expr_uses(c.get(), name)) return true;
    }
    for (const MacroParam& p : n->params) {
      if (expr_uses(p.default_value.get(), name)) return true;
    }
    for (const Body& b : n->bodies) {
      if (body_uses(b, name)) return true;
    }
    if (body_uses(n->else_body, name)) return true;
  }
  return false;
}

}  // namespace

const Token& Parser::look(std::size_t ahead) const {
  return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
}

bool Parser::skip_op(std::string_view op) {
  if (!is_op(op)) return false;
  advance();
  return true;
}

bool Parser::skip_name(std::string_view name) {
  if (!is_name(name)) return false;
  advance();
  return true;
}

void Parser::expect_op(std::string_view op) {
  if (!skip_op(op))
    fail(cur().offset, "expected '" + std::string(op) + "', got " + describe(cur()));
}

void Parser::expect_name(std::string_view name) {
  if (!skip_name(name)) {
    fail(cur().offset, "expected '" + std::string(name) + "', got " + describe(cur()));
  }
}

std::string Parser::expect_identifier() {
  if (cur().kind != Tok::kName) fail(cur().offset, "expected a name, got " + describe(cur()));
  return advance().text;
}

void Parser::expect_block_end() {
  if (cur().kind != Tok::kBlockEnd) {
    fail(cur().offset, "expected end of statement '%}', got " + describe(cur()));
  }
  advance();
}

void Parser::fail(std::size_t offset, const std::string& msg) const {
  LineCol lc = line_col(source_, offset);
  throw Error("[" + op_ + "] " + std::to_string(lc.line) + ":" + std::to_string(lc.col) + ": " +
              msg);
}

std::string Parser::describe(const Token& t) const {
  switch (t.kind) {
    case Tok::kText:
      return "template text";
    case Tok::kVarBegin:
      return "'{{'";
    case Tok::kVarEnd:
      return "'}}'";
    case Tok::kBlockBegin:
      return "'{%'";
    case Tok::kBlockEnd:
      return "'%}'";
    case Tok::kEof:
      return "end of template";
    case Tok::kString:
      return "string literal";
    default:
      return "'" + t.text + "'";
  }
}

Parser::DepthGuard::DepthGuard(Parser& parser, std::size_t offset) : p(parser) {
  if (++p.depth_ > kMaxParseDepth) {
    --p.depth_;
    p.fail(offset, "template nested too deeply (limit " + std::to_string(kMaxParseDepth) + ")");
  }
}

Body Parser::parse_template() {
  Body body = parse_body({});
  return body;
}

Body Parser::parse_body(const std::vector<std::string_view>& ends) {
  Body body;
  while (true) {
    const Token& t = cur();
    switch (t.kind) {
      case Tok::kText: {
        auto n = std::make_unique<Node>(Node::Kind::kText, t.offset);
        n->text = t.text;
        body.push_back(std::move(n));
        advance();
        break;
      }
      case Tok::kVarBegin: {
        auto n = std::make_unique<Node>(Node::Kind::kOutput, t.offset);
        advance();
        n->expr = parse_tuple(true, false);
        if (cur().kind != Tok::kVarEnd) fail(cur().offset, "expected '}}', got " + describe(cur()));
        advance();
        body.push_back(std::move(n));
        break;
      }
      case Tok::kBlockBegin: {
        const Token& name = look();
        if (name.kind == Tok::kName &&
            std::find(ends.begin(), ends.end(), std::string_view(name.text)) != ends.end()) {
          advance();
          return body;
        }
        advance();
        if (NodePtr n = parse_statement()) body.push_back(std::move(n));
        break;
      }
      case Tok::kEof: {
        if (!ends.empty()) {
          std::string want;
          for (std::string_view e : ends)
            want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
          fail(t.offset, "unexpected end of template, expected " + want);
        }
        return body;
      }
      default:
        fail(t.offset, "unexpected " + describe(t));
    }
  }
}

NodePtr Parser::parse_statement() {
  DepthGuard guard(*this, cur().offset);
  if (cur().kind != Tok::kName)
    fail(cur().offset, "expected a statement name, got " + describe(cur()));
  std::size_t offset = cur().offset;
  std::string kw = advance().text;
  if (kw == "if") return parse_if(offset);
  if (kw == "for") return parse_for(offset);
  if (kw == "set") return parse_set(offset);
  if (kw == "macro") return parse_macro(offset);
  if (kw == "break" || kw == "continue") {
    if (loop_depth_ == 0) fail(offset, "'" + kw + "' outside of a loop");
    expect_block_end();
    return std::make_unique<Node>(kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue,
                                  offset);
  }
  if (kw == "generation") {
    // transformers' AssistantTracker: renders its body in place.
    expect_block_end();
    auto n = std::make_unique<Node>(Node::Kind::kScope, offset);
    n->bodies.push_back(parse_body({"endgeneration"}));
    advance();
    expect_block_end();
    return n;
  }
  static const char* kUnsupported[] = {"extends", "block", "include",    "import",
                                       "from",    "call",  "filter",     "with",
                                       "do",      "trans", "autoescape", "pluralize"};
  for (const char* u : kUnsupported) {
    if (kw == u) fail(offset, "unsupported statement '" + kw + "'");
  }
  if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else") {
    fail(offset, "unexpected '" + kw + "'");
  }
  fail(offset, "unknown statement '" + kw + "'");
}

NodePtr Parser::parse_if(std::size_t offset) {
  auto n = std::make_unique<Node>(Node::Kind::kIf, offset);
  while (true) {
    n->conditions.push_back(parse_tuple(false, false));
    expect_block_end();
    n->bodies.push_back(parse_body({"elif", "else", "endif"}));
    std::string kw = advance().text;
    if (kw == "elif") continue;
    if (kw == "else") {
      expect_block_end();
      n->else_body = parse_body({"endif"});
      advance();
    }
    expect_block_end();
    return n;
  }
}

NodePtr Parser::parse_for(std::size_t offset) {
  auto n = std::make_unique<Node>(Node::Kind::kFor, offset);
  n->target = parse_target(false);
  expect_name("in");
  n->expr = parse_tuple(false, false, "recursive");
  if (skip_name("if")) n->filter = parse_expression();
  if (is_name("recursive")) fail(cur().offset, "recursive loops are not supported");
  expect_block_end();
  ++loop_depth_;
  n->bodies.push_back(parse_body({"endfor", "else"}));
  --loop_depth_;
  if (advance().text == "else") {
    expect_block_end();
    n->else_body = parse_body({"endfor"});
    advance();
  }
  expect_block_end();
  return n;
}

Target Parser::parse_target(bool with_namespace) {
  Target t;
  if (with_namespace && cur().kind == Tok::kName && look().kind == Tok::kOp && look().text == ".") {
    t.names.push_back(advance().text);
    advance();
    t.attr = expect_identifier();
    return t;
  }
  bool parens = skip_op("(");
  while (true) {
    std::size_t at = cur().offset;
    std::string name = expect_identifier();
    if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
        name == "None") {
      fail(at, "cannot assign to '" + name + "'");
    }
    t.names.push_back(std::move(name));
    if (!skip_op(",")) break;
    t.tuple = true;
    if ((parens && is_op(")")) || is_name("in") || is_op("=") || cur().kind == Tok::kBlockEnd)
      break;
  }
  if (parens) expect_op(")");
  return t;
}

NodePtr Parser::parse_set(std::size_t offset) {
  Target target = parse_target(true);
  if (skip_op("=")) {
    auto n = std::make_unique<Node>(Node::Kind::kSet, offset);
    n->target = std::move(target);
    n->expr = parse_tuple(true, false);
    expect_block_end();
    return n;
  }
  if (is_op("|")) fail(cur().offset, "filtered set blocks are not supported");
  expect_block_end();
  if (target.tuple) fail(offset, "a set block assigns a single name");
  auto n = std::make_unique<Node>(Node::Kind::kSetBlock, offset);
  n->target = std::move(target);
  n->bodies.push_back(parse_body({"endset"}));
  advance();
  expect_block_end();
  return n;
}

NodePtr Parser::parse_macro(std::size_t offset) {
  auto n = std::make_unique<Node>(Node::Kind::kMacro, offset);
  n->text = expect_identifier();
  expect_op("(");
  bool any_default = false;
  while (!is_op(")")) {
    if (!n->params.empty()) expect_op(",");
    std::size_t at = cur().offset;
    MacroParam p{expect_identifier(), nullptr};
    if (skip_op("=")) {
      p.default_value = parse_expression();
      any_default = true;
    } else if (any_default) {
      fail(at, "non-default argument follows default argument");
    }
    n->params.push_back(std::move(p));
  }
  advance();
  expect_block_end();
  int saved_loops = loop_depth_;
  loop_depth_ = 0;
  n->bodies.push_back(parse_body({"endmacro"}));
  loop_depth_ = saved_loops;
  advance();
  expect_block_end();
  for (const char* special : {"varargs", "kwargs", "caller"}) {
    if (body_uses(n->bodies[0], special)) {
      fail(offset, std::string("macros using '") + special + "' are not supported");
    }
  }
  return n;
}

std::shared_ptr<const Program> parse(std::string_view source, const LexOptions& options,
                                     const std::string& op) {
  auto program = std::make_shared<Program>();
  program->source = normalize_source(source);
  program->op = op;
  if (!pystr::valid_utf8(program->source)) throw Error("[" + op + "] template is not valid UTF-8");
  Parser parser(program->source, tokenize(program->source, options, op), op);
  program->body = parser.parse_template();
  return program;
}

}  // namespace ferry::text::jinja
