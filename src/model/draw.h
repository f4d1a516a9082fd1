// Drawing a token from a row of logits: temperature, top-k, top-p and
// min-p over the whole vocabulary, defined in integers so that a GPU block
// and the host give the same token for the same logits and uniform draw.
//
// The definition (one row; NaN logits never take part):
//   x_i = l_i * inv_temp (float), m = max x_i, d_i = x_i - m (0 where x_i = m)
//   w_i = floor(e(d_i) * 2^kDrawBits), e a fixed float exp (draw_weight below),
//         so w_max = 2^kDrawBits and tokens with e(d) < 2^-kDrawBits weigh 0
//   the order: x descending, then id ascending; "prefix" means a prefix of it
//   K = the first top_k tokens (all when top_k is 0 or covers the row)
//   top-p: P = the shortest prefix of K whose weight reaches
//          ceil(top_p * W(K)) (all of K when top_p is 1)
//   min-p: tokens of K with d_i >= log_min_p (a prefix: d falls along it)
//   S = P ∩ min-p set; t = min(floor(u * W(S)), W(S) - 1)
//   the token: the first of S whose cumulative weight along the order
//   exceeds t.
// Sums of weights are integers, so they do not depend on the order of
// addition: a block of threads can take them in any order and find the
// token by a radix search over the order keys instead of a sort. Against
// the float definition (a softmax normalised in double), the weights
// round each probability down to a multiple of 2^-kDrawBits of the largest
// one: a token's probability moves by at most that much.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>

#if defined(__CUDACC__)
#define FERRY_DRAW_HD __host__ __device__ __forceinline__
#else
#define FERRY_DRAW_HD inline
#endif

namespace ferry::model {

struct TopLogit;  // model/outputs.h

// What a row's draw needs besides its logits. inv_temp finite and > 0 (the
// caller's 1 / temperature, rounded to float); top_k 0: off; top_p in (0, 1];
// log_min_p: log(min_p) as float, -inf when min-p is off; u in [0, 1);
// repetition: the repetition penalty of the row's DrawPenalty tokens.
struct DrawSpec {
  float inv_temp = 1.0f;
  uint32_t top_k = 0;
  float top_p = 1.0f;
  float log_min_p = -INFINITY;
  double u = 0.0;
  float repetition = 1.0f;
};

// A token whose logit is penalised before the draw: l becomes
// (l > 0 ? l / repetition : l * repetition) - sub (draw_penalized), as
// HF's repetition penalty, then OpenAI's frequency and presence penalties
// folded into sub (frequency * count + presence for a generated token, 0
// for a prompt-only one). A row lists each token at most once; tokens
// outside the vocabulary are skipped.
struct DrawPenalty {
  int32_t token;
  float sub;
};

inline constexpr int kDrawBits = 40;
// e(d) < 2^-40 for every d below this: such tokens weigh 0.
inline constexpr float kDrawCut = -27.8f;

// Keys in the order of the floats (larger float, larger key), -0 as +0.
FERRY_DRAW_HD uint32_t draw_key(float f) {
#if defined(__CUDA_ARCH__)
  uint32_t u = __float_as_uint(f);
#else
  uint32_t u;
  static_assert(sizeof(u) == sizeof(f));
  std::memcpy(&u, &f, sizeof(u));
#endif
  if (f == 0.0f) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A prefix of the order (x descending, id ascending) by its last token: a
// token is in it when its key is larger, or equal with an id no larger.
// Key 0 is no float's: the default holds every token.
struct DrawBound {
  uint32_t key = 0;
  int32_t id = INT32_MAX;
  FERRY_DRAW_HD bool holds(uint32_t k, int32_t i) const { return k > key || (k == key && i <= id); }
};

// Round-to-nearest products, sums and differences that no compiler may
// fuse (nvcc contracts a * b + c into an fma unless told; the host build
// has -ffp-contract=off).
FERRY_DRAW_HD float draw_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FERRY_DRAW_HD float draw_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FERRY_DRAW_HD float draw_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
FERRY_DRAW_HD float draw_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// A penalised logit (DrawPenalty): repetition 1 and sub 0 leave l as it is.
FERRY_DRAW_HD float draw_penalized(float l, float repetition, float sub) {
  return draw_sub(l > 0.0f ? draw_div(l, repetition) : draw_mul(l, repetition), sub);
}

// The weight of d = x - m <= 0: floor(e(d) * 2^kDrawBits) with e a float exp
// made of correctly rounded products and sums only (no fma: a host without
// one would emulate it), so host and device agree bit for bit: k = d / ln 2
// rounded to nearest even by the 1.5 * 2^23 trick, r = d - k ln 2 in two
// parts (k * the high part is exact), a degree-6 Taylor polynomial of e^r,
// then 2^k. Its error against exp is a few float ulps, far below the
// weights' own rounding for all but the largest.
FERRY_DRAW_HD uint64_t draw_weight(float d) {
  if (!(d >= kDrawCut)) return 0;        // also NaN (never passed) and -inf
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float k = draw_sub(draw_add(draw_mul(d, 1.44269504f), kRound), kRound);
  float r = draw_sub(d, draw_mul(k, 0.693145752f));  // ln 2 = 0.693145752 + 1.42860677e-6
  r = draw_sub(r, draw_mul(k, 1.42860677e-6f));
  float p = 1.38888889e-3f;
  p = draw_add(draw_mul(p, r), 8.33333377e-3f);
  p = draw_add(draw_mul(p, r), 4.16666679e-2f);
  p = draw_add(draw_mul(p, r), 1.66666672e-1f);
  p = draw_add(draw_mul(p, r), 0.5f);
  p = draw_add(draw_mul(p, r), 1.0f);
  p = draw_add(draw_mul(p, r), 1.0f);
  // p * 2^(kDrawBits + k) is exact in double (k >= -41; p > 0), and the
  // conversion truncates: the floor.
  const int e = kDrawBits + static_cast<int>(k);
  const uint64_t scale_bits = static_cast<uint64_t>(1023 + e) << 52;
  double scale;
#if defined(__CUDA_ARCH__)
  scale = __longlong_as_double(static_cast<long long>(scale_bits));
#else
  std::memcpy(&scale, &scale_bits, sizeof(scale));
#endif
  return static_cast<uint64_t>(static_cast<double>(p) * scale);
}

// The draw's targets: top-p's weight to reach and the uniform's place in S.
FERRY_DRAW_HD uint64_t draw_top_p_target(float top_p, uint64_t w_k) {
  const double t = ceil(static_cast<double>(top_p) * static_cast<double>(w_k));
  const uint64_t n = static_cast<uint64_t>(t);
  return n < 1 ? 1 : (n > w_k ? w_k : n);
}
FERRY_DRAW_HD uint64_t draw_u_target(double u, uint64_t w_s) {
  const uint64_t t = static_cast<uint64_t>(u * static_cast<double>(w_s));
  return t < w_s ? t : w_s - 1;
}

// The token the definition above draws from `row` (its id and raw logit);
// id -1 when every logit is NaN. O(vocabulary): a radix search, no sort.
// Penalties are the caller's to apply first (apply_draw_penalties).
TopLogit draw_from_row(std::span<const float> row, const DrawSpec& spec);

// row[p.token] = draw_penalized(row[p.token], repetition, p.sub) for each
// penalty whose token is in the row.
void apply_draw_penalties(std::span<float> row, float repetition,
                          std::span<const DrawPenalty> penalties);

}  // namespace ferry::model
