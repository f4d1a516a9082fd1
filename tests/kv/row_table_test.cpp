// RowTable: every operation on small tables whose expected rows are worked
// out by hand in the comments (columns as in row_table.h's diagram).
#include "kv/row_table.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "kv/row_state_print.h"

namespace ferry::kv {
namespace {

using Rows = std::vector<RowState>;

Rows rows_of(const RowTable& t) {
  return Rows(t.rows().begin(), t.rows().end());
}

// The table of row_table.h's diagram, with prompt and reuse marks so that
// every operation can be seen to carry them along:
//   column:   0   1   2   3   4   5
//   row 0:    .   .   a0  a1  a2  a3     start 2, end 6
//   row 1:    b0  b1  b2  b3  b4  b5     start 0, end 6
//   row 2:    .   .   .   .   c0  c1     start 4, end 6
RowTable diagram() {
  return RowTable({{2, 6, 3, 1}, {0, 6, 5, 2}, {4, 6, 2, 0}});
}

TEST(RowTable, Accessors) {
  const RowTable t = diagram();
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.width(), 6u);
  EXPECT_EQ(t.shared_padding(), 0u);
  EXPECT_TRUE(t.right_aligned());
  EXPECT_EQ(t.row(0).length(), 4u);
  EXPECT_EQ(t.next_position(0), 4u);
  EXPECT_EQ(t.next_position(1), 6u);
  EXPECT_EQ(t.next_position(2), 2u);

  // Ragged (after a per-row rollback): ends 5 and 6, both padded.
  const RowTable ragged({{1, 5, 0, 0}, {2, 6, 0, 0}});
  EXPECT_EQ(ragged.width(), 6u);
  EXPECT_EQ(ragged.shared_padding(), 1u);
  EXPECT_FALSE(ragged.right_aligned());

  const RowTable empty;
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.width(), 0u);
  EXPECT_EQ(empty.shared_padding(), 0u);
  EXPECT_TRUE(empty.right_aligned());
}

TEST(RowTable, Merged) {
  // Lengths 4, 6, 2 right-aligned at 6: paddings 2, 0, 4.
  const std::vector<size_t> lengths = {4, 6, 2};
  EXPECT_EQ(rows_of(RowTable::merged(lengths)), (Rows{{2, 6, 0, 0}, {0, 6, 0, 0}, {4, 6, 0, 0}}));
  // An empty row sits at the right edge.
  const std::vector<size_t> with_empty = {0, 3};
  EXPECT_EQ(rows_of(RowTable::merged(with_empty)), (Rows{{3, 3, 0, 0}, {0, 3, 0, 0}}));
  EXPECT_EQ(RowTable::merged({}).size(), 0u);
}

TEST(RowTable, ExtendedWithoutShift) {
  // A 3-token row fits width 6: it starts at 3; nothing else moves.
  size_t shift = 99;
  const RowTable t = diagram().extended(3, &shift);
  EXPECT_EQ(shift, 0u);
  EXPECT_EQ(rows_of(t), (Rows{{2, 6, 3, 1}, {0, 6, 5, 2}, {4, 6, 2, 0}, {3, 6, 0, 0}}));
  // Exactly the width, and an empty row; the shift pointer is optional.
  EXPECT_EQ(diagram().extended(6, nullptr).row(3), (RowState{0, 6, 0, 0}));
  EXPECT_EQ(diagram().extended(0, nullptr).row(3), (RowState{6, 6, 0, 0}));
}

TEST(RowTable, ExtendedWithShift) {
  // An 8-token row is 2 longer than width 6: every existing row shifts right
  // by 2 (prompt and reuse marks count tokens and stay), the new row starts
  // at 0 and the width becomes 8.
  size_t shift = 99;
  const RowTable t = diagram().extended(8, &shift);
  EXPECT_EQ(shift, 2u);
  EXPECT_EQ(rows_of(t), (Rows{{4, 8, 3, 1}, {2, 8, 5, 2}, {6, 8, 2, 0}, {0, 8, 0, 0}}));
  EXPECT_EQ(t.width(), 8u);
  EXPECT_TRUE(t.right_aligned());

  // From an empty table the new row is the whole width.
  EXPECT_EQ(rows_of(RowTable().extended(5, &shift)), (Rows{{0, 5, 0, 0}}));
  EXPECT_EQ(shift, 5u);

  // A ragged table extends at its widest end: ends 5, 6 -> new row [4, 6).
  const RowTable ragged({{1, 5, 0, 0}, {2, 6, 0, 0}});
  EXPECT_EQ(rows_of(ragged.extended(2, &shift)), (Rows{{1, 5, 0, 0}, {2, 6, 0, 0}, {4, 6, 0, 0}}));
  EXPECT_EQ(shift, 0u);
}

TEST(RowTable, FilteredTrimsSharedPadding) {
  size_t trimmed = 99;
  // Rows 0 and 2 start at 2 and 4: both lose 2 columns of shared padding.
  EXPECT_EQ(rows_of(diagram().filtered(std::vector<size_t>{0, 2}, &trimmed)),
            (Rows{{0, 4, 3, 1}, {2, 4, 2, 0}}));
  EXPECT_EQ(trimmed, 2u);
  // Row 2 alone loses all 4 of its padding.
  EXPECT_EQ(rows_of(diagram().filtered(std::vector<size_t>{2}, &trimmed)), (Rows{{0, 2, 2, 0}}));
  EXPECT_EQ(trimmed, 4u);
  // Row 1 has no padding, so nothing is trimmed while it survives.
  EXPECT_EQ(rows_of(diagram().filtered(std::vector<size_t>{1, 2}, &trimmed)),
            (Rows{{0, 6, 5, 2}, {4, 6, 2, 0}}));
  EXPECT_EQ(trimmed, 0u);
  // All rows: unchanged. No rows: empty, nothing trimmed.
  EXPECT_EQ(diagram().filtered(std::vector<size_t>{0, 1, 2}, &trimmed), diagram());
  EXPECT_EQ(trimmed, 0u);
  EXPECT_EQ(diagram().filtered({}, &trimmed).size(), 0u);
  EXPECT_EQ(trimmed, 0u);
  // Ragged rows trim by the smallest start: starts 1, 2 -> 0, 1.
  const RowTable ragged({{1, 5, 0, 0}, {2, 6, 0, 0}});
  EXPECT_EQ(rows_of(ragged.filtered(std::vector<size_t>{0, 1}, nullptr)),
            (Rows{{0, 4, 0, 0}, {1, 5, 0, 0}}));
}

TEST(RowTable, FilteredRejectsBadIndices) {
  EXPECT_THROW(diagram().filtered(std::vector<size_t>{3}, nullptr), Error);
  EXPECT_THROW(diagram().filtered(std::vector<size_t>{2, 0}, nullptr), Error);
  EXPECT_THROW(diagram().filtered(std::vector<size_t>{1, 1}, nullptr), Error);
}

TEST(RowTable, Aligned) {
  // Left-align every row: lengths 4, 6, 2 kept.
  EXPECT_EQ(rows_of(diagram().aligned(std::vector<size_t>{0, 0, 0})),
            (Rows{{0, 4, 3, 1}, {0, 6, 5, 2}, {0, 2, 2, 0}}));
  // Arbitrary paddings, wider than before.
  EXPECT_EQ(rows_of(diagram().aligned(std::vector<size_t>{5, 1, 0})),
            (Rows{{5, 9, 3, 1}, {1, 7, 5, 2}, {0, 2, 2, 0}}));
  // The current paddings give the same table.
  EXPECT_EQ(diagram().aligned(std::vector<size_t>{2, 0, 4}), diagram());
  EXPECT_THROW(diagram().aligned(std::vector<size_t>{0, 0}), Error);
}

TEST(RowTable, Trim) {
  // Drop 3 tokens: lengths 4, 6, 2 -> 1, 3, 0 (row 2 clamps at its start).
  // The prompt marks of rows 0 and 1 (3 and 5 tokens) clamp to what is left.
  RowTable t = diagram();
  t.trim(3);
  EXPECT_EQ(rows_of(t), (Rows{{2, 3, 1, 1}, {0, 3, 3, 2}, {4, 4, 0, 0}}));
  t.trim(0);
  EXPECT_EQ(rows_of(t), (Rows{{2, 3, 1, 1}, {0, 3, 3, 2}, {4, 4, 0, 0}}));
  t.trim(100);
  EXPECT_EQ(rows_of(t), (Rows{{2, 2, 0, 1}, {0, 0, 0, 2}, {4, 4, 0, 0}}));

  // One token: rows 0 and 1 lose a generated token and keep their prompt
  // marks; row 2 is all prompt, so its mark follows it down.
  RowTable u = diagram();
  u.trim(1);
  EXPECT_EQ(rows_of(u), (Rows{{2, 5, 3, 1}, {0, 5, 5, 2}, {4, 5, 1, 0}}));
}

TEST(RowTable, InPlaceUpdates) {
  RowTable t = RowTable::merged(std::vector<size_t>{2, 3});
  t.advance(0, 2);
  t.advance(1, 1);
  EXPECT_EQ(rows_of(t), (Rows{{1, 5, 0, 0}, {0, 4, 0, 0}}));
  t.set_prefill_end(0);
  t.set_min_reusable(1, 3);
  EXPECT_EQ(rows_of(t), (Rows{{1, 5, 4, 0}, {0, 4, 0, 3}}));
}

TEST(RowTable, RollbackTo) {
  // A speculative round began at ends 4 and 3; row 0 keeps 1 of its new
  // tokens, row 1 keeps none.
  RowTable t({{1, 7, 2, 0}, {0, 6, 3, 0}});
  t.rollback_to(std::vector<size_t>{4, 3}, std::vector<size_t>{1, 0});
  EXPECT_EQ(rows_of(t), (Rows{{1, 5, 2, 0}, {0, 3, 3, 0}}));
  EXPECT_FALSE(t.right_aligned());
  EXPECT_EQ(t.width(), 5u);
}

}  // namespace
}  // namespace ferry::kv
