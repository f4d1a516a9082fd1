// Helpers of the BatchKv tests (batch_kv_test.cpp, batch_kv_safety_test.cpp):
// a model of what every row holds, steps that write recognisable tokens,
// exact readback through kernels::decode_kv, snapshots, an allocator that
// fails on its n-th call, and the formats every test runs in.
//
// Each token written is a recognisable vector: its tag (sequence * 1000 +
// position * 10, + 5 for a token rewritten after a rollback) + head +
// layer / 2 + side / 4 + d / 64. The expected decoded value is that vector
// passed through the format's own encoding (f16 or bf16 rounding, or
// affine_quantize + affine_dequantize, which affine_quant_test.cpp pins to
// MLX), so every comparison is exact, never a tolerance.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <vector>

#include "core/half.h"
#include "kernels/ops.h"
#include "kv/affine_quant.h"
#include "kv/batch_kv.h"
#include "kv/row_state_print.h"

namespace ferry::kv::kvtest {

using kernels::KvFormat;
using kernels::KvSide;
using Rows = std::vector<RowState>;

constexpr size_t kLayers = 2, kHeads = 2;

inline Rows rows_of(const RowTable& t) {
  return Rows(t.rows().begin(), t.rows().end());
}

// --- the model of a cache: each row's token tags, in row order ---

using Tags = std::vector<float>;
using Model = std::vector<Tags>;

inline float tag(int seq, size_t pos) {
  return static_cast<float>(seq * 1000 + pos * 10);
}

inline Tags seq_tags(int seq, size_t n) {
  Tags t;
  for (size_t p = 0; p < n; ++p) t.push_back(tag(seq, p));
  return t;
}

// n further tokens for every row, continuing its sequence (+ salt).
inline std::vector<Tags> next_tokens(const Model& m, size_t n, float salt = 0) {
  std::vector<Tags> out(m.size());
  for (size_t b = 0; b < m.size(); ++b)
    for (size_t i = 0; i < n; ++i) out[b].push_back(m[b].back() + 10.0f * (i + 1) + salt);
  return out;
}

inline Model pick(const Model& m, const std::vector<size_t>& keep) {
  Model out;
  for (size_t b : keep) out.push_back(m[b]);
  return out;
}

// The K or V vector written for a token: [kHeads * head_dim].
inline std::vector<float> token_vec(const KvSpec& s, float t, size_t layer, bool v_side) {
  std::vector<float> x(kHeads * s.head_dim);
  for (size_t h = 0; h < kHeads; ++h)
    for (size_t d = 0; d < s.head_dim; ++d)
      x[h * s.head_dim + d] = t + static_cast<float>(h) + 0.5f * static_cast<float>(layer) +
                              (v_side ? 0.25f : 0.0f) + static_cast<float>(d) / 64.0f;
  return x;
}

// What decode_kv returns for one head's D values x after storing them in f.
inline std::vector<float> stored(KvFormat f, const float* x, size_t D) {
  std::vector<float> out(D);
  switch (f.kind) {
    case KvFormat::Kind::F32:
      out.assign(x, x + D);
      break;
    case KvFormat::Kind::F16:
      for (size_t i = 0; i < D; ++i) out[i] = f16_to_f32(f32_to_f16(x[i]));
      break;
    case KvFormat::Kind::BF16:
      for (size_t i = 0; i < D; ++i) out[i] = bf16_to_f32(f32_to_bf16(x[i]));
      break;
    case KvFormat::Kind::Affine: {
      std::vector<uint32_t> packed(D * f.bits / 32);
      std::vector<uint16_t> scales(D / f.group), biases(D / f.group);
      affine_quantize(x, D, f.bits, f.group, packed.data(), scales.data(), biases.data());
      affine_dequantize(packed.data(), scales.data(), biases.data(), D, f.bits, f.group,
                        out.data());
      break;
    }
  }
  return out;
}

// Decodes token t (counted from the row's start) of (layer, row, kv head h).
inline std::vector<float> read(const BatchKv& kv, size_t layer, size_t row, size_t t, size_t h,
                               bool v_side) {
  KvSide k, v;
  const kernels::AttentionTask task = kv.attention_task(layer, row, 0, &k, &v);
  const RowState& r = kv.table().row(row);
  // The task's keys end just after the query's own column, end + 0: that
  // gives the physical offset of logical columns.
  const size_t base = task.seg[0].end - r.end - 1;
  std::vector<float> out(kv.spec().head_dim);
  kernels::decode_kv(v_side ? v : k, out.size(), h, r.start + t + base, out.data());
  return out;
}

// Every valid token of kv decodes to exactly what m says was written.
inline void expect_contents(const BatchKv& kv, const Model& m) {
  ASSERT_EQ(kv.rows(), m.size());
  for (size_t b = 0; b < m.size(); ++b)
    ASSERT_EQ(kv.table().row(b).length(), m[b].size()) << "row " << b;
  const KvSpec& s = kv.spec();
  for (size_t l = 0; l < kLayers; ++l)
    for (size_t b = 0; b < m.size(); ++b)
      for (size_t t = 0; t < m[b].size(); ++t)
        for (bool vs : {false, true}) {
          const std::vector<float> x = token_vec(s, m[b][t], l, vs);
          for (size_t h = 0; h < kHeads; ++h) {
            const KvFormat f = vs ? s.layers[l].v : s.layers[l].k;
            if (read(kv, l, b, t, h, vs) != stored(f, &x[h * s.head_dim], s.head_dim)) {
              ADD_FAILURE() << "layer " << l << " row " << b << " token " << t << " head " << h
                            << (vs ? " V" : " K") << " differs (tag " << m[b][t] << ")";
              return;
            }
          }
        }
}

inline void expect_accounting(const BatchKv& kv) {
  EXPECT_EQ(kv.allocated_bytes(), kv.bytes_per_token() * kv.row_capacity() * kv.col_capacity());
  EXPECT_NO_THROW(kv.check_integrity());
}

// One forward step: tokens[b] are row b's new tokens (any number, maybe
// none): reserve, every layer writes, commit. The model follows.
inline void step(BatchKv& kv, Model& m, const std::vector<Tags>& tokens) {
  std::vector<size_t> counts;
  for (const Tags& t : tokens) counts.push_back(t.size());
  kv.reserve(counts);
  for (size_t l = 0; l < kLayers; ++l)
    for (size_t b = 0; b < tokens.size(); ++b)
      for (size_t i = 0; i < tokens[b].size(); ++i) {
        const std::vector<float> k = token_vec(kv.spec(), tokens[b][i], l, false);
        const std::vector<float> v = token_vec(kv.spec(), tokens[b][i], l, true);
        kv.write(l, b, i, k.data(), v.data());
      }
  kv.commit(counts);
  for (size_t b = 0; b < tokens.size(); ++b)
    m[b].insert(m[b].end(), tokens[b].begin(), tokens[b].end());
}

// A cache holding m's rows, prefilled `chunk` tokens per row per step.
inline BatchKv prefilled(const KvSpec& s, const Model& m, std::shared_ptr<KvAllocator> alloc,
                         size_t chunk = 2) {
  BatchKv kv(s, std::move(alloc));
  std::vector<size_t> lengths;
  for (const Tags& t : m) lengths.push_back(t.size());
  kv.prepare_prefill(lengths);
  Model written(m.size());
  for (size_t done = 0;; done += chunk) {
    std::vector<Tags> tokens(m.size());
    bool any = false;
    for (size_t b = 0; b < m.size(); ++b)
      for (size_t i = done; i < std::min(done + chunk, m[b].size()); ++i) {
        tokens[b].push_back(m[b][i]);
        any = true;
      }
    if (!any) break;
    step(kv, written, tokens);
  }
  kv.finalize_prefill();
  return kv;
}

// Plane pointers of rows [0, n) of every layer, K then V: equal lists mean
// no byte of those rows moved.
inline std::vector<const uint8_t*> planes(const BatchKv& kv, size_t n) {
  std::vector<const uint8_t*> out;
  for (size_t l = 0; l < kLayers; ++l)
    for (size_t b = 0; b < n; ++b) {
      KvSide k, v;
      kv.attention_task(l, b, 0, &k, &v);
      for (const KvSide* s : {&k, &v}) out.insert(out.end(), s->plane, s->plane + 3);
    }
  return out;
}
inline std::vector<const uint8_t*> planes(const BatchKv& kv) {
  return planes(kv, kv.rows());
}

// Everything observable about a cache.
struct Snapshot {
  Rows rows;
  size_t allocated = 0, row_cap = 0, col_cap = 0, min_reusable = 0;
  bool round = false;
  std::vector<float> values;
  bool operator==(const Snapshot&) const = default;
};

inline Snapshot snapshot(const BatchKv& kv) {
  Snapshot s{rows_of(kv.table()),
             kv.allocated_bytes(),
             kv.row_capacity(),
             kv.col_capacity(),
             kv.minimum_reusable_offset(),
             kv.in_spec_round(),
             {}};
  for (size_t l = 0; l < kLayers; ++l)
    for (size_t b = 0; b < kv.rows(); ++b)
      for (size_t t = 0; t < kv.table().row(b).length(); ++t)
        for (size_t h = 0; h < kHeads; ++h)
          for (bool vs : {false, true}) {
            const std::vector<float> x = read(kv, l, b, t, h, vs);
            s.values.insert(s.values.end(), x.begin(), x.end());
          }
  return s;
}

// Everything a donor view shows: every valid token of every row.
inline std::vector<float> view_values(const KvView& view, size_t head_dim) {
  std::vector<float> out;
  for (size_t b = 0; b < view.table().size(); ++b) {
    const RowState& r = view.table().row(b);
    if (r.length() == 0) continue;
    KvSide k, v;
    const kernels::AttentionTask task = view.task(b, r.start, r.end - 1, &k, &v);
    EXPECT_EQ(task.n_keys(), r.length());
    for (size_t j = task.seg[0].begin; j < task.seg[0].end; ++j)
      for (size_t h = 0; h < kHeads; ++h)
        for (const KvSide* s : {&k, &v}) {
          std::vector<float> x(head_dim);
          kernels::decode_kv(*s, head_dim, h, j, x.data());
          out.insert(out.end(), x.begin(), x.end());
        }
  }
  return out;
}

// An allocator that throws std::bad_alloc on its n-th call (0-based) once
// armed; disarmed, it allocates normally.
class FailingAllocator : public KvAllocator {
 public:
  std::shared_ptr<KvBuffer> allocate(size_t bytes) override {
    if (fail_at_ && calls_++ == *fail_at_) throw std::bad_alloc();
    return KvAllocator::allocate(bytes);
  }
  void arm(size_t n) {
    fail_at_ = n;
    calls_ = 0;
  }
  // Disarms; returns the calls made since arm().
  size_t disarm() {
    fail_at_.reset();
    return calls_;
  }

 private:
  std::optional<size_t> fail_at_;
  size_t calls_ = 0;
};

// Runs op with the allocator failing on call 0, 1, 2, ... until it
// succeeds. After every failure each watched cache must be exactly as it
// was and sound. Returns the allocations of the successful run.
inline size_t expect_all_or_nothing(FailingAllocator& alloc, std::vector<const BatchKv*> watched,
                                    const std::function<void()>& op) {
  std::vector<Snapshot> before;
  for (const BatchKv* kv : watched) before.push_back(snapshot(*kv));
  for (size_t n = 0; n < 100; ++n) {
    alloc.arm(n);
    try {
      op();
    } catch (const std::bad_alloc&) {
      EXPECT_EQ(alloc.disarm(), n + 1);
      for (size_t i = 0; i < watched.size(); ++i) {
        EXPECT_TRUE(snapshot(*watched[i]) == before[i])
            << "cache " << i << " changed by a failure at allocation " << n;
        EXPECT_NO_THROW(watched[i]->check_integrity());
      }
      continue;
    }
    return alloc.disarm();
  }
  ADD_FAILURE() << "the operation never succeeded";
  return 0;
}

// --- the formats ---

struct FormatCase {
  const char* name;
  KvFormat k, v;
  size_t head_dim;
  size_t k_bytes, v_bytes;  // per (kv head, token), worked out by hand
};

// Affine: head_dim * bits / 8 bytes of codes, then one f16 scale and one
// f16 bias per group.
inline const FormatCase kFormats[] = {
    {"f32", KvFormat::f32(), KvFormat::f32(), 16, 16 * 4, 16 * 4},
    {"f16", KvFormat::f16(), KvFormat::f16(), 16, 16 * 2, 16 * 2},
    {"bf16", KvFormat::bf16(), KvFormat::bf16(), 16, 16 * 2, 16 * 2},
    {"q8g32", KvFormat::affine(8, 32), KvFormat::affine(8, 32), 32, 32 + 2 + 2, 32 + 2 + 2},
    {"q4g32", KvFormat::affine(4, 32), KvFormat::affine(4, 32), 32, 16 + 2 + 2, 16 + 2 + 2},
    {"k_q8g32_v_q4g32", KvFormat::affine(8, 32), KvFormat::affine(4, 32), 32, 36, 20},
    {"k_f16_v_q4g32", KvFormat::f16(), KvFormat::affine(4, 32), 32, 32 * 2, 20},
    // Two groups per head on one side: 32 bytes of codes + 2 scales + 2 biases.
    {"k_q4g32_v_q8g64_d64", KvFormat::affine(4, 32), KvFormat::affine(8, 64), 64, 32 + 4 + 4,
     64 + 2 + 2},
};

inline void PrintTo(const FormatCase& c, std::ostream* os) {
  *os << c.name;
}

class BatchKvFormat : public testing::TestWithParam<FormatCase> {
 protected:
  KvSpec spec() const {
    const FormatCase& c = GetParam();
    return KvSpec::uniform(kLayers, kHeads, c.head_dim, c.k, c.v);
  }
  BatchKv make(const Model& m) const { return prefilled(spec(), m, alloc_); }
  // Buffers one layer allocates.
  size_t planes_per_layer() const {
    return (GetParam().k.quantized() ? 3 : 1) + (GetParam().v.quantized() ? 3 : 1);
  }
  size_t head_dim() const { return GetParam().head_dim; }

  std::shared_ptr<FailingAllocator> alloc_ = std::make_shared<FailingAllocator>();
};

}  // namespace ferry::kv::kvtest
