// GGUF reader: values, tensors and layout of well-formed files, written by the
// test writer, by the reference Python `gguf` package, and a real model.
// Malformed inputs are in gguf_malformed_test.cpp.
#include "gguf/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "gguf/gguf_test.h"
#include "gguf/gguf_writer.h"

namespace ferry::test {
namespace {

using gguf::Array;
using gguf::File;
using gguf::Value;
using gguf::ValueType;

// 12 bytes with a two-byte UTF-8 character and an embedded NUL.
const std::string kOddString("h\xc3\xa9llo\0world", 12);

// One key per scalar type (with its extreme value), then arrays.
GgufWriter all_types_writer(uint32_t version) {
  GgufWriter w(version);
  w.add_u8("t.u8", 255)
      .add_i8("t.i8", -128)
      .add_u16("t.u16", 65535)
      .add_i16("t.i16", -32768)
      .add_u32("t.u32", 0xffffffffu)
      .add_i32("t.i32", std::numeric_limits<int32_t>::min())
      .add_u64("t.u64", std::numeric_limits<uint64_t>::max())
      .add_i64("t.i64", std::numeric_limits<int64_t>::min())
      .add_f32("t.f32", -1.5f)
      .add_f64("t.f64", 0.1)
      .add_bool("t.true", true)
      .add_bool("t.false", false)
      .add_string("t.str", kOddString)
      .add_string("t.empty", "")
      .add_string_array("t.strs", {"a", "", "ccc"})
      .add_i32_array("t.i32s", {-1, 0, 7})
      .add_f32_array("t.f32s", {0.25f, -2.0f})
      .add("t.u8s", gv::array(ValueType::U8, {gv::u8(0), gv::u8(200)}))
      .add("t.i8s", gv::array(ValueType::I8, {gv::i8(-1)}))
      .add("t.u16s", gv::array(ValueType::U16, {gv::u16(65535)}))
      .add("t.i16s", gv::array(ValueType::I16, {gv::i16(-300)}))
      .add("t.u32s", gv::array(ValueType::U32, {gv::u32(70000)}))
      .add("t.u64s", gv::array(ValueType::U64, {gv::u64(1ull << 40)}))
      .add("t.i64s", gv::array(ValueType::I64, {gv::i64(-(1ll << 40))}))
      .add("t.f64s", gv::array(ValueType::F64, {gv::f64(1e300)}))
      .add("t.bools", gv::array(ValueType::BOOL, {gv::boolean(true), gv::boolean(false)}))
      .add("t.nested",
           gv::array(ValueType::ARRAY, {gv::array(ValueType::U16, {gv::u16(1), gv::u16(2)}),
                                        gv::array(ValueType::STRING, {gv::str("x")})}))
      .add("t.empty_arr", gv::array(ValueType::F64, {}));
  return w;
}

template <typename T>
T held(const File& f, const char* key) {
  return std::get<T>(f.get(key).v);
}

class GgufVersions : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufVersions, EveryMetadataTypeRoundTrips) {
  const std::vector<uint8_t> image = all_types_writer(GetParam()).bytes();
  auto f = parse_bytes(image);
  EXPECT_EQ(f->version(), GetParam());
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->metadata().size(), 28u);
  EXPECT_TRUE(f->tensors().empty());

  const std::pair<const char*, ValueType> types[] = {
      {"t.u8", ValueType::U8},      {"t.i8", ValueType::I8},        {"t.u16", ValueType::U16},
      {"t.i16", ValueType::I16},    {"t.u32", ValueType::U32},      {"t.i32", ValueType::I32},
      {"t.u64", ValueType::U64},    {"t.i64", ValueType::I64},      {"t.f32", ValueType::F32},
      {"t.f64", ValueType::F64},    {"t.true", ValueType::BOOL},    {"t.str", ValueType::STRING},
      {"t.strs", ValueType::ARRAY}, {"t.nested", ValueType::ARRAY},
  };
  for (const auto& [key, type] : types) EXPECT_EQ(f->get(key).type, type) << key;

  EXPECT_EQ(held<uint64_t>(*f, "t.u8"), 255u);
  EXPECT_EQ(held<int64_t>(*f, "t.i8"), -128);
  EXPECT_EQ(held<uint64_t>(*f, "t.u16"), 65535u);
  EXPECT_EQ(held<int64_t>(*f, "t.i16"), -32768);
  EXPECT_EQ(held<uint64_t>(*f, "t.u32"), 0xffffffffu);
  EXPECT_EQ(held<int64_t>(*f, "t.i32"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(held<uint64_t>(*f, "t.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(held<int64_t>(*f, "t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(held<double>(*f, "t.f32"), -1.5);
  EXPECT_EQ(held<double>(*f, "t.f64"), 0.1);
  EXPECT_EQ(held<bool>(*f, "t.true"), true);
  EXPECT_EQ(held<bool>(*f, "t.false"), false);
  EXPECT_EQ(held<std::string>(*f, "t.str"), kOddString);
  EXPECT_EQ(held<std::string>(*f, "t.empty"), "");

  EXPECT_EQ(f->get_string_array("t.strs"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f->get_int_array("t.i32s"), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(f->get_float_array("t.f32s"), (std::vector<double>{0.25, -2.0}));
  EXPECT_EQ(f->get_int_array("t.u8s"), (std::vector<int64_t>{0, 200}));
  EXPECT_EQ(f->get_int_array("t.i8s"), (std::vector<int64_t>{-1}));
  EXPECT_EQ(f->get_int_array("t.u16s"), (std::vector<int64_t>{65535}));
  EXPECT_EQ(f->get_int_array("t.i16s"), (std::vector<int64_t>{-300}));
  EXPECT_EQ(f->get_int_array("t.u32s"), (std::vector<int64_t>{70000}));
  EXPECT_EQ(f->get_int_array("t.u64s"), (std::vector<int64_t>{1ll << 40}));
  EXPECT_EQ(f->get_int_array("t.i64s"), (std::vector<int64_t>{-(1ll << 40)}));
  EXPECT_EQ(f->get_float_array("t.f64s"), (std::vector<double>{1e300}));

  const Array& bools = f->get("t.bools").as_array("t.bools");
  EXPECT_EQ(bools.elem_type, ValueType::BOOL);
  ASSERT_EQ(bools.items.size(), 2u);
  EXPECT_TRUE(bools.items[0].as_bool("t.bools"));
  EXPECT_FALSE(bools.items[1].as_bool("t.bools"));

  const Array& nested = f->get("t.nested").as_array("t.nested");
  EXPECT_EQ(nested.elem_type, ValueType::ARRAY);
  ASSERT_EQ(nested.items.size(), 2u);
  const Array& inner0 = nested.items[0].as_array("t.nested");
  EXPECT_EQ(inner0.elem_type, ValueType::U16);
  ASSERT_EQ(inner0.items.size(), 2u);
  EXPECT_EQ(inner0.items[0].type, ValueType::U16);
  EXPECT_EQ(inner0.items[1].as_uint("t.nested"), 2u);
  const Array& inner1 = nested.items[1].as_array("t.nested");
  EXPECT_EQ(inner1.elem_type, ValueType::STRING);
  ASSERT_EQ(inner1.items.size(), 1u);
  EXPECT_EQ(inner1.items[0].as_string("t.nested"), "x");

  const Array& empty = f->get("t.empty_arr").as_array("t.empty_arr");
  EXPECT_EQ(empty.elem_type, ValueType::F64);
  EXPECT_TRUE(empty.items.empty());
}

INSTANTIATE_TEST_SUITE_P(V2AndV3, GgufVersions, ::testing::Values(2u, 3u));

TEST(GgufValues, AccessorsConvertWhereTheValueFits) {
  auto f = parse_bytes(all_types_writer(3).bytes());
  EXPECT_EQ(f->get("t.u32").as_int("t.u32"), 4294967295);
  EXPECT_EQ(f->get("t.u32").as_uint("t.u32"), 4294967295u);
  EXPECT_EQ(f->get("t.u32").as_float("t.u32"), 4294967295.0);
  EXPECT_EQ(f->get("t.i16").as_float("t.i16"), -32768.0);
  EXPECT_EQ(f->get("t.i64").as_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f->get("t.u64").as_uint("t.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->get("t.f32").as_float("t.f32"), -1.5);
  EXPECT_EQ(f->get("t.str").as_string("t.str"), kOddString);

  EXPECT_EQ(error_of([&] { f->get("t.u64").as_int("t.u64"); }),
            "[gguf] key 't.u64': value 18446744073709551615 does not fit in int64");
  EXPECT_EQ(error_of([&] { f->get("t.i8").as_uint("t.i8"); }),
            "[gguf] key 't.i8': value -128 is negative, expected an unsigned integer");
  EXPECT_EQ(error_of([&] { f->get("t.str").as_int("t.str"); }),
            "[gguf] key 't.str': expected an integer, got string");
  EXPECT_EQ(error_of([&] { f->get("t.str").as_uint("t.str"); }),
            "[gguf] key 't.str': expected an unsigned integer, got string");
  EXPECT_EQ(error_of([&] { f->get("t.true").as_float("t.true"); }),
            "[gguf] key 't.true': expected a number, got bool");
  EXPECT_EQ(error_of([&] { f->get("t.u8").as_bool("t.u8"); }),
            "[gguf] key 't.u8': expected a bool, got u8");
  EXPECT_EQ(error_of([&] { f->get("t.strs").as_string("t.strs"); }),
            "[gguf] key 't.strs': expected a string, got array of string");
  EXPECT_EQ(error_of([&] { f->get("t.str").as_array("t.str"); }),
            "[gguf] key 't.str': expected an array, got string");
}

TEST(GgufValues, FileGettersNameTheFileAndKey) {
  auto f = parse_bytes(all_types_writer(3).bytes(), "m.gguf");
  EXPECT_EQ(f->get_int("t.i16"), -32768);
  EXPECT_EQ(f->get_int("absent", 5), 5);
  EXPECT_EQ(f->get_float("t.f64"), 0.1);
  EXPECT_EQ(f->get_float("absent", 2.5), 2.5);
  EXPECT_EQ(f->get_string("t.str"), kOddString);
  EXPECT_EQ(f->get_string("absent", "dflt"), "dflt");
  EXPECT_TRUE(f->get_bool("t.true"));
  EXPECT_TRUE(f->get_bool("absent", true));
  EXPECT_EQ(f->find("absent"), nullptr);
  ASSERT_NE(f->find("t.u8"), nullptr);
  EXPECT_EQ(f->find("t.u8")->type, ValueType::U8);

  EXPECT_EQ(error_of([&] { f->get("absent"); }), "[gguf] m.gguf: missing metadata key 'absent'");
  EXPECT_EQ(error_of([&] { f->get_int("absent"); }),
            "[gguf] m.gguf: missing metadata key 'absent'");
  EXPECT_EQ(error_of([&] { f->get_int("t.str", 1); }),
            "[gguf] m.gguf: key 't.str': expected an integer, got string");
  EXPECT_EQ(error_of([&] { f->get_float("t.str"); }),
            "[gguf] m.gguf: key 't.str': expected a number, got string");
  EXPECT_EQ(error_of([&] { f->get_string("t.u8"); }),
            "[gguf] m.gguf: key 't.u8': expected a string, got u8");
  EXPECT_EQ(error_of([&] { f->get_bool("t.u8"); }),
            "[gguf] m.gguf: key 't.u8': expected a bool, got u8");
  EXPECT_EQ(error_of([&] { f->get_string_array("t.i32s"); }),
            "[gguf] m.gguf: key 't.i32s': expected an array of strings, got array of i32");
  EXPECT_EQ(error_of([&] { f->get_int_array("t.f32s"); }),
            "[gguf] m.gguf: key 't.f32s': expected an array of integers, got array of f32");
  EXPECT_EQ(error_of([&] { f->get_float_array("t.strs"); }),
            "[gguf] m.gguf: key 't.strs': expected an array of numbers, got array of string");
  EXPECT_EQ(error_of([&] { f->get_int_array("t.str"); }),
            "[gguf] m.gguf: key 't.str': expected an array, got string");
  EXPECT_EQ(f->get_float_array("t.i32s"), (std::vector<double>{-1, 0, 7}));
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + 7 * i);
  return b;
}

TEST(GgufTensors, SizesOffsetsAndDataPointersAreExact) {
  struct Case {
    const char* name;
    std::vector<uint64_t> shape;
    DType type;
    size_t n_bytes;   // rows * blocks per row * block bytes, by hand
    uint64_t offset;  // previous end rounded up to 32
  };
  const std::vector<Case> cases = {
      {"f32", {3, 2}, DType::F32, 24, 0},
      {"f16", {5}, DType::F16, 10, 32},
      {"bf16", {2, 2}, DType::BF16, 8, 64},
      {"q8_0", {64, 3}, DType::Q8_0, 6 * 34, 96},
      {"q4_0", {32}, DType::Q4_0, 18, 320},
      {"q4_1", {96, 2}, DType::Q4_1, 6 * 20, 352},
      {"q4_k", {256, 2}, DType::Q4_K, 2 * 144, 480},
      {"q5_k", {512}, DType::Q5_K, 2 * 176, 768},
      {"q6_k", {256, 1, 1, 2}, DType::Q6_K, 2 * 210, 1120},
  };
  GgufWriter w;
  w.add_string("general.architecture", "test");
  for (size_t i = 0; i < cases.size(); ++i) {
    w.add_tensor(cases[i].name, cases[i].shape, cases[i].type,
                 pattern(cases[i].n_bytes, static_cast<uint8_t>(i)));
  }
  const std::vector<uint8_t> image = w.bytes();
  auto f = parse_bytes(image);
  ASSERT_EQ(f->tensors().size(), cases.size());
  EXPECT_EQ(f->data_offset(), w.data_offset());
  EXPECT_EQ(f->data_offset() % 32, 0u);
  EXPECT_EQ(image.size(), f->data_offset() + 1120 + 420);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.name);
    const gguf::TensorInfo& t = f->tensors()[i];
    EXPECT_EQ(&t, &f->tensor(c.name));
    EXPECT_EQ(t.name, c.name);
    EXPECT_EQ(t.shape, c.shape);
    EXPECT_EQ(t.type, c.type);
    EXPECT_EQ(t.n_bytes, c.n_bytes);
    EXPECT_EQ(t.offset, c.offset);
    EXPECT_EQ(t.data, image.data() + f->data_offset() + c.offset);
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.n_bytes),
              pattern(c.n_bytes, static_cast<uint8_t>(i)));
  }
  EXPECT_EQ(f->tensor("q6_k").n_elements(), 512u);
  EXPECT_EQ(f->tensor("q8_0").n_elements(), 192u);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
  EXPECT_EQ(error_of([&] { f->tensor("nope"); }), "[gguf] test.gguf: missing tensor 'nope'");
}

// Data section offsets below are counted by hand: header 24 bytes; a kv with
// key "general.alignment" and a u32 value 8+17+4+4 = 33; a tensor info with a
// one-byte name and one dim 8+1+4+8+4+8 = 33.
TEST(GgufLayout, DefaultAlignmentIs32) {
  GgufWriter w;
  w.add_tensor_f32("t", {8}, {1, 2, 3, 4, 5, 6, 7, 8});
  const std::vector<uint8_t> image = w.bytes();
  ASSERT_EQ(image.size(), 64u + 32u);  // 24 + 33 = 57 -> 64
  auto f = parse_bytes(image);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), 64u);
  EXPECT_EQ(f->tensor("t").data, image.data() + 64);
  float x = 0;
  std::memcpy(&x, f->tensor("t").data + 28, 4);
  EXPECT_EQ(x, 8.0f);
}

TEST(GgufLayout, CustomAlignmentMovesTheDataSection) {
  GgufWriter w;
  w.set_alignment(64);
  w.add_tensor_f32("a", {8}, std::vector<float>(8, 1.0f));
  w.add_tensor_f32("b", {8}, std::vector<float>(8, 2.0f));
  const std::vector<uint8_t> image = w.bytes();
  auto f = parse_bytes(image);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset(), 128u);  // 24 + 33 + 2 * 33 = 123 -> 128
  EXPECT_EQ(f->tensor("a").offset, 0u);
  EXPECT_EQ(f->tensor("b").offset, 64u);
  EXPECT_EQ(f->tensor("b").data, image.data() + 192);
  EXPECT_EQ(image.size(), 192u + 32u);
}

TEST(GgufLayout, AlignmentOneAllowsPackedTensors) {
  GgufWriter w;
  w.set_alignment(1);
  w.add_tensor("a", {3}, DType::F16, pattern(6, 1));
  w.add_tensor("b", {3}, DType::F16, pattern(6, 2));
  const std::vector<uint8_t> image = w.bytes();
  ASSERT_EQ(image.size(), 123u + 12u);
  auto f = parse_bytes(image);
  EXPECT_EQ(f->alignment(), 1u);
  EXPECT_EQ(f->data_offset(), 123u);
  EXPECT_EQ(f->tensor("b").offset, 6u);
  EXPECT_EQ(f->tensor("b").data, image.data() + 129);
}

TEST(GgufLayout, LargeAlignmentWithoutTensorsNeedsNoPadding) {
  GgufWriter w;
  w.set_alignment(1u << 31);
  auto f = parse_bytes(w.bytes());
  EXPECT_EQ(f->alignment(), 1u << 31);
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufLayout, ArraysNestedEightDeepAreAccepted) {
  Value v = gv::u8(1);
  for (int i = 0; i < 8; ++i) v = gv::array(v.type, {v});
  GgufWriter w;
  w.add("deep", v);
  auto f = parse_bytes(w.bytes());
  const Value* cur = &f->get("deep");
  for (int i = 0; i < 8; ++i) cur = &cur->as_array("deep").items.at(0);
  EXPECT_EQ(cur->as_uint("deep"), 1u);
}

class GgufOpen : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove(path_); }
  const std::string path_ =
      ::testing::TempDir() + "ferry_gguf_test_" + std::to_string(::getpid()) + ".gguf";
};

TEST_F(GgufOpen, MapsTheFileAndMatchesParse) {
  GgufWriter w = all_types_writer(3);
  w.add_tensor_f32("w", {2, 2}, {1, 2, 3, 4});
  w.write_file(path_);
  auto f = File::open(path_);
  EXPECT_EQ(f->path(), path_);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 28u);
  EXPECT_EQ(f->get_string("t.str"), kOddString);
  const gguf::TensorInfo& t = f->tensor("w");
  EXPECT_EQ(t.n_bytes, 16u);
  float x[4];
  std::memcpy(x, t.data, 16);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[3], 4.0f);
}

TEST_F(GgufOpen, ErrorsNameThePath) {
  expect_contains(error_of([&] { File::open(path_); }),
                  {"[gguf] " + path_ + ": cannot open: No such file or directory"});
  expect_contains(error_of([] { File::open(::testing::TempDir()); }), {"not a regular file"});
  GgufWriter().write_file(path_);
  std::filesystem::resize_file(path_, 0);
  expect_contains(error_of([&] { File::open(path_); }),
                  {"[gguf] " + path_ + ": truncated: magic needs 4 bytes at offset 0"});
  GgufWriter bad;
  bad.version = 1;
  bad.write_file(path_);
  EXPECT_EQ(error_of([&] { File::open(path_); }),
            "[gguf] " + path_ + ": GGUF version 1 is not supported (only versions 2 and 3)");
}

// Files written by the reference Python package (fuzz/make_gguf_corpus.py).
std::string reference_file(const char* name) {
  return std::string(FERRY_TEST_DATA) + "/../../fuzz/corpus/gguf/" + name;
}

TEST(GgufReference, AllTypesFromPythonWriter) {
  auto f = File::open(reference_file("all_types.gguf"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 2);
  EXPECT_EQ(held<uint64_t>(*f, "t.u8"), 255u);
  EXPECT_EQ(held<int64_t>(*f, "t.i8"), -128);
  EXPECT_EQ(held<uint64_t>(*f, "t.u16"), 65535u);
  EXPECT_EQ(held<int64_t>(*f, "t.i16"), -32768);
  EXPECT_EQ(held<uint64_t>(*f, "t.u32"), 4294967295u);
  EXPECT_EQ(held<int64_t>(*f, "t.i32"), -2147483648ll);
  EXPECT_EQ(held<uint64_t>(*f, "t.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(held<int64_t>(*f, "t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(held<double>(*f, "t.f32"), -1.5);
  EXPECT_EQ(held<double>(*f, "t.f64"), 0.1);
  EXPECT_EQ(held<bool>(*f, "t.bool"), true);
  EXPECT_EQ(held<std::string>(*f, "t.str"), "h\xc3\xa9llo");
  EXPECT_EQ(f->get_string_array("t.strs"), (std::vector<std::string>{"a", "bb", "ccc"}));
  EXPECT_EQ(f->get("t.u16s").as_array("t.u16s").elem_type, ValueType::U16);
  EXPECT_EQ(f->get_int_array("t.u16s"), (std::vector<int64_t>{1, 65535}));
  EXPECT_EQ(f->get_float_array("t.f32s"), (std::vector<double>{0.25, -2.0}));
  const Array& nested = f->get("t.nested").as_array("t.nested");
  ASSERT_EQ(nested.items.size(), 2u);
  EXPECT_EQ(nested.items[0].as_array("t.nested").items.at(1).as_int("t.nested"), 2);
  EXPECT_EQ(nested.items[1].as_array("t.nested").items.at(0).as_int("t.nested"), 3);

  // Offsets and the data section start as reported by gguf.GGUFReader.
  EXPECT_EQ(f->data_offset(), 736u);
  struct Expect {
    const char* name;
    DType type;
    std::vector<uint64_t> shape;
    size_t n_bytes;
    uint64_t offset;
  };
  const Expect expect[] = {{"f32", DType::F32, {3, 2}, 24, 0},
                           {"f16", DType::F16, {5}, 10, 32},
                           {"q8_0", DType::Q8_0, {32, 2}, 68, 64},
                           {"q4_1", DType::Q4_1, {64, 1}, 40, 160}};
  ASSERT_EQ(f->tensors().size(), 4u);
  for (const Expect& e : expect) {
    SCOPED_TRACE(e.name);
    const gguf::TensorInfo& t = f->tensor(e.name);
    EXPECT_EQ(t.type, e.type);
    EXPECT_EQ(t.shape, e.shape);
    EXPECT_EQ(t.n_bytes, e.n_bytes);
    EXPECT_EQ(t.offset, e.offset);
  }
  float x[6];
  std::memcpy(x, f->tensor("f32").data, sizeof x);
  EXPECT_EQ(x[5], 5.0f);
  EXPECT_EQ(f->tensor("q8_0").data[67], 67);
}

TEST(GgufReference, Version2WithAlignment64) {
  auto f = File::open(reference_file("v2_align64.gguf"));
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset(), 192u);
  EXPECT_EQ(f->tensor("a").offset, 0u);
  EXPECT_EQ(f->tensor("b").offset, 64u);
  EXPECT_EQ(f->tensor("b").shape, (std::vector<uint64_t>{2, 2, 2, 2}));
  float x = 0;
  std::memcpy(&x, f->tensor("b").data + 60, 4);
  EXPECT_EQ(x, 15.0f);
}

TEST(GgufReference, MetadataOnly) {
  auto f = File::open(reference_file("kv_only.gguf"));
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"<s>", "</s>", "a", "b"}));
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores"),
            (std::vector<double>{0.0, 0.0, -1.0, -2.0}));
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type"), (std::vector<int64_t>{3, 3, 1, 1}));
}

TEST(GgufModel, SmolLM2Q4_1) {
  // Same location as tools/fetch-model.sh: $FERRY_CACHE or ~/.cache/ferry.
  const char* cache = std::getenv("FERRY_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir =
      cache ? std::string(cache) : std::string(home ? home : "") + "/.cache/ferry";
  const std::string path = dir + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) {
    FAIL() << "model file missing: " << path << " (run tools/fetch-model.sh to download it)";
  }
  auto f = File::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 272u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 30);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f->data_offset(), 1785664u);  // as reported by gguf.GGUFReader

  const gguf::TensorInfo& embd = f->tensor("token_embd.weight");
  EXPECT_EQ(embd.type, DType::Q8_0);
  EXPECT_EQ(embd.shape, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ(embd.n_bytes, 576u * 49152 / 32 * 34);
  EXPECT_EQ(embd.offset, 0u);

  const gguf::TensorInfo& down = f->tensor("blk.0.ffn_down.weight");
  EXPECT_EQ(down.type, DType::Q4_1);
  EXPECT_EQ(down.shape, (std::vector<uint64_t>{1536, 576}));
  EXPECT_EQ(down.n_bytes, 1536u * 576 / 32 * 20);
  EXPECT_EQ(down.data - embd.data, 31868992 - 1785664);
}

}  // namespace
}  // namespace ferry::test
