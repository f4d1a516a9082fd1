// BatchKv's row operations on tiny specs (2 layers, 2 KV heads) in every
// storage format and in mixed K/V pairs: exact table and exact decoded
// contents after padded prefill, reserve, merge, extend, filter, extract,
// align and trim; exact memory accounting; attention key ranges.
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

class BatchKvOps : public BatchKvFormat {};
INSTANTIATE_TEST_SUITE_P(Formats, BatchKvOps, testing::ValuesIn(kFormats),
                         [](const testing::TestParamInfo<FormatCase>& i) {
                           return std::string(i.param.name);
                         });

// --- memory accounting ---

TEST_P(BatchKvOps, MemoryAccountingIsExact) {
  const FormatCase& c = GetParam();
  BatchKv kv(spec(), alloc_);
  const size_t bpt = kLayers * kHeads * (c.k_bytes + c.v_bytes);
  EXPECT_EQ(kv.bytes_per_token(), bpt);
  EXPECT_EQ(kv.projected_bytes(0), 0u);
  EXPECT_EQ(kv.projected_bytes(100), 100 * bpt);
  EXPECT_EQ(kv.allocated_bytes(), 0u);
  EXPECT_EQ(kv.row_capacity(), 0u);
  expect_accounting(kv);

  // Two prompts of 3 and 70 tokens: 2 rows, columns rounded up to 64s.
  kv.prepare_prefill(std::vector<size_t>{3, 70});
  EXPECT_EQ(kv.row_capacity(), 2u);
  EXPECT_EQ(kv.col_capacity(), 128u);
  EXPECT_EQ(kv.allocated_bytes(), bpt * 2 * 128);
  expect_accounting(kv);
}

TEST_P(BatchKvOps, SidesDescribeThePlanes) {
  BatchKv kv(spec(), alloc_);
  kv.prepare_prefill(std::vector<size_t>{3, 5});
  const size_t cols = kv.col_capacity();
  for (size_t l = 0; l < kLayers; ++l) {
    KvSide k0, v0, k1, v1;
    kv.attention_task(l, 0, 0, &k0, &v0);
    kv.attention_task(l, 1, 0, &k1, &v1);
    for (bool vs : {false, true}) {
      const KvFormat f = vs ? GetParam().v : GetParam().k;
      const KvSide& r0 = vs ? v0 : k0;
      const KvSide& r1 = vs ? v1 : k1;
      EXPECT_EQ(r0.format, f);
      const std::vector<size_t> units = f.plane_units(head_dim());
      for (size_t i = 0; i < 3; ++i) {
        if (i >= units.size()) {
          EXPECT_EQ(r0.plane[i], nullptr);
          continue;
        }
        EXPECT_EQ(r0.unit[i], units[i]);
        EXPECT_EQ(r0.head_stride[i], cols * units[i]);
        // Row slots follow one another: [row][head][col][unit].
        EXPECT_EQ(r1.plane[i] - r0.plane[i], static_cast<ptrdiff_t>(kHeads * cols * units[i]));
      }
    }
  }
}

// --- batched padded prefill ---

TEST_P(BatchKvOps, PaddedPrefill) {
  const Model m = {seq_tags(1, 3), seq_tags(2, 5), seq_tags(3, 1)};
  BatchKv kv(spec(), alloc_);
  kv.prepare_prefill(std::vector<size_t>{3, 5, 1});
  // Empty rows placed so that the prompts end right-aligned at 5.
  // (The last field is the prompt length still pending.)
  EXPECT_EQ(rows_of(kv.table()),
            (Rows{{2, 2, 0, 0, 0, 3}, {0, 0, 0, 0, 0, 5}, {4, 4, 0, 0, 0, 1}}));
  EXPECT_EQ(kv.row_capacity(), 3u);
  EXPECT_EQ(kv.col_capacity(), 64u);
  expect_accounting(kv);

  Model got(3);
  step(kv, got, {{m[0][0], m[0][1]}, {m[1][0], m[1][1]}, {m[2][0]}});
  EXPECT_EQ(rows_of(kv.table()),
            (Rows{{2, 4, 0, 0, 0, 3}, {0, 2, 0, 0, 0, 5}, {4, 5, 0, 0, 0, 1}}));
  // Rows 0 and 1 are short of their prompts: refused, nothing recorded.
  EXPECT_THROW(kv.finalize_prefill(), Error);
  EXPECT_EQ(rows_of(kv.table()),
            (Rows{{2, 4, 0, 0, 0, 3}, {0, 2, 0, 0, 0, 5}, {4, 5, 0, 0, 0, 1}}));

  step(kv, got, {{m[0][2]}, {m[1][2], m[1][3], m[1][4]}, {}});
  EXPECT_EQ(rows_of(kv.table()),
            (Rows{{2, 5, 0, 0, 0, 3}, {0, 5, 0, 0, 0, 5}, {4, 5, 0, 0, 0, 1}}));
  EXPECT_TRUE(kv.table().right_aligned());
  kv.finalize_prefill();
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 5, 3, 0}, {0, 5, 5, 0}, {4, 5, 1, 0}}));
  expect_contents(kv, m);

  // Decode continues in one shared column.
  Model d = m;
  step(kv, d, next_tokens(d, 1));
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 6, 3, 0}, {0, 6, 5, 0}, {4, 6, 1, 0}}));
  expect_contents(kv, d);
  expect_accounting(kv);
}

TEST_P(BatchKvOps, RowLeavesDuringPrefill) {
  Model m = {seq_tags(1, 3), seq_tags(2, 5), seq_tags(3, 4)};
  BatchKv kv(spec(), alloc_);
  kv.prepare_prefill(std::vector<size_t>{3, 5, 4});
  Model got(3);
  step(kv, got, {{m[0][0], m[0][1]}, {m[1][0], m[1][1]}, {m[2][0], m[2][1]}});
  // Row 1 is cancelled half-way; rows 0 and 2 finish their prompts.
  kv.filter(std::vector<size_t>{0, 2});
  m = pick(m, {0, 2});
  got = pick(got, {0, 2});
  // Starts 2 and 1 (prompts right-aligned at 5) share one column: trimmed.
  EXPECT_EQ(rows_of(kv.table()), (Rows{{1, 3, 0, 0, 0, 3}, {0, 2, 0, 0, 0, 4}}));
  step(kv, got, {{m[0][2]}, {m[1][2], m[1][3]}});
  kv.finalize_prefill();
  EXPECT_EQ(rows_of(kv.table()), (Rows{{1, 4, 3, 0}, {0, 4, 4, 0}}));
  expect_contents(kv, m);
}

TEST_P(BatchKvOps, WritesOutsideTheReservationAreRefused) {
  BatchKv kv(spec(), alloc_);
  kv.prepare_prefill(std::vector<size_t>{64});
  Model m(1);
  step(kv, m, {seq_tags(1, 64)});
  const std::vector<float> x = token_vec(spec(), 0, 0, false);
  EXPECT_THROW(kv.write(0, 0, 0, x.data(), x.data()), Error);  // column 64 of 64
  EXPECT_THROW(kv.write(kLayers, 0, 0, x.data(), x.data()), Error);
  EXPECT_THROW(kv.write(0, 1, 0, x.data(), x.data()), Error);
  EXPECT_THROW(kv.commit(std::vector<size_t>{1}), Error);  // past capacity: reserve first
  EXPECT_THROW(kv.commit(std::vector<size_t>{0, 0}), Error);
  expect_contents(kv, m);
}

// --- reserve ---

TEST_P(BatchKvOps, ReserveReclaimsTrimmedColumns) {
  Model m = {seq_tags(1, 60), seq_tags(2, 3), seq_tags(3, 2)};
  BatchKv kv = make(m);
  // The 60-token row leaves: the others trim 57 shared columns, and sit at
  // physical columns 57..60 of 64.
  kv.filter(std::vector<size_t>{1, 2});
  m = pick(m, {1, 2});
  EXPECT_EQ(rows_of(kv.table()), (Rows{{0, 3, 3, 0}, {1, 3, 2, 0}}));
  const size_t bytes = kv.allocated_bytes();
  const auto ptrs = planes(kv);
  // 8 columns are needed, 64 exist: the rows move left in place instead
  // of the cache growing.
  step(kv, m, next_tokens(m, 5));
  EXPECT_EQ(kv.col_capacity(), 64u);
  EXPECT_EQ(kv.allocated_bytes(), bytes);
  EXPECT_EQ(planes(kv), ptrs);
  expect_contents(kv, m);
  step(kv, m, next_tokens(m, 56));  // 64 of 64
  EXPECT_EQ(kv.col_capacity(), 64u);
  expect_contents(kv, m);

  // The same while a view shares a layer: only that layer is copied.
  Model m2 = {seq_tags(1, 60), seq_tags(2, 3)};
  BatchKv kv2 = make(m2);
  kv2.filter(std::vector<size_t>{1});
  m2 = pick(m2, {1});
  const KvView view = kv2.capture(0);
  const std::vector<float> seen = view_values(view, head_dim());
  EXPECT_EQ(expect_all_or_nothing(*alloc_, {&kv2}, [&] { kv2.reserve(std::vector<size_t>{10}); }),
            planes_per_layer());
  EXPECT_EQ(kv2.col_capacity(), 64u);
  EXPECT_EQ(view_values(view, head_dim()), seen);
  step(kv2, m2, next_tokens(m2, 10));
  expect_contents(kv2, m2);
  expect_accounting(kv2);
}

// --- merge ---

TEST_P(BatchKvOps, MergeRightAlignsRows) {
  BatchKv a = make({seq_tags(1, 4)});
  a.set_min_reusable(0, 2);
  BatchKv b = make({seq_tags(2, 6), seq_tags(3, 2)});
  // c's surviving row sits past 8 columns of trimmed padding (base 8).
  BatchKv c = make({seq_tags(4, 9), seq_tags(5, 1)});
  c.filter(std::vector<size_t>{1});
  EXPECT_EQ(rows_of(c.table()), (Rows{{0, 1, 1, 0}}));
  const Snapshot sa = snapshot(a), sb = snapshot(b), sc = snapshot(c);

  const BatchKv empty(spec(), alloc_);  // never prepared: adds no row
  const BatchKv* parts[] = {&a, &empty, &b, &c};
  BatchKv kv = BatchKv::merge(parts);
  // Lengths 4, 6, 2, 1 right-aligned at 6; prompt and reuse marks kept.
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 6, 4, 2}, {0, 6, 6, 0}, {4, 6, 2, 0}, {5, 6, 1, 0}}));
  EXPECT_EQ(kv.minimum_reusable_offset(), 2u);
  EXPECT_EQ(kv.row_capacity(), 4u);
  EXPECT_EQ(kv.col_capacity(), 64u);
  Model m = {seq_tags(1, 4), seq_tags(2, 6), seq_tags(3, 2), seq_tags(5, 1)};
  expect_contents(kv, m);
  expect_accounting(kv);
  // The parts are untouched.
  EXPECT_TRUE(snapshot(a) == sa);
  EXPECT_TRUE(snapshot(b) == sb);
  EXPECT_TRUE(snapshot(c) == sc);

  step(kv, m, next_tokens(m, 2));
  expect_contents(kv, m);

  EXPECT_THROW(BatchKv::merge({}), Error);
  BatchKv other(KvSpec::uniform(1, kHeads, head_dim(), GetParam().k, GetParam().v), alloc_);
  const BatchKv* mixed[] = {&a, &other};
  EXPECT_THROW(BatchKv::merge(mixed), Error);
}

// --- extend ---

TEST_P(BatchKvOps, ExtendInPlaceMovesNoRunningRow) {
  Model m = {seq_tags(1, 5), seq_tags(2, 3), seq_tags(3, 4)};
  BatchKv kv = make(m);
  step(kv, m, next_tokens(m, 1));
  // A free row slot: {2,6} and {1,6} survive and lose one shared column.
  kv.filter(std::vector<size_t>{1, 2});
  m = pick(m, {1, 2});
  EXPECT_EQ(rows_of(kv.table()), (Rows{{1, 5, 3, 0}, {0, 5, 4, 0}}));
  const size_t bytes = kv.allocated_bytes();
  const auto ptrs = planes(kv);

  const Model j = {seq_tags(4, 2)};
  kv.extend(make(j));
  m.push_back(j[0]);
  EXPECT_EQ(rows_of(kv.table()), (Rows{{1, 5, 3, 0}, {0, 5, 4, 0}, {3, 5, 2, 0}}));
  EXPECT_EQ(kv.allocated_bytes(), bytes);
  EXPECT_EQ(kv.row_capacity(), 3u);
  EXPECT_EQ(planes(kv, 2), ptrs);
  expect_contents(kv, m);
  step(kv, m, next_tokens(m, 1));
  expect_contents(kv, m);
  expect_accounting(kv);
}

TEST_P(BatchKvOps, ExtendRebuildsForALongerRow) {
  Model m = {seq_tags(1, 3), seq_tags(2, 2)};
  BatchKv kv = make(m);
  EXPECT_EQ(rows_of(kv.table()), (Rows{{0, 3, 3, 0}, {1, 3, 2, 0}}));
  BatchKv j = make({seq_tags(3, 6)});
  j.set_min_reusable(0, 4);
  kv.extend(j);
  m.push_back(seq_tags(3, 6));
  // 3 longer than the width: the running rows shift right by 3.
  EXPECT_EQ(rows_of(kv.table()), (Rows{{3, 6, 3, 0}, {4, 6, 2, 0}, {0, 6, 6, 4}}));
  EXPECT_EQ(kv.row_capacity(), 4u);  // full: row slots double
  EXPECT_EQ(kv.col_capacity(), 64u);
  EXPECT_EQ(kv.minimum_reusable_offset(), 4u);
  expect_contents(kv, m);
  expect_accounting(kv);

  // A longer joiner while a slot is free: rebuilt for the width only, the
  // row capacity stays.
  kv.filter(std::vector<size_t>{0, 2});
  m = pick(m, {0, 2});
  kv.extend(make({seq_tags(4, 70)}));
  m.push_back(seq_tags(4, 70));
  EXPECT_EQ(rows_of(kv.table()), (Rows{{67, 70, 3, 0}, {64, 70, 6, 4}, {0, 70, 70, 0}}));
  EXPECT_EQ(kv.row_capacity(), 4u);
  EXPECT_EQ(kv.col_capacity(), 128u);
  expect_contents(kv, m);
  step(kv, m, next_tokens(m, 1));
  expect_contents(kv, m);
  expect_accounting(kv);
}

TEST_P(BatchKvOps, ExtendWithSeveralRows) {
  Model m = {seq_tags(1, 4), seq_tags(2, 6), seq_tags(3, 2)};
  BatchKv kv = make(m);
  kv.filter(std::vector<size_t>{1});
  m = pick(m, {1});
  const auto ptrs = planes(kv);
  // Two joiners fit the width and the two free slots: in place.
  const Model j1 = {seq_tags(4, 3), seq_tags(5, 6)};
  kv.extend(make(j1));
  m.insert(m.end(), j1.begin(), j1.end());
  EXPECT_EQ(rows_of(kv.table()), (Rows{{0, 6, 6, 0}, {3, 6, 3, 0}, {0, 6, 6, 0}}));
  EXPECT_EQ(planes(kv, 1), ptrs);
  expect_contents(kv, m);
  // Two more, one longer: rebuilt once, rows shift by 2, slots double.
  const Model j2 = {seq_tags(6, 2), seq_tags(7, 8)};
  kv.extend(make(j2));
  m.insert(m.end(), j2.begin(), j2.end());
  EXPECT_EQ(rows_of(kv.table()),
            (Rows{{2, 8, 6, 0}, {5, 8, 3, 0}, {2, 8, 6, 0}, {6, 8, 2, 0}, {0, 8, 8, 0}}));
  EXPECT_EQ(kv.row_capacity(), 6u);
  expect_contents(kv, m);
  expect_accounting(kv);
}

TEST_P(BatchKvOps, ExtendAnEmptyCache) {
  BatchKv kv(spec(), alloc_);
  const Model j = {seq_tags(1, 3), seq_tags(2, 5)};
  kv.extend(make(j));
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 5, 3, 0}, {0, 5, 5, 0}}));
  expect_contents(kv, j);
  // An empty joiner changes nothing; a cache cannot join itself.
  const auto ptrs = planes(kv);
  kv.extend(BatchKv(spec(), alloc_));
  EXPECT_EQ(planes(kv), ptrs);
  EXPECT_THROW(kv.extend(kv), Error);
  expect_contents(kv, j);
  // Drained, then refilled within capacity: the storage is reused.
  const auto first_row = planes(kv, 1);
  kv.filter({});
  EXPECT_EQ(kv.rows(), 0u);
  const size_t bytes = kv.allocated_bytes();
  kv.extend(make({seq_tags(3, 4)}));
  EXPECT_EQ(rows_of(kv.table()), (Rows{{0, 4, 4, 0}}));
  EXPECT_EQ(kv.allocated_bytes(), bytes);
  EXPECT_EQ(planes(kv), first_row);
  expect_contents(kv, {seq_tags(3, 4)});
  expect_accounting(kv);
  EXPECT_THROW(
      kv.extend(BatchKv(KvSpec::uniform(1, kHeads, head_dim(), GetParam().k, GetParam().v))),
      Error);
}

// --- filter ---

TEST_P(BatchKvOps, FilterKeepsSurvivorsAndTrimsSharedPadding) {
  Model m = {seq_tags(1, 4), seq_tags(2, 6), seq_tags(3, 2)};
  BatchKv kv = make(m);
  step(kv, m, next_tokens(m, 1));
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 7, 4, 0}, {0, 7, 6, 0}, {4, 7, 2, 0}}));
  const size_t bytes = kv.allocated_bytes();
  const auto ptrs = planes(kv, 2);

  kv.filter(std::vector<size_t>{0, 2});
  m = pick(m, {0, 2});
  // Starts 2 and 4 share 2 columns of padding: trimmed.
  EXPECT_EQ(rows_of(kv.table()), (Rows{{0, 5, 4, 0}, {2, 5, 2, 0}}));
  EXPECT_EQ(kv.allocated_bytes(), bytes);
  EXPECT_EQ(planes(kv), ptrs);
  expect_contents(kv, m);
  // Writes land after the trimmed columns.
  step(kv, m, next_tokens(m, 2));
  expect_contents(kv, m);

  kv.filter(std::vector<size_t>{1});
  m = pick(m, {1});
  EXPECT_EQ(rows_of(kv.table()), (Rows{{0, 5, 2, 0}}));
  expect_contents(kv, m);

  EXPECT_THROW(kv.filter(std::vector<size_t>{1}), Error);
  EXPECT_THROW(kv.filter(std::vector<size_t>{0, 0}), Error);
  expect_contents(kv, m);
  kv.filter({});
  EXPECT_EQ(kv.rows(), 0u);
  EXPECT_EQ(kv.allocated_bytes(), bytes);
  expect_accounting(kv);
}

// --- extract ---

TEST_P(BatchKvOps, ExtractOwnsItsBytes) {
  Model m = {seq_tags(1, 5), seq_tags(2, 3), seq_tags(3, 7)};
  std::optional<BatchKv> batch = make(m);
  step(*batch, m, next_tokens(m, 1));
  batch->set_min_reusable(1, 2);
  batch->filter(std::vector<size_t>{0, 1});  // trims 2 columns: base 2
  m = pick(m, {0, 1});
  EXPECT_EQ(rows_of(batch->table()), (Rows{{0, 6, 5, 0}, {2, 6, 3, 2}}));

  BatchKv one = batch->extract(1);
  EXPECT_EQ(rows_of(one.table()), (Rows{{0, 4, 3, 2}}));
  EXPECT_EQ(one.row_capacity(), 1u);
  EXPECT_EQ(one.col_capacity(), 64u);
  EXPECT_EQ(one.allocated_bytes(), one.bytes_per_token() * 64);
  Model solo = {m[1]};
  expect_contents(one, solo);

  // The batch writes, drops the row, and goes away: the copy is unchanged.
  step(*batch, m, next_tokens(m, 1, 5));
  batch->filter(std::vector<size_t>{0});
  EXPECT_THROW(batch->extract(1), Error);
  batch.reset();
  expect_contents(one, solo);
  step(one, solo, next_tokens(solo, 2));
  expect_contents(one, solo);
  expect_accounting(one);
}

// --- align ---

TEST_P(BatchKvOps, Align) {
  Model m = {seq_tags(1, 4), seq_tags(2, 6), seq_tags(3, 2)};
  BatchKv kv = make(m);
  const size_t bytes = kv.allocated_bytes();
  const auto ptrs = planes(kv);

  kv.align(std::vector<size_t>{2, 0, 4});  // the current layout: nothing to do
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 6, 4, 0}, {0, 6, 6, 0}, {4, 6, 2, 0}}));

  kv.align(std::vector<size_t>{0, 0, 0});
  EXPECT_EQ(rows_of(kv.table()), (Rows{{0, 4, 4, 0}, {0, 6, 6, 0}, {0, 2, 2, 0}}));
  EXPECT_EQ(planes(kv), ptrs);
  EXPECT_EQ(kv.allocated_bytes(), bytes);
  expect_contents(kv, m);

  // Up to the last column: still in place.
  kv.align(std::vector<size_t>{60, 0, 62});
  EXPECT_EQ(rows_of(kv.table()), (Rows{{60, 64, 4, 0}, {0, 6, 6, 0}, {62, 64, 2, 0}}));
  EXPECT_EQ(planes(kv), ptrs);
  expect_contents(kv, m);

  // One column more: rebuilt wider, same rows.
  kv.align(std::vector<size_t>{61, 0, 0});
  EXPECT_EQ(rows_of(kv.table()), (Rows{{61, 65, 4, 0}, {0, 6, 6, 0}, {0, 2, 2, 0}}));
  EXPECT_EQ(kv.row_capacity(), 3u);
  EXPECT_EQ(kv.col_capacity(), 128u);
  expect_contents(kv, m);
  expect_accounting(kv);
  // Ragged rows write at their own ends.
  step(kv, m, next_tokens(m, 1));
  expect_contents(kv, m);
  EXPECT_THROW(kv.align(std::vector<size_t>{0, 0}), Error);
}

// --- trim ---

TEST_P(BatchKvOps, TrimMovesNoBytes) {
  Model m = {seq_tags(1, 3), seq_tags(2, 5)};
  BatchKv kv = make(m);
  step(kv, m, next_tokens(m, 2));
  const auto ptrs = planes(kv);
  kv.trim(2);
  for (Tags& t : m) t.resize(t.size() - 2);
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 5, 3, 0}, {0, 5, 5, 0}}));
  EXPECT_EQ(planes(kv), ptrs);
  expect_contents(kv, m);
  // Rewritten tokens replace the dropped ones.
  step(kv, m, next_tokens(m, 1, 5));
  expect_contents(kv, m);
  // Into the prompts: prefill_end follows the rows down.
  kv.trim(4);
  EXPECT_EQ(rows_of(kv.table()), (Rows{{2, 2, 0, 0}, {0, 2, 2, 0}}));
  m = {{}, Tags(m[1].begin(), m[1].begin() + 2)};
  expect_contents(kv, m);
  expect_accounting(kv);
}

// --- attention key ranges ---

TEST(BatchKvAttention, KeyRangesAreCausalPaddedAndWindowed) {
  KvSpec s = KvSpec::uniform(2, kHeads, 16, KvFormat::f32(), KvFormat::f32());
  s.layers[1].window = 3;
  BatchKv kv(s);
  kv.prepare_prefill(std::vector<size_t>{5, 2});
  std::vector<size_t> counts = {5, 2};
  kv.reserve(counts);
  kv.commit(counts);
  kv.finalize_prefill();
  ASSERT_EQ(rows_of(kv.table()), (Rows{{0, 5, 5, 0}, {3, 5, 2, 0}}));
  kv.reserve(std::vector<size_t>{2, 2});

  struct Want {
    size_t layer, row, i, begin, end;
  };
  // Step token i of a row sits at column end + i and sees its row's keys
  // from its start (or the window's first key) up to itself.
  const Want wants[] = {
      {0, 0, 0, 0, 6},
      {0, 0, 1, 0, 7},
      {0, 1, 0, 3, 6},
      {0, 1, 1, 3, 7},
      // Window 3: keys [last - 2, last], never before the row's start.
      {1, 0, 0, 3, 6},
      {1, 0, 1, 4, 7},
      {1, 1, 0, 3, 6},
      {1, 1, 1, 4, 7},
  };
  for (const Want& w : wants) {
    KvSide k, v;
    const kernels::AttentionTask t = kv.attention_task(w.layer, w.row, w.i, &k, &v);
    EXPECT_EQ(t.seg[0].begin, w.begin) << w.layer << "/" << w.row << "/" << w.i;
    EXPECT_EQ(t.seg[0].end, w.end) << w.layer << "/" << w.row << "/" << w.i;
    EXPECT_EQ(t.seg[1].end - t.seg[1].begin, 0u);
    EXPECT_EQ(t.k, &k);
    EXPECT_EQ(t.v, &v);
    EXPECT_EQ(t.n_keys(), w.end - w.begin);
  }
  KvSide k, v;
  EXPECT_THROW(kv.attention_task(2, 0, 0, &k, &v), Error);
  EXPECT_THROW(kv.attention_task(0, 2, 0, &k, &v), Error);

  // After trimming 3 shared columns, slots are physical: logical + 3.
  kv.filter(std::vector<size_t>{1});
  ASSERT_EQ(rows_of(kv.table()), (Rows{{0, 2, 2, 0}}));
  kernels::AttentionTask t = kv.attention_task(0, 0, 0, &k, &v);
  EXPECT_EQ(t.seg[0].begin, 3u);
  EXPECT_EQ(t.seg[0].end, 6u);
  t = kv.attention_task(1, 0, 1, &k, &v);  // last 3, window 3: keys 1..3
  EXPECT_EQ(t.seg[0].begin, 4u);
  EXPECT_EQ(t.seg[0].end, 7u);

  // A view's task takes explicit logical keys inside the row.
  const KvView view = kv.capture(0);
  t = view.task(0, 0, 1, &k, &v);
  EXPECT_EQ(t.seg[0].begin, 3u);
  EXPECT_EQ(t.seg[0].end, 5u);
  EXPECT_THROW(view.task(0, 0, 2, &k, &v), Error);
  EXPECT_THROW(view.task(0, 1, 0, &k, &v), Error);
  EXPECT_THROW(view.task(1, 0, 0, &k, &v), Error);
}

TEST(BatchKvSpec, Validation) {
  auto make = [](KvSpec s) { return BatchKv(std::move(s)); };
  EXPECT_THROW(make(KvSpec::uniform(0, 2, 16, KvFormat::f32(), KvFormat::f32())), Error);
  EXPECT_THROW(make(KvSpec::uniform(1, 0, 16, KvFormat::f32(), KvFormat::f32())), Error);
  // head_dim 16 holds no group of 32; 3 bits is not a format.
  EXPECT_THROW(make(KvSpec::uniform(1, 2, 16, KvFormat::affine(4, 32), KvFormat::f32())), Error);
  EXPECT_THROW(make(KvSpec::uniform(1, 2, 64, KvFormat::f32(), KvFormat::affine(3, 32))), Error);
}

TEST(BatchKvReuse, MinimumReusableOffsetIsTheLargest) {
  BatchKv kv(KvSpec::uniform(1, 1, 16, KvFormat::f32(), KvFormat::f32()));
  EXPECT_EQ(kv.minimum_reusable_offset(), 0u);
  kv.prepare_prefill(std::vector<size_t>{2, 3, 1});
  kv.set_min_reusable(0, 1);
  kv.set_min_reusable(1, 4);
  EXPECT_EQ(kv.minimum_reusable_offset(), 4u);
  kv.filter(std::vector<size_t>{0, 2});
  EXPECT_EQ(kv.minimum_reusable_offset(), 1u);
}

}  // namespace
}  // namespace ferry::kv::kvtest
