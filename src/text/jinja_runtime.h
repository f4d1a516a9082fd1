// The evaluator: renders a Program against a context. Statements live in
// jinja_exec.cpp, expressions and Python's attribute/item/operator rules in
// jinja_eval.cpp.
//
// Scoping follows jinja2: each for-loop iteration and each macro call gets a
// fresh frame whose parent is the enclosing one, so `{% set %}` inside a
// loop body never leaks out (hence namespace()); `if` bodies share their
// frame. Macros see their defining frame as it is at call time.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja.h"
#include "text/jinja_parser.h"

namespace ferry::text::jinja {

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};

class Runtime {
 public:
  Runtime(const Program& program, const RenderOptions& options, const Value& context);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Renders the whole template; errors become ferry::Error("[op] line:col: ...").
  std::string render();

  // For builtins.
  const std::string& op() const { return program_.op; }
  const RenderOptions& options() const { return options_; }
  std::tm now() const;
  // Throws when a string of `bytes` would exceed the output limit.
  void check_string_size(std::size_t bytes) const;
  void check_list_size(std::size_t items) const;
  void step();
  Value call(const Value& fn, CallArgs& args);
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  // Keeps a namespace so its entries can be cleared (cycles) after render.
  void track(std::shared_ptr<DictData> ns) { namespaces_.push_back(std::move(ns)); }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // jinja_exec.cpp
  Flow exec(const Body& body, const std::shared_ptr<Frame>& frame);
  Flow exec_node(const Node& n, const std::shared_ptr<Frame>& frame);
  void exec_if(const Node& n, const std::shared_ptr<Frame>& frame, Flow& flow);
  Flow exec_for(const Node& n, const std::shared_ptr<Frame>& frame);
  void assign(const Target& t, Value v, Frame& frame);
  Value define_macro(const Node& n, const std::shared_ptr<Frame>& frame);
  std::string capture(const Body& body, const std::shared_ptr<Frame>& frame);
  void emit(std::string_view s);

  // jinja_eval.cpp
  Value eval(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_inner(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value lookup(const std::string& name, const Frame& frame) const;
  Value eval_binary(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_slice(const Expr& e, const std::shared_ptr<Frame>& frame);
  CallArgs eval_args(const Expr& e, std::size_t first, const std::shared_ptr<Frame>& frame);

  const Program& program_;
  const RenderOptions& options_;
  Value context_;
  std::string out_;
  std::uint64_t steps_ = 0;
  int call_depth_ = 0;
  std::vector<std::shared_ptr<Frame>> captured_frames_;
  std::vector<std::shared_ptr<DictData>> namespaces_;
};

// Python binary operators on values (throw EvalError like Python's TypeError).
Value binary_op(Runtime& rt, std::string_view op, const Value& a, const Value& b);
// Python `item in container`.
bool contains(const Value& container, const Value& item);

}  // namespace ferry::text::jinja
