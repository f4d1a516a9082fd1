// RowTable: the per-row metadata of a batched KV cache, as plain data.
//
// The cache holds B rows in one [B, H, S, *] buffer. Row b's keys occupy
// logical columns [start_b, end_b): start_b is its left padding, end_b its
// write column, and the token at column c has RoPE position c - start_b.
// In the decode layout rows are right-aligned (every end_b equals width()),
// so one step's writes land in the same column for every row; after a
// speculative rollback rows may end at different columns (ragged), which
// the kernels handle as well (each row writes at its own end).
//
//   column:   0   1   2   3   4   5
//   row 0:    .   .   a0  a1  a2  a3     start 2, end 6
//   row 1:    b0  b1  b2  b3  b4  b5     start 0, end 6
//   row 2:    .   .   .   .   c0  c1     start 4, end 6
//
// prefill_end and min_reusable count tokens, not columns, so moving a row
// never changes them. Every operation here is pure metadata; LayerStore
// moves the bytes.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

namespace ferry::kv {

struct RowState {
  size_t start = 0;         // left padding (first valid column)
  size_t end = 0;           // one past the last valid column
  size_t prefill_end = 0;   // tokens of the row's prompt (0 before prefill ends)
  size_t min_reusable = 0;  // earliest token count a retained prefix can resume from
  // Sliding-window ring layers keep only the newest tokens: tokens before
  // this count (from the row's start) may have been overwritten there.
  size_t ring_lost = 0;
  // Prompt tokens this row is being prefilled with (0 once finalized).
  size_t pending_prefill = 0;
  size_t length() const { return end - start; }
  // Copies the fields that count tokens (not columns) from another row.
  void copy_token_meta(const RowState& o) {
    prefill_end = o.prefill_end;
    min_reusable = o.min_reusable;
    ring_lost = o.ring_lost;
    pending_prefill = o.pending_prefill;
  }
  bool operator==(const RowState&) const = default;
};

class RowTable {
 public:
  RowTable() = default;
  explicit RowTable(std::vector<RowState> rows) : rows_(std::move(rows)) {}

  size_t size() const { return rows_.size(); }
  const RowState& row(size_t b) const { return rows_[b]; }
  std::span<const RowState> rows() const { return rows_; }
  // Largest end over rows (0 when empty): the buffer width in use.
  size_t width() const;
  // Smallest start over rows: padding every row shares.
  size_t shared_padding() const;
  bool right_aligned() const;
  // RoPE position of row b's next token.
  size_t next_position(size_t b) const { return rows_[b].length(); }

  // --- planning helpers (pure; the cache applies them to bytes) ---
  // Rows of the given lengths, right-aligned at max(length).
  static RowTable merged(std::span<const size_t> lengths);
  // This table plus one row of `length` tokens, right-aligned: if the new
  // row is longer than width(), existing rows shift right by the difference.
  RowTable extended(size_t length, size_t* shift_existing) const;
  // Only the rows in `keep` (ascending, unique), minus the padding they all
  // share (returned in *trimmed).
  RowTable filtered(std::span<const size_t> keep, size_t* trimmed) const;
  // Rows moved so that row b starts at left_pad[b]; lengths kept.
  RowTable aligned(std::span<const size_t> left_pad) const;

  // --- in-place metadata updates (no bytes move) ---
  // Advances row b's end by n (after its tokens were written).
  void advance(size_t b, size_t n) { rows_[b].end += n; }
  void set_prefill_end(size_t b) { rows_[b].prefill_end = rows_[b].length(); }
  void set_min_reusable(size_t b, size_t tokens) { rows_[b].min_reusable = tokens; }
  // Drops the last n tokens of every row (clamped at each row's start); a
  // row trimmed into its prompt keeps prefill_end <= length().
  void trim(size_t n);
  // Sets every row's end to base[b] + keep[b].
  void rollback_to(std::span<const size_t> base_end, std::span<const size_t> keep);

  bool operator==(const RowTable&) const = default;

 private:
  std::vector<RowState> rows_;
};

}  // namespace ferry::kv
