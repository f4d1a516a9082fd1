// A token drawn per row of a step's logits on the device (cuda_ops.h,
// draw_logits) by model::draw_from_row's definition (model/draw.h): a
// cluster of kC blocks per row (kC = 1 where the rows fill the GPU; on
// Hopper up to 8 for a few rows, each block taking every kC-th chunk of the
// row and reading the others' histograms from their shared memory). Every
// sum is of integer weights (exact in any order) and the max is a max, so
// the token equals the host's bit for bit whatever kC and never depends on
// the other rows; the order along which the uniform is placed is found by a
// radix search over the 32-bit order keys of the scaled logits, 8 bits a
// pass, instead of a sort of the vocabulary. A row's penalties are applied
// to it in place first.
#include <climits>
#include <cstdlib>

#include "cuda/common_impl.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/knobs.h"
#include "model/draw.h"

namespace ferry::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

using model::draw_key;
using model::draw_mul;
using model::draw_sub;
using model::draw_weight;

using Bound = model::DrawBound;

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
  // The scaled logit of key k (-0 comes back as +0), and the d of every
  // token whose key is k (equal keys, equal scaled logits).
  __device__ static float x_of_key(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
  }
  __device__ float d_of_key(uint32_t k) const {
    const float x = x_of_key(k);
    return x == m ? 0.0f : draw_sub(x, m);
  }
};

// Calls f(tok, i, ok) for this block's share of the row, every index of the
// row once per cluster in some order (what f does must not depend on it:
// integer sums, maxima, minima). The row is read as float4 where it is
// 16-byte aligned (chunks of kThreads float4s, chunk q taken by block
// q mod kC; rank: this block's), kRun4 of them in flight per thread, then
// the rest one float at a time. Every lane of a warp makes the same calls
// (ok: i is in the row), so f may use warp collectives.
template <int kC, class F>
__device__ __forceinline__ void each(const Ctx& c, unsigned rank, F&& f) {
  constexpr int kRun4 = 2, kStride = kThreads * kC;
  const int lane = threadIdx.x % 32,
            first = static_cast<int>(rank) * kThreads + static_cast<int>(threadIdx.x) - lane;
  const int n4 = (reinterpret_cast<uintptr_t>(c.row) & 15u) == 0 ? c.V / 4 : 0;
  const float4* row4 = reinterpret_cast<const float4*>(c.row);
  for (int base = first; base < n4; base += kStride * kRun4) {
    float4 v[kRun4];
#pragma unroll
    for (int k = 0; k < kRun4; ++k) {
      const int j = base + lane + k * kStride;
      v[k] = j < n4 ? row4[j] : make_float4(NAN, NAN, NAN, NAN);
    }
#pragma unroll
    for (int k = 0; k < kRun4; ++k) {
      const int j = base + lane + k * kStride;
      const bool ok = j < n4;
      f(c.tok(v[k].x), 4 * j, ok);
      f(c.tok(v[k].y), 4 * j + 1, ok);
      f(c.tok(v[k].z), 4 * j + 2, ok);
      f(c.tok(v[k].w), 4 * j + 3, ok);
    }
  }
  for (int base = 4 * n4 + first; base < c.V; base += kStride) {
    const int i = base + lane;
    f(c.tok(i < c.V ? c.row[i] : NAN), i, i < c.V);
  }
}

// The cluster's barrier (release/acquire: shared-memory writes before it are
// seen by every block of the cluster after it) and another block's copy of
// a shared variable; with kC = 1, the block's barrier and its own copy.
template <int kC>
__device__ __forceinline__ void peers_sync() {
  if constexpr (kC == 1) {
    __syncthreads();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n"
        "barrier.cluster.wait.acquire.aligned;" ::
            : "memory");
#else
    __trap();  // clusters are launched on sm_90 only (draw_logits)
#endif
  }
}
template <int kC, class T>
__device__ __forceinline__ const T* peer(const T* p, unsigned rank) {
  if constexpr (kC == 1) {
    return p;
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint64_t q;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(q) : "l"(p), "r"(rank));
    return reinterpret_cast<const T*>(q);
#else
    return p;
#endif
  }
}
__device__ __forceinline__ unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
#else
  return 0;
#endif
}

// wh[bucket] += w for every lane of the warp that takes a token, wh this
// warp's own histogram (no other warp writes it: plain adds, no atomics;
// 64-bit shared atomics would be compare-and-swap loops contending on the
// few buckets a row's first pass falls in). The lanes of each bucket sum
// their weights by two 32-bit reductions (w <= 2^40: 22 low bits and the
// rest, each summing below 2^32) and one of them adds: one reduction pair
// per bucket present, not one step per lane (a shuffle loop per bucket
// made the first pass five times slower).
__device__ __forceinline__ void hist_add(unsigned long long* wh, bool take, unsigned bucket,
                                         unsigned long long w) {
  const unsigned takers = __ballot_sync(0xffffffffu, take);
  if (takers == 0) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int first = __ffs(takers) - 1;
  const unsigned b0 = __shfl_sync(0xffffffffu, bucket, first);
  const unsigned lo_w = take ? static_cast<unsigned>(w & 0x3fffffu) : 0u;
  const unsigned hi_w = take ? static_cast<unsigned>(w >> 22) : 0u;
  if (__all_sync(0xffffffffu, !take || bucket == b0)) {
    const unsigned lo = __reduce_add_sync(0xffffffffu, lo_w);
    const unsigned hi = __reduce_add_sync(0xffffffffu, hi_w);
    if (lane == first) wh[b0] += (static_cast<unsigned long long>(hi) << 22) + lo;
  } else {
    const unsigned peers = __match_any_sync(0xffffffffu, take ? bucket : 256u);
    if (take) {
      const unsigned lo = __reduce_add_sync(peers, lo_w);
      const unsigned hi = __reduce_add_sync(peers, hi_w);
      if (lane == __ffs(peers) - 1) wh[bucket] += (static_cast<unsigned long long>(hi) << 22) + lo;
    }
  }
  __syncwarp();  // the adds are seen by the warp's next call, whichever lane adds
}

// Warp 0 of the block: the bucket where a walk down from bucket 255 passes
// `rem` (the first b with tot[255] + ... + tot[b] > rem; 0 if none) and
// what is left of rem at it, as the loop
//   for (b = 255; b > 0 && tot[b] <= rem; --b) rem -= tot[b];
// would find it: lane l holds buckets 255 - 8l down to 248 - 8l, a scan
// over the lanes finds the one the walk stops in.
__device__ __forceinline__ void walk_down(const unsigned long long* tot, unsigned long long& rem,
                                          int& bucket) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  unsigned long long v[8], mine = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) mine += v[k] = tot[255 - 8 * lane - k];
  unsigned long long incl = mine;
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned long long o = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += o;
  }
  const unsigned past = __ballot_sync(0xffffffffu, incl > rem);
  const int stop = past ? __ffs(past) - 1 : 31;
  unsigned long long r = rem - __shfl_sync(0xffffffffu, incl - mine, stop);
  int b = 0;
  if (lane == stop) {
    b = 255 - 8 * lane - 7;  // none in the lane's first seven: its last (or 0)
#pragma unroll
    for (int k = 0; k < 7; ++k) {
      if (v[k] > r) {
        b = 255 - 8 * lane - k;
        break;
      }
      r -= v[k];
    }
  }
  bucket = __shfl_sync(0xffffffffu, b, stop);
  rem = __shfl_sync(0xffffffffu, r, stop);
}

struct Shared {
  // Pass p's block histogram in slot p % 2, read by the cluster after a
  // barrier: a slot is written again only after the next pass's barrier,
  // by when every block has read it.
  unsigned long long hist[2][256];
  int min_id[2][256];           // the last pass: each bucket's lowest id
  unsigned long long tot[256];  // the cluster's sums of hist
  int tot_min[256];
  uint32_t prefix, mask;
  unsigned long long rem;
  int warp_count[kWarps];
  int found, seen;
  float warp_m[kWarps];
  float part_m;  // this block's max and count, for the cluster
  unsigned part_valid;
  float m;
  unsigned valid;
};
// Each warp's histogram of the pass (dynamic shared memory: 64 KB), zeroed
// at the start and by each read.
constexpr size_t kWarpHistBytes = size_t{kWarps} * 256 * sizeof(unsigned long long);

// The first token along the order, among those `in` holds, whose
// cumulative weight exceeds target(W), W the set's total weight (the first
// pass's histogram; target(W) < W). Every block of the cluster computes the
// same answer from the same sums. `pass` counts the row's passes (the
// histogram slots alternate with it).
template <int kC, class Target, class In, class Wt>
__device__ Bound block_search(const Ctx& c, Shared& s, unsigned long long* warp_hist, unsigned rank,
                              int& pass, Target target, In in, Wt wt) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) {
    s.prefix = 0;
    s.mask = 0;
  }
  for (int shift = 24; shift >= 0; shift -= 8, ++pass) {
    const int slot = pass % 2;
    for (int b = tid; b < 256; b += kThreads) s.min_id[slot][b] = INT_MAX;
    __syncthreads();
    const uint32_t prefix = s.prefix, mask = s.mask;
    unsigned long long* wh = warp_hist + static_cast<size_t>(warp) * 256;
    each<kC>(c, rank, [&](Tok t, int i, bool ok) {
      const bool take = ok && t.key != 0 && (t.key & mask) == prefix && in(t, i);
      const unsigned bucket = (t.key >> shift) & 255u;
      hist_add(wh, take, bucket, take ? wt(t.d) : 0);
      if (shift == 0 && take) atomicMin(&s.min_id[slot][bucket], i);
    });
    __syncthreads();
    for (int b = tid; b < 256; b += kThreads) {
      unsigned long long sum = 0;
      for (int w = 0; w < kWarps; ++w) {
        sum += warp_hist[w * 256 + b];
        warp_hist[w * 256 + b] = 0;
      }
      s.hist[slot][b] = sum;
    }
    peers_sync<kC>();
    for (int b = tid; b < 256; b += kThreads) {
      unsigned long long sum = 0;
      int lo = INT_MAX;
      for (unsigned r = 0; r < kC; ++r) {
        sum += peer<kC>(&s.hist[slot][b], r)[0];
        lo = min(lo, peer<kC>(&s.min_id[slot][b], r)[0]);
      }
      s.tot[b] = sum;
      s.tot_min[b] = lo;
    }
    __syncthreads();
    if (warp == 0) {
      unsigned long long rem = s.rem;
      if (shift == 24) {
        unsigned long long total = 0;
        for (int b = lane; b < 256; b += 32) total += s.tot[b];
        for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
        rem = target(total);
      }
      int b = 0;
      walk_down(s.tot, rem, b);
      if (lane == 0) {
        s.rem = rem;
        s.prefix |= static_cast<uint32_t>(b) << shift;
        s.mask |= 255u << shift;
      }
    }
    __syncthreads();
  }
  // The tied tokens (key == prefix) weigh the same: the answer is the
  // (rem / weight)-th of them by id: the lowest id of the last pass for the
  // first (the usual case: ties are rare), else a block-wide ordered count
  // over the whole row (each block of the cluster the same).
  const uint32_t key = s.prefix;
  const uint64_t unit = wt(c.d_of_key(key));
  const int j = static_cast<int>(s.rem / (unit ? unit : 1));
  if (tid == 0) {
    s.found = j == 0 ? s.tot_min[key & 255u] : INT_MAX;
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

template <int kC>
__global__ void __launch_bounds__(kThreads)
    draw_kernel(float* __restrict__ logits, size_t vocab, const DrawJob* __restrict__ jobs,
                const model::DrawPenalty* __restrict__ pens, float* __restrict__ raw,
                model::TopLogit* __restrict__ out) {
  detail::dependency_wait();
  const unsigned row = blockIdx.x / kC, rank = kC == 1 ? 0u : cluster_rank();
  const DrawJob job = jobs[row];
  if (!job.active) return;  // (the whole cluster)
  __shared__ Shared s;
  extern __shared__ unsigned long long warp_hist[];  // kWarpHistBytes
  const int tid = threadIdx.x, lane = tid % 32;
  for (int b = tid; b < kWarps * 256; b += kThreads) warp_hist[b] = 0;
  float* const row_logits = logits + static_cast<size_t>(row) * vocab;
  Ctx c{row_logits, static_cast<int>(vocab), job.spec.inv_temp, 0.0f};

  // Penalties, in place, by the cluster's first block (each token once).
  const model::DrawPenalty* const pen = pens + job.pen_begin;
  if (job.pen_count > 0) {
    if (rank == 0)
      for (uint32_t j = tid; j < job.pen_count; j += kThreads) {
        const int32_t token = pen[j].token;
        if (token < 0 || static_cast<size_t>(token) >= vocab) continue;
        const float l = row_logits[token];
        raw[job.pen_begin + j] = l;
        row_logits[token] = model::draw_penalized(l, job.spec.repetition, pen[j].sub);
      }
    __threadfence();
    peers_sync<kC>();
  }

  // The largest scaled logit (a max: any order gives the same value) and
  // the count of non-NaN logits, over the block's share, then the cluster.
  float m = -INFINITY;
  unsigned valid = 0;
  each<kC>(c, rank, [&](Tok t, int i, bool ok) {
    if (!ok || t.key == 0) return;
    m = fmaxf(m, Ctx::x_of_key(t.key));
    ++valid;
  });
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
    float mm = -INFINITY;
    unsigned vv = 0;
    for (int w = 0; w < kWarps; ++w) {
      mm = fmaxf(mm, s.warp_m[w]);
      vv += static_cast<unsigned>(s.warp_count[w]);
    }
    s.part_m = mm;
    s.part_valid = vv;
  }
  peers_sync<kC>();
  if (tid == 0) {
    float mm = -INFINITY;
    unsigned vv = 0;
    for (unsigned r = 0; r < kC; ++r) {
      mm = fmaxf(mm, peer<kC>(&s.part_m, r)[0]);
      vv += peer<kC>(&s.part_valid, r)[0];
    }
    s.m = mm;
    s.valid = vv;
  }
  __syncthreads();
  c.m = s.m;
  valid = s.valid;
  int pass = 0;
  Bound t{0u, -1};
  if (valid > 0) {
    const model::DrawSpec& sp = job.spec;
    auto one = [](float) { return uint64_t{1}; };
    auto weight = [](float d) { return draw_weight(d); };
    auto in_all = [](Tok, int) { return true; };
    Bound k{0u, INT_MAX};
    if (sp.top_k > 0 && sp.top_k < valid) {
      const uint32_t top_k = sp.top_k;
      auto last = [top_k](uint64_t) { return uint64_t{top_k} - 1; };
      k = block_search<kC>(c, s, warp_hist, rank, pass, last, in_all, one);
    }
    auto in_k = [k](Tok t, int i) { return k.holds(t.key, i); };
    Bound p = k;
    if (sp.top_p < 1.0f) {
      const float top_p = sp.top_p;
      auto reach = [top_p](uint64_t w_k) { return model::draw_top_p_target(top_p, w_k) - 1; };
      p = block_search<kC>(c, s, warp_hist, rank, pass, reach, in_k, weight);
    }
    const float floor_d = sp.log_min_p;
    auto in_s = [p, floor_d](Tok t, int i) { return p.holds(t.key, i) && t.d >= floor_d; };
    const double u = sp.u;
    auto place = [u](uint64_t w_s) { return model::draw_u_target(u, w_s); };
    t = block_search<kC>(c, s, warp_hist, rank, pass, place, in_s, weight);
  }
  if (rank == 0) {
    // The drawn token's raw logit: its penalised one unless it is listed.
    if (tid == 0)
      out[row] = t.id >= 0 ? model::TopLogit{c.row[t.id], t.id} : model::TopLogit{NAN, -1};
    __syncthreads();
    for (uint32_t j = tid; t.id >= 0 && j < job.pen_count; j += kThreads)
      if (pen[j].token == t.id) out[row].value = raw[job.pen_begin + j];
  }
  peers_sync<kC>();  // no block leaves while another may read its shared memory
}

}  // namespace

void draw_logits(float* logits, size_t n_rows, size_t vocab, const DrawJob* jobs,
                 const model::DrawPenalty* penalties, float* raw, model::TopLogit* out,
                 cudaStream_t stream) {
  if (n_rows == 0) return;
  // Blocks per row: as many as keep rows x kC within the SMs (a single
  // row's passes spread over 8 SMs), on GPUs with clusters.
  // FERRY_CUDA_DRAW_CLUSTER=1, 2, 4 or 8 fixes it (a measuring knob).
  int dev = 0, sms = 0, major = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&dev));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  const size_t forced = knob_size("FERRY_CUDA_DRAW_CLUSTER", 0);
  int kc = 1;
  if (major >= 9) {
    if (forced == 1 || forced == 2 || forced == 4 || forced == 8) {
      kc = static_cast<int>(forced);
    } else {
      while (kc < 8 && n_rows * static_cast<size_t>(kc) * 2 <= static_cast<size_t>(sms)) kc *= 2;
    }
  }
  const unsigned grid = static_cast<unsigned>(n_rows) * static_cast<unsigned>(kc);
  auto go = [&](auto kernel) {
    // (on every call: the attribute is the current device's)
    FERRY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kWarpHistBytes)));
    detail::launch_cluster("draw_logits", kernel, grid, static_cast<unsigned>(kc), kThreads,
                           kWarpHistBytes, stream, logits, vocab, jobs, penalties, raw, out);
  };
  switch (kc) {
    case 8:
      go(draw_kernel<8>);
      break;
    case 4:
      go(draw_kernel<4>);
      break;
    case 2:
      go(draw_kernel<2>);
      break;
    default:
      go(draw_kernel<1>);
  }
}

}  // namespace ferry::cuda
