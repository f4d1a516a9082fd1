#include "model/draw.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "model/outputs.h"

namespace ferry::model {

namespace {

using Bound = DrawBound;

struct Row {
  std::vector<uint32_t> key;  // 0: NaN, not in the draw
  std::vector<uint64_t> w;
  std::vector<float> d;
  std::vector<uint32_t> cand;  // search's scratch
};

// The first token of `in` (a predicate on the index) along the order whose
// cumulative weight (wt(i) each) exceeds target(W), W the set's total
// weight (the first pass's histogram; target(W) < W). Four passes of an
// 8-bit digit of the key from the top, each over the tokens left by the
// last (the first pass takes the set, later ones a bucket of it), then the
// tied tokens (equal keys, so equal weights) by id: the candidates (in
// r.cand) stay in id order throughout.
template <class Target, class In, class Wt>
Bound search(Row& r, Target target, In in, Wt wt) {
  std::vector<uint32_t>& cand = r.cand;
  cand.clear();
  for (size_t i = 0; i < r.key.size(); ++i)
    if (r.key[i] != 0 && in(i)) cand.push_back(static_cast<uint32_t>(i));
  uint64_t rem = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint64_t hist[256] = {};
    for (uint32_t i : cand) hist[(r.key[i] >> shift) & 255u] += wt(i);
    if (shift == 24) {
      uint64_t total = 0;
      for (uint64_t h : hist) total += h;
      rem = target(total);
    }
    uint32_t b = 255;
    for (; b > 0 && hist[b] <= rem; --b) rem -= hist[b];
    size_t kept = 0;
    for (uint32_t i : cand)
      if (((r.key[i] >> shift) & 255u) == b) cand[kept++] = i;
    cand.resize(kept);
  }
  if (cand.empty()) return Bound{};  // unreachable when the total exceeds target
  const uint64_t j = rem / wt(cand[0]);
  return Bound{r.key[cand[0]], static_cast<int32_t>(cand[j < cand.size() ? j : cand.size() - 1])};
}

}  // namespace

TopLogit draw_from_row(std::span<const float> row, const DrawSpec& spec) {
  thread_local Row r;
  const size_t n = row.size();
  r.key.resize(n);
  r.w.resize(n);
  r.d.resize(n);
  float m = -INFINITY;
  size_t valid = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(row[i])) continue;
    const float x = draw_mul(row[i], spec.inv_temp);
    m = valid++ ? std::max(m, x) : x;
  }
  if (valid == 0) return TopLogit{NAN, -1};
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(row[i])) {
      r.key[i] = 0;
      continue;
    }
    const float x = draw_mul(row[i], spec.inv_temp);
    r.key[i] = draw_key(x);
    r.d[i] = x == m ? 0.0f : draw_sub(x, m);
    r.w[i] = draw_weight(r.d[i]);
  }
  auto one = [](size_t) { return uint64_t{1}; };
  auto weight = [&](size_t i) { return r.w[i]; };
  auto in_all = [](size_t) { return true; };

  Bound k;
  if (spec.top_k > 0 && spec.top_k < valid) {
    const uint64_t last = spec.top_k - 1;
    k = search(
        r, [last](uint64_t) { return last; }, in_all, one);
  }
  auto in_k = [&](size_t i) { return k.holds(r.key[i], static_cast<int32_t>(i)); };
  Bound p = k;
  if (spec.top_p < 1.0f) {
    auto reach = [&](uint64_t w_k) { return draw_top_p_target(spec.top_p, w_k) - 1; };
    p = search(r, reach, in_k, weight);
  }
  auto in_s = [&](size_t i) {
    return p.holds(r.key[i], static_cast<int32_t>(i)) && r.d[i] >= spec.log_min_p;
  };
  auto place = [&](uint64_t w_s) { return draw_u_target(spec.u, w_s); };
  const Bound t = search(r, place, in_s, weight);
  return TopLogit{row[static_cast<size_t>(t.id)], t.id};
}

void apply_draw_penalties(std::span<float> row, float repetition,
                          std::span<const DrawPenalty> penalties) {
  for (const DrawPenalty& p : penalties)
    if (p.token >= 0 && static_cast<size_t>(p.token) < row.size())
      row[static_cast<size_t>(p.token)] =
          draw_penalized(row[static_cast<size_t>(p.token)], repetition, p.sub);
}

}  // namespace ferry::model
