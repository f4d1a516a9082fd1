#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <system_error>

#include "core/error.h"
#include "gguf/quote.h"

// Layout of a GGUF file (v2 and v3 are identical; all integers little-endian):
//   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count  x { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset }
//   zero padding up to a multiple of the alignment | data section
// A string is u64 length + bytes; an array value is u32 elem_type | u64 count | elements.
//
// Every count is checked against the bytes left before anything is reserved,
// so memory use stays proportional to the file size whatever the counts say.

namespace ferry::gguf {
namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
// Real files nest arrays one level deep (arrays of strings); the format allows
// arrays of arrays, so accept a few levels but bound the recursion.
constexpr uint32_t kMaxArrayDepth = 8;
constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Smallest encodings of a metadata entry (empty key, u8 value) and of a tensor
// info (empty name, one dim); they bound the counts in the header.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// Encoded size of the smallest value of type `t`; 0 for an invalid type id.
uint64_t min_value_bytes(uint32_t t) {
  switch (static_cast<ValueType>(t)) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
    case ValueType::STRING:
      return 8;  // u64 length
    case ValueType::ARRAY:
      return 4 + 8;  // elem_type, count
  }
  return 0;
}

using internal::quoted;

std::string shape_str(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

template <typename T>
Value make_value(ValueType type, T x) {
  return Value{type, decltype(Value::v)(std::in_place_type<T>, std::move(x))};
}

// Bounds-checked little-endian cursor over the file image. Errors name the
// file and the current context (the key or tensor being read).
class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }
  void set_context(std::string ctx) { ctx_ = std::move(ctx); }

  template <typename... Args>
  [[noreturn]] void error(Args&&... args) const {
    if (ctx_.empty()) fail("gguf", path_, ": ", std::forward<Args>(args)...);
    fail("gguf", path_, ": ", ctx_, ": ", std::forward<Args>(args)...);
  }

  const uint8_t* take(size_t n, const char* what) {
    if (n > remaining()) {
      error("truncated: ", what, " needs ", n, " bytes at offset ", pos_, " but the file ends at ",
            bytes_.size());
    }
    const uint8_t* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }

  uint64_t uint_le(size_t n, const char* what) {
    const uint8_t* p = take(n, what);
    uint64_t x = 0;
    for (size_t i = 0; i < n; ++i) x |= static_cast<uint64_t>(p[i]) << (8 * i);
    return x;
  }
  uint8_t u8(const char* what) { return static_cast<uint8_t>(uint_le(1, what)); }
  uint16_t u16(const char* what) { return static_cast<uint16_t>(uint_le(2, what)); }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(uint_le(4, what)); }
  uint64_t u64(const char* what) { return uint_le(8, what); }

  std::string str(const char* what) {
    const uint64_t len = u64(what);
    if (len > remaining()) {
      error(what, " length ", len, " exceeds the ", remaining(), " bytes left in the file");
    }
    const uint8_t* p = take(static_cast<size_t>(len), what);
    return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
  }

  // `depth` is the number of arrays enclosing this value.
  Value value(uint32_t type, uint32_t depth) {
    const auto t = static_cast<ValueType>(type);
    switch (t) {
      case ValueType::U8:
        return make_value<uint64_t>(t, u8("u8 value"));
      case ValueType::U16:
        return make_value<uint64_t>(t, u16("u16 value"));
      case ValueType::U32:
        return make_value<uint64_t>(t, u32("u32 value"));
      case ValueType::U64:
        return make_value<uint64_t>(t, u64("u64 value"));
      case ValueType::I8:
        return make_value<int64_t>(t, static_cast<int8_t>(u8("i8 value")));
      case ValueType::I16:
        return make_value<int64_t>(t, static_cast<int16_t>(u16("i16 value")));
      case ValueType::I32:
        return make_value<int64_t>(t, static_cast<int32_t>(u32("i32 value")));
      case ValueType::I64:
        return make_value<int64_t>(t, static_cast<int64_t>(u64("i64 value")));
      case ValueType::F32:
        return make_value<double>(t, std::bit_cast<float>(u32("f32 value")));
      case ValueType::F64:
        return make_value<double>(t, std::bit_cast<double>(u64("f64 value")));
      case ValueType::BOOL: {
        const uint8_t b = u8("bool value");
        if (b > 1) error("invalid bool value ", static_cast<int>(b), " (must be 0 or 1)");
        return make_value<bool>(t, b == 1);
      }
      case ValueType::STRING:
        return make_value<std::string>(t, str("string value"));
      case ValueType::ARRAY:
        return make_value<Array>(t, array(depth));
    }
    error("invalid value type ", type);
  }

 private:
  Array array(uint32_t depth) {
    if (depth >= kMaxArrayDepth) error("arrays nested more than ", kMaxArrayDepth, " levels deep");
    const uint32_t elem = u32("array element type");
    const uint64_t min_bytes = min_value_bytes(elem);
    if (min_bytes == 0) error("invalid array element type ", elem);
    const uint64_t n = u64("array length");
    if (n > remaining() / min_bytes) {
      error("array length ", n, " of ", value_type_name(static_cast<ValueType>(elem)),
            " exceeds what the ", remaining(), " bytes left in the file can hold");
    }
    Array a{static_cast<ValueType>(elem), {}};
    a.items.reserve(static_cast<size_t>(n));
    for (uint64_t i = 0; i < n; ++i) a.items.push_back(value(elem, depth + 1));
    return a;
  }

  std::span<const uint8_t> bytes_;
  const std::string& path_;
  std::string ctx_;
  size_t pos_ = 0;
};

// Closes a file descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

std::string errno_message(int e) {
  return std::generic_category().message(e);
}

struct Header {
  uint32_t version;
  uint64_t n_tensors;
  uint64_t n_kv;
};

Header read_header(Reader& r) {
  const uint8_t* magic = r.take(4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    r.error("bad magic ", quoted({reinterpret_cast<const char*>(magic), 4}), " (not a GGUF file)");
  }
  Header h{};
  h.version = r.u32("version");
  if (h.version == 1) r.error("GGUF version 1 is not supported (only versions 2 and 3)");
  if (h.version != 2 && h.version != 3) {
    const uint32_t v = h.version;
    const uint32_t swapped =
        ((v & 0xffu) << 24) | ((v & 0xff00u) << 8) | ((v >> 8) & 0xff00u) | (v >> 24);
    if (swapped == 2 || swapped == 3) r.error("big-endian GGUF files are not supported");
    r.error("unsupported GGUF version ", v, " (only versions 2 and 3)");
  }
  h.n_tensors = r.u64("tensor count");
  h.n_kv = r.u64("metadata count");
  if (h.n_kv > r.remaining() / kMinKvBytes) {
    r.error("metadata count ", h.n_kv, " is impossible: the ", r.remaining(),
            " bytes left hold at most ", r.remaining() / kMinKvBytes, " entries");
  }
  if (h.n_tensors > r.remaining() / kMinTensorInfoBytes) {
    r.error("tensor count ", h.n_tensors, " is impossible: the ", r.remaining(),
            " bytes left hold at most ", r.remaining() / kMinTensorInfoBytes, " tensor infos");
  }
  return h;
}

void read_metadata(Reader& r, uint64_t n_kv, std::map<std::string, Value, std::less<>>& kv) {
  for (uint64_t i = 0; i < n_kv; ++i) {
    r.set_context(detail::concat("metadata entry ", i));
    std::string key = r.str("key");
    r.set_context("key " + quoted(key));
    if (kv.contains(key)) r.error("duplicate metadata key");
    const uint32_t type = r.u32("value type");
    if (min_value_bytes(type) == 0) r.error("invalid value type ", type);
    Value v = r.value(type, 0);
    kv.emplace(std::move(key), std::move(v));
  }
  r.set_context("");
}

// general.alignment if present (a nonzero power-of-two u32), else 32.
uint64_t read_alignment(Reader& r, const std::map<std::string, Value, std::less<>>& kv) {
  auto it = kv.find("general.alignment");
  if (it == kv.end()) return kDefaultAlignment;
  r.set_context("key 'general.alignment'");
  const Value& a = it->second;
  if (a.type != ValueType::U32) r.error("must be a u32, got ", value_type_name(a.type));
  const uint64_t alignment = std::get<uint64_t>(a.v);
  if (!std::has_single_bit(alignment)) {
    r.error("alignment ", alignment, " is not a nonzero power of two");
  }
  r.set_context("");
  return alignment;
}

// Reads one tensor info and derives its byte size; leaves the context naming
// the tensor (for the caller's duplicate check). `data` is set later.
TensorInfo read_tensor_info(Reader& r, uint64_t index, uint64_t alignment) {
  r.set_context(detail::concat("tensor info ", index));
  TensorInfo t{};
  t.name = r.str("tensor name");
  r.set_context("tensor " + quoted(t.name));

  const uint32_t n_dims = r.u32("n_dims");
  if (n_dims == 0 || n_dims > kMaxDims) {
    r.error("n_dims ", n_dims, " is out of range (1..", kMaxDims, ")");
  }
  uint64_t n_elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t extent = r.u64("dimension");
    t.shape.push_back(extent);
    if (extent == 0) r.error("dimension ", d, " of shape ", shape_str(t.shape), " is zero");
    if (__builtin_mul_overflow(n_elements, extent, &n_elements) || n_elements > kMaxInt64) {
      r.error("element count of shape ", shape_str(t.shape), " overflows int64");
    }
  }

  const uint32_t type = r.u32("tensor type");
  const std::optional<DTypeTraits> tr = dtype_traits(type);
  if (!tr) r.error("unsupported type ", ggml_type_name(type), " (ggml type id ", type, ")");
  t.type = static_cast<DType>(type);
  if (t.shape[0] % tr->block_elems != 0) {
    r.error("row length ", t.shape[0], " of shape ", shape_str(t.shape),
            " is not a multiple of the ", tr->name, " block size ", tr->block_elems);
  }
  // shape[0] is a whole number of blocks, so n_elements is too.
  uint64_t n_bytes = 0;
  if (__builtin_mul_overflow(n_elements / tr->block_elems, uint64_t{tr->block_bytes}, &n_bytes)) {
    r.error("byte size of ", tr->name, " shape ", shape_str(t.shape), " overflows");
  }
  t.n_bytes = static_cast<size_t>(n_bytes);

  t.offset = r.u64("tensor data offset");
  if (t.offset % alignment != 0) {
    r.error("data offset ", t.offset, " is not a multiple of the alignment ", alignment);
  }
  return t;
}

// Points each tensor into `bytes` after checking that its data lies inside the
// data section, and that no two tensors share bytes (a writer never emits that,
// so it means corruption).
void place_tensor_data(Reader& r, std::span<const uint8_t> bytes, uint64_t data_offset,
                       std::vector<TensorInfo>& tensors) {
  // With no tensors a file may end before data_offset; only tensors check EOF.
  const uint64_t available = data_offset < bytes.size() ? bytes.size() - data_offset : 0;
  for (TensorInfo& t : tensors) {
    if (t.offset > available || t.n_bytes > available - t.offset) {
      r.set_context("tensor " + quoted(t.name));
      r.error("data of ", t.n_bytes, " bytes at offset ", t.offset,
              " extends past end of file (data section at byte ", data_offset, " holds ", available,
              " bytes)");
    }
    t.data = bytes.data() + data_offset + t.offset;
  }

  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const TensorInfo& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    // Both ends are within the data section, so the sum cannot overflow.
    if (prev.offset + prev.n_bytes > cur.offset) {
      r.set_context("tensor " + quoted(cur.name));
      r.error("data at offset ", cur.offset, " overlaps tensor ", quoted(prev.name), " [",
              prev.offset, ", ", prev.offset + prev.n_bytes, ")");
    }
  }
}

}  // namespace

std::unique_ptr<File> File::open(const std::string& path) {
  std::unique_ptr<File> f(new File());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("gguf", path, ": cannot open: ", errno_message(errno));
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("gguf", path, ": cannot stat: ", errno_message(errno));
  if (!S_ISREG(st.st_mode)) fail("gguf", path, ": not a regular file");
  const auto size = static_cast<size_t>(st.st_size);
  // mmap rejects length 0; an empty file is reported by the parser as truncated.
  // The mapping is private and read-only; it lives as long as the File.
  if (size > 0) {
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED)
      fail("gguf", path, ": cannot map ", size, " bytes: ", errno_message(errno));
    f->map_ = m;
    f->map_size_ = size;
  }
  f->parse_all({static_cast<const uint8_t*>(f->map_), size});
  return f;
}

std::unique_ptr<File> File::parse(std::span<const uint8_t> bytes, std::string name) {
  std::unique_ptr<File> f(new File());
  f->path_ = std::move(name);
  f->parse_all(bytes);
  return f;
}

File::~File() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

void File::parse_all(std::span<const uint8_t> bytes) {
  Reader r(bytes, path_);
  const Header h = read_header(r);
  version_ = h.version;
  read_metadata(r, h.n_kv, kv_);
  alignment_ = read_alignment(r, kv_);

  // read_header bounded n_tensors by the file size, so reserving is safe.
  tensors_.reserve(static_cast<size_t>(h.n_tensors));
  for (uint64_t i = 0; i < h.n_tensors; ++i) {
    TensorInfo t = read_tensor_info(r, i, alignment_);
    if (tensor_index_.contains(t.name)) r.error("duplicate tensor name");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the first aligned offset after the tensor infos.
  const uint64_t pos = r.pos();
  data_offset_ = pos + (alignment_ - pos % alignment_) % alignment_;
  place_tensor_data(r, bytes, data_offset_, tensors_);
}

}  // namespace ferry::gguf
