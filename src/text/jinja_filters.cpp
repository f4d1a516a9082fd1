// Builtin filters, following jinja2/filters.py; `tojson` is transformers'
// override (json.dumps with ensure_ascii=False, no HTML escaping, no sorting).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/jinja_builtins.h"
#include "text/jinja_json.h"
#include "text/jinja_runtime.h"
#include "text/jinja_strings.h"

namespace ferry::text::jinja {
namespace {

using Type = ListData::Type;

Value same_markup(const Value& like, std::string s) {
  return like.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then index 0.
std::vector<Value> attribute_parts(const Value& attr) {
  if (!attr.is_string()) return {attr};
  std::vector<Value> parts;
  for (std::string& p : pystr::split(attr.as_string(), std::string("."), -1)) {
    bool digits =
        !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) {
      parts.emplace_back(*pystr::parse_int(p, 10));
    } else {
      parts.emplace_back(std::move(p));
    }
  }
  return parts;
}

Value get_path(Runtime& rt, Value item, const std::vector<Value>& parts, const Value* fallback) {
  for (const Value& part : parts) {
    item = rt.get_item(item, part);
    if (fallback && item.is_undefined()) item = *fallback;
  }
  return item;
}

Value ignore_case(const Value& v) {
  return v.is_string() ? Value(pystr::lower(v.as_string())) : v;
}

Value generator(std::vector<Value> items) {
  return Value::sequence(std::move(items), Type::kGenerator);
}

Value f_abs(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("abs", a, {});
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) throw EvalError("integer overflow");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.is_undefined()) throw EvalError(v.undefined_hint());
  throw EvalError("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_capitalize(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("capitalize", a, {});
  return same_markup(v, pystr::capitalize(to_str(v)));
}

Value f_default(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs b("default", a, {"default_value", "boolean"});
  if (v.is_undefined() || (truthy(b.get_or(1, Value(false))) && !truthy(v))) {
    return b.get_or(0, Value(""));
  }
  return v;
}

Value f_dictsort(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs b("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (v.is_undefined()) throw EvalError(v.undefined_hint());
  if (!v.is_mapping()) throw EvalError("dictsort() requires a mapping");
  bool cs = truthy(b.get_or(0, Value(false)));
  std::string by = b.get_str(1).value_or("key");
  if (by != "key" && by != "value")
    throw EvalError("You can only sort by either \"key\" or \"value\"");
  std::size_t pos = by == "key" ? 0 : 1;
  std::vector<Value> pairs;
  for (const auto& [k, item] : v.dict().entries()) pairs.push_back(Value::tuple({Value(k), item}));
  auto key = [&](const Value& p) {
    const Value& x = p.list().items[pos];
    return cs ? x : ignore_case(x);
  };
  bool rev = truthy(b.get_or(2, Value(false)));
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    return rev ? compare(key(y), key(x), "<") == -1 : compare(key(x), key(y), "<") == -1;
  });
  return Value::list(std::move(pairs));
}

Value f_escape(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("escape", a, {});
  if (v.is_markup()) return v;
  return Value::markup(pystr::escape_html(to_str(v)));
}

Value f_first(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("first", a, {});
  if (v.is_generator()) {
    const ListData& l = v.list();
    if (l.cursor < l.items.size()) return l.items[l.cursor++];
    return Value::undefined("No first item, sequence was empty.");
  }
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("last", a, {});
  if (v.is_generator()) throw EvalError("'generator' object is not reversible");
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs b("float", a, {"default"});
  if (v.is_undefined()) throw EvalError(v.undefined_hint());
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    if (auto d = pystr::parse_float(v.as_string())) return Value(*d);
  }
  return b.get_or(0, Value(0.0));
}

Value f_int(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs b("int", a, {"default", "base"});
  Value fallback = b.get_or(0, Value(0));
  if (v.is_undefined()) throw EvalError(v.undefined_hint());
  auto from_double = [&](double d) -> Value {
    if (std::isnan(d)) return fallback;
    if (std::isinf(d)) throw EvalError("cannot convert float infinity to integer");
    if (std::fabs(d) >= 9.2e18) throw EvalError("integer overflow");
    return Value(static_cast<std::int64_t>(d));
  };
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return from_double(v.as_double());
  if (v.is_string()) {
    std::int64_t base = b.get_int(1, 10);
    if (base != 0 && (base < 2 || base > 36))
      throw EvalError("int() base must be >= 2 and <= 36, or 0");
    if (auto i = pystr::parse_int(v.as_string(), static_cast<int>(base))) return Value(*i);
    if (auto d = pystr::parse_float(v.as_string())) return from_double(*d);
  }
  return fallback;
}

Value f_indent(Runtime& rt, const Value& v, CallArgs& a) {
  BoundArgs b("indent", a, {"width", "first", "blank"});
  Value w = b.get_or(0, Value(4));
  std::string ind =
      w.is_string()
          ? w.as_string()
          : std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, b.get_int(0, 4))), ' ');
  if (v.is_undefined()) throw EvalError(v.undefined_hint());
  if (!v.is_string()) throw EvalError("indent() needs a string, not " + type_name(v));
  std::string s = v.as_string() + "\n";
  std::vector<std::string> lines = pystr::splitlines(s, false);
  std::string rv;
  if (truthy(b.get_or(2, Value(false)))) {
    for (std::size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (std::size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += ind;
      rv += lines[i];
      rt.check_string_size(rv.size());
    }
  }
  if (truthy(b.get_or(1, Value(false)))) rv = ind + rv;
  return same_markup(v, std::move(rv));
}

Value f_items(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("items", a, {});
  if (v.is_undefined()) return generator({});
  if (!v.is_mapping()) throw EvalError("Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [k, item] : v.dict().entries()) pairs.push_back(Value::tuple({Value(k), item}));
  return generator(std::move(pairs));
}

Value f_join(Runtime& rt, const Value& v, CallArgs& a) {
  BoundArgs b("join", a, {"d", "attribute"});
  std::string sep = to_str(b.get_or(0, Value("")));
  std::vector<Value> items = iterate(v);
  std::vector<Value> parts;
  if (b.has(1) && !b.get(1).is_none()) parts = attribute_parts(b.get(1));
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += to_str(parts.empty() ? items[i] : get_path(rt, items[i], parts, nullptr));
    rt.check_string_size(out.size());
  }
  return Value(std::move(out));
}

Value f_length(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("length", a, {});
  return Value(static_cast<std::int64_t>(length_of(v)));
}

Value f_list(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("list", a, {});
  return Value::list(iterate(v));
}

Value f_lower(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("lower", a, {});
  return same_markup(v, pystr::lower(to_str(v)));
}

Value f_upper(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("upper", a, {});
  return same_markup(v, pystr::upper(to_str(v)));
}

Value f_title(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("title", a, {});
  return Value(pystr::jinja_title(to_str(v)));
}

Value f_map(Runtime& rt, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  std::vector<Value> items = truthy(v) ? iterate(v) : std::vector<Value>{};
  if (a.args.empty()) {
    BoundArgs b("map", a, {"attribute", "default"});
    if (!b.has(0)) throw EvalError("map requires a filter argument");
    std::vector<Value> parts = attribute_parts(b.get(0));
    const Value* fallback = b.has(1) && !b.get(1).is_none() ? &b.get(1) : nullptr;
    for (const Value& item : items) out.push_back(get_path(rt, item, parts, fallback));
    return generator(std::move(out));
  }
  if (!a.args[0].is_string()) throw EvalError("map: the filter name must be a string");
  FilterFn fn = find_filter(a.args[0].as_string());
  if (!fn) throw EvalError("unsupported filter '" + a.args[0].as_string() + "'");
  CallArgs rest{std::vector<Value>(a.args.begin() + 1, a.args.end()), a.kwargs};
  for (const Value& item : items) {
    CallArgs copy = rest;
    out.push_back(fn(rt, item, copy));
  }
  return generator(std::move(out));
}

Value select_or_reject(Runtime& rt, const Value& v, CallArgs& a, bool select, bool by_attr) {
  if (!truthy(v)) return generator({});
  std::size_t off = by_attr ? 1 : 0;
  if (by_attr && a.args.empty()) throw EvalError("Missing parameter for attribute name");
  std::vector<Value> parts = by_attr ? attribute_parts(a.args[0]) : std::vector<Value>{};
  TestFn test = nullptr;
  CallArgs test_args;
  if (a.args.size() > off) {
    if (!a.args[off].is_string()) throw EvalError("the test name must be a string");
    test = find_test(a.args[off].as_string());
    if (!test) throw EvalError("unsupported test '" + a.args[off].as_string() + "'");
    test_args.args.assign(a.args.begin() + static_cast<std::ptrdiff_t>(off) + 1, a.args.end());
    test_args.kwargs = a.kwargs;
  }
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    Value x = by_attr ? get_path(rt, item, parts, nullptr) : item;
    CallArgs copy = test_args;
    bool ok = test ? test(rt, x, copy) : truthy(x);
    if (ok == select) out.push_back(item);
  }
  return generator(std::move(out));
}

Value f_select(Runtime& rt, const Value& v, CallArgs& a) {
  return select_or_reject(rt, v, a, true, false);
}
Value f_reject(Runtime& rt, const Value& v, CallArgs& a) {
  return select_or_reject(rt, v, a, false, false);
}
Value f_selectattr(Runtime& rt, const Value& v, CallArgs& a) {
  return select_or_reject(rt, v, a, true, true);
}
Value f_rejectattr(Runtime& rt, const Value& v, CallArgs& a) {
  return select_or_reject(rt, v, a, false, true);
}

// min/max/sort/unique keys: an attribute path, lower-cased unless case_sensitive.
std::vector<Value> sort_keys(Runtime& rt, const std::vector<Value>& items, const BoundArgs& b,
                             std::size_t cs_idx, std::size_t attr_idx) {
  bool cs = truthy(b.get_or(cs_idx, Value(false)));
  std::vector<Value> parts;
  if (b.has(attr_idx) && !b.get(attr_idx).is_none()) parts = attribute_parts(b.get(attr_idx));
  std::vector<Value> keys;
  for (const Value& item : items) {
    Value k = get_path(rt, item, parts, nullptr);
    keys.push_back(cs ? k : ignore_case(k));
  }
  return keys;
}

Value min_or_max(Runtime& rt, const Value& v, CallArgs& a, bool is_max) {
  BoundArgs b(is_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  std::vector<Value> keys = sort_keys(rt, items, b, 0, 1);
  std::size_t best = 0;
  for (std::size_t i = 1; i < items.size(); ++i) {
    if (compare(keys[i], keys[best], is_max ? ">" : "<") == (is_max ? 1 : -1)) best = i;
  }
  return items[best];
}

Value f_max(Runtime& rt, const Value& v, CallArgs& a) {
  return min_or_max(rt, v, a, true);
}
Value f_min(Runtime& rt, const Value& v, CallArgs& a) {
  return min_or_max(rt, v, a, false);
}

Value f_sort(Runtime& rt, const Value& v, CallArgs& a) {
  BoundArgs b("sort", a, {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = iterate(v);
  std::vector<Value> keys = sort_keys(rt, items, b, 1, 2);
  std::vector<std::size_t> order(items.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  bool rev = truthy(b.get_or(0, Value(false)));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return rev ? compare(keys[y], keys[x], "<") == -1 : compare(keys[x], keys[y], "<") == -1;
  });
  std::vector<Value> out;
  for (std::size_t i : order) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value f_unique(Runtime& rt, const Value& v, CallArgs& a) {
  BoundArgs b("unique", a, {"case_sensitive", "attribute"});
  std::vector<Value> items = iterate(v);
  std::vector<Value> keys = sort_keys(rt, items, b, 0, 1);
  std::vector<Value> out, seen;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (keys[i].is_list() || keys[i].is_dict())
      throw EvalError("unhashable type: '" + type_name(keys[i]) + "'");
    if (std::none_of(seen.begin(), seen.end(),
                     [&](const Value& s) { return equals(s, keys[i]); })) {
      seen.push_back(keys[i]);
      out.push_back(items[i]);
    }
  }
  return generator(std::move(out));
}

Value f_replace(Runtime& rt, const Value& v, CallArgs& a) {
  BoundArgs b("replace", a, {"old", "new", "count"});
  std::string s = to_str(v), old = to_str(b.get(0)), with = to_str(b.get(1));
  std::int64_t count = b.has(2) && !b.get(2).is_none() ? b.get_int(2, -1) : -1;
  std::int64_t hits = pystr::count(s, old);
  if (count >= 0) hits = std::min(hits, count);
  rt.check_string_size(s.size() + static_cast<std::size_t>(hits) * with.size());
  return Value(pystr::replace(s, old, with, count));
}

Value f_reverse(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("reverse", a, {});
  if (v.is_string()) {
    std::u32string u = pystr::decode(v.as_string());
    std::reverse(u.begin(), u.end());
    return same_markup(v, pystr::encode(u));
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  // reversed() of a generator fails and jinja2 falls back to a list.
  return v.is_generator() ? Value::list(std::move(items)) : generator(std::move(items));
}

Value f_round(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs b("round", a, {"precision", "method"});
  std::int64_t precision = b.get_int(0, 0);
  std::string method = b.get_str(1).value_or("common");
  if (method != "common" && method != "ceil" && method != "floor") {
    throw EvalError("method must be common, ceil or floor");
  }
  if (v.is_undefined()) throw EvalError(v.undefined_hint());
  if (!v.is_number()) throw EvalError("type " + type_name(v) + " doesn't define __round__ method");
  if (precision < 0 || precision > 300)
    throw EvalError("round() precision outside 0..300 is not supported");
  if (method != "common") {
    // math.ceil/floor return an int (so -0.0 becomes 0), then int / 10**p.
    if (precision > 22)
      throw EvalError("round() precision above 22 with ceil/floor is not supported");
    double p10 = std::pow(10.0, static_cast<double>(precision));
    double x = v.as_double() * p10;
    if (std::isnan(x)) throw EvalError("cannot convert float NaN to integer");
    if (std::isinf(x)) throw EvalError("cannot convert float infinity to integer");
    double r = method == "ceil" ? std::ceil(x) : std::floor(x);
    return Value((r == 0.0 ? 0.0 : r) / p10);
  }
  if (!v.is_float()) return Value(v.as_int());  // round(int, n >= 0) is the int itself
  double d = v.as_double();
  if (!std::isfinite(d)) return v;
  // Python rounds the exact binary value half-to-even; so does printf.
  char buf[700];  // 309 integer digits + 300 decimals at most
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), d);
  return Value(std::strtod(buf, nullptr));
}

Value f_safe(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("safe", a, {});
  return v.is_markup() ? v : Value::markup(to_str(v));
}

Value f_string(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs("string", a, {});
  return v.is_markup() ? v : Value(to_str(v));
}

Value f_sum(Runtime& rt, const Value& v, CallArgs& a) {
  BoundArgs b("sum", a, {"attribute", "start"});
  Value total = b.get_or(1, Value(0));
  if (total.is_string()) throw EvalError("sum() can't sum strings [use ''.join(seq) instead]");
  std::vector<Value> parts;
  if (b.has(0) && !b.get(0).is_none()) parts = attribute_parts(b.get(0));
  for (const Value& item : iterate(v))
    total = binary_op(rt, "+", total, get_path(rt, item, parts, nullptr));
  return total;
}

Value f_tojson(Runtime& rt, const Value& v, CallArgs& a) {
  BoundArgs b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = truthy(b.get_or(0, Value(false)));
  if (b.has(1) && !b.get(1).is_none()) {
    const Value& ind = b.get(1);
    if (ind.is_string()) {
      o.indent = ind.as_string();
    } else {
      o.indent =
          std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, b.get_int(1, 0))), ' ');
    }
  }
  if (b.has(2) && !b.get(2).is_none()) {
    std::vector<Value> seps = iterate(b.get(2));
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      throw EvalError("tojson(): separators must be a pair of strings");
    }
    o.item_separator = seps[0].as_string();
    o.key_separator = seps[1].as_string();
  }
  o.sort_keys = truthy(b.get_or(3, Value(false)));
  std::string out = dumps(v, o);
  rt.check_string_size(out.size());
  return Value(std::move(out));
}

Value f_trim(Runtime&, const Value& v, CallArgs& a) {
  BoundArgs b("trim", a, {"chars"});
  return same_markup(v, pystr::strip(to_str(v), true, true, b.get_str(0)));
}

struct NamedFilter {
  const char* name;
  FilterFn fn;
};

constexpr NamedFilter kFilters[] = {
    {"abs", f_abs},
    {"capitalize", f_capitalize},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
};

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const NamedFilter& f : kFilters) {
    if (name == f.name) return f.fn;
  }
  return nullptr;
}

}  // namespace ferry::text::jinja
