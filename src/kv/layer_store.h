// LayerStore: the bytes of one layer's K and V for every row of a batch.
//
// Each side (K, V) is one plane per KvFormat plane, each plane a buffer
//   [row_cap][n_kv_heads][col_cap][unit]
// so one head's keys of one row are contiguous along the token axis and
// every row operation is a byte copy along that axis (quantized planes
// included: groups run along head_dim, inside `unit`).
// Column numbers here are physical; BatchKv maps logical columns to them.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kernels/kv_format.h"
#include "kernels/ops.h"
#include "kv/kv_buffer.h"

namespace ferry::kv {

struct StoreGeometry {
  size_t n_kv_heads = 0, head_dim = 0;
  size_t row_cap = 0, col_cap = 0;
  bool operator==(const StoreGeometry&) const = default;
};

class LayerStore {
 public:
  LayerStore() = default;
  // Allocates zeroed planes for `geo` from `alloc`, whose memory the bytes
  // then live in (throws on allocation failure).
  LayerStore(kernels::KvFormat k, kernels::KvFormat v, const StoreGeometry& geo,
             std::shared_ptr<KvAllocator> alloc);

  LayerStore(LayerStore&&) noexcept = default;
  LayerStore& operator=(LayerStore&&) noexcept = default;
  LayerStore(const LayerStore&) = delete;  // see share() and clone()
  LayerStore& operator=(const LayerStore&) = delete;

  // A second handle on the same bytes (for views); cheap.
  LayerStore share() const;
  const StoreGeometry& geometry() const { return geo_; }
  kernels::KvFormat format(bool v_side) const { return v_side ? v_fmt_ : k_fmt_; }
  bool allocated() const { return !planes_.empty(); }

  // Encodes one token's K and V rows ([n_kv_heads * head_dim] floats each)
  // into (row, col). Host-accessible memory only (a device backend encodes
  // with its own kernel into side()'s planes).
  void write(size_t row, size_t col, const float* k, const float* v);
  // The copies of n columns of src's row sr starting at sc into (dr, dc),
  // appended to `batch` for KvAllocator::copy_batch (src another store).
  // All planes of both sides; formats and head shapes must match.
  void copy_cols(const LayerStore& src, size_t sr, size_t sc, size_t dr, size_t dc, size_t n,
                 std::vector<KvAllocator::Copy2d>& batch) const;
  // The same within this store; source and destination may overlap.
  void move_cols(size_t sr, size_t sc, size_t dr, size_t dc, size_t n);
  // move_cols's copies appended to `batch` instead (for
  // KvAllocator::copy_moves).
  void move_cols(size_t sr, size_t sc, size_t dr, size_t dc, size_t n,
                 std::vector<KvAllocator::Copy2d>& batch) const;
  // Attention view of one row (slots are physical columns).
  kernels::KvSide side(bool v_side, size_t row) const;

  size_t allocated_bytes() const;
  // True while a donor view shares these buffers (writes must copy first).
  bool shared() const;
  // A deep copy (same geometry, same allocator).
  LayerStore clone() const;

 private:
  struct Plane {
    size_t unit;
    std::shared_ptr<KvBuffer> buf;
  };
  uint8_t* at(const Plane& p, size_t row, size_t head, size_t col) const;
  size_t n_planes(bool v_side) const { return (v_side ? v_fmt_ : k_fmt_).quantized() ? 3 : 1; }
  const Plane& plane(bool v_side, size_t i) const {
    return planes_[(v_side ? n_planes(false) : 0) + i];
  }
  void encode(kernels::KvFormat f, const float* x, const Plane* planes, size_t row, size_t head,
              size_t col);

  kernels::KvFormat k_fmt_, v_fmt_;
  StoreGeometry geo_;
  std::shared_ptr<KvAllocator> mem_;
  std::vector<Plane> planes_;  // K planes, then V planes
};

}  // namespace ferry::kv
