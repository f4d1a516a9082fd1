// Python methods callable from templates: str, dict and list/tuple methods
// that do not mutate (ImmutableSandboxedEnvironment turns mutating ones into
// an Undefined that fails when called). Python methods outside the
// implemented set resolve to a callable that fails loudly.
#include <algorithm>
#include <cstring>

#include "text/jinja_builtins.h"
#include "text/jinja_runtime.h"
#include "text/jinja_strings.h"

namespace ferry::text::jinja {
namespace {

using Method = Value (*)(Runtime&, const Value& self, CallArgs& args);

Value list_of_strings(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.emplace_back(std::move(p));
  return Value::list(std::move(items));
}

std::int64_t maxsplit_arg(const BoundArgs& b, std::size_t i) {
  return b.get_int(i, -1);
}

Value s_strip_impl(const Value& self, CallArgs& a, const char* name, bool left, bool right) {
  BoundArgs b(name, a, {"chars"});
  std::string out = pystr::strip(self.as_string(), left, right, b.get_str(0));
  return self.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
}
Value s_strip(Runtime&, const Value& s, CallArgs& a) {
  return s_strip_impl(s, a, "strip", true, true);
}
Value s_lstrip(Runtime&, const Value& s, CallArgs& a) {
  return s_strip_impl(s, a, "lstrip", true, false);
}
Value s_rstrip(Runtime&, const Value& s, CallArgs& a) {
  return s_strip_impl(s, a, "rstrip", false, true);
}

Value s_split(Runtime&, const Value& s, CallArgs& a) {
  BoundArgs b("split", a, {"sep", "maxsplit"});
  return list_of_strings(pystr::split(s.as_string(), b.get_str(0), maxsplit_arg(b, 1)));
}

Value s_rsplit(Runtime&, const Value& s, CallArgs& a) {
  BoundArgs b("rsplit", a, {"sep", "maxsplit"});
  return list_of_strings(pystr::rsplit(s.as_string(), b.get_str(0), maxsplit_arg(b, 1)));
}

Value s_splitlines(Runtime&, const Value& s, CallArgs& a) {
  BoundArgs b("splitlines", a, {"keepends"});
  return list_of_strings(pystr::splitlines(s.as_string(), truthy(b.get_or(0, Value(false)))));
}

// startswith/endswith(prefix_or_tuple, start=None, end=None)
Value affix(const Value& s, CallArgs& a, const char* name, bool prefix) {
  BoundArgs b(name, a, {"prefix", "start", "end"});
  std::string text = s.as_string();
  if (b.has(1) || b.has(2)) {
    std::u32string u = pystr::decode(text);
    auto n = static_cast<std::int64_t>(u.size());
    auto norm = [&](std::size_t i, std::int64_t dflt) {
      if (!b.has(i) || b.get(i).is_none()) return dflt;
      std::int64_t v = b.get_int(i, dflt);
      if (v < 0) v = std::max<std::int64_t>(0, v + n);
      return std::min(v, n);
    };
    std::int64_t from = norm(1, 0), to = norm(2, n);
    if (from > to) return Value(false);
    text = pystr::encode(std::u32string_view(u).substr(static_cast<std::size_t>(from),
                                                       static_cast<std::size_t>(to - from)));
  }
  const Value& p = b.get(0);
  std::vector<Value> options = p.is_tuple() ? p.list().items : std::vector<Value>{p};
  for (const Value& o : options) {
    if (!o.is_string()) {
      throw EvalError(std::string(name) + " first arg must be str or a tuple of str, not " +
                      type_name(o));
    }
    const std::string& x = o.as_string();
    bool hit = x.size() <= text.size() &&
               (prefix ? text.compare(0, x.size(), x) == 0
                       : text.compare(text.size() - x.size(), x.size(), x) == 0);
    if (hit) return Value(true);
  }
  return Value(false);
}
Value s_startswith(Runtime&, const Value& s, CallArgs& a) {
  return affix(s, a, "startswith", true);
}
Value s_endswith(Runtime&, const Value& s, CallArgs& a) {
  return affix(s, a, "endswith", false);
}

#define FERRY_STR_MAP(fn, name, expr)                                             \
  Value fn(Runtime&, const Value& s, CallArgs& a) {                               \
    BoundArgs(name, a, {});                                                       \
    std::string out = (expr);                                                     \
    return s.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out)); \
  }
FERRY_STR_MAP(s_upper, "upper", pystr::upper(s.as_string()))
FERRY_STR_MAP(s_lower, "lower", pystr::lower(s.as_string()))
FERRY_STR_MAP(s_title, "title", pystr::title(s.as_string()))
FERRY_STR_MAP(s_capitalize, "capitalize", pystr::capitalize(s.as_string()))
#undef FERRY_STR_MAP

Value s_replace(Runtime& rt, const Value& s, CallArgs& a) {
  BoundArgs b("replace", a, {"old", "new", "count"});
  std::optional<std::string> old = b.get_str(0), with = b.get_str(1);
  if (!old || !with) throw EvalError("replace() arguments must be str");
  std::int64_t count = b.get_int(2, -1);
  std::int64_t hits = pystr::count(s.as_string(), *old);
  if (count >= 0) hits = std::min(hits, count);
  rt.check_string_size(s.as_string().size() + static_cast<std::size_t>(hits) * with->size());
  std::string out = pystr::replace(s.as_string(), *old, *with, count);
  return s.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
}

Value find_impl(const Value& s, CallArgs& a, const char* name, bool reverse, bool must) {
  BoundArgs b(name, a, {"sub"});
  std::optional<std::string> sub = b.get_str(0);
  if (!sub) throw EvalError(std::string(name) + "() argument must be str");
  std::int64_t i = pystr::find(s.as_string(), *sub, reverse);
  if (must && i < 0) throw EvalError("substring not found");
  return Value(i);
}
Value s_find(Runtime&, const Value& s, CallArgs& a) {
  return find_impl(s, a, "find", false, false);
}
Value s_rfind(Runtime&, const Value& s, CallArgs& a) {
  return find_impl(s, a, "rfind", true, false);
}
Value s_index(Runtime&, const Value& s, CallArgs& a) {
  return find_impl(s, a, "index", false, true);
}
Value s_rindex(Runtime&, const Value& s, CallArgs& a) {
  return find_impl(s, a, "rindex", true, true);
}

Value s_count(Runtime&, const Value& s, CallArgs& a) {
  BoundArgs b("count", a, {"sub"});
  std::optional<std::string> sub = b.get_str(0);
  if (!sub) throw EvalError("count() argument must be str");
  return Value(pystr::count(s.as_string(), *sub));
}

Value s_join(Runtime& rt, const Value& s, CallArgs& a) {
  BoundArgs b("join", a, {"iterable"});
  std::string out;
  std::vector<Value> items = iterate(b.get(0));
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      throw EvalError("sequence item " + std::to_string(i) + ": expected str instance, " +
                      type_name(items[i]) + " found");
    }
    if (i) out += s.as_string();
    out += items[i].as_string();
    rt.check_string_size(out.size());
  }
  return Value(std::move(out));
}

template <bool (*Pred)(char32_t)>
Value char_class(const Value& s, CallArgs& a, const char* name) {
  BoundArgs(name, a, {});
  std::u32string u = pystr::decode(s.as_string());
  return Value(!u.empty() && std::all_of(u.begin(), u.end(), Pred));
}
bool ascii_digit(char32_t c) {
  return c >= '0' && c <= '9';
}
bool ascii_alpha(char32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool ascii_alnum(char32_t c) {
  return ascii_digit(c) || ascii_alpha(c);
}
// Only ASCII text is classified; Python's Unicode categories are not modelled.
void require_ascii(const Value& s, const char* name) {
  for (char c : s.as_string()) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      throw EvalError(std::string("str.") + name + "() on non-ASCII text is not supported");
    }
  }
}
Value s_isdigit(Runtime&, const Value& s, CallArgs& a) {
  require_ascii(s, "isdigit");
  return char_class<ascii_digit>(s, a, "isdigit");
}
Value s_isalpha(Runtime&, const Value& s, CallArgs& a) {
  require_ascii(s, "isalpha");
  return char_class<ascii_alpha>(s, a, "isalpha");
}
Value s_isalnum(Runtime&, const Value& s, CallArgs& a) {
  require_ascii(s, "isalnum");
  return char_class<ascii_alnum>(s, a, "isalnum");
}
Value s_isspace(Runtime&, const Value& s, CallArgs& a) {
  return char_class<pystr::is_space>(s, a, "isspace");
}
Value s_islower(Runtime&, const Value& s, CallArgs& a) {
  BoundArgs("islower", a, {});
  return Value(pystr::is_lower(s.as_string()));
}
Value s_isupper(Runtime&, const Value& s, CallArgs& a) {
  BoundArgs("isupper", a, {});
  return Value(pystr::is_upper(s.as_string()));
}

Value affix_remove(const Value& s, CallArgs& a, const char* name, bool prefix) {
  BoundArgs b(name, a, {"affix"});
  std::optional<std::string> x = b.get_str(0);
  if (!x) throw EvalError(std::string(name) + "() argument must be str");
  const std::string& t = s.as_string();
  bool hit =
      x->size() <= t.size() && (prefix ? t.compare(0, x->size(), *x) == 0
                                       : t.compare(t.size() - x->size(), x->size(), *x) == 0);
  if (!hit) return s;
  std::string out = prefix ? t.substr(x->size()) : t.substr(0, t.size() - x->size());
  return s.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
}
Value s_removeprefix(Runtime&, const Value& s, CallArgs& a) {
  return affix_remove(s, a, "removeprefix", true);
}
Value s_removesuffix(Runtime&, const Value& s, CallArgs& a) {
  return affix_remove(s, a, "removesuffix", false);
}

Value d_get(Runtime&, const Value& d, CallArgs& a) {
  BoundArgs b("get", a, {"key", "default"});
  const Value& key = b.get(0);
  if (key.is_string()) {
    if (const Value* v = d.dict().find(key.as_string())) return *v;
  }
  return b.get_or(1, Value::none());
}

Value d_view(const Value& d, CallArgs& a, const char* name, int what) {
  BoundArgs(name, a, {});
  std::vector<Value> out;
  for (const auto& [k, v] : d.dict().entries()) {
    out.push_back(what == 0 ? Value(k) : what == 1 ? v : Value::tuple({Value(k), v}));
  }
  return Value::sequence(std::move(out), ListData::Type::kView);
}
Value d_keys(Runtime&, const Value& d, CallArgs& a) {
  return d_view(d, a, "keys", 0);
}
Value d_values(Runtime&, const Value& d, CallArgs& a) {
  return d_view(d, a, "values", 1);
}
Value d_items(Runtime&, const Value& d, CallArgs& a) {
  return d_view(d, a, "items", 2);
}

Value d_copy(Runtime&, const Value& d, CallArgs& a) {
  BoundArgs("copy", a, {});
  return Value::dict(std::make_shared<DictData>(d.dict()));
}

Value l_count(Runtime&, const Value& l, CallArgs& a) {
  BoundArgs b("count", a, {"value"});
  const auto& items = l.list().items;
  return Value(static_cast<std::int64_t>(std::count_if(
      items.begin(), items.end(), [&](const Value& v) { return equals(v, b.get(0)); })));
}

Value l_index(Runtime&, const Value& l, CallArgs& a) {
  BoundArgs b("index", a, {"value"});
  const auto& items = l.list().items;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (equals(items[i], b.get(0))) return Value(static_cast<std::int64_t>(i));
  }
  throw EvalError("value is not in list");
}

Value l_copy(Runtime&, const Value& l, CallArgs& a) {
  BoundArgs("copy", a, {});
  return Value::list(l.list().items);
}

struct NamedMethod {
  const char* name;
  Method fn;
};

constexpr NamedMethod kStrMethods[] = {
    {"strip", s_strip},
    {"lstrip", s_lstrip},
    {"rstrip", s_rstrip},
    {"split", s_split},
    {"rsplit", s_rsplit},
    {"splitlines", s_splitlines},
    {"startswith", s_startswith},
    {"endswith", s_endswith},
    {"upper", s_upper},
    {"lower", s_lower},
    {"title", s_title},
    {"capitalize", s_capitalize},
    {"replace", s_replace},
    {"find", s_find},
    {"rfind", s_rfind},
    {"index", s_index},
    {"rindex", s_rindex},
    {"count", s_count},
    {"join", s_join},
    {"isdigit", s_isdigit},
    {"isalpha", s_isalpha},
    {"isalnum", s_isalnum},
    {"isspace", s_isspace},
    {"islower", s_islower},
    {"isupper", s_isupper},
    {"removeprefix", s_removeprefix},
    {"removesuffix", s_removesuffix},
};
constexpr const char* kOtherStrMethods[] = {
    "casefold",    "center",     "encode",    "expandtabs",   "format",
    "format_map",  "isascii",    "isdecimal", "isidentifier", "isnumeric",
    "isprintable", "istitle",    "ljust",     "maketrans",    "partition",
    "rjust",       "rpartition", "swapcase",  "translate",    "zfill"};

constexpr NamedMethod kDictMethods[] = {
    {"get", d_get}, {"keys", d_keys}, {"values", d_values}, {"items", d_items}, {"copy", d_copy}};
constexpr const char* kDictMutators[] = {"clear", "pop", "popitem", "setdefault", "update"};

constexpr NamedMethod kListMethods[] = {{"count", l_count}, {"index", l_index}, {"copy", l_copy}};
constexpr const char* kListMutators[] = {"append", "clear",  "extend",  "insert",
                                         "pop",    "remove", "reverse", "sort"};

constexpr const char* kNumberAttrs[] = {
    "as_integer_ratio", "bit_count", "bit_length", "conjugate", "denominator",
    "from_bytes",       "fromhex",   "hex",        "imag",      "is_integer",
    "numerator",        "real",      "to_bytes"};

template <std::size_t N>
const NamedMethod* find_in(const NamedMethod (&table)[N], std::string_view name) {
  for (const NamedMethod& m : table) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

template <std::size_t N>
bool listed(const char* const (&names)[N], std::string_view name) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

Value bind_method(const Value& self, const std::string& type, const NamedMethod& m) {
  Method fn = m.fn;
  return Value::callable(type + "." + m.name,
                         [self, fn](Runtime& rt, CallArgs& a) { return fn(rt, self, a); });
}

Value unsupported(const std::string& qualified) {
  return Value::callable(qualified, [qualified](Runtime&, CallArgs&) -> Value {
    throw EvalError("the Python method " + qualified + "() is not supported");
  });
}

Value unsafe(const Value& obj, std::string_view name) {
  return Value::undefined("access to attribute '" + std::string(name) + "' of '" + type_name(obj) +
                          "' object is unsafe.");
}

}  // namespace

std::optional<Value> find_method(const Value& obj, std::string_view name) {
  std::string type = type_name(obj);
  if (obj.is_string()) {
    if (const NamedMethod* m = find_in(kStrMethods, name)) return bind_method(obj, "str", *m);
    if (listed(kOtherStrMethods, name)) return unsupported("str." + std::string(name));
  } else if (obj.is_mapping()) {
    if (const NamedMethod* m = find_in(kDictMethods, name)) return bind_method(obj, "dict", *m);
    if (listed(kDictMutators, name)) return unsafe(obj, name);
    if (name == "fromkeys") return unsupported("dict.fromkeys");
  } else if (obj.is_plain_sequence()) {
    if (const NamedMethod* m = find_in(kListMethods, name)) {
      if (!(obj.is_tuple() && name == "copy")) return bind_method(obj, type, *m);
    }
    if (!obj.is_tuple() && listed(kListMutators, name)) return unsafe(obj, name);
  } else if (obj.is_number()) {
    if (listed(kNumberAttrs, name)) return unsupported(type + "." + std::string(name));
  }
  return std::nullopt;
}

}  // namespace ferry::text::jinja
