// A token drawn per row of a step's logits on the device (cuda_ops.h,
// draw_logits) by model::draw_from_row's definition (model/draw.h): one
// block per row. Every sum is of integer weights (atomics in shared memory
// are exact in any order), so the token equals the host's bit for bit and
// never depends on the other rows; the order along which the uniform is
// placed is found by a radix search over the 32-bit order keys of the
// scaled logits, 8 bits a pass, instead of a sort of the vocabulary.
#include <climits>

#include "cuda/common_impl.cuh"
#include "cuda/cuda_ops.h"
#include "model/draw.h"

namespace ferry::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kRun = 8;  // loads in flight per thread in a pass

using model::draw_key;
using model::draw_mul;
using model::draw_sub;
using model::draw_weight;

// A prefix of the order by its last token (as draw.cpp's Bound).
struct Bound {
  uint32_t key;
  int32_t id;
  __device__ bool holds(uint32_t k, int32_t i) const { return k > key || (k == key && i <= id); }
};

// One token as the passes see it; key 0: a NaN logit, never in the draw.
struct Tok {
  uint32_t key;
  float d;
};

struct Ctx {
  const float* row;
  int V;
  float inv_temp, m;
  __device__ Tok tok(float l) const {
    if (isnan(l)) return Tok{0u, 0.0f};
    const float x = draw_mul(l, inv_temp);
    return Tok{draw_key(x), x == m ? 0.0f : draw_sub(x, m)};
  }
  // The d of every token whose key is k (equal keys, equal scaled logits).
  __device__ float d_of_key(uint32_t k) const {
    const uint32_t bits = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    const float x = __uint_as_float(bits);
    return x == m ? 0.0f : draw_sub(x, m);
  }
};

// Calls f(tok, i, ok) for this thread's indices i = tid, tid + kThreads,
// ... in increasing order, kRun loads in flight; every lane of a warp makes
// the same calls (ok: i is in the row), so f may use warp collectives.
template <class F>
__device__ __forceinline__ void each(const Ctx& c, F&& f) {
  const int lane = threadIdx.x % 32;
  for (int base = threadIdx.x - lane; base < c.V; base += kThreads * kRun) {
    float v[kRun];
#pragma unroll
    for (int k = 0; k < kRun; ++k) {
      const int i = base + lane + k * kThreads;
      v[k] = i < c.V ? c.row[i] : NAN;
    }
#pragma unroll
    for (int k = 0; k < kRun; ++k) {
      const int i = base + lane + k * kThreads;
      f(c.tok(v[k]), i, i < c.V);
    }
  }
}

// hist[bucket] += w for every lane of the warp that takes a token. Where
// the takers share one bucket (most of a row's first pass falls in a few
// buckets) the warp sums their weights by two 32-bit reductions (w <= 2^40:
// 22 low bits and the rest, each summing below 2^32) and one lane adds;
// otherwise each bucket's lanes sum by shuffles first. Never one atomic per
// lane: those would serialise on the hot buckets.
__device__ __forceinline__ void hist_add(unsigned long long* hist, bool take, unsigned bucket,
                                         unsigned long long w) {
  const unsigned takers = __ballot_sync(0xffffffffu, take);
  if (takers == 0) return;
  const int first = __ffs(takers) - 1, lane = static_cast<int>(threadIdx.x % 32);
  const unsigned b0 = __shfl_sync(0xffffffffu, bucket, first);
  if (__all_sync(0xffffffffu, !take || bucket == b0)) {
    const unsigned lo =
        __reduce_add_sync(0xffffffffu, take ? static_cast<unsigned>(w & 0x3fffffu) : 0u);
    const unsigned hi = __reduce_add_sync(0xffffffffu, take ? static_cast<unsigned>(w >> 22) : 0u);
    if (lane == first) atomicAdd(&hist[b0], (static_cast<unsigned long long>(hi) << 22) + lo);
    return;
  }
  const unsigned peers = __match_any_sync(0xffffffffu, take ? bucket : 256u);
  if (!take) return;
  unsigned long long sum = 0;
  for (unsigned m = peers; m; m &= m - 1) sum += __shfl_sync(peers, w, __ffs(m) - 1);
  if (lane == __ffs(peers) - 1) atomicAdd(&hist[bucket], sum);
}

struct Shared {
  unsigned long long hist[256];
  int min_id[256];  // the last pass: each bucket's lowest id
  unsigned long long sum;
  uint32_t prefix, mask;
  unsigned long long rem;
  int warp_count[kWarps];
  int found, seen;
  float warp_m[kWarps];
  float m;
  unsigned valid;
};

// The first token along the order, among those `in` holds, whose
// cumulative weight exceeds target(W), W the set's total weight (the first
// pass's histogram; target(W) < W).
template <class Target, class In, class Wt>
__device__ Bound block_search(const Ctx& c, Shared& s, Target target, In in, Wt wt) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) {
    s.prefix = 0;
    s.mask = 0;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) {
      s.hist[b] = 0;
      s.min_id[b] = INT_MAX;
    }
    __syncthreads();
    const uint32_t prefix = s.prefix, mask = s.mask;
    each(c, [&](Tok t, int i, bool ok) {
      const bool take = ok && t.key != 0 && (t.key & mask) == prefix && in(t, i);
      const unsigned bucket = (t.key >> shift) & 255u;
      hist_add(s.hist, take, bucket, take ? wt(t.d) : 0);
      if (shift == 0 && take) atomicMin(&s.min_id[bucket], i);
    });
    __syncthreads();
    if (tid == 0) {
      if (shift == 24) {
        unsigned long long total = 0;
        for (int b = 0; b < 256; ++b) total += s.hist[b];
        s.rem = target(total);
      }
      unsigned long long rem = s.rem;
      int b = 255;
      for (; b > 0 && s.hist[b] <= rem; --b) rem -= s.hist[b];
      s.rem = rem;
      s.prefix |= static_cast<uint32_t>(b) << shift;
      s.mask |= 255u << shift;
    }
    __syncthreads();
  }
  // The tied tokens (key == prefix) weigh the same: the answer is the
  // (rem / weight)-th of them by id, found by a block-wide ordered count.
  const uint32_t key = s.prefix;
  const uint64_t unit = wt(c.d_of_key(key));
  const int j = static_cast<int>(s.rem / (unit ? unit : 1));
  if (tid == 0) {
    s.found = j == 0 ? s.min_id[key & 255u] : INT_MAX;  // the first tie: no scan
    s.seen = 0;
  }
  __syncthreads();
  for (int base = 0; s.found == INT_MAX && base < c.V; base += kThreads) {
    const int i = base + tid;
    bool tie = false;
    if (i < c.V) {
      const Tok t = c.tok(c.row[i]);
      tie = t.key == key && in(t, i);
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, tie);
    if (lane == 0) s.warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = s.seen + __popc(ballot & ((1u << lane) - 1u));
    for (int w = 0; w < warp; ++w) before += s.warp_count[w];
    if (tie && before == j) s.found = i;
    __syncthreads();
    if (tid == 0)
      for (int w = 0; w < kWarps; ++w) s.seen += s.warp_count[w];
    __syncthreads();
  }
  const Bound r{key, s.found};
  __syncthreads();
  return r;
}

__global__ void draw_kernel(const float* __restrict__ logits, size_t vocab,
                            const DrawJob* __restrict__ jobs, model::TopLogit* __restrict__ out) {
  detail::dependency_wait();
  const DrawJob job = jobs[blockIdx.x];
  if (!job.active) return;
  __shared__ Shared s;
  const int tid = threadIdx.x, lane = tid % 32;
  Ctx c{logits + static_cast<size_t>(blockIdx.x) * vocab, static_cast<int>(vocab),
        job.spec.inv_temp, 0.0f};

  // The largest scaled logit (a max: any order gives the same value) and
  // the count of non-NaN logits.
  float m = -INFINITY;
  unsigned valid = 0;
  bool any = false;
  for (int i = tid; i < c.V; i += kThreads) {
    const float l = c.row[i];
    if (isnan(l)) continue;
    const float x = draw_mul(l, c.inv_temp);
    m = any ? fmaxf(m, x) : x;
    any = true;
    ++valid;
  }
  for (int off = 16; off > 0; off >>= 1) {
    m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, off));
    valid += __shfl_down_sync(0xffffffffu, valid, off);
  }
  if (lane == 0) {
    s.warp_m[tid / 32] = m;
    s.warp_count[tid / 32] = static_cast<int>(valid);
  }
  __syncthreads();
  if (tid == 0) {
    float mm = s.warp_m[0];
    unsigned vv = 0;
    for (int w = 0; w < kWarps; ++w) {
      mm = fmaxf(mm, s.warp_m[w]);
      vv += static_cast<unsigned>(s.warp_count[w]);
    }
    s.m = mm;
    s.valid = vv;
  }
  __syncthreads();
  c.m = s.m;
  valid = s.valid;
  __syncthreads();
  if (valid == 0) {
    if (tid == 0) out[blockIdx.x] = model::TopLogit{NAN, -1};
    return;
  }

  const model::DrawSpec& sp = job.spec;
  auto one = [](float) { return uint64_t{1}; };
  auto weight = [](float d) { return draw_weight(d); };
  auto in_all = [](Tok, int) { return true; };
  Bound k{0u, INT_MAX};
  if (sp.top_k > 0 && sp.top_k < valid) {
    const uint32_t top_k = sp.top_k;
    k = block_search(
        c, s, [top_k](uint64_t) { return uint64_t{top_k} - 1; }, in_all, one);
  }
  auto in_k = [k](Tok t, int i) { return k.holds(t.key, i); };
  Bound p = k;
  if (sp.top_p < 1.0f) {
    const float top_p = sp.top_p;
    auto reach = [top_p](uint64_t w_k) { return model::draw_top_p_target(top_p, w_k) - 1; };
    p = block_search(c, s, reach, in_k, weight);
  }
  const float floor_d = sp.log_min_p;
  auto in_s = [p, floor_d](Tok t, int i) { return p.holds(t.key, i) && t.d >= floor_d; };
  const double u = sp.u;
  auto place = [u](uint64_t w_s) { return model::draw_u_target(u, w_s); };
  const Bound t = block_search(c, s, place, in_s, weight);
  if (tid == 0) out[blockIdx.x] = model::TopLogit{c.row[t.id], t.id};
}

}  // namespace

void draw_logits(const float* logits, size_t n_rows, size_t vocab, const DrawJob* jobs,
                 model::TopLogit* out, cudaStream_t stream) {
  if (n_rows == 0) return;
  detail::launch("draw_logits", draw_kernel, static_cast<unsigned>(n_rows), kThreads, 0, stream,
                 logits, vocab, jobs, out);
}

}  // namespace ferry::cuda
