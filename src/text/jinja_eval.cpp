// Expressions, with Python's operator semantics and jinja2's sandboxed
// attribute/item lookup: a missing key, attribute or index is Undefined, and
// only using an Undefined (calling it, reading its attributes, arithmetic)
// is an error.
#include <cmath>
#include <limits>

#include "text/jinja_builtins.h"
#include "text/jinja_runtime.h"
#include "text/jinja_strings.h"

namespace ferry::text::jinja {
namespace {

std::string owner_repr(const Value& obj) {
  return obj.is_none() ? "'None'" : "'" + type_name(obj) + " object'";
}

Value no_attribute(const Value& obj, std::string_view name) {
  return Value::undefined(owner_repr(obj) + " has no attribute '" + std::string(name) + "'");
}

[[noreturn]] void bad_operands(std::string_view op, const Value& a, const Value& b) {
  throw EvalError("unsupported operand type(s) for " + std::string(op) + ": '" + type_name(a) +
                  "' and '" + type_name(b) + "'");
}

[[noreturn]] void overflow() {
  throw EvalError("integer overflow (Python's unbounded integers are not supported)");
}

// Checked int64 arithmetic; Python's ints are unbounded, ferry's are not.
template <typename Op>
std::int64_t checked(Op op, std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (op(a, b, &r)) overflow();
  return r;
}
bool add_ovf(std::int64_t a, std::int64_t b, std::int64_t* r) {
  return __builtin_add_overflow(a, b, r);
}
bool sub_ovf(std::int64_t a, std::int64_t b, std::int64_t* r) {
  return __builtin_sub_overflow(a, b, r);
}
bool mul_ovf(std::int64_t a, std::int64_t b, std::int64_t* r) {
  return __builtin_mul_overflow(a, b, r);
}

// Python's float floor division and modulo (Objects/floatobject.c).
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  if (wx == 0.0) throw EvalError("float division by zero");
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

Value repeat(Runtime& rt, const Value& seq, std::int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<std::uint64_t>(n) > rt.options().max_output_bytes / s.size()) {
      rt.check_string_size(rt.options().max_output_bytes + 1);
    }
    std::string out;
    for (std::int64_t i = 0; i < n; ++i) out += s;
    return seq.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
  }
  const auto& items = seq.list().items;
  if (!items.empty() &&
      static_cast<std::uint64_t>(n) > rt.options().max_list_items / items.size()) {
    rt.check_list_size(rt.options().max_list_items + 1);
  }
  std::vector<Value> out;
  for (std::int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value add(Runtime& rt, const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_double() + b.as_double());
    return Value(checked(add_ovf, a.as_int(), b.as_int()));
  }
  if (a.is_string() && b.is_string()) {
    rt.check_string_size(a.as_string().size() + b.as_string().size());
    if (a.is_markup() == b.is_markup()) {
      std::string s = a.as_string() + b.as_string();
      return a.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
    }
    // markupsafe: the plain side is escaped, the result is Markup.
    std::string l = a.is_markup() ? a.as_string() : pystr::escape_html(a.as_string());
    std::string r = b.is_markup() ? b.as_string() : pystr::escape_html(b.as_string());
    return Value::markup(l + r);
  }
  if (a.is_plain_sequence() && b.is_plain_sequence() && a.is_tuple() == b.is_tuple()) {
    std::vector<Value> items = a.list().items;
    rt.check_list_size(items.size() + b.list().items.size());
    items.insert(items.end(), b.list().items.begin(), b.list().items.end());
    return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  if (a.is_string()) {
    throw EvalError("can only concatenate str (not \"" + type_name(b) + "\") to str");
  }
  bad_operands("+", a, b);
}

Value arith(const Value& a, const Value& b, std::string_view op) {
  if (!a.is_number() || !b.is_number()) bad_operands(op, a, b);
  bool is_float = a.is_float() || b.is_float();
  if (op == "/") {
    if (b.as_double() == 0.0) throw EvalError("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (is_float) {
    double x = a.as_double(), y = b.as_double();
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "**") {
      if (x == 0.0 && y < 0) throw EvalError("0.0 cannot be raised to a negative power");
      if (x < 0 && y != std::floor(y)) throw EvalError("complex results are not supported");
      return Value(std::pow(x, y));
    }
    double fd = 0, mod = 0;
    float_divmod(x, y, fd, mod);
    return Value(op == "//" ? fd : mod);
  }
  std::int64_t x = a.as_int(), y = b.as_int();
  if (op == "-") return Value(checked(sub_ovf, x, y));
  if (op == "*") return Value(checked(mul_ovf, x, y));
  if (op == "**") {
    if (y < 0) {
      if (x == 0) throw EvalError("0.0 cannot be raised to a negative power");
      return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
    }
    std::int64_t result = 1;
    for (std::int64_t i = 0; i < y; ++i) {
      result = checked(mul_ovf, result, x);
      if (result == 0 || result == 1) break;
    }
    return Value(result);
  }
  if (y == 0) throw EvalError("integer division or modulo by zero");
  if (x == std::numeric_limits<std::int64_t>::min() && y == -1) overflow();
  std::int64_t q = x / y, m = x % y;
  if (m != 0 && ((m < 0) != (y < 0))) {
    q -= 1;
    m += y;
  }
  return Value(op == "//" ? q : m);
}

// Python's slice.indices(): the indices a[start:stop:step] selects.
std::vector<std::size_t> slice_indices(std::size_t n, const Value* start, const Value* stop,
                                       const Value* step) {
  std::int64_t st = step ? step->as_int() : 1;
  if (st == 0) throw EvalError("slice step cannot be zero");
  auto len = static_cast<std::int64_t>(n);
  std::int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? len : len - 1;
  auto clamp = [&](const Value* v, std::int64_t dflt) {
    if (!v) return dflt;
    std::int64_t i = v->as_int();
    if (i < 0) {
      i += len;
      return i < lower ? lower : i;
    }
    return i > upper ? upper : i;
  };
  std::int64_t b = clamp(start, st > 0 ? lower : upper);
  std::int64_t e = clamp(stop, st > 0 ? upper : lower);
  std::vector<std::size_t> out;
  for (std::int64_t i = b; st > 0 ? i < e : i > e; i += st)
    out.push_back(static_cast<std::size_t>(i));
  return out;
}

}  // namespace

Value binary_op(Runtime& rt, std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string l = to_str(a), r = to_str(b);
    rt.check_string_size(l.size() + r.size());
    return Value(l + r);
  }
  if (a.is_undefined()) throw EvalError(a.undefined_hint());
  if (b.is_undefined()) throw EvalError(b.undefined_hint());
  if (op == "+") return add(rt, a, b);
  if (op == "*") {
    auto seq = [](const Value& v) { return v.is_string() || v.is_plain_sequence(); };
    if (seq(a) && (b.is_int() || b.is_bool())) return repeat(rt, a, b.as_int());
    if (seq(b) && (a.is_int() || a.is_bool())) return repeat(rt, b, a.as_int());
  }
  if (op == "%" && a.is_string()) throw EvalError("string formatting with '%' is not supported");
  return arith(a, b, op);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        throw EvalError("'in <string>' requires string as left operand, not " + type_name(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList: {
      const ListData& l = container.list();
      std::size_t from = container.is_generator() ? l.cursor : 0;
      for (std::size_t i = from; i < l.items.size(); ++i) {
        if (equals(l.items[i], item)) {
          if (container.is_generator()) l.cursor = i + 1;
          return true;
        }
      }
      if (container.is_generator()) l.cursor = l.items.size();
      return false;
    }
    case Value::Kind::kDict:
      if (container.is_mapping())
        return item.is_string() && container.dict().find(item.as_string());
      break;
    default:
      break;
  }
  throw EvalError("argument of type '" + type_name(container) + "' is not iterable");
}

Value Runtime::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) throw EvalError(obj.undefined_hint());
  if (name.rfind("__", 0) == 0) {
    return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) +
                            "' object is unsafe.");
  }
  if (obj.is_dict()) {
    if (obj.is_mapping()) {
      if (auto m = find_method(obj, name)) return *m;
    }
    if (const Value* v = obj.dict().find(name)) return *v;
    return no_attribute(obj, name);
  }
  if (auto m = find_method(obj, name)) return *m;
  return no_attribute(obj, name);
}

Value Runtime::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) throw EvalError(obj.undefined_hint());
  bool indexable =
      obj.is_string() ||
      (obj.is_list() && (obj.is_plain_sequence() || obj.list().type == ListData::Type::kRange));
  if (indexable && (key.is_int() || key.is_bool())) {
    std::int64_t i = key.as_int();
    if (obj.is_list()) {
      auto n = static_cast<std::int64_t>(obj.list().items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list().items[static_cast<std::size_t>(i)];
    } else {
      std::u32string s = pystr::decode(obj.as_string());
      auto n = static_cast<std::int64_t>(s.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        std::string ch;
        pystr::append_utf8(ch, s[static_cast<std::size_t>(i)]);
        return obj.is_markup() ? Value::markup(std::move(ch)) : Value(std::move(ch));
      }
    }
    return Value::undefined(owner_repr(obj) + " has no element " + std::to_string(key.as_int()));
  }
  if (key.is_string()) {
    if (obj.is_mapping()) {
      if (const Value* v = obj.dict().find(key.as_string())) return *v;
    }
    return get_attr(obj, key.as_string());
  }
  return Value::undefined(owner_repr(obj) + " has no element " + repr(key));
}

Value Runtime::lookup(const std::string& name, const Frame& frame) const {
  for (const Frame* f = &frame; f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  if (context_.is_mapping()) {
    if (const Value* v = context_.dict().find(name)) return *v;
  }
  if (const Value* v = globals().find(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

Value Runtime::eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
  try {
    step();
    return eval_inner(e, frame);
  } catch (EvalError& err) {
    if (!err.has_offset) {
      err.offset = e.offset;
      err.has_offset = true;
    }
    throw;
  }
}

CallArgs Runtime::eval_args(const Expr& e, std::size_t first, const std::shared_ptr<Frame>& frame) {
  CallArgs args;
  for (std::size_t i = first; i < e.items.size(); ++i)
    args.args.push_back(eval(*e.items[i], frame));
  for (const Keyword& k : e.keywords) args.kwargs.emplace_back(k.name, eval(*k.value, frame));
  return args;
}

Value Runtime::eval_inner(const Expr& e, const std::shared_ptr<Frame>& frame) {
  switch (e.kind) {
    case Expr::Kind::kConst:
      return e.constant;
    case Expr::Kind::kName:
      return lookup(e.name, *frame);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const ExprPtr& item : e.items) items.push_back(eval(*item, frame));
      return e.kind == Expr::Kind::kList ? Value::list(std::move(items))
                                         : Value::tuple(std::move(items));
    }
    case Expr::Kind::kDict: {
      auto d = std::make_shared<DictData>();
      for (std::size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value key = eval(*e.items[i], frame);
        if (!key.is_string()) throw EvalError("dict keys other than strings are not supported");
        d->set(key.as_string(), eval(*e.items[i + 1], frame));
      }
      return Value::dict(std::move(d));
    }
    case Expr::Kind::kAttr:
      return get_attr(eval(*e.items[0], frame), e.name);
    case Expr::Kind::kItem:
      return get_item(eval(*e.items[0], frame), eval(*e.items[1], frame));
    case Expr::Kind::kSlice:
      return eval_slice(e, frame);
    case Expr::Kind::kCall: {
      Value fn = eval(*e.items[0], frame);
      CallArgs args = eval_args(e, 1, frame);
      return call(fn, args);
    }
    case Expr::Kind::kFilter: {
      Value subject = eval(*e.items[0], frame);
      CallArgs args = eval_args(e, 1, frame);
      return find_filter(e.name)(*this, subject, args);
    }
    case Expr::Kind::kTest: {
      Value subject = eval(*e.items[0], frame);
      CallArgs args = eval_args(e, 1, frame);
      return Value(find_test(e.name)(*this, subject, args));
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      Value v = eval(*e.items[0], frame);
      if (v.is_undefined()) throw EvalError(v.undefined_hint());
      if (!v.is_number()) {
        throw EvalError("bad operand type for unary " +
                        std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" + type_name(v) +
                        "'");
      }
      if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_double());
      return Value(checked(sub_ovf, 0, v.as_int()));
    }
    case Expr::Kind::kNot:
      return Value(!truthy(eval(*e.items[0], frame)));
    case Expr::Kind::kBinary:
      return binary_op(*this, e.name, eval(*e.items[0], frame), eval(*e.items[1], frame));
    case Expr::Kind::kCompare:
      return eval_compare(e, frame);
    case Expr::Kind::kAnd: {
      Value a = eval(*e.items[0], frame);
      return truthy(a) ? eval(*e.items[1], frame) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.items[0], frame);
      return truthy(a) ? a : eval(*e.items[1], frame);
    }
    case Expr::Kind::kCondition:
      if (truthy(eval(*e.items[0], frame))) return eval(*e.items[1], frame);
      if (e.items[2]) return eval(*e.items[2], frame);
      return Value::undefined(
          "the inline if-expression evaluated to false and no else section was defined");
  }
  throw EvalError("unknown expression");
}

Value Runtime::eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame) {
  Value left = eval(*e.items[0], frame);
  for (std::size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i + 1], frame);
    const std::string& op = e.ops[i];
    bool ok = false;
    if (op == "==") {
      ok = equals(left, right);
    } else if (op == "!=") {
      ok = !equals(left, right);
    } else if (op == "in" || op == "notin") {
      ok = contains(right, left) == (op == "in");
    } else {
      int c = compare(left, right, op);
      ok = op == "<"    ? c == -1
           : op == "<=" ? (c == -1 || c == 0)
           : op == ">"  ? c == 1
                        : (c == 1 || c == 0);
    }
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Runtime::eval_slice(const Expr& e, const std::shared_ptr<Frame>& frame) {
  Value target = eval(*e.items[0], frame);
  Value parts[3];
  const Value* ptrs[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < 3; ++i) {
    if (!e.items[i + 1]) continue;
    parts[i] = eval(*e.items[i + 1], frame);
    if (parts[i].is_none()) continue;
    if (!parts[i].is_int() && !parts[i].is_bool()) {
      throw EvalError("slice indices must be integers or None");
    }
    ptrs[i] = &parts[i];
  }
  if (target.is_undefined()) throw EvalError(target.undefined_hint());
  if (target.is_plain_sequence() ||
      (target.is_list() && target.list().type == ListData::Type::kRange)) {
    const auto& items = target.list().items;
    std::vector<Value> out;
    for (std::size_t i : slice_indices(items.size(), ptrs[0], ptrs[1], ptrs[2]))
      out.push_back(items[i]);
    return Value::sequence(std::move(out), target.list().type);
  }
  if (target.is_string()) {
    std::u32string s = pystr::decode(target.as_string());
    std::string out;
    for (std::size_t i : slice_indices(s.size(), ptrs[0], ptrs[1], ptrs[2]))
      pystr::append_utf8(out, s[i]);
    return target.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
  }
  // Slicing a dict raises (unhashable slice); jinja2 turns the TypeError of
  // other objects into Undefined.
  if (target.is_dict()) throw EvalError("cannot slice a '" + type_name(target) + "' object");
  return Value::undefined(owner_repr(target) + " has no element slice");
}

}  // namespace ferry::text::jinja
