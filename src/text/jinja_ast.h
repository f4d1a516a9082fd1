// Syntax tree of a parsed Jinja template. Every node carries the byte offset
// of its first token in the normalized source, for line:col in errors.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace ferry::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Keyword {
  std::string name;
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    kConst,      // constant
    kName,       // name
    kList,       // items
    kTuple,      // items
    kDict,       // items: key0, value0, key1, value1, ...
    kAttr,       // items[0].name
    kItem,       // items[0][items[1]]
    kSlice,      // items[0][a:b:c]; items[1..3] may be null
    kCall,       // items[0](items[1..], keywords)
    kFilter,     // items[0] | name(items[1..], keywords)
    kTest,       // items[0] is name(items[1..], keywords); negated via kNot
    kNeg,        // -items[0]
    kPos,        // +items[0]
    kNot,        // not items[0]
    kBinary,     // items[0] op items[1], op in + - * / // % ** ~
    kCompare,    // items[0] ops[0] items[1] ops[1] items[2] ...
    kAnd,        // items[0] and items[1]
    kOr,         // items[0] or items[1]
    kCondition,  // items[1] if items[0] else items[2] (items[2] may be null)
  };

  Kind kind;
  std::size_t offset = 0;
  Value constant;
  std::string name;  // Name, Attr, Filter, Test; the operator of a Binary
  std::vector<ExprPtr> items;
  std::vector<Keyword> keywords;
  std::vector<std::string> ops;  // Compare: "==", "!=", "<", "<=", ">", ">=", "in", "notin"

  Expr(Kind k, std::size_t off) : kind(k), offset(off) {}
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

// Assignment target of set/for: one name, a tuple of names, or ns.attr.
struct Target {
  std::vector<std::string> names;
  bool tuple = false;
  std::string attr;  // non-empty: names[0].attr (namespace assignment)
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conditions[i] -> bodies[i]; else_body
    kFor,       // for target in expr [if filter] body [else else_body]
    kSet,       // set target = expr
    kSetBlock,  // set target %} body {% endset
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
    kScope,  // a body rendered in place ({% generation %})
  };

  Kind kind;
  std::size_t offset = 0;
  std::string text;  // Text; Macro name
  ExprPtr expr;      // Output, For iterable, Set value
  ExprPtr filter;    // For's inline `if`
  Target target;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;  // If branches; bodies[0] for For/SetBlock/Macro/Scope
  Body else_body;
  std::vector<MacroParam> params;

  Node(Kind k, std::size_t off) : kind(k), offset(off) {}
};

}  // namespace ferry::text::jinja
