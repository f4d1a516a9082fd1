// BatchKv's safety properties in every storage format: speculative rounds
// that roll back per row without moving bytes, donor views that stay
// unchanged while the owner changes, and every allocating operation all or
// nothing under an allocator that fails on its n-th call (each failure
// leaves every cache exactly as it was; ASan builds check nothing leaks).
// Helpers and the token scheme: batch_kv_test_util.h.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/batch_kv.h"
#include "kv/batch_kv_test_util.h"

namespace ferry::kv::kvtest {
namespace {

class BatchKvSafety : public BatchKvFormat {};
INSTANTIATE_TEST_SUITE_P(Formats, BatchKvSafety, testing::ValuesIn(kFormats),
                         [](const testing::TestParamInfo<FormatCase>& i) {
                           return std::string(i.param.name);
                         });

// --- speculative rounds ---

TEST_P(BatchKvSafety, SpeculativeRollbackPerRow) {
  Model m = {seq_tags(1, 3), seq_tags(2, 5)};
  BatchKv kv = make(m);
  kv.spec_begin();
  EXPECT_TRUE(kv.in_spec_round());
  step(kv, m, next_tokens(m, 3));
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 8, 3, 0}, {0, 8, 5, 0}}));
  const size_t bytes = kv.allocated_bytes();
  const auto ptrs = planes(kv);

  // Row 0 keeps 1 of its 3 drafts, row 1 all 3: ragged, nothing moved.
  kv.spec_rollback(std::vector<size_t>{1, 3});
  m[0].resize(4);
  EXPECT_FALSE(kv.in_spec_round());
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 6, 3, 0}, {0, 8, 5, 0}}));
  EXPECT_EQ(kv.allocated_bytes(), bytes);
  EXPECT_EQ(planes(kv), ptrs);
  expect_contents(kv, m);

  // Each row writes at its own end; row 0 overwrites a dropped draft.
  step(kv, m, next_tokens(m, 1, 5));
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 7, 3, 0}, {0, 9, 5, 0}}));
  expect_contents(kv, m);

  // A committed round keeps everything.
  kv.spec_begin();
  step(kv, m, next_tokens(m, 2));
  kv.spec_commit();
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 9, 3, 0}, {0, 11, 5, 0}}));
  expect_contents(kv, m);
  // Keeping none returns to the round's start.
  kv.spec_begin();
  step(kv, m, next_tokens(m, 2));
  kv.spec_rollback(std::vector<size_t>{0, 0});
  for (Tags& t : m) t.resize(t.size() - 2);
  expect_contents(kv, m);
  expect_accounting(kv);
}

TEST_P(BatchKvSafety, SpeculativeRoundRefusesOtherOperations) {
  Model m = {seq_tags(1, 3), seq_tags(2, 5)};
  BatchKv kv = make(m);
  EXPECT_THROW(kv.spec_commit(), Error);
  EXPECT_THROW(kv.spec_rollback(std::vector<size_t>{0, 0}), Error);
  kv.spec_begin();
  step(kv, m, next_tokens(m, 2));
  const Snapshot during = snapshot(kv);

  // More than was added, or the wrong number of rows: refused, round open.
  EXPECT_THROW(kv.spec_rollback(std::vector<size_t>{3, 0}), Error);
  EXPECT_THROW(kv.spec_rollback(std::vector<size_t>{0}), Error);
  EXPECT_TRUE(snapshot(kv) == during);
  EXPECT_TRUE(kv.in_spec_round());

  BatchKv joiner = make({seq_tags(3, 2)});
  const BatchKv* parts[] = {&kv, &joiner};
  EXPECT_THROW(kv.spec_begin(), Error);
  EXPECT_THROW(kv.prepare_prefill(std::vector<size_t>{1}), Error);
  EXPECT_THROW(kv.filter(std::vector<size_t>{0}), Error);
  EXPECT_THROW(kv.extend(joiner), Error);
  EXPECT_THROW(joiner.extend(kv), Error);
  EXPECT_THROW(kv.extract(0), Error);
  EXPECT_THROW(kv.align(std::vector<size_t>{0, 0}), Error);
  EXPECT_THROW(kv.trim(1), Error);
  EXPECT_THROW(BatchKv::merge(parts), Error);
  EXPECT_TRUE(snapshot(kv) == during);
  EXPECT_NO_THROW(kv.check_integrity());

  kv.spec_rollback(std::vector<size_t>{2, 1});
  m[1].pop_back();
  expect_contents(kv, m);
}

// --- donor views ---

TEST_P(BatchKvSafety, CapturedViewIsASnapshot) {
  Model m = {seq_tags(1, 3), seq_tags(2, 5)};
  BatchKv kv = make(m);
  std::optional<KvView> view = kv.capture(1);
  const Rows view_rows = rows_of(view->table());
  const std::vector<float> seen = view_values(*view, head_dim());
  EXPECT_EQ(view_rows, rows_of(kv.table()));
  const size_t bytes = kv.allocated_bytes();
  const auto ptrs = planes(kv);

  // The owner rewrites a column the view shows (trim, then a step): the
  // step's reserve copies the shared layer first. (Trimming into the
  // prompts lowers their prefill_end: 3, 5 -> 2, 4.)
  kv.trim(1);
  for (Tags& t : m) t.pop_back();
  step(kv, m, next_tokens(m, 1, 5));
  expect_contents(kv, m);
  EXPECT_EQ(view_values(*view, head_dim()), seen);
  EXPECT_EQ(kv.allocated_bytes(), bytes);
  // Only layer 1 was copied.
  const auto now = planes(kv);
  EXPECT_TRUE(std::equal(now.begin(), now.begin() + 12, ptrs.begin()));
  EXPECT_FALSE(std::equal(now.begin() + 12, now.end(), ptrs.begin() + 12));

  // More changes while a fresh view is held.
  view.emplace(kv.capture(1));
  const Model at_capture = m;
  const std::vector<float> seen2 = view_values(*view, head_dim());
  kv.filter(std::vector<size_t>{1});
  m = pick(m, {1});
  kv.extend(make({seq_tags(3, 7)}));
  m.push_back(seq_tags(3, 7));
  step(kv, m, next_tokens(m, 2));
  kv.align(std::vector<size_t>{0, 0});
  expect_contents(kv, m);
  EXPECT_EQ(rows_of(view->table()), (Rows{{2, 5, 2, 0}, {0, 5, 4, 0}}));
  EXPECT_EQ(view_values(*view, head_dim()), seen2);

  // Released: nothing is shared, the next step moves no byte.
  view.reset();
  const auto before = planes(kv);
  step(kv, m, next_tokens(m, 1));
  EXPECT_EQ(planes(kv), before);
  expect_contents(kv, m);

  // A view outlives its owner.
  std::optional<BatchKv> owner = make(at_capture);
  KvView last = owner->capture(0);
  const std::vector<float> seen3 = view_values(last, head_dim());
  owner.reset();
  EXPECT_EQ(view_values(last, head_dim()), seen3);
}

// --- failure safety: every allocating operation is all or nothing ---

TEST_P(BatchKvSafety, FailedPrepareLeavesTheCache) {
  Model m = {seq_tags(1, 3), seq_tags(2, 5)};
  BatchKv kv = make(m);
  const size_t n = expect_all_or_nothing(*alloc_, {&kv}, [&] {
    kv.prepare_prefill(std::vector<size_t>{4, 1, 2});
  });
  EXPECT_EQ(n, kLayers * planes_per_layer());
  EXPECT_EQ(rows_of(kv.table()),
            (Rows{{0, 0, 0, 0, 0, 4}, {3, 3, 0, 0, 0, 1}, {2, 2, 0, 0, 0, 2}}));
  expect_accounting(kv);
}

TEST_P(BatchKvSafety, FailedReserveGrowthLeavesTheCache) {
  Model m = {seq_tags(1, 60), seq_tags(2, 3)};
  BatchKv kv = make(m);
  const size_t n = expect_all_or_nothing(*alloc_, {&kv}, [&] {
    kv.reserve(std::vector<size_t>{10, 1});
  });
  EXPECT_EQ(n, kLayers * planes_per_layer());
  // 70 columns needed; growth is at least half again (96): 128.
  EXPECT_EQ(kv.col_capacity(), 128u);
  expect_contents(kv, m);
  step(kv, m, next_tokens(m, 10));
  expect_contents(kv, m);
  expect_accounting(kv);
}

TEST_P(BatchKvSafety, FailedMergeLeavesTheParts) {
  BatchKv a = make({seq_tags(1, 4)});
  BatchKv b = make({seq_tags(2, 6), seq_tags(3, 2)});
  const BatchKv* parts[] = {&a, &b};
  std::optional<BatchKv> out;
  const size_t n =
      expect_all_or_nothing(*alloc_, {&a, &b}, [&] { out.emplace(BatchKv::merge(parts)); });
  EXPECT_EQ(n, kLayers * planes_per_layer());
  expect_contents(*out, {seq_tags(1, 4), seq_tags(2, 6), seq_tags(3, 2)});
}

TEST_P(BatchKvSafety, FailedExtendLeavesBothCaches) {
  Model m = {seq_tags(1, 3), seq_tags(2, 2)};
  BatchKv kv = make(m);
  // Two joiners, each of which alone would need new storage (no free slot,
  // then a longer row): still one rebuild, all or nothing.
  const Model j = {seq_tags(3, 1), seq_tags(4, 6)};
  BatchKv joiner = make(j);
  const size_t n = expect_all_or_nothing(*alloc_, {&kv, &joiner}, [&] { kv.extend(joiner); });
  EXPECT_EQ(n, kLayers * planes_per_layer());
  m.insert(m.end(), j.begin(), j.end());
  EXPECT_EQ(rows_of(kv.table()), (Rows{{3, 6, 3, 0}, {4, 6, 2, 0}, {5, 6, 1, 0}, {0, 6, 6, 0}}));
  EXPECT_EQ(kv.row_capacity(), 4u);
  expect_contents(kv, m);
  expect_accounting(kv);
}

TEST_P(BatchKvSafety, FailedExtractLeavesTheBatch) {
  BatchKv kv = make({seq_tags(1, 3), seq_tags(2, 5)});
  std::optional<BatchKv> out;
  const size_t n = expect_all_or_nothing(*alloc_, {&kv}, [&] { out.emplace(kv.extract(1)); });
  EXPECT_EQ(n, kLayers * planes_per_layer());
  expect_contents(*out, {seq_tags(2, 5)});
}

TEST_P(BatchKvSafety, FailedAlignLeavesTheCache) {
  Model m = {seq_tags(1, 3), seq_tags(2, 5)};
  BatchKv kv = make(m);
  const size_t n = expect_all_or_nothing(*alloc_, {&kv}, [&] {
    kv.align(std::vector<size_t>{70, 0});
  });
  EXPECT_EQ(n, kLayers * planes_per_layer());
  EXPECT_EQ(rows_of(kv.table()), (Rows{{70, 73, 3, 0}, {0, 5, 5, 0}}));
  expect_contents(kv, m);
  expect_accounting(kv);
}

TEST_P(BatchKvSafety, FailedCopyOnWriteLeavesCacheAndView) {
  Model m = {seq_tags(1, 3), seq_tags(2, 5), seq_tags(3, 4)};
  BatchKv kv = make(m);
  const size_t one_layer = planes_per_layer();
  std::optional<KvView> view;
  std::vector<float> seen;
  auto hold = [&](size_t layer) {
    view.emplace(kv.capture(layer));
    seen = view_values(*view, head_dim());
  };

  // filter copies the shared layer, and only that one.
  hold(0);
  EXPECT_EQ(expect_all_or_nothing(*alloc_, {&kv},
                                  [&] {
                                    kv.filter(std::vector<size_t>{1, 2});
                                  }),
            one_layer);
  m = pick(m, {1, 2});
  expect_contents(kv, m);
  EXPECT_EQ(view_values(*view, head_dim()), seen);

  hold(0);
  EXPECT_EQ(expect_all_or_nothing(*alloc_, {&kv},
                                  [&] {
                                    kv.reserve(std::vector<size_t>{1, 1});
                                  }),
            one_layer);
  EXPECT_EQ(view_values(*view, head_dim()), seen);

  hold(1);
  EXPECT_EQ(expect_all_or_nothing(*alloc_, {&kv},
                                  [&] {
                                    kv.align(std::vector<size_t>{0, 0});
                                  }),
            one_layer);
  EXPECT_EQ(view_values(*view, head_dim()), seen);
  expect_contents(kv, m);

  // extend cannot write into a shared row slot: it rebuilds every layer.
  const BatchKv joiner = make({seq_tags(4, 2)});
  hold(1);
  EXPECT_EQ(expect_all_or_nothing(*alloc_, {&kv, &joiner}, [&] { kv.extend(joiner); }),
            kLayers * planes_per_layer());
  EXPECT_EQ(view_values(*view, head_dim()), seen);
  m.push_back(seq_tags(4, 2));
  expect_contents(kv, m);
  expect_accounting(kv);
}

TEST_P(BatchKvSafety, OperationsThatNeverAllocate) {
  Model m = {seq_tags(1, 3), seq_tags(2, 5), seq_tags(3, 4)};
  BatchKv kv = make(m);
  BatchKv joiner = make({seq_tags(4, 2)});
  alloc_->arm(0);  // any allocation throws
  kv.spec_begin();
  step(kv, m, next_tokens(m, 1));  // fits the reservation
  kv.spec_rollback(std::vector<size_t>{1, 0, 1});
  m[1].pop_back();
  kv.trim(1);
  for (Tags& t : m) t.pop_back();
  kv.filter(std::vector<size_t>{0, 2});
  m = pick(m, {0, 2});
  kv.align(std::vector<size_t>{0, 1});
  kv.extend(joiner);  // a free slot, not longer
  m.push_back(seq_tags(4, 2));
  EXPECT_EQ(alloc_->disarm(), 0u);
  expect_contents(kv, m);
  expect_accounting(kv);
}

}  // namespace
}  // namespace ferry::kv::kvtest
