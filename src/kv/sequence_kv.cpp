#include "kv/sequence_kv.h"

#include <cstring>

#include "core/error.h"

namespace ferry::kv {

SequenceKv::SequenceKv(const KvShape& shape, size_t capacity)
    : shape_(shape), capacity_(capacity), data_(capacity * shape.floats_per_token()) {}

size_t SequenceKv::offset(size_t layer, bool v, size_t head, size_t pos) const {
  const size_t D = shape_.head_dim;
  return (((layer * 2 + (v ? 1 : 0)) * shape_.n_kv_heads + head) * capacity_ + pos) * D;
}

void SequenceKv::write(size_t layer, size_t pos, const float* k_row, const float* v_row) {
  FERRY_CHECK(layer < shape_.n_layers && pos < capacity_, "kv", "write layer ", layer, " pos ",
              pos, " capacity ", capacity_);
  const size_t D = shape_.head_dim;
  for (size_t h = 0; h < shape_.n_kv_heads; ++h) {
    std::memcpy(&data_[offset(layer, false, h, pos)], k_row + h * D, D * sizeof(float));
    std::memcpy(&data_[offset(layer, true, h, pos)], v_row + h * D, D * sizeof(float));
  }
}

void SequenceKv::advance(size_t n) {
  FERRY_CHECK(length_ + n <= capacity_, "kv", "advance past capacity");
  length_ += n;
}

void SequenceKv::truncate(size_t n) {
  if (n < length_) length_ = n;
}

kernels::AttentionTask SequenceKv::view(size_t layer, size_t n_keys) const {
  FERRY_CHECK(n_keys <= capacity_, "kv", "view of ", n_keys, " keys");
  kernels::AttentionTask t;
  t.k = &data_[offset(layer, false, 0, 0)];
  t.v = &data_[offset(layer, true, 0, 0)];
  t.kv_head_stride = capacity_ * shape_.head_dim;
  t.n_keys = n_keys;
  return t;
}

}  // namespace ferry::kv
