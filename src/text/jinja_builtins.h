// Builtin filters, tests, globals and Python methods of the interpreter.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_value.h"

namespace ferry::text::jinja {

using FilterFn = Value (*)(Runtime&, const Value& subject, CallArgs& args);
using TestFn = bool (*)(Runtime&, const Value& subject, CallArgs& args);

// nullptr when the name is not supported.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

// Global functions: range, namespace, dict, raise_exception, strftime_now.
const DictData& globals();

// The attribute `name` of a str, list, tuple or dict as Python resolves it:
// a bound method, an Undefined for methods the immutable sandbox forbids,
// or nullopt when the type has no such attribute. Python methods outside the
// supported set are callables that fail when called.
std::optional<Value> find_method(const Value& obj, std::string_view name);

// Binds CallArgs to a Python-style parameter list. Too many positionals,
// unknown or duplicate keywords throw EvalError naming `fn`.
class BoundArgs {
 public:
  BoundArgs(std::string_view fn, const CallArgs& call, std::initializer_list<const char*> names);
  bool has(std::size_t i) const { return bound_[i] != nullptr; }
  const Value& get(std::size_t i) const;
  Value get_or(std::size_t i, Value fallback) const { return has(i) ? *bound_[i] : fallback; }
  std::int64_t get_int(std::size_t i, std::int64_t fallback) const;
  std::optional<std::string> get_str(std::size_t i) const;

 private:
  std::string fn_;
  std::vector<const char*> names_;
  std::vector<const Value*> bound_;
};

// Python iter() as a list: list/tuple items, dict keys, string characters;
// Undefined is empty. Throws for non-iterables.
std::vector<Value> iterate(const Value& v);
// Python len().
std::size_t length_of(const Value& v);

}  // namespace ferry::text::jinja
