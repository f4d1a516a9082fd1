// GGUF reader: memory-maps a file (versions 2 and 3) and exposes its
// metadata and tensor table. Every offset and count is validated against the
// mapping before use; a malformed file throws ferry::Error naming the file,
// the key or tensor, and the problem. Tensor data is never copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"

namespace ferry::gguf {

// GGUF metadata value type ids.
enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
// Lower-case name of a value type ("u32", "string", ...); "unknown" otherwise.
std::string_view value_type_name(ValueType t);

struct Value;
// Arrays hold their element type (arrays of arrays are allowed by the format).
struct Array {
  ValueType elem_type;
  std::vector<Value> items;
};

struct Value {
  ValueType type;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> v;

  // Typed accessors: throw ferry::Error naming `key` if the type does not fit.
  // Integer accessors accept any integer type whose value fits.
  int64_t as_int(std::string_view key) const;
  uint64_t as_uint(std::string_view key) const;
  double as_float(std::string_view key) const;  // F32/F64 (or integers)
  bool as_bool(std::string_view key) const;
  const std::string& as_string(std::string_view key) const;
  const Array& as_array(std::string_view key) const;
};

// After parsing, every tensor has 1..4 nonzero dims with an element count
// that fits in int64, a supported type with shape[0] a whole number of blocks,
// an offset that is a multiple of the alignment, and data lying entirely
// inside the file without sharing bytes with another tensor.
struct TensorInfo {
  std::string name;
  std::vector<uint64_t> shape;  // GGUF order: shape[0] is the contiguous dim
  DType type;
  uint64_t offset;  // relative to the data section
  size_t n_bytes;
  const uint8_t* data;  // points into the mapping
  uint64_t n_elements() const;
};

class File {
 public:
  // Opens and validates `path`. Throws ferry::Error on any problem.
  static std::unique_ptr<File> open(const std::string& path);
  // Parses an in-memory image (for tests and the fuzzer); `bytes` must
  // outlive the File. `name` is used in error messages.
  static std::unique_ptr<File> parse(std::span<const uint8_t> bytes, std::string name);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Absolute byte offset of the data section (tensor offsets are relative to it).
  uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, Value, std::less<>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  // Throw "[gguf] PATH: missing metadata key 'KEY'" when absent.
  const Value& get(std::string_view key) const;
  // Convenience typed getters with defaults.
  int64_t get_int(std::string_view key, std::optional<int64_t> dflt = std::nullopt) const;
  double get_float(std::string_view key, std::optional<double> dflt = std::nullopt) const;
  std::string get_string(std::string_view key,
                         std::optional<std::string> dflt = std::nullopt) const;
  bool get_bool(std::string_view key, std::optional<bool> dflt = std::nullopt) const;
  // Array of strings / integers / floats (throws on type mismatch).
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Throws "[gguf] PATH: missing tensor 'NAME'" when absent.
  const TensorInfo& tensor(std::string_view name) const;

 private:
  File() = default;
  void parse_all(std::span<const uint8_t> bytes);

  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, Value, std::less<>> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  // Owns the mapping when opened from a path.
  void* map_ = nullptr;
  size_t map_size_ = 0;
};

}  // namespace ferry::gguf
