// BatchKv: the batched KV cache of a whole model: B rows in one
// [B, H_kv, S, *] buffer per layer, rows joining (merge, extend) and leaving
// (filter, extract), dense or affine-quantized storage per side, speculative
// rounds that roll back per row, and donor views for shared-KV layers.
//
// Shape of the design (docs/KV.md):
//   RowTable     per-row metadata, shared by all layers, pure and exact;
//   LayerStore   one layer's bytes; row ops are byte copies along tokens;
//   BatchKv      applies an operation to the table and every layer as one
//                transaction: new storage is staged first, the swap at the
//                end cannot fail, so a failed operation leaves the cache
//                exactly as it was.
// Logical column c of the table lives at physical column c + base_ of
// every full-attention layer (trimming shared padding only moves base_).
// Sliding-window layers are rings of window + step_cap - 1 columns (the
// newest tokens a step can need): column c lives at slot
// (c + ring_base_) mod ring size, so their memory stays bounded.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kernels/kv_format.h"
#include "kernels/ops.h"
#include "kv/kv_buffer.h"
#include "kv/layer_store.h"
#include "kv/row_table.h"

namespace ferry::kv {

struct KvLayerSpec {
  kernels::KvFormat k, v;
  size_t window = 0;  // sliding window in tokens; 0: full attention
  bool operator==(const KvLayerSpec&) const = default;
};

struct KvSpec {
  size_t n_kv_heads = 0, head_dim = 0;
  std::vector<KvLayerSpec> layers;
  static KvSpec uniform(size_t n_layers, size_t n_kv_heads, size_t head_dim, kernels::KvFormat k,
                        kernels::KvFormat v);
  // Throws ferry::Error if a format cannot store head_dim.
  void validate() const;
  // BatchKv::bytes_per_token and projected_bytes of a cache of this spec
  // (they depend on nothing else, so admission can price a request without
  // touching the engine's cache).
  size_t bytes_per_token() const;
  size_t projected_bytes(size_t tokens, size_t max_step = 1) const;
  bool operator==(const KvSpec&) const = default;
};

// An immutable snapshot of one layer's cache, valid until destroyed even
// while the owning BatchKv changes (the owner copies before writing into
// storage a view shares).
class KvView {
 public:
  const RowTable& table() const { return table_; }
  // Keys [first, last] (logical columns) of `row`, for attention. For a
  // ring layer only the window's keys are held.
  kernels::AttentionTask task(size_t row, size_t first, size_t last, kernels::KvSide* k,
                              kernels::KvSide* v) const;

 private:
  friend class BatchKv;
  KvView(LayerStore store, RowTable table, size_t offset, size_t ring)
      : store_(std::move(store)), table_(std::move(table)), offset_(offset), ring_(ring) {}
  LayerStore store_;
  RowTable table_;
  size_t offset_, ring_;
};

class BatchKv {
 public:
  explicit BatchKv(KvSpec spec, std::shared_ptr<KvAllocator> alloc = KvAllocator::standard());
  BatchKv(BatchKv&&) noexcept = default;
  BatchKv& operator=(BatchKv&&) noexcept = default;
  BatchKv(const BatchKv&) = delete;
  BatchKv& operator=(const BatchKv&) = delete;

  const KvSpec& spec() const { return spec_; }
  // The allocator (and so the memory) the cache's bytes come from.
  const std::shared_ptr<KvAllocator>& allocator() const { return alloc_; }
  size_t rows() const { return table_.size(); }
  const RowTable& table() const { return table_; }
  size_t minimum_reusable_offset() const;
  void set_min_reusable(size_t row, size_t tokens) { table_.set_min_reusable(row, tokens); }

  // --- memory accounting (exact) ---
  // Bytes one token of one row occupies across all layers, K and V.
  size_t bytes_per_token() const;
  // Bytes a row of `tokens` tokens needs (what admission reserves): full
  // layers hold every token, window layers at most their ring. `max_step`
  // is the most tokens a row gets in one step (prefill chunk, verify
  // width); it sets the ring size.
  size_t projected_bytes(size_t tokens, size_t max_step = 1) const;
  // Bytes allocated now: for each layer, bytes per (row, slot) times
  // row_capacity() times its slots (col_capacity(), or its ring size).
  size_t allocated_bytes() const;
  // Slots of a sliding-window layer's ring (0 for a full layer).
  size_t ring_size(size_t layer) const;
  // Capacity in (rows, columns).
  size_t row_capacity() const { return geo_.row_cap; }
  size_t col_capacity() const { return geo_.col_cap; }

  // --- batched padded prefill ---
  // Replaces the contents with lengths.size() empty rows laid out so that
  // after prefilling lengths[b] tokens, rows are right-aligned (row b
  // starts at max(lengths) - lengths[b]). Allocates for the whole prompts.
  void prepare_prefill(std::span<const size_t> lengths);
  // Appends one empty row per prompt length, placed to end at the current
  // width once its prompt is in (from column 0 when the prompt is longer),
  // marked pending. Running rows never move; rebuilds only to add row slots.
  void add_rows(std::span<const size_t> prompt_lengths);
  // Marks row b's prompt complete (its length must equal the pending one).
  void finalize_row(size_t b);
  // Checks every row received its prompt and records prefill_end. (The
  // pending lengths travel with the rows through every row operation.)
  void finalize_prefill();

  // --- one forward step ---
  // Ensures room for counts[b] new tokens in row b (and copies storage a
  // donor view shares). Reclaims the columns filter() trimmed before it
  // grows. May reallocate; on failure nothing changed.
  void reserve(std::span<const size_t> counts);
  // Writes step token i of row b for `layer` at column end_b + i. Needs a
  // reserve() for this step first (which also copies storage a view shares).
  void write(size_t layer, size_t row, size_t i, const float* k, const float* v);
  // Where write() would put step token i of row b: the row's sides and the
  // token slot. For backends that encode with their own kernels into
  // memory the host cannot touch (same preconditions as write()).
  struct WriteTarget {
    kernels::KvSide k, v;
    size_t slot = 0;
  };
  WriteTarget write_target(size_t layer, size_t row, size_t i) const;
  // The keys step token i of row b attends to in `layer`: causal, past the
  // row's padding, inside the layer's window. k and v receive the sides.
  kernels::AttentionTask attention_task(size_t layer, size_t row, size_t i, kernels::KvSide* k,
                                        kernels::KvSide* v) const;
  // The key-validity rule as a [B, 1, N, S] boolean mask (row-major, 1 =
  // may attend) for a step giving counts[b] tokens to row b: N = max
  // counts, S = the width after the step (logical columns). Query i of row
  // b may see key j iff i < counts[b], start_b <= j <= end_b + i, and
  // (window == 0 or end_b + i < j + window). attention_task() hands the
  // kernels exactly the allowed keys; this is for tests and other kernels.
  std::vector<uint8_t> mask(size_t layer, std::span<const size_t> counts) const;
  // Advances every row by counts[b] (all layers have written; within the
  // reservation, else throws and changes nothing).
  void commit(std::span<const size_t> counts);

  // --- row operations (each all-or-nothing) ---
  // Rows of `parts` in order, right-aligned; parts are left untouched.
  static BatchKv merge(std::span<const BatchKv* const> parts);
  // Appends the rows of `other` (usually one; not *this). Running rows are
  // not copied when the new rows fit the current width and spare row slots
  // exist; otherwise storage is rebuilt (O(rows * width) bytes copied), with
  // twice the row slots only when the rows do not fit.
  void extend(const BatchKv& other);
  // Keeps rows `keep` (ascending) and trims the padding they all share
  // (also between prepare_prefill and finalize_prefill). Never allocates
  // unless a donor view shares the storage.
  void filter(std::span<const size_t> keep);
  // Row b as a standalone cache that owns its bytes.
  BatchKv extract(size_t row) const;
  // Moves row b to start at left_pad[b].
  void align(std::span<const size_t> left_pad);
  // Drops the last n tokens of every row. Refused (ferry::Error, nothing
  // changed) when a sliding-window ring no longer holds keys the row's
  // next token would need.
  void trim(size_t n);

  // --- speculative rounds: rollback moves no bytes ---
  void spec_begin();
  void spec_commit();
  // Keeps keep[b] of the tokens row b received since spec_begin(). Refused
  // like trim() when a ring has overwritten keys still needed (cannot
  // happen within one round: rings hold window + step_cap - 1 tokens).
  void spec_rollback(std::span<const size_t> keep);
  bool in_spec_round() const { return spec_base_.has_value(); }

  // --- shared KV across layers ---
  // pending[b] (optional) extends row b by tokens written in the current
  // step but not yet committed, so a later layer of the same step can read
  // them.
  KvView capture(size_t layer, std::span<const size_t> pending = {}) const;

  // Throws ferry::Error describing the first broken invariant.
  void check_integrity() const;

 private:
  // Where logical columns live in one layer: slot(c) = c + offset, modulo
  // `ring` when the layer is a ring.
  struct ColMap {
    size_t offset = 0, ring = 0;
    size_t slot(size_t c) const { return ring ? (c + offset) % ring : c + offset; }
  };
  ColMap colmap(size_t layer) const;
  // Geometry of `layer` for full-layer geometry `geo` and ring step `step`.
  StoreGeometry layer_geometry(size_t layer, const StoreGeometry& geo, size_t step) const;
  // The columns of row r that a layer can hand on: all of them for a full
  // layer, the newest ring-size ones for a ring.
  std::pair<size_t, size_t> live_cols(size_t layer, const RowState& r) const;
  // Copies logical columns [c_src, c_src + n) of src row sr (mapped by sm)
  // to [c_dst, ...) of dst row dr (mapped by dm), splitting at ring wraps.
  // The copies are appended to `batch`, not run: for KvAllocator::
  // copy_batch between two stores, copy_moves within one.
  static void copy_span(LayerStore& dst, size_t dr, ColMap dm, size_t c_dst, const LayerStore& src,
                        size_t sr, ColMap sm, size_t c_src, size_t n,
                        std::vector<KvAllocator::Copy2d>& batch);
  // Builds storage of `geo` (ring step `step`) holding `table`'s rows copied
  // from this cache (src_rows[i] is the source row of new row i, -1 for
  // none), with new offsets 0. Pure: returns the new stores.
  std::vector<LayerStore> rebuilt(const StoreGeometry& geo, size_t step, const RowTable& table,
                                  std::span<const long> src_rows) const;
  void adopt(std::vector<LayerStore> stores, const StoreGeometry& geo, size_t step) noexcept;
  StoreGeometry geometry_for(size_t rows, size_t width) const;
  bool has_ring() const;
  void unshare();  // copy-on-write before in-place changes
  void require_no_round(const char* op) const;
  // Throws unless every row, cut to new_len[b] tokens, still has in its
  // rings every key its next token needs.
  void check_ring_rollback(const char* op, std::span<const size_t> new_len) const;

  KvSpec spec_;
  std::shared_ptr<KvAllocator> alloc_;
  StoreGeometry geo_;
  std::vector<LayerStore> layers_;
  RowTable table_;
  size_t base_ = 0;       // full layers' column offset
  size_t ring_base_ = 0;  // ring layers' column offset
  size_t step_cap_ = 1;   // most tokens per row and step the rings allow
  std::optional<std::vector<size_t>> spec_base_;
};

}  // namespace ferry::kv
