// JSON in and out of the Jinja value model.
//
// dumps() is Python's json.dumps as transformers' `tojson` filter calls it
// (ensure_ascii=False, indent=None, separators=None, sort_keys=False by
// default), not Jinja's HTML-escaping built-in.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja_value.h"

namespace ferry::text::jinja {

struct JsonDumpOptions {
  // nullopt: one line. Otherwise newlines and this string per nesting level
  // (json.dumps' indent=N is N spaces; indent=0 still breaks lines).
  std::optional<std::string> indent;
  bool ensure_ascii = false;
  // nullopt: json.dumps' defaults, (", ", ": ") or ("," , ": ") with indent.
  std::optional<std::string> item_separator;
  std::optional<std::string> key_separator;
  bool sort_keys = false;
};

std::string dumps(const Value& v, const JsonDumpOptions& options);

// Objects keep the order of the input (use ordered_json to keep a document's
// order; nlohmann::json has already sorted its keys).
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);

}  // namespace ferry::text::jinja
