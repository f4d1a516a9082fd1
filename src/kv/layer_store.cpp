#include "kv/layer_store.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kv/affine_quant.h"

namespace ferry::kv {

LayerStore::LayerStore(kernels::KvFormat k, kernels::KvFormat v, const StoreGeometry& geo,
                       std::shared_ptr<KvAllocator> alloc)
    : k_fmt_(k), v_fmt_(v), geo_(geo), mem_(std::move(alloc)) {
  for (bool vs : {false, true})
    for (size_t unit : (vs ? v : k).plane_units(geo.head_dim)) {
      const size_t bytes = geo.row_cap * geo.n_kv_heads * geo.col_cap * unit;
      planes_.push_back(Plane{unit, mem_->allocate(bytes)});
    }
}

uint8_t* LayerStore::at(const Plane& p, size_t row, size_t head, size_t col) const {
  return p.buf->data + ((row * geo_.n_kv_heads + head) * geo_.col_cap + col) * p.unit;
}

void LayerStore::encode(kernels::KvFormat f, const float* x, const Plane* planes, size_t row,
                        size_t head, size_t col) {
  const size_t D = geo_.head_dim;
  uint8_t* dst = at(planes[0], row, head, col);
  switch (f.kind) {
    case kernels::KvFormat::Kind::F32:
      std::memcpy(dst, x, D * 4);
      return;
    case kernels::KvFormat::Kind::F16:
    case kernels::KvFormat::Kind::BF16:
      for (size_t i = 0; i < D; ++i) {
        uint16_t h = f.kind == kernels::KvFormat::Kind::F16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case kernels::KvFormat::Kind::Affine: {
      // Quantize into aligned temporaries, then copy: plane bytes carry no
      // alignment promise.
      uint32_t packed[512];
      uint16_t scales[64], biases[64];
      FERRY_CHECK(D * f.bits / 32 <= 512 && D / f.group <= 64, "kv", "head_dim ", D, " too large");
      affine_quantize(x, D, f.bits, f.group, packed, scales, biases);
      std::memcpy(dst, packed, planes[0].unit);
      std::memcpy(at(planes[1], row, head, col), scales, planes[1].unit);
      std::memcpy(at(planes[2], row, head, col), biases, planes[2].unit);
      return;
    }
  }
}

void LayerStore::write(size_t row, size_t col, const float* k, const float* v) {
  FERRY_CHECK(row < geo_.row_cap && col < geo_.col_cap, "kv", "write at row ", row, " col ", col,
              " outside ", geo_.row_cap, "x", geo_.col_cap);
  FERRY_CHECK(mem_->host_accessible(), "kv", "host write into device KV memory");
  const size_t D = geo_.head_dim;
  for (size_t h = 0; h < geo_.n_kv_heads; ++h) {
    encode(k_fmt_, k + h * D, &planes_[0], row, h, col);
    encode(v_fmt_, v + h * D, &planes_[n_planes(false)], row, h, col);
  }
}

void LayerStore::copy_cols(const LayerStore& src, size_t sr, size_t sc, size_t dr, size_t dc,
                           size_t n, std::vector<KvAllocator::Copy2d>& batch) const {
  if (n == 0) return;
  FERRY_CHECK(src.k_fmt_ == k_fmt_ && src.v_fmt_ == v_fmt_ &&
                  src.geo_.n_kv_heads == geo_.n_kv_heads && src.geo_.head_dim == geo_.head_dim,
              "kv", "copy between stores of different formats");
  FERRY_CHECK(sr < src.geo_.row_cap && dr < geo_.row_cap && sc + n <= src.geo_.col_cap &&
                  dc + n <= geo_.col_cap,
              "kv", "copy out of range");
  // One strided copy per plane: the row's heads are runs col_cap apart.
  for (size_t p = 0; p < planes_.size(); ++p) {
    const size_t u = planes_[p].unit;
    batch.push_back({at(planes_[p], dr, 0, dc), geo_.col_cap * u, src.at(src.planes_[p], sr, 0, sc),
                     src.geo_.col_cap * u, n * u, geo_.n_kv_heads});
  }
}

void LayerStore::move_cols(size_t sr, size_t sc, size_t dr, size_t dc, size_t n) {
  std::vector<KvAllocator::Copy2d> batch;
  move_cols(sr, sc, dr, dc, n, batch);
  mem_->copy_each(batch);
}

void LayerStore::move_cols(size_t sr, size_t sc, size_t dr, size_t dc, size_t n,
                           std::vector<KvAllocator::Copy2d>& batch) const {
  if (n == 0 || (sr == dr && sc == dc)) return;
  FERRY_CHECK(
      sr < geo_.row_cap && dr < geo_.row_cap && sc + n <= geo_.col_cap && dc + n <= geo_.col_cap,
      "kv", "move out of range");
  for (const auto& p : planes_)
    batch.push_back({at(p, dr, 0, dc), geo_.col_cap * p.unit, at(p, sr, 0, sc),
                     geo_.col_cap * p.unit, n * p.unit, geo_.n_kv_heads});
}

kernels::KvSide LayerStore::side(bool v_side, size_t row) const {
  kernels::KvSide s;
  s.format = format(v_side);
  for (size_t i = 0; i < n_planes(v_side); ++i) {
    const Plane& p = plane(v_side, i);
    s.plane[i] = at(p, row, 0, 0);
    s.head_stride[i] = geo_.col_cap * p.unit;
    s.unit[i] = p.unit;
  }
  return s;
}

size_t LayerStore::allocated_bytes() const {
  size_t n = 0;
  for (const auto& p : planes_) n += p.buf->size;
  return n;
}

bool LayerStore::shared() const {
  for (const auto& p : planes_)
    if (p.buf.use_count() > 1) return true;
  return false;
}

LayerStore LayerStore::share() const {
  LayerStore c;
  c.k_fmt_ = k_fmt_;
  c.v_fmt_ = v_fmt_;
  c.geo_ = geo_;
  c.mem_ = mem_;
  c.planes_ = planes_;
  return c;
}

LayerStore LayerStore::clone() const {
  LayerStore c;
  c.k_fmt_ = k_fmt_;
  c.v_fmt_ = v_fmt_;
  c.geo_ = geo_;
  c.mem_ = mem_;
  for (const auto& p : planes_) {
    auto b = mem_->allocate(p.buf->size);
    mem_->copy_2d(b->data, 0, p.buf->data, 0, p.buf->size, 1);
    c.planes_.push_back(Plane{p.unit, std::move(b)});
  }
  return c;
}

}  // namespace ferry::kv
