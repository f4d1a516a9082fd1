// Byte buffers of the KV cache and the allocator they come from. Tests
// pass an allocator that fails on the n-th call to prove that every cache
// operation either completes or leaves the cache exactly as it was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ferry::kv {

struct KvBuffer {
  std::unique_ptr<uint8_t[]> data;
  size_t size = 0;
};

class KvAllocator {
 public:
  virtual ~KvAllocator() = default;
  // A zero-filled buffer of `bytes`; throws std::bad_alloc (or ferry::Error)
  // on failure.
  virtual std::shared_ptr<KvBuffer> allocate(size_t bytes);
  static std::shared_ptr<KvAllocator> standard();
};

}  // namespace ferry::kv
