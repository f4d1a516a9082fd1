#include "text/jinja_value.h"

#include "text/jinja_strings.h"

namespace ferry::text::jinja {

const Value* DictData::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void DictData::set(std::string key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

void DictData::clear() {
  // Move the entries out first: destroying them may re-enter this object.
  auto doomed = std::move(entries_);
  entries_.clear();
  index_.clear();
}

Value::Value(std::string s)
    : kind_(Kind::kString), ptr_(std::make_shared<std::string>(std::move(s))) {}

Value Value::undefined(std::string hint) {
  Value v;
  v.ptr_ = std::make_shared<std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

Value Value::sequence(std::vector<Value> items, ListData::Type type) {
  Value v;
  v.kind_ = Kind::kList;
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->type = type;
  v.ptr_ = std::move(data);
  return v;
}

Value Value::list(std::vector<Value> items) {
  return sequence(std::move(items), ListData::Type::kList);
}

Value Value::tuple(std::vector<Value> items) {
  return sequence(std::move(items), ListData::Type::kTuple);
}

Value Value::dict(std::shared_ptr<DictData> d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.ptr_ = std::move(d);
  return v;
}

Value Value::callable(std::string name, std::function<Value(Runtime&, CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.ptr_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

const std::string& Value::undefined_hint() const {
  static const std::string kNoHint = "value is undefined";
  return ptr_ ? *static_cast<const std::string*>(ptr_.get()) : kNoHint;
}

DictData& Value::mutable_namespace() const {
  if (!is_namespace()) throw EvalError("cannot assign attribute on non-namespace object");
  return *static_cast<DictData*>(ptr_.get());
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_double() != 0.0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kList:
      return v.is_generator() || !v.list().items.empty();
    case Value::Kind::kDict:
      return v.dict().type() != DictData::Type::kDict || v.dict().size() != 0;
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return v.is_markup() ? "Markup" : "str";
    case Value::Kind::kList:
      switch (v.list().type) {
        case ListData::Type::kList:
          return "list";
        case ListData::Type::kTuple:
          return "tuple";
        case ListData::Type::kRange:
          return "range";
        case ListData::Type::kView:
          return "dict view";
        case ListData::Type::kGenerator:
          return "generator";
      }
      break;
    case Value::Kind::kDict:
      switch (v.dict().type()) {
        case DictData::Type::kDict:
          return "dict";
        case DictData::Type::kNamespace:
          return "Namespace";
        case DictData::Type::kLoop:
          return "LoopContext";
      }
      break;
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

namespace {

void repr_into(const Value& v, std::string& out, int depth) {
  if (depth > 200) throw EvalError("value nested too deeply to print");
  switch (v.kind()) {
    case Value::Kind::kString:
      if (v.is_markup())
        throw EvalError("printing a Markup string inside a container is not supported");
      out += pystr::repr(v.as_string());
      return;
    case Value::Kind::kList: {
      if (!v.is_plain_sequence()) {
        throw EvalError("printing a " + type_name(v) + " object is not supported");
      }
      const ListData& l = v.list();
      bool tuple = v.is_tuple();
      out += tuple ? '(' : '[';
      for (std::size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        repr_into(l.items[i], out, depth + 1);
      }
      if (tuple && l.items.size() == 1) out += ',';
      out += tuple ? ')' : ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict().type() != DictData::Type::kDict) {
        throw EvalError("printing a " + type_name(v) + " object is not supported");
      }
      out += '{';
      bool first = true;
      for (const auto& [k, item] : v.dict().entries()) {
        if (!first) out += ", ";
        first = false;
        out += pystr::repr(k);
        out += ": ";
        repr_into(item, out, depth + 1);
      }
      out += '}';
      return;
    }
    case Value::Kind::kUndefined:
      // Python's repr(Undefined) is "Undefined".
      out += "Undefined";
      return;
    default:
      out += to_str(v);
      return;
  }
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return pystr::float_repr(v.as_double());
    case Value::Kind::kString:
      return v.as_string();
    case Value::Kind::kList:
    case Value::Kind::kDict: {
      std::string out;
      repr_into(v, out, 0);
      return out;
    }
    case Value::Kind::kCallable:
      throw EvalError("printing the function '" + v.callable().name + "' is not supported");
  }
  return {};
}

std::string repr(const Value& v) {
  std::string out;
  repr_into(v, out, 0);
  return out;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const ListData& x = a.list();
      const ListData& y = b.list();
      if (a.is_generator() || b.is_generator()) return a.identity() == b.identity();
      if (x.type != y.type || x.items.size() != y.items.size()) return false;
      for (std::size_t i = 0; i < x.items.size(); ++i) {
        if (!equals(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().type() != DictData::Type::kDict || b.dict().type() != DictData::Type::kDict) {
        return a.identity() == b.identity();
      }
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, item] : a.dict().entries()) {
        const Value* other = b.dict().find(k);
        if (!other || !equals(item, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return a.identity() == b.identity();
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : x == y ? 0 : kUnordered;
    }
    std::int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined()) {
    throw EvalError((a.is_undefined() ? a : b).undefined_hint());
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order.
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_plain_sequence() && b.is_plain_sequence() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw EvalError("'" + std::string(op) + "' not supported between instances of '" + type_name(a) +
                  "' and '" + type_name(b) + "'");
}

}  // namespace ferry::text::jinja
