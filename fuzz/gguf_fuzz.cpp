// libFuzzer target for the GGUF reader. Any input must either parse or throw
// ferry::Error; everything else (a crash, a sanitizer report, another
// exception type, an allocation over libFuzzer's limit) is a finding.
// Build and run with tools/fuzz-gguf.sh.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"
#include "gguf/gguf.h"

namespace {

using ferry::gguf::Value;
using ferry::gguf::ValueType;

// Calls every accessor on `v` (and recursively on array items) and folds what
// comes back into `sink`, so the reads cannot be optimised away.
void touch(const Value& v, std::string_view key, uint64_t& sink) {
  auto attempt = [&](auto&& f) {
    try {
      f();
    } catch (const ferry::Error&) {
      ++sink;
    }
  };
  attempt([&] { sink += static_cast<uint64_t>(v.as_int(key)); });
  attempt([&] { sink += v.as_uint(key); });
  attempt([&] { sink += static_cast<uint64_t>(v.as_float(key) != 0.0); });
  attempt([&] { sink += v.as_bool(key) ? 1 : 0; });
  attempt([&] {
    const std::string& s = v.as_string(key);
    for (char c : s) sink += static_cast<unsigned char>(c);
  });
  attempt([&] {
    const ferry::gguf::Array& a = v.as_array(key);
    sink += static_cast<uint64_t>(a.elem_type);
    for (const Value& item : a.items) touch(item, key, sink);
  });
}

void touch_file(const ferry::gguf::File& f, uint64_t& sink) {
  for (const auto& entry : f.metadata()) {
    const std::string& key = entry.first;  // clang 14 cannot capture structured bindings
    touch(entry.second, key, sink);
    auto attempt = [&](auto&& fn) {
      try {
        fn();
      } catch (const ferry::Error&) {
        ++sink;
      }
    };
    attempt([&] { sink += static_cast<uint64_t>(f.get_int(key)); });
    attempt([&] { sink += static_cast<uint64_t>(f.get_float(key) != 0.0); });
    attempt([&] { sink += f.get_string(key).size(); });
    attempt([&] { sink += f.get_bool(key) ? 1 : 0; });
    attempt([&] { sink += f.get_string_array(key).size(); });
    attempt([&] { sink += f.get_int_array(key).size(); });
    attempt([&] { sink += f.get_float_array(key).size(); });
  }
  for (const ferry::gguf::TensorInfo& t : f.tensors()) {
    if (&f.tensor(t.name) != &t) __builtin_trap();  // the index must find each tensor
    sink += t.n_elements() + t.offset + static_cast<uint64_t>(t.type);
    // Read every byte: ASan reports any tensor that reaches past the input.
    for (size_t i = 0; i < t.n_bytes; ++i) sink += t.data[i];
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint64_t sink = 0;
  try {
    auto f = ferry::gguf::File::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
    touch_file(*f, sink);
  } catch (const ferry::Error&) {
  }
  // Keep `sink` observable without affecting control flow.
  asm volatile("" : : "r"(sink));
  return 0;
}
