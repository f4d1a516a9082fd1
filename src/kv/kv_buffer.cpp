#include "kv/kv_buffer.h"

#include <cstring>

namespace ferry::kv {

KvBuffer::~KvBuffer() = default;

namespace {
struct HostBuffer final : KvBuffer {
  explicit HostBuffer(size_t bytes) : bytes_(new uint8_t[bytes]()) {
    data = bytes_.get();
    size = bytes;
  }
  std::unique_ptr<uint8_t[]> bytes_;
};
}  // namespace

std::shared_ptr<KvBuffer> KvAllocator::allocate(size_t bytes) {
  return std::make_shared<HostBuffer>(bytes);
}

void KvAllocator::copy_2d(uint8_t* dst, size_t dpitch, const uint8_t* src, size_t spitch,
                          size_t width, size_t height) {
  if (width == 0 || height == 0) return;
  // Runs overlap only when moving within one row of planes; copy in the
  // direction that reads each run before it is overwritten.
  if (dst <= src) {
    for (size_t i = 0; i < height; ++i) std::memmove(dst + i * dpitch, src + i * spitch, width);
  } else {
    for (size_t i = height; i-- > 0;) std::memmove(dst + i * dpitch, src + i * spitch, width);
  }
}

void KvAllocator::copy_each(std::span<const Copy2d> copies) {
  for (const Copy2d& c : copies) copy_2d(c.dst, c.dpitch, c.src, c.spitch, c.width, c.height);
}

void KvAllocator::copy_batch(std::span<const Copy2d> copies) {
  copy_each(copies);
}

void KvAllocator::copy_moves(std::span<const Copy2d> moves) {
  copy_each(moves);
}

std::shared_ptr<KvAllocator> KvAllocator::standard() {
  static auto a = std::make_shared<KvAllocator>();
  return a;
}

}  // namespace ferry::kv
