// SequenceKv: the simple per-sequence float32 KV cache of the first slice.
// The batched KV layer (kv/batched_*) replaces it for serving; this one
// stays as the solo reference the batched layer is tested against.
//
// Layout: [layer][kv_head][capacity][head_dim], so the keys one attention
// head reads are contiguous.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/ops.h"

namespace ferry::kv {

struct KvShape {
  size_t n_layers = 0;
  size_t n_kv_heads = 0;
  size_t head_dim = 0;
  size_t floats_per_token() const { return 2 * n_layers * n_kv_heads * head_dim; }
};

class SequenceKv {
 public:
  // Allocates capacity tokens now (capacity * shape.floats_per_token() floats).
  SequenceKv(const KvShape& shape, size_t capacity);

  const KvShape& shape() const { return shape_; }
  size_t capacity() const { return capacity_; }
  // Tokens whose K/V every layer holds.
  size_t length() const { return length_; }

  // Writes the K/V of token `pos` (pos < capacity) for one layer; rows are
  // [n_kv_heads * head_dim].
  void write(size_t layer, size_t pos, const float* k_row, const float* v_row);
  // Marks tokens [length, length + n) as written by every layer.
  void advance(size_t n);
  // Forgets tokens from n on.
  void truncate(size_t n);

  // Attention task over keys [0, n_keys) of `layer` (q and out set by caller).
  kernels::AttentionTask view(size_t layer, size_t n_keys) const;

  size_t bytes() const { return data_.size() * sizeof(float); }

 private:
  size_t offset(size_t layer, bool v, size_t head, size_t pos) const;

  KvShape shape_;
  size_t capacity_;
  size_t length_ = 0;
  std::vector<float> data_;
};

}  // namespace ferry::kv
