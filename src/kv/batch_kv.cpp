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
  FERRY_CHECK(ring_ == 0 || last - first < ring_, "kv_view", "keys [", first, ", ", last,
              "] are more than the ring of ", ring_, " holds");
  *k = store_.side(false, row);
  *v = store_.side(true, row);
  kernels::AttentionTask t;
  t.k = k;
  t.v = v;
  const size_t s0 = ring_ ? (first + offset_) % ring_ : first + offset_;
  const size_t n = last + 1 - first;
  if (ring_ && s0 + n > ring_) {
    t.seg[0] = {s0, ring_};
    t.seg[1] = {0, s0 + n - ring_};
  } else {
    t.seg[0] = {s0, s0 + n};
  }
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

static size_t layer_bytes_per_token(const KvSpec& s, const KvLayerSpec& l) {
  return s.n_kv_heads *
         (l.k.bytes_per_head_token(s.head_dim) + l.v.bytes_per_head_token(s.head_dim));
}

size_t KvSpec::bytes_per_token() const {
  size_t n = 0;
  for (const auto& l : layers) n += layer_bytes_per_token(*this, l);
  return n;
}

size_t KvSpec::projected_bytes(size_t tokens, size_t max_step) const {
  size_t n = 0;
  for (const auto& l : layers) {
    const size_t held =
        l.window ? std::min(tokens, l.window + std::max<size_t>(max_step, 1) - 1) : tokens;
    n += layer_bytes_per_token(*this, l) * held;
  }
  return n;
}

size_t BatchKv::bytes_per_token() const {
  return spec_.bytes_per_token();
}

size_t BatchKv::projected_bytes(size_t tokens, size_t max_step) const {
  return spec_.projected_bytes(tokens, max_step);
}

size_t BatchKv::allocated_bytes() const {
  size_t n = 0;
  for (const auto& l : layers_) n += l.allocated_bytes();
  return n;
}

size_t BatchKv::ring_size(size_t layer) const {
  const size_t w = spec_.layers[layer].window;
  return w ? w + step_cap_ - 1 : 0;
}

bool BatchKv::has_ring() const {
  return std::any_of(spec_.layers.begin(), spec_.layers.end(),
                     [](const KvLayerSpec& l) { return l.window > 0; });
}

BatchKv::ColMap BatchKv::colmap(size_t layer) const {
  const size_t ring = ring_size(layer);
  return ring ? ColMap{ring_base_ % ring, ring} : ColMap{base_, 0};
}

StoreGeometry BatchKv::layer_geometry(size_t layer, const StoreGeometry& geo, size_t step) const {
  StoreGeometry g = geo;
  const size_t w = spec_.layers[layer].window;
  if (w) g.col_cap = w + step - 1;
  return g;
}

std::pair<size_t, size_t> BatchKv::live_cols(size_t layer, const RowState& r) const {
  const size_t ring = ring_size(layer);
  const size_t n = ring ? std::min(r.length(), ring) : r.length();
  return {r.end - n, n};
}

void BatchKv::copy_span(LayerStore& dst, size_t dr, ColMap dm, size_t c_dst, const LayerStore& src,
                        size_t sr, ColMap sm, size_t c_src, size_t n,
                        std::vector<KvAllocator::Copy2d>& batch) {
  const bool same = &dst == &src;
  while (n > 0) {
    const size_t ps = sm.slot(c_src), pd = dm.slot(c_dst);
    size_t run = n;
    if (sm.ring) run = std::min(run, sm.ring - ps);
    if (dm.ring) run = std::min(run, dm.ring - pd);
    if (same)
      dst.move_cols(sr, ps, dr, pd, run, batch);
    else
      dst.copy_cols(src, sr, ps, dr, pd, run, batch);
    c_src += run;
    c_dst += run;
    n -= run;
  }
}

StoreGeometry BatchKv::geometry_for(size_t rows, size_t width) const {
  StoreGeometry g = geo_;
  g.row_cap = std::max<size_t>(rows, 1);
  g.col_cap = round_up(std::max<size_t>(width, 1), kColStep);
  return g;
}

std::vector<LayerStore> BatchKv::rebuilt(const StoreGeometry& geo, size_t step,
                                         const RowTable& table,
                                         std::span<const long> src_rows) const {
  std::vector<LayerStore> out;
  out.reserve(spec_.layers.size());
  // Every row's copies into the new stores, run together at the end (the
  // new stores share no bytes with the old ones).
  std::vector<KvAllocator::Copy2d> batch;
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    const StoreGeometry lg = layer_geometry(l, geo, step);
    out.emplace_back(spec_.layers[l].k, spec_.layers[l].v, lg, alloc_);
    const ColMap to_map{0, spec_.layers[l].window ? lg.col_cap : 0};
    for (size_t r = 0; r < table.size(); ++r) {
      if (src_rows[r] < 0) continue;
      const RowState& from = table_.row(static_cast<size_t>(src_rows[r]));
      const RowState& to = table.row(r);
      auto [c0, n] = live_cols(l, from);
      const size_t keep = std::min(n, to.length());
      if (to_map.ring) {
        // The new ring holds at most its own size: the newest columns.
        const size_t fit = std::min(keep, to_map.ring);
        c0 = from.end - fit;
        n = fit;
      } else {
        n = keep;
      }
      copy_span(out[l], r, to_map, to.start + (c0 - from.start), layers_[l],
                static_cast<size_t>(src_rows[r]), colmap(l), c0, n, batch);
    }
  }
  if (!batch.empty()) alloc_->copy_batch(batch);
  return out;
}

void BatchKv::adopt(std::vector<LayerStore> stores, const StoreGeometry& geo,
                    size_t step) noexcept {
  layers_ = std::move(stores);
  geo_ = geo;
  step_cap_ = step;
  base_ = 0;
  ring_base_ = 0;
}

void BatchKv::unshare() {
  bool any = std::any_of(layers_.begin(), layers_.end(), [](const auto& l) { return l.shared(); });
  if (!any) return;
  std::vector<LayerStore> copies;
  copies.reserve(layers_.size());
  for (const auto& l : layers_) copies.push_back(l.shared() ? l.clone() : l.share());
  layers_ = std::move(copies);
}

void BatchKv::require_no_round(const char* op) const {
  if (spec_base_) fail("kv", op, " during a speculative round (commit or roll back first)");
}

void BatchKv::check_ring_rollback(const char* op, std::span<const size_t> new_len) const {
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    const size_t w = spec_.layers[l].window;
    if (!w) continue;
    for (size_t b = 0; b < rows(); ++b) {
      // The next token (position new_len) needs keys from new_len + 1 - w.
      const size_t need_from = new_len[b] + 1 > w ? new_len[b] + 1 - w : 0;
      if (table_.row(b).ring_lost > need_from)
        fail("kv", op, ": row ", b, " would need keys from position ", need_from, " that layer ", l,
             "'s sliding-window ring (", ring_size(l),
             " slots) has already overwritten; keep more tokens");
    }
  }
}

void BatchKv::prepare_prefill(std::span<const size_t> lengths) {
  require_no_round("prepare_prefill");
  RowTable t = RowTable::merged(lengths);
  std::vector<RowState> rows(t.rows().begin(), t.rows().end());
  for (size_t b = 0; b < rows.size(); ++b) {
    rows[b].end = rows[b].start;
    rows[b].pending_prefill = lengths[b];
  }
  RowTable empty(std::move(rows));
  const StoreGeometry g = geometry_for(lengths.size(), t.width());
  std::vector<long> none(lengths.size(), -1);
  // Rings start sized for the whole prompt in one step; reserve() resizes.
  size_t step = 1;
  for (size_t len : lengths) step = std::max(step, len);
  std::vector<LayerStore> stores = rebuilt(g, step, empty, none);
  adopt(std::move(stores), g, step);  // no-throw from here
  table_ = std::move(empty);
}

void BatchKv::add_rows(std::span<const size_t> prompt_lengths) {
  require_no_round("add_rows");
  if (prompt_lengths.empty()) return;
  if (layers_.empty()) {
    prepare_prefill(prompt_lengths);
    return;
  }
  const size_t w = table_.width();
  std::vector<RowState> next(table_.rows().begin(), table_.rows().end());
  for (size_t len : prompt_lengths) {
    RowState r;
    r.start = r.end = len <= w ? w - len : 0;
    r.pending_prefill = len;
    next.push_back(r);
  }
  RowTable t(std::move(next));
  if (t.size() <= geo_.row_cap) {
    table_ = std::move(t);
    return;
  }
  const StoreGeometry g = geometry_for(std::max(t.size(), 2 * geo_.row_cap), geo_.col_cap);
  std::vector<long> src(t.size(), -1);
  for (size_t b = 0; b < rows(); ++b) src[b] = static_cast<long>(b);
  std::vector<LayerStore> stores = rebuilt(g, step_cap_, t, src);
  adopt(std::move(stores), g, step_cap_);
  table_ = std::move(t);
}

void BatchKv::finalize_row(size_t b) {
  FERRY_CHECK(b < rows(), "kv", "finalize_row ", b, " of ", rows());
  const RowState& r = table_.row(b);
  if (r.pending_prefill == 0 || r.length() != r.pending_prefill)
    fail("kv", "finalize_row: row ", b, " has ", r.length(), " tokens, prompt ", r.pending_prefill);
  std::vector<RowState> rows(table_.rows().begin(), table_.rows().end());
  rows[b].prefill_end = rows[b].length();
  rows[b].pending_prefill = 0;
  table_ = RowTable(std::move(rows));
}

void BatchKv::finalize_prefill() {
  bool any = false;
  for (size_t b = 0; b < rows(); ++b) {
    const RowState& r = table_.row(b);
    if (r.pending_prefill == 0) continue;
    any = true;
    if (r.length() != r.pending_prefill)
      fail("kv", "finalize_prefill: row ", b, " has ", r.length(), " of its ", r.pending_prefill,
           " prompt tokens");
  }
  FERRY_CHECK(any || rows() == 0, "kv", "finalize_prefill without prepare_prefill");
  std::vector<RowState> rows(table_.rows().begin(), table_.rows().end());
  for (auto& r : rows)
    if (r.pending_prefill) {
      r.prefill_end = r.length();
      r.pending_prefill = 0;
    }
  table_ = RowTable(std::move(rows));
}

void BatchKv::reserve(std::span<const size_t> counts) {
  FERRY_CHECK(counts.size() == rows(), "kv", "reserve: ", counts.size(), " counts for ", rows(),
              " rows");
  size_t need = 0, step = 0;
  for (size_t b = 0; b < rows(); ++b) {
    need = std::max(need, table_.row(b).end + counts[b]);
    step = std::max(step, counts[b]);
  }
  const bool rings_fit = !has_ring() || step <= step_cap_;
  if (!layers_.empty() && need <= geo_.col_cap && rings_fit) {
    unshare();
    if (need + base_ > geo_.col_cap) {
      // Fits once the columns filter() trimmed (base_) are given back: move
      // the full layers' rows left in place. (base_ only rises between
      // rebuilds, so growing here would enlarge a long-running batch
      // without bound.) Ring layers keep their own offset.
      for (size_t l = 0; l < layers_.size(); ++l) {
        if (spec_.layers[l].window) continue;
        for (size_t b = 0; b < rows(); ++b)
          layers_[l].move_cols(b, table_.row(b).start + base_, b, table_.row(b).start,
                               table_.row(b).length());
      }
      base_ = 0;
    }
    return;
  }
  // Grow: at least half again, so a long decode reallocates O(log n) times.
  const size_t width =
      need <= geo_.col_cap ? geo_.col_cap : std::max(need, geo_.col_cap + geo_.col_cap / 2);
  StoreGeometry g = geometry_for(std::max(rows(), geo_.row_cap), width);
  std::vector<long> same(rows());
  for (size_t b = 0; b < rows(); ++b) same[b] = static_cast<long>(b);
  std::vector<LayerStore> stores = rebuilt(g, std::max(step, step_cap_), table_, same);
  adopt(std::move(stores), g, std::max(step, step_cap_));
}

BatchKv::WriteTarget BatchKv::write_target(size_t layer, size_t row, size_t i) const {
  FERRY_CHECK(layer < layers_.size() && row < rows(), "kv", "write to layer ", layer, " row ", row);
  FERRY_CHECK(!layers_[layer].shared(), "kv", "write into storage a view shares (reserve first)");
  FERRY_CHECK(!spec_.layers[layer].window || i < step_cap_, "kv", "write of step token ", i,
              " past the ring's step capacity ", step_cap_, " (reserve first)");
  const size_t slot = colmap(layer).slot(table_.row(row).end + i);
  FERRY_CHECK(slot < layers_[layer].geometry().col_cap, "kv", "write at slot ", slot,
              " outside the reservation (reserve first)");
  return {layers_[layer].side(false, row), layers_[layer].side(true, row), slot};
}

void BatchKv::write(size_t layer, size_t row, size_t i, const float* k, const float* v) {
  const WriteTarget t = write_target(layer, row, i);
  layers_[layer].write(row, t.slot, k, v);
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
  FERRY_CHECK(!window || first >= r.start + r.ring_lost, "kv", "row ", row,
              " needs keys its ring overwrote");
  *k = layers_[layer].side(false, row);
  *v = layers_[layer].side(true, row);
  kernels::AttentionTask t;
  t.k = k;
  t.v = v;
  const ColMap m = colmap(layer);
  const size_t s0 = m.slot(first), n = last + 1 - first;
  if (m.ring && s0 + n > m.ring) {
    t.seg[0] = {s0, m.ring};
    t.seg[1] = {0, s0 + n - m.ring};
  } else {
    t.seg[0] = {s0, s0 + n};
  }
  return t;
}

void BatchKv::commit(std::span<const size_t> counts) {
  FERRY_CHECK(counts.size() == rows(), "kv", "commit: ", counts.size(), " counts for ", rows(),
              " rows");
  for (size_t b = 0; b < rows(); ++b) {
    FERRY_CHECK(table_.row(b).end + counts[b] + base_ <= geo_.col_cap, "kv", "commit: row ", b,
                " would end past capacity ", geo_.col_cap, " (reserve first)");
    FERRY_CHECK(!has_ring() || counts[b] <= step_cap_, "kv", "commit: row ", b, " got ", counts[b],
                " tokens, rings allow ", step_cap_, " (reserve first)");
  }
  std::vector<RowState> next(table_.rows().begin(), table_.rows().end());
  size_t min_ring = 0;
  for (size_t l = 0; l < spec_.layers.size(); ++l)
    if (ring_size(l)) min_ring = min_ring ? std::min(min_ring, ring_size(l)) : ring_size(l);
  for (size_t b = 0; b < next.size(); ++b) {
    next[b].end += counts[b];
    // The smallest ring now holds only the newest min_ring tokens.
    if (min_ring && next[b].length() > min_ring)
      next[b].ring_lost = std::max(next[b].ring_lost, next[b].length() - min_ring);
  }
  table_ = RowTable(std::move(next));
}

BatchKv BatchKv::merge(std::span<const BatchKv* const> parts) {
  FERRY_CHECK(!parts.empty(), "kv", "merge of no caches");
  const BatchKv& first = *parts[0];
  std::vector<size_t> lengths;
  size_t step = 1;
  for (const BatchKv* p : parts) {
    if (!(p->spec_ == first.spec_)) fail("kv", "merge: caches have different layouts");
    p->require_no_round("merge");
    for (const auto& r : p->table_.rows()) lengths.push_back(r.length());
    step = std::max(step, p->step_cap_);
  }
  RowTable t = RowTable::merged(lengths);
  // Keep per-row token metadata.
  std::vector<RowState> rows(t.rows().begin(), t.rows().end());
  size_t i = 0;
  for (const BatchKv* p : parts)
    for (const auto& r : p->table_.rows()) rows[i++].copy_token_meta(r);
  t = RowTable(std::move(rows));
  BatchKv out(first.spec_, first.alloc_);
  const StoreGeometry g = out.geometry_for(lengths.size(), t.width());
  out.step_cap_ = step;
  std::vector<LayerStore> stores;
  std::vector<KvAllocator::Copy2d> batch;  // (into the new stores: run together)
  for (size_t l = 0; l < first.spec_.layers.size(); ++l) {
    const StoreGeometry lg = out.layer_geometry(l, g, step);
    stores.emplace_back(first.spec_.layers[l].k, first.spec_.layers[l].v, lg, first.alloc_);
    const ColMap to_map{0, first.spec_.layers[l].window ? lg.col_cap : 0};
    size_t row = 0;
    for (const BatchKv* p : parts)
      for (size_t r = 0; r < p->rows(); ++r, ++row) {
        const RowState& from = p->table_.row(r);
        auto [c0, n] = p->live_cols(l, from);
        if (to_map.ring && n > to_map.ring) {
          c0 += n - to_map.ring;
          n = to_map.ring;
        }
        copy_span(stores[l], row, to_map, t.row(row).start + (c0 - from.start), p->layers_[l], r,
                  p->colmap(l), c0, n, batch);
      }
  }
  if (!batch.empty()) first.alloc_->copy_batch(batch);
  out.adopt(std::move(stores), g, step);
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
    rows.back().copy_token_meta(src);
    t = RowTable(std::move(rows));
    shift += s;
  }
  const size_t n0 = rows(), n = t.size();
  const size_t step = std::max(step_cap_, other.step_cap_);
  // Copies the joiners into `to` whose layer l maps columns by `to_map`
  // (appended to `batch`: they read only `other`).
  std::vector<KvAllocator::Copy2d> batch;
  auto copy_joiners = [&](LayerStore& to, size_t l, ColMap to_map) {
    for (size_t r = 0; r < other.rows(); ++r) {
      const RowState& src = other.table_.row(r);
      auto [c0, cnt] = other.live_cols(l, src);
      if (to_map.ring && cnt > to_map.ring) {
        c0 += cnt - to_map.ring;
        cnt = to_map.ring;
      }
      copy_span(to, n0 + r, to_map, t.row(n0 + r).start + (c0 - src.start), other.layers_[l], r,
                other.colmap(l), c0, cnt, batch);
    }
  };
  const bool in_place =
      !layers_.empty() && (shift == 0 || n0 == 0) && n <= geo_.row_cap &&
      t.width() + base_ <= geo_.col_cap && step == step_cap_ &&
      std::none_of(layers_.begin(), layers_.end(), [](const auto& l) { return l.shared(); });
  if (in_place) {
    for (size_t l = 0; l < layers_.size(); ++l) copy_joiners(layers_[l], l, colmap(l));
    if (!batch.empty()) alloc_->copy_batch(batch);
    table_ = std::move(t);
    return;
  }
  // Rebuild: running rows shift right by `shift`; row slots double only when
  // the rows do not fit (a rebuild for width alone keeps the row capacity).
  const size_t row_cap = n <= geo_.row_cap ? geo_.row_cap : std::max(n, 2 * geo_.row_cap);
  StoreGeometry g = geometry_for(row_cap, t.width());
  std::vector<long> src_rows(n, -1);
  for (size_t b = 0; b < n0; ++b) src_rows[b] = static_cast<long>(b);
  std::vector<LayerStore> stores = rebuilt(g, step, t, src_rows);
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    const size_t ring = spec_.layers[l].window ? spec_.layers[l].window + step - 1 : 0;
    copy_joiners(stores[l], l, ColMap{0, ring});
  }
  if (!batch.empty()) alloc_->copy_batch(batch);
  adopt(std::move(stores), g, step);
  table_ = std::move(t);
}

void BatchKv::filter(std::span<const size_t> keep) {
  require_no_round("filter");
  size_t trim = 0;
  RowTable t = table_.filtered(keep, &trim);
  unshare();  // the last step that can fail
  // Row keep[i] to row i (keep increases, keep[i] >= i): each layer's moves
  // in row order, destinations before their sources.
  std::vector<KvAllocator::Copy2d> moves;
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (size_t i = 0; i < keep.size(); ++i) {
      if (keep[i] == i) continue;
      const RowState& r = table_.row(keep[i]);
      auto [c0, n] = live_cols(l, r);
      copy_span(layers_[l], i, colmap(l), c0, layers_[l], keep[i], colmap(l), c0, n, moves);
    }
    alloc_->copy_moves(moves);
    moves.clear();
  }
  base_ += trim;
  ring_base_ += trim;
  table_ = std::move(t);
}

BatchKv BatchKv::extract(size_t row) const {
  FERRY_CHECK(row < rows(), "kv", "extract row ", row, " of ", rows());
  require_no_round("extract");
  const RowState& r = table_.row(row);
  BatchKv out(spec_, alloc_);
  const StoreGeometry g = out.geometry_for(1, r.length());
  std::vector<LayerStore> stores;
  std::vector<KvAllocator::Copy2d> batch;  // (into the new stores: run together)
  for (size_t l = 0; l < layers_.size(); ++l) {
    const StoreGeometry lg = layer_geometry(l, g, step_cap_);
    stores.emplace_back(spec_.layers[l].k, spec_.layers[l].v, lg, alloc_);
    auto [c0, n] = live_cols(l, r);
    copy_span(stores[l], 0, ColMap{0, spec_.layers[l].window ? lg.col_cap : 0}, c0 - r.start,
              layers_[l], row, colmap(l), c0, n, batch);
  }
  if (!batch.empty()) alloc_->copy_batch(batch);
  out.adopt(std::move(stores), g, step_cap_);
  RowState one{0, r.length()};
  one.copy_token_meta(r);
  out.table_ = RowTable({one});
  return out;
}

void BatchKv::align(std::span<const size_t> left_pad) {
  require_no_round("align");
  RowTable t = table_.aligned(left_pad);
  if (t == table_) return;
  // In place for full layers when it fits; rings rotate with their columns,
  // so a cache with ring layers is rebuilt.
  if (t.width() + base_ <= geo_.col_cap && !has_ring()) {
    unshare();
    for (auto& l : layers_)
      for (size_t b = 0; b < rows(); ++b)
        l.move_cols(b, table_.row(b).start + base_, b, t.row(b).start + base_,
                    table_.row(b).length());
    table_ = std::move(t);
    return;
  }
  StoreGeometry g = geometry_for(geo_.row_cap, std::max(t.width(), geo_.col_cap));
  std::vector<long> same(rows());
  for (size_t b = 0; b < rows(); ++b) same[b] = static_cast<long>(b);
  std::vector<LayerStore> stores = rebuilt(g, step_cap_, t, same);
  adopt(std::move(stores), g, step_cap_);
  table_ = std::move(t);
}

void BatchKv::trim(size_t n) {
  require_no_round("trim");
  std::vector<size_t> len(rows());
  for (size_t b = 0; b < rows(); ++b)
    len[b] = table_.row(b).length() - std::min(n, table_.row(b).length());
  check_ring_rollback("trim", len);
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
  std::vector<size_t> len(rows());
  for (size_t b = 0; b < rows(); ++b) {
    const size_t added = table_.row(b).end - (*spec_base_)[b];
    if (keep[b] > added)
      fail("kv", "spec_rollback: row ", b, " keeps ", keep[b], " of ", added,
           " speculative tokens");
    len[b] = (*spec_base_)[b] + keep[b] - table_.row(b).start;
  }
  check_ring_rollback("spec_rollback", len);
  table_.rollback_to(*spec_base_, keep);
  spec_base_.reset();
}

KvView BatchKv::capture(size_t layer, std::span<const size_t> pending) const {
  FERRY_CHECK(layer < layers_.size(), "kv", "capture layer ", layer);
  FERRY_CHECK(pending.empty() || pending.size() == rows(), "kv", "capture: ", pending.size(),
              " pending counts for ", rows(), " rows");
  const ColMap m = colmap(layer);
  if (pending.empty()) return KvView(layers_[layer].share(), table_, m.offset, m.ring);
  std::vector<RowState> rows(table_.rows().begin(), table_.rows().end());
  for (size_t b = 0; b < rows.size(); ++b) {
    FERRY_CHECK(rows[b].end + pending[b] + base_ <= geo_.col_cap, "kv", "capture: row ", b,
                " pending past the reservation");
    rows[b].end += pending[b];
  }
  return KvView(layers_[layer].share(), RowTable(std::move(rows)), m.offset, m.ring);
}

std::vector<uint8_t> BatchKv::mask(size_t layer, std::span<const size_t> counts) const {
  FERRY_CHECK(layer < spec_.layers.size() && counts.size() == rows(), "kv", "mask: layer ", layer,
              ", ", counts.size(), " counts for ", rows(), " rows");
  size_t N = 0, S = 0;
  for (size_t b = 0; b < rows(); ++b) {
    N = std::max(N, counts[b]);
    S = std::max(S, table_.row(b).end + counts[b]);
  }
  const size_t window = spec_.layers[layer].window;
  std::vector<uint8_t> m(rows() * N * S, 0);
  for (size_t b = 0; b < rows(); ++b) {
    const RowState& r = table_.row(b);
    for (size_t i = 0; i < counts[b]; ++i) {
      const size_t q = r.end + i;
      for (size_t j = r.start; j <= q; ++j)
        if (window == 0 || q < j + window) m[(b * N + i) * S + j] = 1;
    }
  }
  return m;
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
    if (r.ring_lost > r.length()) bad("row ", b, " lost more ring tokens than it has");
  }
  for (size_t l = 0; l < layers_.size(); ++l)
    if (!(layers_[l].geometry() == layer_geometry(l, geo_, step_cap_)))
      bad("layer ", l, "'s geometry differs from the cache's");
  if (spec_base_) {
    if (spec_base_->size() != rows()) bad("speculative base of the wrong size");
    for (size_t b = 0; b < rows(); ++b)
      if ((*spec_base_)[b] < table_.row(b).start || (*spec_base_)[b] > table_.row(b).end)
        bad("row ", b, " speculative base outside the row");
  }
}

}  // namespace ferry::kv
