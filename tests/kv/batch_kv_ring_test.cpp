// Sliding-window layers stored as rings: memory bounded by the window, the
// newest keys kept across every row operation, rollbacks that would need
// overwritten keys refused, and exact accounting.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "kv/batch_kv.h"

namespace ferry::kv {
namespace {

using kernels::KvFormat;

// Layer 0 full attention, layer 1 a window of 4; 1 head of dim 16.
KvSpec ring_spec() {
  KvSpec s = KvSpec::uniform(2, 1, 16, KvFormat::f32(), KvFormat::f32());
  s.layers[1].window = 4;
  return s;
}

std::vector<float> vec(float t) {
  std::vector<float> x(16);
  for (size_t d = 0; d < 16; ++d) x[d] = t + d / 64.0f;
  return x;
}

// Appends n tokens to every row; token value = row * 1000 + position.
void step(BatchKv& kv, size_t n) {
  std::vector<size_t> counts(kv.rows(), n);
  kv.reserve(counts);
  for (size_t b = 0; b < kv.rows(); ++b)
    for (size_t i = 0; i < n; ++i) {
      auto x = vec(static_cast<float>(b * 1000 + kv.table().row(b).length() + i));
      for (size_t l = 0; l < 2; ++l) kv.write(l, b, i, x.data(), x.data());
    }
  kv.commit(counts);
}

// The value at logical key positions the next token of row b sees in
// layer `l`, through the attention task the kernels get.
std::vector<float> visible(const BatchKv& kv, size_t l, size_t b) {
  kernels::KvSide k, v;
  kernels::AttentionTask t = kv.attention_task(l, b, 0, &k, &v);
  std::vector<float> out;
  float buf[16];
  for (const auto& sg : t.seg)
    for (size_t j = sg.begin; j < sg.end; ++j) {
      kernels::decode_kv(k, 16, 0, j, buf);
      out.push_back(buf[0]);
    }
  return out;
}

TEST(BatchKvRing, MemoryIsBoundedAndNewestKeysAreKept) {
  BatchKv kv(ring_spec());
  const std::vector<size_t> lens{3, 6};
  kv.prepare_prefill(lens);
  std::vector<size_t> counts{3, 6};
  kv.reserve(counts);
  for (size_t b = 0; b < 2; ++b)
    for (size_t i = 0; i < counts[b]; ++i) {
      auto x = vec(static_cast<float>(b * 1000 + i));
      for (size_t l = 0; l < 2; ++l) kv.write(l, b, i, x.data(), x.data());
    }
  kv.commit(counts);
  kv.finalize_prefill();
  for (int i = 0; i < 50; ++i) step(kv, 1);
  // The ring holds window + step_cap - 1 = 4 + 6 - 1 slots.
  EXPECT_EQ(kv.ring_size(1), 9u);
  EXPECT_EQ(kv.ring_size(0), 0u);
  // Next token of row 0 is position 53: the window shows positions 50..52
  // (plus itself once written); the full layer shows all 53.
  // (attention_task includes the query's own column, written in the step;
  // here we look before writing, so the last slot is stale: drop it.)
  auto ring = visible(kv, 1, 0);
  ASSERT_EQ(ring.size(), 4u);
  EXPECT_EQ(std::vector<float>(ring.begin(), ring.end() - 1), (std::vector<float>{50, 51, 52}));
  EXPECT_EQ(visible(kv, 0, 0).size(), 54u);
  // Accounting: the ring layer allocates row_cap * 9 slots only.
  const size_t per_slot = 2 * 16 * 4;  // K + V, f32, one head
  EXPECT_EQ(kv.allocated_bytes(),
            per_slot * kv.row_capacity() * (kv.col_capacity() + kv.ring_size(1)));
  EXPECT_EQ(kv.projected_bytes(100, 6), per_slot * (100 + 9));
  EXPECT_EQ(kv.projected_bytes(5, 6), per_slot * (5 + 5));
  kv.check_integrity();
}

TEST(BatchKvRing, RowOperationsKeepTheWindow) {
  BatchKv kv(ring_spec());
  const std::vector<size_t> lens{2, 5};
  kv.prepare_prefill(lens);
  step(kv, 1);  // rows are empty; prefill token by token
  step(kv, 1);
  // Row 0 had 2 of 2 prompt tokens by now; row 1 needs 3 more.
  for (int i = 0; i < 3; ++i) {
    std::vector<size_t> c{0, 1};
    kv.reserve(c);
    auto x = vec(static_cast<float>(1000 + kv.table().row(1).length()));
    for (size_t l = 0; l < 2; ++l) kv.write(l, 1, 0, x.data(), x.data());
    kv.commit(c);
  }
  kv.finalize_prefill();
  for (int i = 0; i < 20; ++i) step(kv, 1);
  const auto before0 = visible(kv, 1, 0), before1 = visible(kv, 1, 1);
  // extract / filter / extend / merge all carry the ring's newest keys.
  BatchKv one = kv.extract(1);
  EXPECT_EQ(visible(one, 1, 0), before1);
  kv.filter(std::vector<size_t>{0});
  EXPECT_EQ(visible(kv, 1, 0), before0);
  kv.extend(one);
  EXPECT_EQ(visible(kv, 1, 1), before1);
  std::vector<const BatchKv*> parts{&kv, &one};
  BatchKv merged = BatchKv::merge(parts);
  EXPECT_EQ(visible(merged, 1, 0), before0);
  EXPECT_EQ(visible(merged, 1, 2), before1);
  merged.align(std::vector<size_t>{0, 0, 0});
  EXPECT_EQ(visible(merged, 1, 2), before1);
  merged.check_integrity();
}

TEST(BatchKvRing, RollbackPastTheRingIsRefused) {
  BatchKv kv(ring_spec());
  const std::vector<size_t> lens{1};
  kv.prepare_prefill(lens);
  step(kv, 1);
  kv.finalize_prefill();
  for (int i = 0; i < 30; ++i) step(kv, 1);  // ring of 4 slots, step 1
  EXPECT_EQ(kv.ring_size(1), 4u);
  // A round of 3 tokens grows the ring to 6 slots; rolling back all of it
  // is fine (the keys a window of 4 needs are still there).
  kv.spec_begin();
  step(kv, 3);
  kv.spec_rollback(std::vector<size_t>{0});
  EXPECT_EQ(kv.table().row(0).length(), 31u);
  // Trimming far back would need keys the ring overwrote: refused, unchanged.
  const RowTable before = kv.table();
  try {
    kv.trim(10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window ring"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kv.table(), before);
  // Even one token back is too far now: the round's writes overwrote
  // position 27 (the ring of 6 holds 28..33, of which 31..33 were rolled
  // back), and position 30's window starts at 27.
  EXPECT_THROW(kv.trim(1), Error);
  step(kv, 1);
  step(kv, 1);  // positions 31, 32: ring holds 27+..; window of 33 starts at 30
  kv.trim(1);   // back to 32 tokens: its window starts at 29, still held
  EXPECT_EQ(kv.table().row(0).length(), 32u);
}

}  // namespace
}  // namespace ferry::kv

namespace ferry::kv {
namespace {

// The mask and the attention tasks agree key for key: every allowed key of
// the mask is in the task's segments (mapped to the same stored token) and
// no other, for padded, ragged and windowed rows.
TEST(BatchKvMask, MatchesAttentionTasks) {
  BatchKv kv(ring_spec());
  const std::vector<size_t> lens{2, 7, 4};
  kv.prepare_prefill(lens);
  std::vector<size_t> counts = lens;
  kv.reserve(counts);
  for (size_t b = 0; b < 3; ++b)
    for (size_t i = 0; i < counts[b]; ++i) {
      auto x = vec(static_cast<float>(b * 1000 + i));
      for (size_t l = 0; l < 2; ++l) kv.write(l, b, i, x.data(), x.data());
    }
  // Before commit: the mask of this prefill step (row b's query i sees
  // positions 0..i of its own prompt, windowed in layer 1).
  for (size_t l = 0; l < 2; ++l) {
    const auto m = kv.mask(l, counts);
    const size_t N = 7, S = 7;
    ASSERT_EQ(m.size(), 3 * N * S);
    for (size_t b = 0; b < 3; ++b) {
      const size_t start = kv.table().row(b).start;
      EXPECT_EQ(start, 7 - lens[b]);
      for (size_t i = 0; i < N; ++i) {
        kernels::KvSide k, v;
        std::vector<float> from_task;
        if (i < counts[b]) {
          auto t = kv.attention_task(l, b, i, &k, &v);
          float buf[16];
          for (const auto& sg : t.seg)
            for (size_t j = sg.begin; j < sg.end; ++j) {
              kernels::decode_kv(k, 16, 0, j, buf);
              from_task.push_back(buf[0]);
            }
        }
        std::vector<float> from_mask;
        for (size_t j = 0; j < S; ++j)
          if (m[(b * N + i) * S + j]) from_mask.push_back(static_cast<float>(b * 1000 + j - start));
        EXPECT_EQ(from_task, from_mask) << "layer " << l << " row " << b << " query " << i;
      }
    }
  }
  kv.commit(counts);
}

}  // namespace
}  // namespace ferry::kv
