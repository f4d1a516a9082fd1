#include "kv/row_table.h"

#include <algorithm>

#include "core/error.h"

namespace ferry::kv {

size_t RowTable::width() const {
  size_t w = 0;
  for (const auto& r : rows_) w = std::max(w, r.end);
  return w;
}

size_t RowTable::shared_padding() const {
  if (rows_.empty()) return 0;
  size_t p = rows_[0].start;
  for (const auto& r : rows_) p = std::min(p, r.start);
  return p;
}

bool RowTable::right_aligned() const {
  size_t w = width();
  return std::all_of(rows_.begin(), rows_.end(), [&](const RowState& r) { return r.end == w; });
}

RowTable RowTable::merged(std::span<const size_t> lengths) {
  size_t w = 0;
  for (size_t l : lengths) w = std::max(w, l);
  std::vector<RowState> rows;
  for (size_t l : lengths) rows.push_back(RowState{w - l, w, 0, 0});
  return RowTable(std::move(rows));
}

RowTable RowTable::extended(size_t length, size_t* shift_existing) const {
  const size_t w = width();
  const size_t shift = length > w ? length - w : 0;
  std::vector<RowState> rows = rows_;
  for (auto& r : rows) {
    r.start += shift;
    r.end += shift;
  }
  const size_t nw = w + shift;
  rows.push_back(RowState{nw - length, nw, 0, 0});
  if (shift_existing) *shift_existing = shift;
  return RowTable(std::move(rows));
}

RowTable RowTable::filtered(std::span<const size_t> keep, size_t* trimmed) const {
  std::vector<RowState> rows;
  for (size_t i = 0; i < keep.size(); ++i) {
    FERRY_CHECK(keep[i] < rows_.size() && (i == 0 || keep[i] > keep[i - 1]), "kv",
                "filter: keep must be ascending row indices below ", rows_.size());
    rows.push_back(rows_[keep[i]]);
  }
  RowTable t(std::move(rows));
  const size_t trim = t.shared_padding();
  for (auto& r : t.rows_) {
    r.start -= trim;
    r.end -= trim;
  }
  if (trimmed) *trimmed = trim;
  return t;
}

RowTable RowTable::aligned(std::span<const size_t> left_pad) const {
  FERRY_CHECK(left_pad.size() == rows_.size(), "kv", "align: ", left_pad.size(), " paddings for ",
              rows_.size(), " rows");
  std::vector<RowState> rows = rows_;
  for (size_t b = 0; b < rows.size(); ++b) {
    const size_t len = rows[b].length();
    rows[b].start = left_pad[b];
    rows[b].end = left_pad[b] + len;
  }
  return RowTable(std::move(rows));
}

void RowTable::trim(size_t n) {
  for (auto& r : rows_) {
    r.end = r.end - std::min(n, r.length());
    r.prefill_end = std::min(r.prefill_end, r.length());
  }
}

void RowTable::rollback_to(std::span<const size_t> base_end, std::span<const size_t> keep) {
  FERRY_CHECK(base_end.size() == rows_.size() && keep.size() == rows_.size(), "kv",
              "rollback: ", base_end.size(), " ends and ", keep.size(), " keeps for ", rows_.size(),
              " rows");
  for (size_t b = 0; b < rows_.size(); ++b) rows_[b].end = base_end[b] + keep[b];
}

}  // namespace ferry::kv
