// Per-row reductions of a step's logits on the device (cuda_ops.h,
// select_logits): the largest logits by radix select, and the row's
// log-sum-exp, so that a greedy or top-k step reads back a few bytes per
// row instead of the vocabulary. One block per row; every reduction has a
// fixed order (strided per thread, then a fixed tree), so a row's result
// never depends on the other rows.
#include <cfloat>
#include <climits>

#include "cuda/common_impl.cuh"
#include "cuda/cuda_ops.h"
#include "model/draw.h"

namespace ferry::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kRun = 8;  // loads in flight per thread in the scans

// (value, id) with the larger value first, then the lower id; id < 0: none.
__device__ __forceinline__ bool better(float v, int id, float bv, int bid) {
  if (id < 0) return false;
  if (bid < 0) return true;
  return v > bv || (v == bv && id < bid);
}

// Calls f(row[i], i) for i = tid, tid + kThreads, ... < V in increasing
// order, loading kRun values at a time (one memory round trip per run).
template <class F>
__device__ __forceinline__ void scan_row(const float* row, int V, int tid, F&& f) {
  for (int base = tid; base < V; base += kThreads * kRun) {
    float v[kRun];
#pragma unroll
    for (int k = 0; k < kRun; ++k) {
      const int i = base + k * kThreads;
      v[k] = i < V ? row[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kRun; ++k)
      if (base + k * kThreads < V) f(v[k], base + k * kThreads);
  }
}

__global__ void select_kernel(const float* __restrict__ logits, size_t vocab,
                              const SelectJob* __restrict__ jobs, size_t stride,
                              model::TopLogit* __restrict__ top, uint32_t* __restrict__ count,
                              float* __restrict__ lse_max, double* __restrict__ lse_sum) {
  detail::dependency_wait();
  const SelectJob job = jobs[blockIdx.x];
  if (job.top_n == 0 && !job.lse) return;
  const float* row = logits + static_cast<size_t>(blockIdx.x) * vocab;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int V = static_cast<int>(vocab);
  model::TopLogit* out = top + static_cast<size_t>(blockIdx.x) * stride;

  __shared__ float s_val[kWarps];
  __shared__ int s_id[kWarps];
  __shared__ double s_sum[kThreads];
  __shared__ unsigned s_hist[256];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_want, s_remaining, s_above, s_eq_base;
  __shared__ int s_warp_eq[kWarps];
  __shared__ model::TopLogit s_cand[model::kMaxTopN];

  // 1. The maximum (ties: lowest id): the argmax, and the lse's shift.
  if (job.top_n == 1 || job.lse) {
    float bv = -INFINITY;
    int bid = -1;
    scan_row(row, V, tid, [&](float v, int i) {
      if (!isnan(v) && better(v, i, bv, bid)) {
        bv = v;
        bid = i;
      }
    });
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_down_sync(0xffffffffu, bv, off);
      const int oid = __shfl_down_sync(0xffffffffu, bid, off);
      if (better(ov, oid, bv, bid)) {
        bv = ov;
        bid = oid;
      }
    }
    if (lane == 0) {
      s_val[warp] = bv;
      s_id[warp] = bid;
    }
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < kWarps; ++w)
        if (better(s_val[w], s_id[w], bv, bid)) {
          bv = s_val[w];
          bid = s_id[w];
        }
      s_val[0] = bid < 0 ? -INFINITY : bv;
      s_id[0] = bid;
      if (job.top_n == 1) {
        count[blockIdx.x] = bid < 0 ? 0 : 1;
        if (bid >= 0) out[0] = model::TopLogit{bv == 0.0f ? 0.0f : bv, bid};
      }
    }
    __syncthreads();
  }

  // 2. sum of exp(l - max) in double: strided per thread, then a fixed tree.
  if (job.lse) {
    const double mx = s_val[0];
    double sum = 0.0;
    scan_row(row, V, tid, [&](float v, int) {
      if (!isnan(v)) sum += exp(static_cast<double>(v) - mx);
    });
    s_sum[tid] = sum;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half >>= 1) {
      if (tid < half) s_sum[tid] += s_sum[tid + half];
      __syncthreads();
    }
    if (tid == 0) {
      lse_max[blockIdx.x] = s_val[0];
      lse_sum[blockIdx.x] = s_sum[0];
    }
  }
  if (job.top_n <= 1) return;

  // 3. Radix select of the top_n-th largest key, 8 bits at a time from the
  //    top: after it, the keys above s_prefix are all taken and the first
  //    s_remaining keys equal to it (lowest ids) complete the set.
  if (tid == 0) {
    s_prefix = 0;
    s_mask = 0;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) s_hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix, mask = s_mask;
    for (int i = tid; i < V; i += kThreads) {
      const float v = row[i];
      if (isnan(v)) continue;
      const uint32_t k = model::draw_key(v);
      if ((k & mask) == prefix) atomicAdd(&s_hist[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      if (shift == 24) {
        unsigned total = 0;
        for (int b = 0; b < 256; ++b) total += s_hist[b];
        s_want = static_cast<int>(job.top_n < total ? job.top_n : total);
        s_remaining = s_want;
      }
      int b = 255;
      if (s_remaining > 0) {
        for (; b > 0; --b) {
          if (static_cast<int>(s_hist[b]) >= s_remaining) break;
          s_remaining -= static_cast<int>(s_hist[b]);
        }
      }
      s_prefix |= static_cast<uint32_t>(b) << shift;
      s_mask |= 255u << shift;
    }
    __syncthreads();
  }
  const uint32_t thr = s_prefix;
  const int want = s_want, remaining = s_remaining;
  if (tid == 0) {
    s_above = 0;
    s_eq_base = 0;
  }
  __syncthreads();

  // 4. Collect: keys above the threshold in any order (sorted below), equal
  //    keys in id order (a block-wide scan per chunk of the row).
  const int above = want - remaining;
  for (int base = 0; base < V; base += kThreads) {
    const int i = base + tid;
    const float v = i < V ? row[i] : NAN;
    const bool valid = !isnan(v);
    const uint32_t k = valid ? model::draw_key(v) : 0;
    if (valid && k > thr) s_cand[atomicAdd(&s_above, 1)] = model::TopLogit{v == 0.0f ? 0.0f : v, i};
    const bool eq = valid && k == thr;
    const unsigned ballot = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) s_warp_eq[warp] = __popc(ballot);
    __syncthreads();
    int before_me = s_eq_base + __popc(ballot & ((1u << lane) - 1u));
    for (int w = 0; w < warp; ++w) before_me += s_warp_eq[w];
    if (eq && before_me < remaining)
      s_cand[above + before_me] = model::TopLogit{v == 0.0f ? 0.0f : v, i};
    __syncthreads();
    if (tid == 0)
      for (int w = 0; w < kWarps; ++w) s_eq_base += s_warp_eq[w];
    __syncthreads();
    if (s_eq_base >= remaining && s_above == above) break;  // the set is complete
  }

  // 5. Sort the set by rank (value desc, then id asc): ids are distinct.
  for (int c = tid; c < want; c += kThreads) {
    const model::TopLogit me = s_cand[c];
    int rank = 0;
    for (int j = 0; j < want; ++j) {
      const model::TopLogit o = s_cand[j];
      rank += (o.value > me.value || (o.value == me.value && o.id < me.id)) ? 1 : 0;
    }
    out[rank] = me;
  }
  if (tid == 0) count[blockIdx.x] = static_cast<uint32_t>(want);
}

}  // namespace

void select_logits(const float* logits, size_t n_rows, size_t vocab, const SelectJob* jobs,
                   size_t stride, model::TopLogit* top, uint32_t* count, float* lse_max,
                   double* lse_sum, cudaStream_t stream) {
  if (n_rows == 0) return;
  detail::launch("select_logits", select_kernel, static_cast<unsigned>(n_rows), kThreads, 0, stream,
                 logits, vocab, jobs, stride, top, count, lse_max, lse_sum);
}

}  // namespace ferry::cuda
