// GGUF reader on malformed input: each case must throw ferry::Error whose
// message names the file, the key or tensor, and the problem; truncating or
// corrupting a valid file anywhere must throw (or parse), never crash.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_test.h"
#include "gguf/gguf_writer.h"

namespace ferry::test {
namespace {

using gguf::ValueType;

constexpr uint64_t k2p60 = 1ull << 60;
constexpr uint64_t k2p63 = 1ull << 63;

std::vector<uint8_t> le(uint64_t x, size_t n) {
  std::vector<uint8_t> out;
  GgufWriter::put_le(out, x, n);
  return out;
}

std::vector<uint8_t> cat(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<uint8_t> patched_u64(std::vector<uint8_t> b, size_t at, uint64_t x) {
  for (size_t i = 0; i < 8; ++i) b.at(at + i) = static_cast<uint8_t>(x >> (8 * i));
  return b;
}

std::vector<uint8_t> f32_bytes(size_t n) {
  return std::vector<uint8_t>(4 * n, 0x3f);
}

// A file with one tensor "w" of the given shape, type and data.
std::vector<uint8_t> one_tensor(std::vector<uint64_t> shape, uint32_t type,
                                std::vector<uint8_t> data, std::optional<uint64_t> offset = {}) {
  GgufWriter w;
  w.add_tensor("w", std::move(shape), type, std::move(data), offset);
  return w.bytes();
}

constexpr uint32_t kF32 = static_cast<uint32_t>(DType::F32);
constexpr uint32_t kQ8_0 = static_cast<uint32_t>(DType::Q8_0);

struct BadCase {
  std::string name;
  std::function<std::vector<uint8_t>()> make;
  std::vector<std::string> expect;  // substrings of the message after the file prefix
};

std::vector<BadCase> bad_cases() {
  return {
      {"empty",
       [] { return std::vector<uint8_t>{}; },
       {"truncated: magic needs 4 bytes at offset 0 but the file ends at 0"}},
      {"bad_magic",
       [] {
         GgufWriter w;
         w.magic = {'G', 'G', 'M', 'L'};
         return w.bytes();
       },
       {"bad magic 'GGML' (not a GGUF file)"}},
      {"version_1",
       [] {
         GgufWriter w(1);
         return w.bytes();
       },
       {"GGUF version 1 is not supported (only versions 2 and 3)"}},
      {"version_4",
       [] { return GgufWriter(4).bytes(); },
       {"unsupported GGUF version 4 (only versions 2 and 3)"}},
      {"big_endian",
       [] { return GgufWriter(0x03000000).bytes(); },
       {"big-endian GGUF files are not supported"}},
      {"header_cut",
       [] { return std::vector<uint8_t>{'G', 'G', 'U', 'F', 3, 0, 0, 0, 1}; },
       {"truncated: tensor count needs 8 bytes at offset 8 but the file ends at 9"}},
      {"huge_kv_count",
       [] {
         GgufWriter w;
         w.kv_count = k2p60;
         w.add_u32("a", 1);
         return w.bytes();
       },
       {"metadata count 1152921504606846976 is impossible: the 17 bytes left hold at most 1"}},
      {"huge_tensor_count",
       [] {
         GgufWriter w;
         w.tensor_count = k2p60;
         return w.bytes();
       },
       {"tensor count 1152921504606846976 is impossible: the 0 bytes left"}},
      {"huge_key_length",
       [] {
         GgufWriter w;
         w.add_u32("a", 1);
         return patched_u64(w.bytes(), 24, k2p63);
       },
       {"metadata entry 0: key length 9223372036854775808 exceeds the 9 bytes left"}},
      {"huge_string_length",
       [] {
         GgufWriter w;
         w.add_raw("general.name", 8, cat(le(k2p63, 8), {'a', 'b', 'c'}));
         return w.bytes();
       },
       {"key 'general.name': string value length 9223372036854775808 exceeds the 3 bytes"}},
      {"huge_array_length",
       [] {
         GgufWriter w;
         w.add_raw("tokenizer.ggml.tokens", 9, cat(le(8, 4), le(1ull << 62, 8)));
         return w.bytes();
       },
       {"key 'tokenizer.ggml.tokens': array length 4611686018427387904 of string exceeds"}},
      {"array_one_too_long",
       [] {
         GgufWriter w;  // 3 u32 claimed, 2 present: the bound is exact
         w.add_raw("arr", 9, cat(cat(le(4, 4), le(3, 8)), le(0, 8)));
         return w.bytes();
       },
       {"key 'arr': array length 3 of u32 exceeds what the 8 bytes left"}},
      {"invalid_value_type",
       [] {
         GgufWriter w;
         w.add_raw("k", 13, {0});
         return w.bytes();
       },
       {"key 'k': invalid value type 13"}},
      {"invalid_array_elem_type",
       [] {
         GgufWriter w;
         w.add_raw("k", 9, cat(le(99, 4), le(0, 8)));
         return w.bytes();
       },
       {"key 'k': invalid array element type 99"}},
      {"arrays_nested_too_deep",
       [] {
         gguf::Value v = gv::u8(1);
         for (int i = 0; i < 9; ++i) v = gv::array(v.type, {v});
         GgufWriter w;
         w.add("deep", v);
         return w.bytes();
       },
       {"key 'deep': arrays nested more than 8 levels deep"}},
      {"bad_bool",
       [] {
         GgufWriter w;
         w.add_raw("flag", 7, {2});
         return w.bytes();
       },
       {"key 'flag': invalid bool value 2 (must be 0 or 1)"}},
      {"value_cut",
       [] {
         GgufWriter w;
         w.add_raw("k", 10, {1, 2, 3});
         return w.bytes();
       },
       {"key 'k': truncated: u64 value needs 8 bytes at offset"}},
      {"duplicate_key",
       [] {
         GgufWriter w;
         w.add_u32("a", 1).add_string("a", "x");
         return w.bytes();
       },
       {"key 'a': duplicate metadata key"}},
      {"unprintable_key_is_escaped",
       [] {
         GgufWriter w;
         w.add_u8(std::string("\x01k'", 3), 1).add_u8(std::string("\x01k'", 3), 2);
         return w.bytes();
       },
       {"key '\\x01k\\x27': duplicate metadata key"}},
      {"alignment_not_power_of_two",
       [] {
         GgufWriter w;
         w.add_u32("general.alignment", 48);
         return w.bytes();
       },
       {"key 'general.alignment': alignment 48 is not a nonzero power of two"}},
      {"alignment_zero",
       [] {
         GgufWriter w;
         w.add_u32("general.alignment", 0);
         return w.bytes();
       },
       {"key 'general.alignment': alignment 0 is not a nonzero power of two"}},
      {"alignment_wrong_type",
       [] {
         GgufWriter w;
         w.add_u64("general.alignment", 32);
         return w.bytes();
       },
       {"key 'general.alignment': must be a u32, got u64"}},
      {"misaligned_offset",
       [] { return one_tensor({4}, kF32, f32_bytes(4), 16); },
       {"tensor 'w': data offset 16 is not a multiple of the alignment 32"}},
      {"offset_not_multiple_of_custom_alignment",
       [] {
         GgufWriter w;
         w.set_alignment(64);
         w.add_tensor("w", {8}, kF32, f32_bytes(8), 32);
         return w.bytes();
       },
       {"tensor 'w': data offset 32 is not a multiple of the alignment 64"}},
      {"data_past_eof",
       [] { return one_tensor({8}, kF32, f32_bytes(4)); },
       {"tensor 'w': data of 32 bytes at offset 0 extends past end of file (data section at byte "
        "64 holds 16 bytes)"}},
      {"offset_past_eof",
       [] { return one_tensor({4}, kF32, {}, 1ull << 40); },
       {"tensor 'w': data of 16 bytes at offset 1099511627776 extends past end of file"}},
      {"offset_near_u64_max",
       [] { return one_tensor({4}, kF32, {}, ~uint64_t{31}); },
       {"tensor 'w': data of 16 bytes at offset 18446744073709551584 extends past end of file"}},
      {"second_tensor_past_eof",
       [] {
         GgufWriter w;
         w.add_tensor_f32("a", {4}, {1, 2, 3, 4});
         w.add_tensor("b", {4}, kF32, {}, 32);
         return w.bytes();
       },
       {"tensor 'b': data of 16 bytes at offset 32 extends past end of file (data section at byte "
        "96 holds 16 bytes)"}},
      {"unsupported_type",
       [] { return one_tensor({32}, 6, std::vector<uint8_t>(22)); },
       {"tensor 'w': unsupported type Q5_0 (ggml type id 6)"}},
      {"unknown_type",
       [] { return one_tensor({32}, 1000, {}); },
       {"tensor 'w': unsupported type unknown (ggml type id 1000)"}},
      {"zero_n_dims",
       [] { return one_tensor({}, kF32, {}); },
       {"tensor 'w': n_dims 0 is out of range (1..4)"}},
      {"five_dims",
       [] {
         return one_tensor({1, 1, 1, 1, 1}, kF32, f32_bytes(1));
       },
       {"tensor 'w': n_dims 5 is out of range (1..4)"}},
      {"zero_dimension",
       [] {
         return one_tensor({4, 0}, kF32, {});
       },
       {"tensor 'w': dimension 1 of shape [4, 0] is zero"}},
      {"element_count_overflow",
       [] {
         return one_tensor({1ull << 32, 1ull << 32}, kF32, {});
       },
       {"tensor 'w': element count of shape [4294967296, 4294967296] overflows int64"}},
      {"byte_size_overflow",
       [] { return one_tensor({1ull << 62}, kF32, {}); },
       {"tensor 'w': byte size of F32 shape [4611686018427387904] overflows"}},
      {"row_not_block_multiple",
       [] {
         return one_tensor({48, 2}, kQ8_0, {});
       },
       {"tensor 'w': row length 48 of shape [48, 2] is not a multiple of the Q8_0 block size 32"}},
      {"duplicate_tensor",
       [] {
         GgufWriter w;
         w.add_tensor_f32("w", {4}, {1, 2, 3, 4}).add_tensor_f32("w", {4}, {1, 2, 3, 4});
         return w.bytes();
       },
       {"tensor 'w': duplicate tensor name"}},
      {"overlapping_tensors",
       [] {
         GgufWriter w;
         w.add_tensor("a", {16}, kF32, f32_bytes(16));
         w.add_tensor("b", {8}, kF32, f32_bytes(8), 32);
         return w.bytes();
       },
       {"tensor 'b': data at offset 32 overlaps tensor 'a' [0, 64)"}},
      {"huge_tensor_name_length",
       [] {
         GgufWriter w;
         w.add_tensor_f32("w", {4}, {1, 2, 3, 4});
         return patched_u64(w.bytes(), 24, k2p63);
       },
       {"tensor info 0: tensor name length 9223372036854775808 exceeds"}},
  };
}

class GgufMalformed : public ::testing::TestWithParam<BadCase> {};

TEST_P(GgufMalformed, ThrowsNamingFileItemAndProblem) {
  const std::string msg = error_of([&] { parse_bytes(GetParam().make(), "bad.gguf"); });
  EXPECT_EQ(msg.rfind("[gguf] bad.gguf: ", 0), 0u) << msg;
  for (const std::string& part : GetParam().expect) expect_contains(msg, {part});
}

INSTANTIATE_TEST_SUITE_P(Table, GgufMalformed, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return info.param.name;
                         });

// A valid file touching every encoding: all value types, nested arrays and
// tensors of several types. Nothing follows the last tensor's bytes.
std::vector<uint8_t> rich_file() {
  GgufWriter w;
  w.set_alignment(16);
  w.add_u8("u8", 1).add_i8("i8", -1).add_u16("u16", 2).add_i16("i16", -2);
  w.add_u32("u32", 3).add_i32("i32", -3).add_u64("u64", 4).add_i64("i64", -4);
  w.add_f32("f32", 0.5f).add_f64("f64", 0.25).add_bool("bool", true).add_string("str", "abc");
  w.add_string_array("strs", {"x", "yz"});
  w.add("nested", gv::array(ValueType::ARRAY, {gv::array(ValueType::I16, {gv::i16(5)})}));
  w.add_tensor_f32("a", {3}, {1, 2, 3});
  w.add_tensor("b", {32, 2}, DType::Q8_0, std::vector<uint8_t>(68, 9));
  w.add_tensor("c", {2}, DType::F16, {1, 2, 3, 4});
  return w.bytes();
}

// Parses an exactly sized heap copy so that ASan sees any read past its end.
void parse_copy(const std::vector<uint8_t>& b, size_t n) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[n > 0 ? n : 1]);
  if (n > 0) std::memcpy(copy.get(), b.data(), n);
  gguf::File::parse({copy.get(), n}, "cut.gguf");
}

TEST(GgufTruncation, EveryPrefixOfAValidFileThrows) {
  const std::vector<uint8_t> file = rich_file();
  ASSERT_NO_THROW(parse_copy(file, file.size()));
  for (size_t n = 0; n < file.size(); ++n) {
    const std::string msg = error_of([&] { parse_copy(file, n); });
    EXPECT_EQ(msg.rfind("[gguf] cut.gguf: ", 0), 0u) << "prefix of " << n << " bytes: " << msg;
  }
}

TEST(GgufTruncation, EveryPrefixOfAMetadataOnlyFileThrows) {
  GgufWriter w;
  w.add_string_array("tokens", {"a", "b"}).add_f64("x", 1.0);
  const std::vector<uint8_t> file = w.bytes();
  ASSERT_NO_THROW(parse_copy(file, file.size()));
  for (size_t n = 0; n < file.size(); ++n) {
    const std::string msg = error_of([&] { parse_copy(file, n); });
    EXPECT_EQ(msg.rfind("[gguf] cut.gguf: ", 0), 0u) << "prefix of " << n << " bytes: " << msg;
  }
}

// Visits every value the way a consumer might, so that corrupt input that
// parses is also safe to use.
void touch(const gguf::Value& v, std::string_view key, uint64_t& sink) {
  if (v.type == ValueType::ARRAY) {
    for (const gguf::Value& item : v.as_array(key).items) touch(item, key, sink);
    return;
  }
  try {
    sink += v.as_float(key) != 0.0 ? 1 : 0;
  } catch (const ferry::Error&) {
    sink += v.type == ValueType::STRING ? v.as_string(key).size() : 1;
  }
}

TEST(GgufCorruption, FlippingAnyByteThrowsOrParses) {
  const std::vector<uint8_t> file = rich_file();
  int parsed = 0;
  uint64_t sink = 0;
  for (size_t i = 0; i < file.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80, 0xff}) {
      std::vector<uint8_t> b = file;
      b[i] ^= mask;
      try {
        auto f = gguf::File::parse(b, "flip.gguf");
        ++parsed;
        for (const auto& [key, v] : f->metadata()) touch(v, key, sink);
        for (const gguf::TensorInfo& t : f->tensors()) {
          ASSERT_GE(t.data, b.data());
          ASSERT_LE(t.data + t.n_bytes, b.data() + b.size());
          sink += t.data[0] + t.data[t.n_bytes - 1];
        }
      } catch (const ferry::Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("[gguf] flip.gguf: ", 0), 0u) << e.what();
      }
    }
  }
  // Flips inside values and tensor data leave a valid file.
  EXPECT_GT(parsed, 0);
  EXPECT_GT(sink, 0u);
}

}  // namespace
}  // namespace ferry::test
