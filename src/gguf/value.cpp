// Typed access to GGUF metadata values and the File lookups. Errors name the
// key, and the file when called through File.
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/quote.h"

namespace ferry::gguf {
namespace {

using internal::quoted;

constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Where an accessor error points: "PATH: key 'K'" or just "key 'K'".
struct Where {
  std::string_view path;
  std::string_view key;
};

template <typename... Args>
[[noreturn]] void value_error(Where w, Args&&... args) {
  if (w.path.empty()) fail("gguf", "key ", quoted(w.key), ": ", std::forward<Args>(args)...);
  fail("gguf", w.path, ": key ", quoted(w.key), ": ", std::forward<Args>(args)...);
}

bool is_int_type(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::U16:
    case ValueType::I16:
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::U64:
    case ValueType::I64:
      return true;
    default:
      return false;
  }
}

bool is_number_type(ValueType t) {
  return is_int_type(t) || t == ValueType::F32 || t == ValueType::F64;
}

std::string describe(const Value& v) {
  if (const auto* a = std::get_if<Array>(&v.v)) {
    return "array of " + std::string(value_type_name(a->elem_type));
  }
  return std::string(value_type_name(v.type));
}

int64_t to_int(const Value& v, Where w) {
  if (const auto* i = std::get_if<int64_t>(&v.v)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v.v)) {
    if (*u > kMaxInt64) value_error(w, "value ", *u, " does not fit in int64");
    return static_cast<int64_t>(*u);
  }
  value_error(w, "expected an integer, got ", describe(v));
}

uint64_t to_uint(const Value& v, Where w) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.v)) {
    if (*i < 0) value_error(w, "value ", *i, " is negative, expected an unsigned integer");
    return static_cast<uint64_t>(*i);
  }
  value_error(w, "expected an unsigned integer, got ", describe(v));
}

double to_float(const Value& v, Where w) {
  if (const auto* d = std::get_if<double>(&v.v)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v.v)) return static_cast<double>(*i);
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return static_cast<double>(*u);
  value_error(w, "expected a number, got ", describe(v));
}

bool to_bool(const Value& v, Where w) {
  if (const auto* b = std::get_if<bool>(&v.v)) return *b;
  value_error(w, "expected a bool, got ", describe(v));
}

const std::string& to_string(const Value& v, Where w) {
  if (const auto* s = std::get_if<std::string>(&v.v)) return *s;
  value_error(w, "expected a string, got ", describe(v));
}

const Array& to_array(const Value& v, Where w) {
  if (const auto* a = std::get_if<Array>(&v.v)) return *a;
  value_error(w, "expected an array, got ", describe(v));
}

}  // namespace

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "unknown";
}

// --- Value -------------------------------------------------------------------

int64_t Value::as_int(std::string_view key) const {
  return to_int(*this, {{}, key});
}
uint64_t Value::as_uint(std::string_view key) const {
  return to_uint(*this, {{}, key});
}
double Value::as_float(std::string_view key) const {
  return to_float(*this, {{}, key});
}
bool Value::as_bool(std::string_view key) const {
  return to_bool(*this, {{}, key});
}
const std::string& Value::as_string(std::string_view key) const {
  return to_string(*this, {{}, key});
}
const Array& Value::as_array(std::string_view key) const {
  return to_array(*this, {{}, key});
}

uint64_t TensorInfo::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// --- File: lookups -------------------------------------------------------------

const Value* File::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const Value& File::get(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) fail("gguf", path_, ": missing metadata key ", quoted(key));
  return *v;
}

int64_t File::get_int(std::string_view key, std::optional<int64_t> dflt) const {
  const Value* v = find(key);
  if (v == nullptr && dflt) return *dflt;
  return to_int(get(key), {path_, key});
}

double File::get_float(std::string_view key, std::optional<double> dflt) const {
  const Value* v = find(key);
  if (v == nullptr && dflt) return *dflt;
  return to_float(get(key), {path_, key});
}

std::string File::get_string(std::string_view key, std::optional<std::string> dflt) const {
  const Value* v = find(key);
  if (v == nullptr && dflt) return *std::move(dflt);
  return to_string(get(key), {path_, key});
}

bool File::get_bool(std::string_view key, std::optional<bool> dflt) const {
  const Value* v = find(key);
  if (v == nullptr && dflt) return *dflt;
  return to_bool(get(key), {path_, key});
}

std::vector<std::string> File::get_string_array(std::string_view key) const {
  const Where w{path_, key};
  const Array& a = to_array(get(key), w);
  if (a.elem_type != ValueType::STRING) {
    value_error(w, "expected an array of strings, got array of ", value_type_name(a.elem_type));
  }
  std::vector<std::string> out;
  out.reserve(a.items.size());
  for (const Value& item : a.items) out.push_back(to_string(item, w));
  return out;
}

std::vector<int64_t> File::get_int_array(std::string_view key) const {
  const Where w{path_, key};
  const Array& a = to_array(get(key), w);
  if (!is_int_type(a.elem_type)) {
    value_error(w, "expected an array of integers, got array of ", value_type_name(a.elem_type));
  }
  std::vector<int64_t> out;
  out.reserve(a.items.size());
  for (const Value& item : a.items) out.push_back(to_int(item, w));
  return out;
}

std::vector<double> File::get_float_array(std::string_view key) const {
  const Where w{path_, key};
  const Array& a = to_array(get(key), w);
  if (!is_number_type(a.elem_type)) {
    value_error(w, "expected an array of numbers, got array of ", value_type_name(a.elem_type));
  }
  std::vector<double> out;
  out.reserve(a.items.size());
  for (const Value& item : a.items) out.push_back(to_float(item, w));
  return out;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) fail("gguf", path_, ": missing tensor ", quoted(name));
  return *t;
}

}  // namespace ferry::gguf
