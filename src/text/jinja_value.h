// The value model of ferry's Jinja interpreter: Python's types as chat
// templates see them (None, bool, int, float, str, list, tuple, dict) plus
// Jinja's Undefined, namespace/loop objects and callables.
//
// Lists and dicts are shared and immutable once built (transformers renders
// in an ImmutableSandboxedEnvironment, which forbids list.append & co.);
// only namespace() objects change, through `{% set ns.attr = ... %}`.
// Dicts keep insertion order, as Python's do; keys are strings.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ferry::text::jinja {

// A render-time failure without a source position yet; the evaluator adds the
// position of the innermost node it passes through and turns it into a
// ferry::Error. Internal to the interpreter.
class EvalError : public std::runtime_error {
 public:
  explicit EvalError(const std::string& what) : std::runtime_error(what) {}
  std::size_t offset = 0;
  bool has_offset = false;
};

// Thrown by the template's raise_exception(msg): what() is "[op] msg",
// message() is exactly msg.
class TemplateException : public Error {
 public:
  TemplateException(const std::string& op, std::string message)
      : Error("[" + op + "] " + message), message_(std::move(message)) {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

class Value;
class Runtime;

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

struct Callable {
  std::string name;
  std::function<Value(Runtime&, CallArgs&)> fn;
};

// Python's sequence-like types. Ranges and dict views print differently
// from lists (printing them is unsupported here); generators (from select,
// map, reverse, ...) have no len(), are always truthy and are consumed by
// iteration, which `cursor` tracks.
struct ListData {
  enum class Type : std::uint8_t { kList, kTuple, kRange, kView, kGenerator };
  std::vector<Value> items;
  Type type = Type::kList;
  mutable std::size_t cursor = 0;
};

// Insertion-ordered string-keyed map.
class DictData {
 public:
  enum class Type : std::uint8_t { kDict, kNamespace, kLoop };
  explicit DictData(Type type = Type::kDict) : type_(type) {}

  Type type() const { return type_; }
  std::size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
  // Drops all entries; breaks reference cycles at the end of a render.
  void clear();

 private:
  Type type_;
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, std::size_t> index_;
};

class Value {
 public:
  enum class Kind : std::uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kCallable
  };

  Value() = default;  // Undefined with no hint.
  Value(bool b) : kind_(Kind::kBool), b_(b) {}
  Value(std::int64_t i) : kind_(Kind::kInt), i_(i) {}
  Value(int i) : kind_(Kind::kInt), i_(i) {}
  Value(double d) : kind_(Kind::kFloat), f_(d) {}
  Value(std::string s);
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}

  // hint: Jinja's message for misuse, e.g. "'foo' is undefined".
  static Value undefined(std::string hint);
  static Value none();
  // A markupsafe.Markup string (from |safe or |escape): `+` escapes the other side.
  static Value markup(std::string s);
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  static Value sequence(std::vector<Value> items, ListData::Type type);
  static Value dict(std::shared_ptr<DictData> d);
  static Value callable(std::string name, std::function<Value(Runtime&, CallArgs&)> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // int, float or bool (Python's bool is an int).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return is_list() && list().type == ListData::Type::kTuple; }
  bool is_generator() const { return is_list() && list().type == ListData::Type::kGenerator; }
  // A list or tuple (what `+`, repr and tojson accept).
  bool is_plain_sequence() const {
    return is_list() && (list().type == ListData::Type::kList || is_tuple());
  }
  bool is_dict() const { return kind_ == Kind::kDict; }
  // A real dict (not a namespace or loop object).
  bool is_mapping() const { return is_dict() && dict().type() == DictData::Type::kDict; }
  bool is_namespace() const { return is_dict() && dict().type() == DictData::Type::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_markup() const { return is_string() && markup_; }

  bool as_bool() const { return b_; }
  std::int64_t as_int() const { return is_bool() ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return is_float() ? f_ : static_cast<double>(as_int()); }
  const std::string& as_string() const { return *static_cast<const std::string*>(ptr_.get()); }
  const std::string& undefined_hint() const;
  const ListData& list() const { return *static_cast<const ListData*>(ptr_.get()); }
  const DictData& dict() const { return *static_cast<const DictData*>(ptr_.get()); }
  // Only namespaces are mutable.
  DictData& mutable_namespace() const;
  std::shared_ptr<DictData> dict_ptr() const { return std::static_pointer_cast<DictData>(ptr_); }
  const Callable& callable() const { return *static_cast<const Callable*>(ptr_.get()); }
  // Identity of the shared payload (Python `is` for containers).
  const void* identity() const { return ptr_.get(); }

 private:
  Kind kind_ = Kind::kUndefined;
  bool markup_ = false;
  union {
    bool b_;
    std::int64_t i_;
    double f_ = 0;
  };
  std::shared_ptr<void> ptr_;
};

// Python semantics. These throw EvalError where Python raises.
bool truthy(const Value& v);
// Python str(); Undefined renders as "".
std::string to_str(const Value& v);
std::string repr(const Value& v);
// Jinja's object_type_repr-style name: "str", "dict", "NoneType", ...
std::string type_name(const Value& v);
bool equals(const Value& a, const Value& b);
// -1, 0, 1 for a<b, a==b, a>b, kUnordered when a NaN is involved; throws
// for types Python cannot order. op names the operator in that message.
inline constexpr int kUnordered = 2;
int compare(const Value& a, const Value& b, std::string_view op);

}  // namespace ferry::text::jinja
