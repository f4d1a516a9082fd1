#include "kv/batch_kv.h"

#include <algorithm>

#include "core/error.h"

namespace ferry::kv {

namespace {
// Column capacity grows in steps of this many tokens (and by half of the
// current capacity at least) so decode does not reallocate every step.
constexpr size_t kColStep = 64;
size_t round_up(size_t n, size_t step) {
  return (n + step - 1) / step * step;
}
}  // namespace

KvSpec KvSpec::uniform(size_t n_layers, size_t n_kv_heads, size_t head_dim, kernels::KvFormat k,
                       kernels::KvFormat v) {
  KvSpec s;
  s.n_kv_heads = n_kv_heads;
  s.head_dim = head_dim;
  s.layers.assign(n_layers, KvLayerSpec{k, v, 0});
  return s;
}

void KvSpec::validate() const {
  if (n_kv_heads == 0 || head_dim == 0 || layers.empty())
    fail("kv", "empty KV spec (heads ", n_kv_heads, ", head_dim ", head_dim, ", layers ",
         layers.size(), ")");
  for (const auto& l : layers) {
    l.k.validate(head_dim);
    l.v.validate(head_dim);
  }
}

kernels::AttentionTask KvView::task(size_t row, size_t first, size_t last, kernels::KvSide* k,
                                    kernels::KvSide* v) const {
  FERRY_CHECK(row < table_.size() && first >= table_.row(row).start && last < table_.row(row).end &&
                  first <= last,
              "kv_view", "keys [", first, ", ", last, "] outside row ", row);
  *k = store_.side(false, row);
  *v = store_.side(true, row);
  kernels::AttentionTask t;
  t.k = k;
  t.v = v;
  t.seg[0] = {first + base_, last + 1 + base_};
  return t;
}

BatchKv::BatchKv(KvSpec spec, std::shared_ptr<KvAllocator> alloc)
    : spec_(std::move(spec)), alloc_(std::move(alloc)) {
  spec_.validate();
  geo_.n_kv_heads = spec_.n_kv_heads;
  geo_.head_dim = spec_.head_dim;
}

size_t BatchKv::minimum_reusable_offset() const {
  size_t m = 0;
  for (const auto& r : table_.rows()) m = std::max(m, r.min_reusable);
  return m;
}

size_t BatchKv::bytes_per_token() const {
  size_t n = 0;
  for (const auto& l : spec_.layers)
    n += spec_.n_kv_heads *
         (l.k.bytes_per_head_token(spec_.head_dim) + l.v.bytes_per_head_token(spec_.head_dim));
  return n;
}

size_t BatchKv::allocated_bytes() const {
  size_t n = 0;
  for (const auto& l : layers_) n += l.allocated_bytes();
  return n;
}

StoreGeometry BatchKv::geometry_for(size_t rows, size_t width) const {
  StoreGeometry g = geo_;
  g.row_cap = std::max<size_t>(rows, 1);
  g.col_cap = round_up(std::max<size_t>(width, 1), kColStep);
  return g;
}

std::vector<LayerStore> BatchKv::rebuilt(const StoreGeometry& geo, const RowTable& table,
                                         std::span<const long> src_rows) const {
  std::vector<LayerStore> out;
  out.reserve(spec_.layers.size());
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    out.emplace_back(spec_.layers[l].k, spec_.layers[l].v, geo, *alloc_);
    for (size_t r = 0; r < table.size(); ++r) {
      if (src_rows[r] < 0) continue;
      const RowState& from = table_.row(static_cast<size_t>(src_rows[r]));
      const RowState& to = table.row(r);
      out[l].copy_cols(layers_[l], static_cast<size_t>(src_rows[r]), from.start + base_, r,
                       to.start, std::min(from.length(), to.length()));
    }
  }
  return out;
}

void BatchKv::unshare() {
  bool any = std::any_of(layers_.begin(), layers_.end(), [](const auto& l) { return l.shared(); });
  if (!any) return;
  std::vector<LayerStore> copies;
  copies.reserve(layers_.size());
  for (const auto& l : layers_) copies.push_back(l.shared() ? l.clone(*alloc_) : l.share());
  layers_ = std::move(copies);
}

void BatchKv::require_no_round(const char* op) const {
  if (spec_base_) fail("kv", op, " during a speculative round (commit or roll back first)");
}

void BatchKv::prepare_prefill(std::span<const size_t> lengths) {
  require_no_round("prepare_prefill");
  RowTable t = RowTable::merged(lengths);
  std::vector<RowState> rows(t.rows().begin(), t.rows().end());
  for (auto& r : rows) r.end = r.start;
  RowTable empty(std::move(rows));
  const StoreGeometry g = geometry_for(lengths.size(), t.width());
  std::vector<long> none(lengths.size(), -1);
  std::vector<LayerStore> stores = rebuilt(g, empty, none);
  // Commit (no-throw from here).
  layers_ = std::move(stores);
  geo_ = g;
  base_ = 0;
  table_ = std::move(empty);
  prefill_lengths_.assign(lengths.begin(), lengths.end());
}

void BatchKv::finalize_prefill() {
  FERRY_CHECK(prefill_lengths_.size() == rows(), "kv", "finalize_prefill without prepare_prefill");
  for (size_t b = 0; b < rows(); ++b)
    if (table_.row(b).length() != prefill_lengths_[b])
      fail("kv", "finalize_prefill: row ", b, " has ", table_.row(b).length(), " of its ",
           prefill_lengths_[b], " prompt tokens");
  for (size_t b = 0; b < rows(); ++b) table_.set_prefill_end(b);
  prefill_lengths_.clear();
}

void BatchKv::reserve(std::span<const size_t> counts) {
  FERRY_CHECK(counts.size() == rows(), "kv", "reserve: ", counts.size(), " counts for ", rows(),
              " rows");
  size_t need = 0;
  for (size_t b = 0; b < rows(); ++b) need = std::max(need, table_.row(b).end + counts[b]);
  if (!layers_.empty() && need <= geo_.col_cap) {
    unshare();
    if (need + base_ > geo_.col_cap) {
      // Fits once the columns filter() trimmed (base_) are given back: move
      // the rows left in place. (base_ only rises between rebuilds, so
      // growing here would enlarge a long-running batch without bound.)
      for (auto& l : layers_)
        for (size_t b = 0; b < rows(); ++b)
          l.move_cols(b, table_.row(b).start + base_, b, table_.row(b).start,
                      table_.row(b).length());
      base_ = 0;
    }
    return;
  }
  // Grow: at least half again, so a long decode reallocates O(log n) times.
  const size_t width = std::max(need, geo_.col_cap + geo_.col_cap / 2);
  StoreGeometry g = geometry_for(std::max(rows(), geo_.row_cap), width);
  std::vector<long> same(rows());
  for (size_t b = 0; b < rows(); ++b) same[b] = static_cast<long>(b);
  std::vector<LayerStore> stores = rebuilt(g, table_, same);
  // rebuilt() placed rows at their logical columns: base becomes 0.
  layers_ = std::move(stores);
  geo_ = g;
  base_ = 0;
}

void BatchKv::write(size_t layer, size_t row, size_t i, const float* k, const float* v) {
  FERRY_CHECK(layer < layers_.size() && row < rows(), "kv", "write to layer ", layer, " row ", row);
  layers_[layer].write(row, table_.row(row).end + i + base_, k, v);
}

kernels::AttentionTask BatchKv::attention_task(size_t layer, size_t row, size_t i,
                                               kernels::KvSide* k, kernels::KvSide* v) const {
  FERRY_CHECK(layer < layers_.size() && row < rows(), "kv", "attention at layer ", layer, " row ",
              row);
  const RowState& r = table_.row(row);
  const size_t last = r.end + i;  // the query's own column
  size_t first = r.start;
  const size_t window = spec_.layers[layer].window;
  if (window > 0 && last + 1 > first + window) first = last + 1 - window;
  *k = layers_[layer].side(false, row);
  *v = layers_[layer].side(true, row);
  kernels::AttentionTask t;
  t.k = k;
  t.v = v;
  t.seg[0] = {first + base_, last + 1 + base_};
  return t;
}

void BatchKv::commit(std::span<const size_t> counts) {
  FERRY_CHECK(counts.size() == rows(), "kv", "commit: ", counts.size(), " counts for ", rows(),
              " rows");
  for (size_t b = 0; b < rows(); ++b)
    FERRY_CHECK(table_.row(b).end + counts[b] + base_ <= geo_.col_cap, "kv", "commit: row ", b,
                " would end past capacity ", geo_.col_cap, " (reserve first)");
  for (size_t b = 0; b < rows(); ++b) table_.advance(b, counts[b]);
}

BatchKv BatchKv::merge(std::span<const BatchKv* const> parts) {
  FERRY_CHECK(!parts.empty(), "kv", "merge of no caches");
  const BatchKv& first = *parts[0];
  std::vector<size_t> lengths;
  for (const BatchKv* p : parts) {
    if (!(p->spec_ == first.spec_)) fail("kv", "merge: caches have different layouts");
    p->require_no_round("merge");
    for (const auto& r : p->table_.rows()) lengths.push_back(r.length());
  }
  RowTable t = RowTable::merged(lengths);
  // Keep per-row token metadata.
  std::vector<RowState> rows(t.rows().begin(), t.rows().end());
  size_t i = 0;
  for (const BatchKv* p : parts)
    for (const auto& r : p->table_.rows()) {
      rows[i].prefill_end = r.prefill_end;
      rows[i].min_reusable = r.min_reusable;
      ++i;
    }
  t = RowTable(std::move(rows));
  BatchKv out(first.spec_, first.alloc_);
  out.geo_ = out.geometry_for(lengths.size(), t.width());
  std::vector<LayerStore> stores;
  for (size_t l = 0; l < first.spec_.layers.size(); ++l) {
    stores.emplace_back(first.spec_.layers[l].k, first.spec_.layers[l].v, out.geo_, *first.alloc_);
    size_t row = 0;
    for (const BatchKv* p : parts)
      for (size_t r = 0; r < p->rows(); ++r, ++row) {
        const RowState& from = p->table_.row(r);
        stores[l].copy_cols(p->layers_[l], r, from.start + p->base_, row, t.row(row).start,
                            from.length());
      }
  }
  out.layers_ = std::move(stores);
  out.table_ = std::move(t);
  return out;
}

void BatchKv::extend(const BatchKv& other) {
  require_no_round("extend");
  other.require_no_round("extend");
  FERRY_CHECK(&other != this, "kv", "extend a cache with itself");
  if (!(other.spec_ == spec_)) fail("kv", "extend: caches have different layouts");
  if (other.rows() == 0) return;
  // Plan the whole table first (other's rows one after another), so that the
  // bytes are applied once, all or nothing.
  RowTable t = table_;
  size_t shift = 0;  // how far the running rows move right
  for (const RowState& src : other.table_.rows()) {
    size_t s = 0;
    const RowTable e = t.extended(src.length(), &s);
    std::vector<RowState> rows(e.rows().begin(), e.rows().end());
    rows.back().prefill_end = src.prefill_end;
    rows.back().min_reusable = src.min_reusable;
    t = RowTable(std::move(rows));
    shift += s;
  }
  const size_t n0 = rows(), n = t.size();
  auto copy_joiners = [&](LayerStore& to, size_t l, size_t col_offset) {
    for (size_t r = 0; r < other.rows(); ++r) {
      const RowState& src = other.table_.row(r);
      to.copy_cols(other.layers_[l], r, src.start + other.base_, n0 + r,
                   t.row(n0 + r).start + col_offset, src.length());
    }
  };
  const bool in_place =
      !layers_.empty() && (shift == 0 || n0 == 0) && n <= geo_.row_cap &&
      t.width() + base_ <= geo_.col_cap &&
      std::none_of(layers_.begin(), layers_.end(), [](const auto& l) { return l.shared(); });
  if (in_place) {
    for (size_t l = 0; l < layers_.size(); ++l) copy_joiners(layers_[l], l, base_);
    table_ = std::move(t);
    return;
  }
  // Rebuild: running rows shift right by `shift`; row slots double only when
  // the rows do not fit (a rebuild for width alone keeps the row capacity).
  const size_t row_cap = n <= geo_.row_cap ? geo_.row_cap : std::max(n, 2 * geo_.row_cap);
  StoreGeometry g = geometry_for(row_cap, t.width());
  std::vector<LayerStore> stores;
  stores.reserve(spec_.layers.size());
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    stores.emplace_back(spec_.layers[l].k, spec_.layers[l].v, g, *alloc_);
    for (size_t b = 0; b < n0; ++b)
      stores[l].copy_cols(layers_[l], b, table_.row(b).start + base_, b, t.row(b).start,
                          table_.row(b).length());
    copy_joiners(stores[l], l, 0);
  }
  layers_ = std::move(stores);
  geo_ = g;
  base_ = 0;
  table_ = std::move(t);
}

void BatchKv::filter(std::span<const size_t> keep) {
  require_no_round("filter");
  size_t trim = 0;
  RowTable t = table_.filtered(keep, &trim);
  // A row may leave in the middle of a batched prefill: the survivors'
  // prompt lengths stay pending.
  std::vector<size_t> pending;
  if (!prefill_lengths_.empty())
    for (size_t b : keep) pending.push_back(prefill_lengths_[b]);
  unshare();  // the last step that can fail
  for (auto& l : layers_)
    for (size_t i = 0; i < keep.size(); ++i) {
      const RowState& r = table_.row(keep[i]);
      l.move_cols(keep[i], r.start + base_, i, r.start + base_, r.length());
    }
  base_ += trim;
  table_ = std::move(t);
  prefill_lengths_ = std::move(pending);
}

BatchKv BatchKv::extract(size_t row) const {
  FERRY_CHECK(row < rows(), "kv", "extract row ", row, " of ", rows());
  require_no_round("extract");
  const RowState& r = table_.row(row);
  BatchKv out(spec_, alloc_);
  out.geo_ = out.geometry_for(1, r.length());
  std::vector<LayerStore> stores;
  for (size_t l = 0; l < layers_.size(); ++l) {
    stores.emplace_back(spec_.layers[l].k, spec_.layers[l].v, out.geo_, *alloc_);
    stores[l].copy_cols(layers_[l], row, r.start + base_, 0, 0, r.length());
  }
  out.layers_ = std::move(stores);
  out.table_ = RowTable({RowState{0, r.length(), r.prefill_end, r.min_reusable}});
  return out;
}

void BatchKv::align(std::span<const size_t> left_pad) {
  require_no_round("align");
  RowTable t = table_.aligned(left_pad);
  if (t == table_) return;
  if (t.width() + base_ <= geo_.col_cap) {
    unshare();
    for (auto& l : layers_)
      for (size_t b = 0; b < rows(); ++b)
        l.move_cols(b, table_.row(b).start + base_, b, t.row(b).start + base_,
                    table_.row(b).length());
    table_ = std::move(t);
    return;
  }
  StoreGeometry g = geometry_for(geo_.row_cap, t.width());
  std::vector<long> same(rows());
  for (size_t b = 0; b < rows(); ++b) same[b] = static_cast<long>(b);
  std::vector<LayerStore> stores = rebuilt(g, t, same);
  layers_ = std::move(stores);
  geo_ = g;
  base_ = 0;
  table_ = std::move(t);
}

void BatchKv::trim(size_t n) {
  require_no_round("trim");
  table_.trim(n);
}

void BatchKv::spec_begin() {
  require_no_round("spec_begin");
  std::vector<size_t> ends;
  for (const auto& r : table_.rows()) ends.push_back(r.end);
  spec_base_ = std::move(ends);
}

void BatchKv::spec_commit() {
  if (!spec_base_) fail("kv", "spec_commit without spec_begin");
  spec_base_.reset();
}

void BatchKv::spec_rollback(std::span<const size_t> keep) {
  if (!spec_base_) fail("kv", "spec_rollback without spec_begin");
  if (keep.size() != rows())
    fail("kv", "spec_rollback: ", keep.size(), " keeps for ", rows(), " rows");
  for (size_t b = 0; b < rows(); ++b) {
    const size_t added = table_.row(b).end - (*spec_base_)[b];
    if (keep[b] > added)
      fail("kv", "spec_rollback: row ", b, " keeps ", keep[b], " of ", added,
           " speculative tokens");
  }
  table_.rollback_to(*spec_base_, keep);
  spec_base_.reset();
}

KvView BatchKv::capture(size_t layer) const {
  FERRY_CHECK(layer < layers_.size(), "kv", "capture layer ", layer);
  return KvView(layers_[layer].share(), table_, base_);
}

void BatchKv::check_integrity() const {
  auto bad = [](auto... what) { fail("kv_integrity", what...); };
  if (layers_.size() != spec_.layers.size() && !(layers_.empty() && rows() == 0))
    bad(layers_.size(), " layer stores for ", spec_.layers.size(), " layers");
  if (rows() > geo_.row_cap && rows() > 0) bad(rows(), " rows over capacity ", geo_.row_cap);
  for (size_t b = 0; b < rows(); ++b) {
    const RowState& r = table_.row(b);
    if (r.start > r.end) bad("row ", b, " starts after it ends");
    if (r.end + base_ > geo_.col_cap) bad("row ", b, " ends past capacity");
    if (r.prefill_end > r.length() && !spec_base_) bad("row ", b, " prefill_end past its length");
  }
  for (const auto& l : layers_)
    if (!(l.geometry() == geo_)) bad("a layer's geometry differs from the cache's");
  if (spec_base_) {
    if (spec_base_->size() != rows()) bad("speculative base of the wrong size");
    for (size_t b = 0; b < rows(); ++b)
      if ((*spec_base_)[b] < table_.row(b).start || (*spec_base_)[b] > table_.row(b).end)
        bad("row ", b, " speculative base outside the row");
  }
}

}  // namespace ferry::kv
