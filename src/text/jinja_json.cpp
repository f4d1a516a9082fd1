#include "text/jinja_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "text/jinja_strings.h"

namespace ferry::text::jinja {
namespace {

void dump_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  auto hex4 = [&](unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "\\u%04x", v);
    out += buf;
  };
  for (char32_t c : pystr::decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        char32_t v = c - 0x10000;
        hex4(0xD800 + static_cast<unsigned>(v >> 10));
        hex4(0xDC00 + static_cast<unsigned>(v & 0x3FF));
      } else {
        hex4(static_cast<unsigned>(c));
      }
      continue;
    }
    pystr::append_utf8(out, c);
  }
  out.push_back('"');
}

struct Dumper {
  const JsonDumpOptions& opt;
  std::string item_sep;
  std::string key_sep;
  std::string out;

  void newline(int level) {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *opt.indent;
  }

  void dump(const Value& v, int level) {
    if (level > 200) throw EvalError("tojson: value nested too deeply");
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat: {
        double d = v.as_double();
        if (std::isnan(d))
          out += "NaN";
        else if (std::isinf(d))
          out += d < 0 ? "-Infinity" : "Infinity";
        else
          out += pystr::float_repr(d);
        return;
      }
      case Value::Kind::kString:
        dump_string(v.as_string(), opt.ensure_ascii, out);
        return;
      case Value::Kind::kList: {
        if (!v.is_plain_sequence()) break;
        const auto& items = v.list().items;
        if (items.empty()) {
          out += "[]";
          return;
        }
        out.push_back('[');
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (opt.indent) newline(level + 1);
          dump(items[i], level + 1);
        }
        if (opt.indent) newline(level);
        out.push_back(']');
        return;
      }
      case Value::Kind::kDict: {
        if (v.dict().type() != DictData::Type::kDict) break;
        std::vector<const std::pair<std::string, Value>*> entries;
        for (const auto& e : v.dict().entries()) entries.push_back(&e);
        if (entries.empty()) {
          out += "{}";
          return;
        }
        if (opt.sort_keys) {
          std::stable_sort(entries.begin(), entries.end(),
                           [](auto* a, auto* b) { return a->first < b->first; });
        }
        out.push_back('{');
        for (std::size_t i = 0; i < entries.size(); ++i) {
          if (i) out += item_sep;
          if (opt.indent) newline(level + 1);
          dump_string(entries[i]->first, opt.ensure_ascii, out);
          out += key_sep;
          dump(entries[i]->second, level + 1);
        }
        if (opt.indent) newline(level);
        out.push_back('}');
        return;
      }
      default:
        break;
    }
    throw EvalError("Object of type " + type_name(v) + " is not JSON serializable");
  }
};

template <typename Json>
Value convert(const Json& j, int depth) {
  if (depth > 200) throw Error("[jinja] JSON value nested too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(static_cast<std::int64_t>(j.template get<std::int64_t>()));
    case nlohmann::json::value_t::number_unsigned: {
      auto u = j.template get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) throw Error("[jinja] JSON integer too large");
      return Value(static_cast<std::int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string: {
      const auto& s = j.template get_ref<const std::string&>();
      if (!pystr::valid_utf8(s)) throw Error("[jinja] JSON string is not valid UTF-8");
      return Value(s);
    }
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(convert(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = std::make_shared<DictData>();
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!pystr::valid_utf8(it.key())) throw Error("[jinja] JSON key is not valid UTF-8");
        d->set(it.key(), convert(it.value(), depth + 1));
      }
      return Value::dict(std::move(d));
    }
    default:
      throw Error("[jinja] unsupported JSON value (binary or discarded)");
  }
}

}  // namespace

std::string dumps(const Value& v, const JsonDumpOptions& options) {
  Dumper d{options,
           options.item_separator.value_or(options.indent ? "," : ", "),
           options.key_separator.value_or(": "),
           {}};
  d.dump(v, 0);
  return std::move(d.out);
}

Value from_json(const nlohmann::ordered_json& j) {
  return convert(j, 0);
}
Value from_json(const nlohmann::json& j) {
  return convert(j, 0);
}

}  // namespace ferry::text::jinja
