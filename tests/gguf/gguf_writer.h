// Test-only GGUF writer: builds small GGUF images in memory, valid or
// deliberately broken, for the reader's tests and any test that needs a tiny
// model file. It is written from the format description, independently of the
// reader, and checks nothing: every header field can be overridden and values
// can be written as raw bytes.
//
// Layout written (all integers little-endian):
//   magic | version | tensor_count | kv_count | kvs | tensor infos
//   | zero padding to `alignment` | data section
// Each tensor's bytes go at its offset in the data section (by default the
// next multiple of `alignment` after the previous tensor's end). Nothing
// follows the last tensor's bytes, so cutting the image anywhere breaks it.
//
//   GgufWriter w;
//   w.add_string("general.architecture", "llama").add_u32("llama.block_count", 2);
//   w.add_tensor_f32("norm.weight", {4}, {1, 2, 3, 4});
//   std::vector<uint8_t> image = w.bytes();
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"

namespace ferry::test {

// Builders for metadata values, including nested arrays:
//   gv::array(ValueType::ARRAY, {gv::array(ValueType::U8, {gv::u8(1)})})
namespace gv {
using gguf::Value;
using gguf::ValueType;
template <typename T>
Value make(ValueType t, T x) {
  return Value{t, decltype(Value::v)(std::in_place_type<T>, std::move(x))};
}
inline Value u8(uint8_t x) {
  return make<uint64_t>(ValueType::U8, x);
}
inline Value i8(int8_t x) {
  return make<int64_t>(ValueType::I8, x);
}
inline Value u16(uint16_t x) {
  return make<uint64_t>(ValueType::U16, x);
}
inline Value i16(int16_t x) {
  return make<int64_t>(ValueType::I16, x);
}
inline Value u32(uint32_t x) {
  return make<uint64_t>(ValueType::U32, x);
}
inline Value i32(int32_t x) {
  return make<int64_t>(ValueType::I32, x);
}
inline Value u64(uint64_t x) {
  return make<uint64_t>(ValueType::U64, x);
}
inline Value i64(int64_t x) {
  return make<int64_t>(ValueType::I64, x);
}
inline Value f32(float x) {
  return make<double>(ValueType::F32, x);
}
inline Value f64(double x) {
  return make<double>(ValueType::F64, x);
}
inline Value boolean(bool x) {
  return make<bool>(ValueType::BOOL, x);
}
inline Value str(std::string x) {
  return make<std::string>(ValueType::STRING, std::move(x));
}
// Items are encoded by their own type; they should all be of `elem`.
inline Value array(ValueType elem, std::vector<Value> items) {
  return make<gguf::Array>(ValueType::ARRAY, gguf::Array{elem, std::move(items)});
}
}  // namespace gv

class GgufWriter {
 public:
  using Value = gguf::Value;
  using ValueType = gguf::ValueType;

  // Header fields; public so a test can break them.
  std::array<char, 4> magic = {'G', 'G', 'U', 'F'};
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;  // written instead of the real count
  std::optional<uint64_t> kv_count;      // written instead of the real count
  // Alignment used to lay out the data section. set_alignment() also writes
  // general.alignment; tests of a bad key add it with add_u32 instead.
  uint64_t alignment = 32;

  explicit GgufWriter(uint32_t v = 3) : version(v) {}

  GgufWriter& set_alignment(uint32_t a) {
    alignment = a;
    return add_u32("general.alignment", a);
  }

  // --- Metadata -------------------------------------------------------------
  GgufWriter& add(std::string key, const Value& v) {
    std::vector<uint8_t> payload;
    put_value(payload, v);
    return add_raw(std::move(key), static_cast<uint32_t>(v.type), std::move(payload));
  }
  // Writes key, the type id and `payload` verbatim (for malformed values).
  GgufWriter& add_raw(std::string key, uint32_t type, std::vector<uint8_t> payload) {
    kvs_.push_back({std::move(key), type, std::move(payload)});
    return *this;
  }
  GgufWriter& add_u8(std::string k, uint8_t x) { return add(std::move(k), gv::u8(x)); }
  GgufWriter& add_i8(std::string k, int8_t x) { return add(std::move(k), gv::i8(x)); }
  GgufWriter& add_u16(std::string k, uint16_t x) { return add(std::move(k), gv::u16(x)); }
  GgufWriter& add_i16(std::string k, int16_t x) { return add(std::move(k), gv::i16(x)); }
  GgufWriter& add_u32(std::string k, uint32_t x) { return add(std::move(k), gv::u32(x)); }
  GgufWriter& add_i32(std::string k, int32_t x) { return add(std::move(k), gv::i32(x)); }
  GgufWriter& add_u64(std::string k, uint64_t x) { return add(std::move(k), gv::u64(x)); }
  GgufWriter& add_i64(std::string k, int64_t x) { return add(std::move(k), gv::i64(x)); }
  GgufWriter& add_f32(std::string k, float x) { return add(std::move(k), gv::f32(x)); }
  GgufWriter& add_f64(std::string k, double x) { return add(std::move(k), gv::f64(x)); }
  GgufWriter& add_bool(std::string k, bool x) { return add(std::move(k), gv::boolean(x)); }
  GgufWriter& add_string(std::string k, std::string x) {
    return add(std::move(k), gv::str(std::move(x)));
  }
  GgufWriter& add_string_array(std::string k, const std::vector<std::string>& xs) {
    std::vector<Value> items;
    for (const std::string& x : xs) items.push_back(gv::str(x));
    return add(std::move(k), gv::array(ValueType::STRING, std::move(items)));
  }
  GgufWriter& add_i32_array(std::string k, const std::vector<int32_t>& xs) {
    std::vector<Value> items;
    for (int32_t x : xs) items.push_back(gv::i32(x));
    return add(std::move(k), gv::array(ValueType::I32, std::move(items)));
  }
  GgufWriter& add_f32_array(std::string k, const std::vector<float>& xs) {
    std::vector<Value> items;
    for (float x : xs) items.push_back(gv::f32(x));
    return add(std::move(k), gv::array(ValueType::F32, std::move(items)));
  }

  // --- Tensors --------------------------------------------------------------
  // `shape` is in GGUF order (shape[0] contiguous); `ggml_type` any id; `data`
  // is written as given, whether or not it matches shape and type. `offset`
  // overrides the computed one. A tensor with empty `data` writes only its
  // info and does not grow the data section (for offsets meant to be wrong).
  GgufWriter& add_tensor(std::string name, std::vector<uint64_t> shape, uint32_t ggml_type,
                         std::vector<uint8_t> data, std::optional<uint64_t> offset = {}) {
    tensors_.push_back({std::move(name), std::move(shape), ggml_type, std::move(data), offset});
    return *this;
  }
  GgufWriter& add_tensor(std::string name, std::vector<uint64_t> shape, DType type,
                         std::vector<uint8_t> data, std::optional<uint64_t> offset = {}) {
    return add_tensor(std::move(name), std::move(shape), static_cast<uint32_t>(type),
                      std::move(data), offset);
  }
  GgufWriter& add_tensor_f32(std::string name, std::vector<uint64_t> shape,
                             const std::vector<float>& values) {
    std::vector<uint8_t> data;
    for (float f : values) put_le(data, std::bit_cast<uint32_t>(f), 4);
    return add_tensor(std::move(name), std::move(shape), DType::F32, std::move(data));
  }

  // --- Output ---------------------------------------------------------------
  std::vector<uint8_t> bytes() const { return build().bytes; }
  // Absolute offset of the data section in bytes().
  uint64_t data_offset() const { return build().data_offset; }
  // Offset of tensor `i` (in order added) relative to the data section.
  uint64_t tensor_offset(size_t i) const { return build().offsets.at(i); }
  void write_file(const std::string& path) const {
    const std::vector<uint8_t> b = bytes();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!f) throw std::runtime_error("GgufWriter: cannot write " + path);
  }

  // Little-endian encoders, public for tests that assemble raw payloads.
  static void put_le(std::vector<uint8_t>& out, uint64_t x, size_t n) {
    for (size_t i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(x >> (8 * i)));
  }
  static void put_string(std::vector<uint8_t>& out, const std::string& s) {
    put_le(out, s.size(), 8);
    out.insert(out.end(), s.begin(), s.end());
  }
  // Encodes a value without its type id (as inside a kv or an array).
  static void put_value(std::vector<uint8_t>& out, const Value& v) {
    switch (v.type) {
      case ValueType::U8:
        put_le(out, std::get<uint64_t>(v.v), 1);
        return;
      case ValueType::U16:
        put_le(out, std::get<uint64_t>(v.v), 2);
        return;
      case ValueType::U32:
        put_le(out, std::get<uint64_t>(v.v), 4);
        return;
      case ValueType::U64:
        put_le(out, std::get<uint64_t>(v.v), 8);
        return;
      case ValueType::I8:
        put_le(out, static_cast<uint64_t>(std::get<int64_t>(v.v)), 1);
        return;
      case ValueType::I16:
        put_le(out, static_cast<uint64_t>(std::get<int64_t>(v.v)), 2);
        return;
      case ValueType::I32:
        put_le(out, static_cast<uint64_t>(std::get<int64_t>(v.v)), 4);
        return;
      case ValueType::I64:
        put_le(out, static_cast<uint64_t>(std::get<int64_t>(v.v)), 8);
        return;
      case ValueType::F32:
        put_le(out, std::bit_cast<uint32_t>(static_cast<float>(std::get<double>(v.v))), 4);
        return;
      case ValueType::F64:
        put_le(out, std::bit_cast<uint64_t>(std::get<double>(v.v)), 8);
        return;
      case ValueType::BOOL:
        out.push_back(std::get<bool>(v.v) ? 1 : 0);
        return;
      case ValueType::STRING:
        put_string(out, std::get<std::string>(v.v));
        return;
      case ValueType::ARRAY: {
        const gguf::Array& a = std::get<gguf::Array>(v.v);
        put_le(out, static_cast<uint32_t>(a.elem_type), 4);
        put_le(out, a.items.size(), 8);
        for (const Value& item : a.items) put_value(out, item);
        return;
      }
    }
    throw std::invalid_argument("GgufWriter: unknown value type");
  }

 private:
  struct Kv {
    std::string key;
    uint32_t type;
    std::vector<uint8_t> payload;
  };
  struct Tensor {
    std::string name;
    std::vector<uint64_t> shape;
    uint32_t type;
    std::vector<uint8_t> data;
    std::optional<uint64_t> offset;
  };
  struct Built {
    std::vector<uint8_t> bytes;
    uint64_t data_offset;
    std::vector<uint64_t> offsets;
  };

  static uint64_t align_up(uint64_t x, uint64_t a) { return a == 0 ? x : (x + a - 1) / a * a; }

  Built build() const {
    Built b;
    // Resolve offsets first: they are relative, so independent of the header size.
    uint64_t data_size = 0;
    for (const Tensor& t : tensors_) {
      const uint64_t off = t.offset ? *t.offset : align_up(data_size, alignment);
      b.offsets.push_back(off);
      if (!t.data.empty()) data_size = std::max(data_size, off + t.data.size());
    }
    std::vector<uint8_t>& out = b.bytes;
    out.insert(out.end(), magic.begin(), magic.end());
    put_le(out, version, 4);
    put_le(out, tensor_count.value_or(tensors_.size()), 8);
    put_le(out, kv_count.value_or(kvs_.size()), 8);
    for (const Kv& kv : kvs_) {
      put_string(out, kv.key);
      put_le(out, kv.type, 4);
      out.insert(out.end(), kv.payload.begin(), kv.payload.end());
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      put_string(out, t.name);
      put_le(out, t.shape.size(), 4);
      for (uint64_t d : t.shape) put_le(out, d, 8);
      put_le(out, t.type, 4);
      put_le(out, b.offsets[i], 8);
    }
    b.data_offset = align_up(out.size(), alignment);
    if (tensors_.empty()) return b;  // no padding after the infos when there is no data
    out.resize(b.data_offset + data_size, 0);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      if (!t.data.empty()) {
        std::memcpy(out.data() + b.data_offset + b.offsets[i], t.data.data(), t.data.size());
      }
    }
    return b;
  }

  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace ferry::test
