#include "model/draw.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/outputs.h"

namespace ferry::model {
namespace {

// The definition in model/draw.h taken literally: sort the whole row, then
// walk it. draw_from_row must give the same token without the sort.
TopLogit draw_by_sort(std::span<const float> row, const DrawSpec& s) {
  struct Tok {
    float x;
    int32_t id;
  };
  std::vector<Tok> t;
  for (size_t i = 0; i < row.size(); ++i)
    if (!std::isnan(row[i])) t.push_back({draw_mul(row[i], s.inv_temp), static_cast<int32_t>(i)});
  if (t.empty()) return {NAN, -1};
  std::sort(t.begin(), t.end(), [](const Tok& a, const Tok& b) {
    const uint32_t ka = draw_key(a.x), kb = draw_key(b.x);
    return ka != kb ? ka > kb : a.id < b.id;
  });
  const float m = t[0].x;
  auto d = [&](const Tok& k) { return k.x == m ? 0.0f : draw_sub(k.x, m); };
  size_t n = s.top_k > 0 ? std::min<size_t>(s.top_k, t.size()) : t.size();
  uint64_t w_k = 0;
  for (size_t i = 0; i < n; ++i) w_k += draw_weight(d(t[i]));
  if (s.top_p < 1.0f) {
    const uint64_t need = draw_top_p_target(s.top_p, w_k);
    uint64_t acc = 0;
    size_t m2 = 0;
    while (m2 < n && acc < need) acc += draw_weight(d(t[m2++]));
    n = m2;
  }
  while (n > 1 && !(d(t[n - 1]) >= s.log_min_p)) --n;
  uint64_t w_s = 0;
  for (size_t i = 0; i < n; ++i) w_s += draw_weight(d(t[i]));
  const uint64_t target = draw_u_target(s.u, w_s);
  uint64_t acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += draw_weight(d(t[i]));
    if (acc > target) return {row[static_cast<size_t>(t[i].id)], t[i].id};
  }
  return {NAN, -2};  // the walk must end inside S
}

TEST(DrawWeight, ExactAtTheMaximumAndZeroFarBelowIt) {
  EXPECT_EQ(draw_weight(0.0f), uint64_t{1} << kDrawBits);
  EXPECT_EQ(draw_weight(-INFINITY), 0u);
  EXPECT_EQ(draw_weight(-30.0f), 0u);
  // e(d) within 4 float ulps of exp(d) over the range that weighs.
  for (float d = kDrawCut; d <= 0.0f; d += 0.013f) {
    const double want = std::ldexp(std::exp(static_cast<double>(d)), kDrawBits);
    const double got = static_cast<double>(draw_weight(d));
    EXPECT_NEAR(got, want, want * 4.8e-7 + 1.0) << d;
  }
  // Along falling d the weights never rise at these steps.
  uint64_t last = draw_weight(0.0f);
  for (float d = -1e-3f; d > -20.0f; d *= 1.1f) {
    EXPECT_LE(draw_weight(d), last) << d;
    last = draw_weight(d);
  }
}

TEST(Draw, MatchesTheSortedWalkOnRowsWithTiesNanAndInfinities) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> val(-6.0f, 6.0f);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const float temps[] = {0.25f, 0.7f, 1.0f, 1.9f};
  const uint32_t ks[] = {0, 1, 3, 40, 5000};
  const float ps[] = {1.0f, 0.9f, 0.3f, 1e-4f};
  const float min_ps[] = {0.0f, 0.05f, 0.9f};
  int checked = 0;
  for (int rep = 0; rep < 6; ++rep) {
    const size_t V = rep == 0 ? 1 : (rep < 3 ? 257 : 3000 + rep);
    std::vector<float> row(V);
    for (float& x : row) x = rep % 2 ? std::round(val(gen) * 2) / 2 : val(gen);  // ties
    if (V > 10) {
      row[3] = NAN;
      row[5] = -INFINITY;
      row[7] = -0.0f;
      row[8] = 0.0f;
    }
    for (float t : temps)
      for (uint32_t k : ks)
        for (float p : ps)
          for (float mp : min_ps) {
            DrawSpec s;
            s.inv_temp = 1.0f / t;
            s.top_k = k;
            s.top_p = p;
            s.log_min_p = mp > 0 ? std::log(mp) : -INFINITY;
            s.u = uni(gen);
            const TopLogit a = draw_from_row(row, s), b = draw_by_sort(row, s);
            ASSERT_EQ(a.id, b.id) << "V " << V << " t " << t << " k " << k << " p " << p;
            ASSERT_GE(a.id, 0);
            EXPECT_EQ(std::memcmp(&a.value, &b.value, 4), 0);
            ++checked;
          }
  }
  EXPECT_EQ(checked, 6 * 4 * 5 * 4 * 3);
}

TEST(Draw, EdgesOfTheUniformPickTheFirstAndLastSurvivor) {
  // x = 2, 1, 1, 0 (ids 0, 2, 3, 1 along the order); top_k 3 keeps 0, 2, 3.
  const std::vector<float> row = {2.0f, 0.0f, 1.0f, 1.0f};
  DrawSpec s;
  s.top_k = 3;
  s.u = 0.0;
  EXPECT_EQ(draw_from_row(row, s).id, 0);
  s.u = std::nextafter(1.0, 0.0);
  EXPECT_EQ(draw_from_row(row, s).id, 3);  // the tie's later id is last
  // The mass of each: w(0) = 2^40, w(-1) for ids 2 and 3.
  const uint64_t w0 = draw_weight(0.0f), w1 = draw_weight(-1.0f);
  const double total = static_cast<double>(w0 + 2 * w1);
  s.u = (static_cast<double>(w0) + 0.5) / total;  // just past token 0's share
  EXPECT_EQ(draw_from_row(row, s).id, 2);
  s.u = (static_cast<double>(w0 + w1) + 0.5) / total;
  EXPECT_EQ(draw_from_row(row, s).id, 3);
  // top_p reached by token 0 alone (its share is 0.576 of the three).
  s.top_p = 0.5f;
  s.u = 0.999;
  EXPECT_EQ(draw_from_row(row, s).id, 0);
  // min-p 0.5 drops the tokens at e^-1 = 0.37 of the largest.
  s.top_p = 1.0f;
  s.log_min_p = std::log(0.5f);
  EXPECT_EQ(draw_from_row(row, s).id, 0);
  s.log_min_p = std::log(0.3f);
  EXPECT_EQ(draw_from_row(row, s).id, 3);
}

TEST(Draw, FrequenciesFollowTheSoftmax) {
  // 20,000 evenly spaced uniforms: each token's count within 2 of its
  // share (the draw is a step function of u with breakpoints at w / W).
  const std::vector<float> row = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f};
  DrawSpec s;
  s.inv_temp = 1.0f / 0.8f;
  const int n = 20000;
  std::vector<int> seen(row.size(), 0);
  for (int i = 0; i < n; ++i) {
    s.u = (i + 0.5) / n;
    ++seen[static_cast<size_t>(draw_from_row(row, s).id)];
  }
  double z = 0;
  for (float l : row) z += std::exp(l / 0.8);
  for (size_t i = 0; i < row.size(); ++i)
    EXPECT_NEAR(seen[i], n * std::exp(row[i] / 0.8) / z, 2.0) << i;
}

TEST(Draw, AllNanRowDrawsNothing) {
  const std::vector<float> row = {NAN, NAN};
  EXPECT_EQ(draw_from_row(row, DrawSpec{}).id, -1);
}

}  // namespace
}  // namespace ferry::model
