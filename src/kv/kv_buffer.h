// Byte buffers of the KV cache, the allocator they come from, and the byte
// moves row operations make on them. The allocator decides where the bytes
// live: host memory (standard()) or a device's (the CUDA backend's
// allocator, src/cuda), so the same row operations run on either and stay
// byte-exact. Tests pass an allocator that fails on the n-th call to prove
// that every cache operation either completes or leaves the cache exactly
// as it was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace ferry::kv {

// `size` bytes at `data` in the allocator's memory; freed by the subclass
// that allocated them.
struct KvBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  KvBuffer() = default;
  KvBuffer(const KvBuffer&) = delete;
  KvBuffer& operator=(const KvBuffer&) = delete;
  virtual ~KvBuffer();
};

class KvAllocator {
 public:
  virtual ~KvAllocator() = default;
  // A zero-filled buffer of `bytes`; throws std::bad_alloc (or ferry::Error)
  // on failure.
  virtual std::shared_ptr<KvBuffer> allocate(size_t bytes);
  // `height` runs of `width` bytes, run i from src + i * spitch to
  // dst + i * dpitch, in this allocator's memory. Runs may overlap (a move
  // within one buffer): the result is as if every run were read first.
  // Never fails for valid ranges.
  virtual void copy_2d(uint8_t* dst, size_t dpitch, const uint8_t* src, size_t spitch, size_t width,
                       size_t height);
  // Many copy_2d's at once, for a rebuild (old stores into new ones): no
  // copy's destination overlaps another's source or destination, so an
  // allocator may run them in any order or together (the CUDA one: one
  // kernel instead of a driver call per copy). By default, one by one.
  struct Copy2d {
    uint8_t* dst;
    size_t dpitch;
    const uint8_t* src;
    size_t spitch, width, height;
  };
  virtual void copy_batch(std::span<const Copy2d> copies);
  // Moves within stores (a filter's compaction), given in order, where no
  // move reads bytes an earlier one wrote and no two write the same bytes:
  // running them one by one in that order gives the same bytes as reading
  // every source before writing any destination, which an allocator may do
  // instead. By default, one by one.
  virtual void copy_moves(std::span<const Copy2d> moves);
  // copy_2d of each, in order (what copy_batch and copy_moves do by default).
  void copy_each(std::span<const Copy2d> copies);
  // Whether the CPU may read and write the buffers' bytes directly
  // (LayerStore::write encodes on the host only when it may).
  virtual bool host_accessible() const { return true; }
  // Bytes caches may take from this memory now, for admission budgets (0:
  // not known; the scheduler then takes a share of host memory).
  virtual size_t memory_hint() const { return 0; }
  static std::shared_ptr<KvAllocator> standard();
};

}  // namespace ferry::kv
