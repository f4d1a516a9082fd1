#include "kv/kv_buffer.h"

namespace ferry::kv {

std::shared_ptr<KvBuffer> KvAllocator::allocate(size_t bytes) {
  auto b = std::make_shared<KvBuffer>();
  b->data.reset(new uint8_t[bytes]());
  b->size = bytes;
  return b;
}

std::shared_ptr<KvAllocator> KvAllocator::standard() {
  static auto a = std::make_shared<KvAllocator>();
  return a;
}

}  // namespace ferry::kv
