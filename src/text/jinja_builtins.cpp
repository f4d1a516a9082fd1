// Argument binding, iteration, tests and globals.
#include "text/jinja_builtins.h"

#include <cmath>
#include <cstring>
#include <ctime>

#include "text/jinja_runtime.h"
#include "text/jinja_strings.h"

namespace ferry::text::jinja {

BoundArgs::BoundArgs(std::string_view fn, const CallArgs& call,
                     std::initializer_list<const char*> names)
    : fn_(fn), names_(names), bound_(names.size(), nullptr) {
  if (call.args.size() > names_.size()) {
    throw EvalError(fn_ + "() takes at most " + std::to_string(names_.size()) + " argument(s) (" +
                    std::to_string(call.args.size()) + " given)");
  }
  for (std::size_t i = 0; i < call.args.size(); ++i) bound_[i] = &call.args[i];
  for (const auto& [key, value] : call.kwargs) {
    std::size_t i = 0;
    while (i < names_.size() && key != names_[i]) ++i;
    if (i == names_.size())
      throw EvalError(fn_ + "() got an unexpected keyword argument '" + key + "'");
    if (bound_[i]) throw EvalError(fn_ + "() got multiple values for argument '" + key + "'");
    bound_[i] = &value;
  }
}

const Value& BoundArgs::get(std::size_t i) const {
  if (!bound_[i]) throw EvalError(fn_ + "() missing required argument '" + names_[i] + "'");
  return *bound_[i];
}

std::int64_t BoundArgs::get_int(std::size_t i, std::int64_t fallback) const {
  if (!has(i)) return fallback;
  const Value& v = *bound_[i];
  if (!v.is_int() && !v.is_bool()) {
    throw EvalError(fn_ + "(): '" + names_[i] + "' must be an integer, not " + type_name(v));
  }
  return v.as_int();
}

std::optional<std::string> BoundArgs::get_str(std::size_t i) const {
  if (!has(i) || bound_[i]->is_none()) return std::nullopt;
  if (!bound_[i]->is_string()) {
    throw EvalError(fn_ + "(): '" + names_[i] + "' must be a string, not " + type_name(*bound_[i]));
  }
  return bound_[i]->as_string();
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList: {
      const ListData& l = v.list();
      if (!v.is_generator()) return l.items;
      std::vector<Value> rest(l.items.begin() + static_cast<std::ptrdiff_t>(l.cursor),
                              l.items.end());
      l.cursor = l.items.size();
      return rest;
    }
    case Value::Kind::kDict:
      if (v.is_mapping()) {
        std::vector<Value> keys;
        for (const auto& e : v.dict().entries()) keys.emplace_back(e.first);
        return keys;
      }
      break;
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : pystr::decode(v.as_string())) {
        std::string s;
        pystr::append_utf8(s, c);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default:
      break;
  }
  throw EvalError("'" + type_name(v) + "' object is not iterable");
}

std::size_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return pystr::length(v.as_string());
    case Value::Kind::kList:
      if (!v.is_generator()) return v.list().items.size();
      break;
    case Value::Kind::kDict:
      if (v.is_mapping()) return v.dict().size();
      break;
    default:
      break;
  }
  throw EvalError("object of type '" + type_name(v) + "' has no len()");
}

namespace {

using Kind = Value::Kind;

const Value& arg0(std::string_view test, CallArgs& a) {
  if (a.args.size() != 1 || !a.kwargs.empty()) {
    throw EvalError("test '" + std::string(test) + "' takes exactly one argument");
  }
  return a.args[0];
}

void no_args(std::string_view test, CallArgs& a) {
  if (!a.args.empty() || !a.kwargs.empty()) {
    throw EvalError("test '" + std::string(test) + "' takes no arguments");
  }
}

#define FERRY_SIMPLE_TEST(fn, name, expr)          \
  bool fn(Runtime&, const Value& v, CallArgs& a) { \
    no_args(name, a);                              \
    return (expr);                                 \
  }

FERRY_SIMPLE_TEST(t_defined, "defined", !v.is_undefined())
FERRY_SIMPLE_TEST(t_undefined, "undefined", v.is_undefined())
FERRY_SIMPLE_TEST(t_none, "none", v.is_none())
FERRY_SIMPLE_TEST(t_string, "string", v.is_string())
FERRY_SIMPLE_TEST(t_number, "number", v.is_number())
FERRY_SIMPLE_TEST(t_integer, "integer", v.is_int())
FERRY_SIMPLE_TEST(t_float, "float", v.is_float())
FERRY_SIMPLE_TEST(t_boolean, "boolean", v.is_bool())
FERRY_SIMPLE_TEST(t_true, "true", v.is_bool() && v.as_bool())
FERRY_SIMPLE_TEST(t_false, "false", v.is_bool() && !v.as_bool())
FERRY_SIMPLE_TEST(t_mapping, "mapping", v.is_mapping())
FERRY_SIMPLE_TEST(t_escaped, "escaped", v.is_markup())
// Undefined defines __call__ (to raise), so Python's callable() is true for it.
FERRY_SIMPLE_TEST(t_callable, "callable", v.is_callable() || v.is_undefined())
FERRY_SIMPLE_TEST(t_iterable, "iterable",
                  v.is_undefined() || v.is_string() || v.is_list() || v.is_mapping())
FERRY_SIMPLE_TEST(t_sequence, "sequence",
                  v.is_undefined() || v.is_string() || (v.is_list() && !v.is_generator()) ||
                      v.is_mapping())
FERRY_SIMPLE_TEST(t_lower, "lower", pystr::is_lower(to_str(v)))
FERRY_SIMPLE_TEST(t_upper, "upper", pystr::is_upper(to_str(v)))
#undef FERRY_SIMPLE_TEST

bool t_odd(Runtime& rt, const Value& v, CallArgs& a) {
  no_args("odd", a);
  return equals(binary_op(rt, "%", v, Value(2)), Value(1));
}

bool t_even(Runtime& rt, const Value& v, CallArgs& a) {
  no_args("even", a);
  return equals(binary_op(rt, "%", v, Value(2)), Value(0));
}

bool t_divisibleby(Runtime& rt, const Value& v, CallArgs& a) {
  return equals(binary_op(rt, "%", v, arg0("divisibleby", a)), Value(0));
}

bool t_eq(Runtime&, const Value& v, CallArgs& a) {
  return equals(v, arg0("eq", a));
}
bool t_ne(Runtime&, const Value& v, CallArgs& a) {
  return !equals(v, arg0("ne", a));
}
bool t_lt(Runtime&, const Value& v, CallArgs& a) {
  return compare(v, arg0("lt", a), "<") == -1;
}
bool t_gt(Runtime&, const Value& v, CallArgs& a) {
  return compare(v, arg0("gt", a), ">") == 1;
}
bool t_le(Runtime&, const Value& v, CallArgs& a) {
  int c = compare(v, arg0("le", a), "<=");
  return c == -1 || c == 0;
}
bool t_ge(Runtime&, const Value& v, CallArgs& a) {
  int c = compare(v, arg0("ge", a), ">=");
  return c == 1 || c == 0;
}
bool t_in(Runtime&, const Value& v, CallArgs& a) {
  return contains(arg0("in", a), v);
}

bool t_sameas(Runtime&, const Value& v, CallArgs& a) {
  const Value& o = arg0("sameas", a);
  if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
  if (v.is_bool() || o.is_bool()) return v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool();
  if (v.is_list() || v.is_dict() || v.is_callable()) return v.identity() == o.identity();
  // CPython's identity of numbers and strings depends on interning details.
  throw EvalError("'sameas' on " + type_name(v) + " values is not supported");
}

bool t_filter(Runtime&, const Value& v, CallArgs& a) {
  no_args("filter", a);
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}

bool t_test(Runtime&, const Value& v, CallArgs& a) {
  no_args("test", a);
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

struct NamedTest {
  const char* name;
  TestFn fn;
};

constexpr NamedTest kTests[] = {
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"none", t_none},
    {"string", t_string},
    {"number", t_number},
    {"integer", t_integer},
    {"float", t_float},
    {"boolean", t_boolean},
    {"true", t_true},
    {"false", t_false},
    {"mapping", t_mapping},
    {"iterable", t_iterable},
    {"sequence", t_sequence},
    {"callable", t_callable},
    {"escaped", t_escaped},
    {"lower", t_lower},
    {"upper", t_upper},
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"ne", t_ne},
    {"!=", t_ne},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<", t_lt},
    {"le", t_le},
    {"<=", t_le},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"ge", t_ge},
    {">=", t_ge},
    {"in", t_in},
    {"sameas", t_sameas},
    {"filter", t_filter},
    {"test", t_test},
};

// ---- globals ----

Value g_range(Runtime& rt, CallArgs& a) {
  if (!a.kwargs.empty() || a.args.empty() || a.args.size() > 3) {
    throw EvalError("range() takes 1 to 3 positional arguments");
  }
  std::int64_t n[3] = {0, 0, 1};
  for (std::size_t i = 0; i < a.args.size(); ++i) {
    if (!a.args[i].is_int() && !a.args[i].is_bool()) {
      throw EvalError("'" + type_name(a.args[i]) + "' object cannot be interpreted as an integer");
    }
  }
  if (a.args.size() == 1) {
    n[1] = a.args[0].as_int();
  } else {
    n[0] = a.args[0].as_int();
    n[1] = a.args[1].as_int();
    if (a.args.size() == 3) n[2] = a.args[2].as_int();
  }
  if (n[2] == 0) throw EvalError("range() arg 3 must not be zero");
  std::vector<Value> items;
  for (std::int64_t i = n[0]; n[2] > 0 ? i < n[1] : i > n[1]; i += n[2]) {
    rt.check_list_size(items.size() + 1);
    items.emplace_back(i);
  }
  return Value::sequence(std::move(items), ListData::Type::kRange);
}

// dict(mapping_or_pairs, **kwargs), as Python's dict() builds it.
std::shared_ptr<DictData> build_dict(const char* fn, CallArgs& a, DictData::Type type) {
  auto d = std::make_shared<DictData>(type);
  if (a.args.size() > 1)
    throw EvalError(std::string(fn) + "() takes at most 1 positional argument");
  if (a.args.size() == 1) {
    const Value& src = a.args[0];
    if (src.is_mapping()) {
      for (const auto& [k, v] : src.dict().entries()) d->set(k, v);
    } else {
      for (const Value& pair : iterate(src)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2 || !kv[0].is_string()) {
          throw EvalError(std::string(fn) + "(): expected (str, value) pairs");
        }
        d->set(kv[0].as_string(), kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.kwargs) d->set(k, v);
  return d;
}

Value g_namespace(Runtime& rt, CallArgs& a) {
  auto ns = build_dict("namespace", a, DictData::Type::kNamespace);
  for (const auto& e : ns->entries()) {
    if (!e.first.empty() && e.first[0] == '_') {
      throw EvalError("cannot store the underscore-prefixed attribute '" + e.first +
                      "' on a namespace");
    }
  }
  rt.track(ns);
  return Value::dict(std::move(ns));
}

Value g_dict(Runtime&, CallArgs& a) {
  return Value::dict(build_dict("dict", a, DictData::Type::kDict));
}

Value g_raise_exception(Runtime& rt, CallArgs& a) {
  BoundArgs b("raise_exception", a, {"message"});
  throw TemplateException(rt.op(), to_str(b.get(0)));
}

Value g_strftime_now(Runtime& rt, CallArgs& a) {
  BoundArgs b("strftime_now", a, {"format"});
  std::optional<std::string> fmt = b.get_str(0);
  if (!fmt) throw EvalError("strftime_now() argument must be str");
  if (fmt->empty()) return Value("");
  std::tm tm = rt.now();
  // strftime returns 0 both for "buffer too small" and for an empty result;
  // grow a few times, then give up on a pathological format.
  for (std::size_t cap = 64 + fmt->size() * 4; cap <= (std::size_t{1} << 16); cap *= 4) {
    std::string buf(cap, '\0');
    std::size_t n = std::strftime(buf.data(), buf.size(), fmt->c_str(), &tm);
    if (n > 0) return Value(buf.substr(0, n));
  }
  return Value("");
}

}  // namespace

TestFn find_test(std::string_view name) {
  for (const NamedTest& t : kTests) {
    if (name == t.name) return t.fn;
  }
  return nullptr;
}

const DictData& globals() {
  static const DictData g = [] {
    DictData d;
    d.set("range", Value::callable("range", g_range));
    d.set("namespace", Value::callable("namespace", g_namespace));
    d.set("dict", Value::callable("dict", g_dict));
    d.set("raise_exception", Value::callable("raise_exception", g_raise_exception));
    d.set("strftime_now", Value::callable("strftime_now", g_strftime_now));
    return d;
  }();
  return g;
}

}  // namespace ferry::text::jinja
