#include "model/outputs.h"

#include <algorithm>

namespace ferry::model {

RowLogits StepOutputs::row(size_t o) {
  RowLogits r;
  if (full_row[o] >= 0)
    r.full = std::span<float>(logits).subspan(static_cast<size_t>(full_row[o]) * vocab, vocab);
  if (o < top_count.size())
    r.top = std::span<const TopLogit>(top).subspan(o * top_stride, top_count[o]);
  if (o < lse.size()) r.lse = lse[o];
  if (o < drawn.size()) r.drawn = drawn[o];
  return r;
}

void StepOutputs::reset_full(size_t n, size_t v) {
  vocab = v;
  // Resized, not cleared: a caller that keeps its outputs across steps pays
  // no allocation or zeroing (256 rows of a 128k vocabulary: 131 MB).
  logits.resize(n * v);
  full_row.resize(n);
  for (size_t o = 0; o < n; ++o) full_row[o] = static_cast<int64_t>(o);
  top_stride = 0;
  top.clear();
  top_count.clear();
  lse.clear();
  drawn.clear();
}

void select_from_row(std::span<const float> row, uint32_t top_n, std::vector<TopLogit>& top,
                     LogSumExp* lse) {
  top.clear();
  if (lse) {
    LogSumExp r{-INFINITY, 0.0};
    for (float l : row)
      if (l > r.max) r.max = l;
    for (float l : row)
      if (!std::isnan(l)) r.sum += std::exp(static_cast<double>(l) - r.max);
    *lse = r;
  }
  if (top_n == 0) return;
  for (size_t i = 0; i < row.size(); ++i)
    if (!std::isnan(row[i]))
      top.push_back({row[i] == 0.0f ? 0.0f : row[i], static_cast<int32_t>(i)});
  const size_t n = std::min<size_t>(top_n, top.size());
  std::partial_sort(top.begin(), top.begin() + static_cast<long>(n), top.end(),
                    [](const TopLogit& a, const TopLogit& b) {
                      return a.value != b.value ? a.value > b.value : a.id < b.id;
                    });
  top.resize(n);
}

}  // namespace ferry::model
