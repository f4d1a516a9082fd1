// Attention of each query token over its own cache row's keys, reading
// dense (f32/f16/bf16) or affine K/V in place.
//
// Arithmetic of one query head (the determinism contract). The job's keys
// (logical index n over seg[0] then seg[1]) are cut into tiles of 32;
// "virtual warp" w (0 <= w < kVirtual = 128) takes tiles w, w + 128, ... For
// a tile, lane l scores key 32 t + l (its own K row, 16 elements at a time,
// FMA in element order, q from shared memory), the warp updates an online
// softmax (max and sum by fixed butterflies), then walks the tile's keys in
// order with each lane accumulating p * V for its kE output dimensions.
// The states of the virtual warps that have tiles are then folded in the
// fixed order 0, 1, 2, ... (fold_weights), and out = acc / l.
//
// Kernels (all with that arithmetic, so they give the same bits; the tests
// compare them):
// - attention_kernel: a block per (job, kv head, chunk of up to kG query
//   heads of that kv head's GQA group), so K and V are read once for the
//   group; its kWarps = 8 warps run the virtual warps in rounds of 8 (warp
//   r takes virtual warp 8 k + r in round k), folding each round into the
//   block's state in order. Decode steps of several jobs.
// - attention_warp_kernel: one warp per job running the virtual warps one
//   after another; a block's warps are consecutive jobs (a prompt chunk's
//   queries share K/V through L1). Steps of many jobs (prefill).
// - attention_split_kernel + attention_merge_kernel: one single-warp block
//   per (job, query head, virtual warp) writing its state to a workspace,
//   then one warp per (job, query head) folding them. Steps of few jobs
//   (single-stream decode), where the others leave most SMs idle and long
//   contexts latency-bound: one warp per tile up to 4k keys.
//
// Determinism: all of that depends only on the job's own keys and shape,
// never on the other jobs or the grid, so a query's output is bit-identical
// alone or in any batch, whichever kernel runs it.
#include <algorithm>

#include "cuda/common_impl.cuh"
#include "cuda/cuda_internal.h"

namespace ferry::cuda {
namespace {

using namespace detail;
using Kind = kernels::KvFormat::Kind;

constexpr int kWarps = 8;     // warps of attention_kernel's and attention_warp_kernel's blocks
constexpr int kVirtual = 128;  // virtual warps of the contract

// One side (K or V) of one kv head, with the plane pointers advanced to the head.
struct SideView {
  const uint8_t* p[3];
  size_t unit[3];
  Kind kind;
  int bits, group;
  __device__ void init(const kernels::KvSide& s, uint32_t h) {
    for (int i = 0; i < 3; ++i) {
      p[i] = s.plane[i] + h * s.head_stride[i];
      unit[i] = s.unit[i];
    }
    kind = s.format.kind;
    bits = s.format.bits;
    group = s.format.group;
  }
};

// Elements [i0, i0 + N) of token slot j, decoded exactly as
// kernels/kv_decode.h (affine: scale * code, then + bias, each rounded).
// i0 is a multiple of N, and N divides 16, so the run lies in one group.
template <int N>
__device__ __forceinline__ void decode_run(const SideView& s, size_t j, uint32_t i0, float* out) {
  const uint8_t* row = s.p[0] + j * s.unit[0];
  switch (s.kind) {
    case Kind::F32: {
      const auto b = load_bytes<4 * N>(row + 4 * i0);
#pragma unroll
      for (int i = 0; i < N; ++i) out[i] = __uint_as_float(b.w[i]);
      return;
    }
    case Kind::F16:
    case Kind::BF16: {
      const auto b = load_bytes<2 * N>(row + 2 * i0);
      const bool f16 = s.kind == Kind::F16;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const uint16_t h = static_cast<uint16_t>(b.field(i, 16));
        out[i] = f16 ? h2f(h) : bf2f(h);
      }
      return;
    }
    case Kind::Affine: {
      const uint32_t g = i0 / s.group;
      const float sc = h2f(static_cast<uint16_t>(ld_u16(s.p[1] + j * s.unit[1] + 2 * g)));
      const float bi = h2f(static_cast<uint16_t>(ld_u16(s.p[2] + j * s.unit[2] + 2 * g)));
      if (s.bits == 4) {
        const auto b = load_bytes<N / 2>(row + i0 / 2);
#pragma unroll
        for (int i = 0; i < N; ++i)
          out[i] = __fadd_rn(__fmul_rn(sc, static_cast<float>(b.field(i, 4))), bi);
      } else {
        const auto b = load_bytes<N>(row + i0);
#pragma unroll
        for (int i = 0; i < N; ++i)
          out[i] = __fadd_rn(__fmul_rn(sc, static_cast<float>(b.field(i, 8))), bi);
      }
      return;
    }
  }
}

// One query's running softmax state for kG heads as one warp holds it: m
// and l are warp-uniform, acc[h][e] is output dimension d0 + e of the lane.
template <int kG, int kE>
struct State {
  float m[kG], l[kG], acc[kG][kE];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.0f;
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[h][e] = 0.0f;
    }
  }
};

// The keys of one job as the kernels walk them (logical index n over
// seg[0] then seg[1]).
struct Keys {
  size_t b0, len0, b1, n;
  __device__ void init(const AttentionJob& job) {
    b0 = job.seg[0].begin;
    len0 = job.seg[0].end - job.seg[0].begin;
    b1 = job.seg[1].begin;
    n = len0 + (job.seg[1].end - job.seg[1].begin);
  }
  __device__ __forceinline__ size_t slot(size_t i) const { return i < len0 ? b0 + i : b1 + (i - len0); }
};
__device__ __forceinline__ size_t n_tiles(const Keys& k) {
  return (k.n + 31) / 32;
}

// A job's K and V sides at one kv head, and its keys.
struct JobView {
  SideView k, v;
  Keys keys;
  __device__ void init(const AttentionJob& job, uint32_t kvh) {
    k.init(job.k, kvh);
    v.init(job.v, kvh);
    keys.init(job);
  }
};

// One tile of 32 keys from t0 into a warp's state: lane l scores key
// t0 + l for every head (canonical chunks of 16, FMA in element order, q
// from shared memory q_s[kG][D]), the warp updates the online softmax (max
// and sum by fixed butterflies), then walks the tile's keys in order with
// each lane accumulating p * V for its kE dimensions.
template <int kG, int kE>
__device__ __forceinline__ void tile(const float* q_s, const SideView& K, const SideView& V,
                                     const Keys& keys, size_t t0, uint32_t D, float scale,
                                     int lane, State<kG, kE>& st) {
  const uint32_t d0 = lane * kE;
  const bool v_lane = d0 < D;
  const size_t n = t0 + lane;
  const bool valid = n < keys.n;
  float s[kG];
#pragma unroll
  for (int h = 0; h < kG; ++h) s[h] = 0.0f;
  if (valid) {
    const size_t j = keys.slot(n);
#pragma unroll 2
    for (uint32_t c = 0; c < D; c += 16) {
      float kv[16];
      decode_run<16>(K, j, c, kv);
#pragma unroll
      for (int h = 0; h < kG; ++h) {
        const float4* q4 = reinterpret_cast<const float4*>(q_s + h * D + c);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float4 qv = q4[e];
          s[h] = __fmaf_rn(qv.x, kv[4 * e], s[h]);
          s[h] = __fmaf_rn(qv.y, kv[4 * e + 1], s[h]);
          s[h] = __fmaf_rn(qv.z, kv[4 * e + 2], s[h]);
          s[h] = __fmaf_rn(qv.w, kv[4 * e + 3], s[h]);
        }
      }
    }
  }
  // Online softmax over the tile (every lane ends with the same m, l).
  float p[kG];
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    const float sc = valid ? __fmul_rn(s[h], scale) : -INFINITY;
    const float m_new = fmaxf(st.m[h], warp_max(sc));  // finite: the tile has a key
    const float corr = expf(st.m[h] - m_new);          // 0 on the first tile (m = -inf)
    p[h] = valid ? expf(sc - m_new) : 0.0f;
    st.l[h] = __fadd_rn(__fmul_rn(st.l[h], corr), warp_sum(p[h]));
    st.m[h] = m_new;
#pragma unroll
    for (int e = 0; e < kE; ++e) st.acc[h][e] = __fmul_rn(st.acc[h][e], corr);
  }
  // p * V over the tile's keys in order; lanes split the dimensions.
  const int nt = static_cast<int>(min(size_t{32}, keys.n - t0));
#pragma unroll 4
  for (int t = 0; t < nt; ++t) {
    float vv[kE];
    if (v_lane) decode_run<kE>(V, keys.slot(t0 + t), d0, vv);
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      const float pt = __shfl_sync(0xffffffffu, p[h], t);
      if (v_lane) {
#pragma unroll
        for (int e = 0; e < kE; ++e) st.acc[h][e] = __fmaf_rn(pt, vv[e], st.acc[h][e]);
      }
    }
  }
}

// q_s[h][D] = the job's query heads h0 .. h0 + gh - 1 (zeros past gh), by
// threads first, first + step, ...
template <int kG>
__device__ __forceinline__ void load_query(float* q_s, const AttentionJob& job, uint32_t h0,
                                           int gh, uint32_t D, uint32_t first, uint32_t step) {
  for (uint32_t i = first; i < kG * D; i += step) {
    const uint32_t h = i / D;
    q_s[i] = h < static_cast<uint32_t>(gh) ? job.q[size_t{h0 + h} * D + i % D] : 0.0f;
  }
}

// Folds a later warp's state into the running one (both empty: nothing to
// fold, and -inf - -inf would be NaN).
__device__ __forceinline__ void fold_weights(float m_run, float m_add, float& mm, float& a,
                                             float& b) {
  mm = fmaxf(m_run, m_add);
  a = mm == -INFINITY ? 1.0f : expf(m_run - mm);
  b = mm == -INFINITY ? 0.0f : expf(m_add - mm);
}

// kG: query heads per block (rounded-up power of two, <= 8); kE: output
// dimensions per lane (2, 4 or 8: the smallest with D <= 32 * kE).
// Dynamic shared memory: q [kG][D], acc [kG][D], m [kG], l [kG] floats
// (the folded state).
// Two blocks per SM: without the bound the kG = 4 variant took 169
// registers (one block, 8 warps per SM) and decode steps were latency-bound.
template <int kG, int kE>
__global__ void __launch_bounds__(kWarps * 32, 2)
    attention_kernel(const AttentionJob* jobs, uint32_t group_heads, uint32_t D, float scale) {
  extern __shared__ __align__(16) float smem[];
  float* q_s = smem;
  float* acc_s = q_s + kG * D;
  float* m_s = acc_s + kG * D;
  float* l_s = m_s + kG;
  // The job, copied once (AttentionJob has member initialisers, so it cannot
  // be a __shared__ variable itself).
  __shared__ __align__(16) unsigned char job_raw[sizeof(AttentionJob)];
  const AttentionJob& job = *reinterpret_cast<const AttentionJob*>(job_raw);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t kvh = blockIdx.y;
  const uint32_t h0 = kvh * group_heads + blockIdx.z * kG;  // first query head
  const int gh = static_cast<int>(min(static_cast<uint32_t>(kG), group_heads - blockIdx.z * kG));
  if (threadIdx.x < sizeof(AttentionJob) / 4)
    reinterpret_cast<uint32_t*>(job_raw)[threadIdx.x] =
        reinterpret_cast<const uint32_t*>(jobs + blockIdx.x)[threadIdx.x];
  __syncthreads();
  load_query<kG>(q_s, job, h0, gh, D, threadIdx.x, kWarps * 32);
  __syncthreads();

  JobView jv;
  jv.init(job, kvh);
  const SideView &K = jv.k, &V = jv.v;
  const Keys& keys = jv.keys;
  const uint32_t d0 = lane * kE;  // this lane's output dims [d0, d0 + kE)
  const bool v_lane = d0 < D;
  // The block's state starts empty (a job without keys writes zeros).
  for (uint32_t i = threadIdx.x; i < kG * D; i += kWarps * 32) acc_s[i] = 0.0f;
  if (threadIdx.x < kG) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  __syncthreads();
  const size_t n_virtual = min(n_tiles(keys), static_cast<size_t>(kVirtual));
  for (size_t round = 0; round * kWarps < n_virtual; ++round) {
    const size_t vw = round * kWarps + warp;
    State<kG, kE> st;
    st.init();
    for (size_t t0 = 32 * vw; t0 < keys.n; t0 += size_t{32} * kVirtual)
      tile<kG, kE>(q_s, K, V, keys, t0, D, scale, lane, st);
    // Fold this round's virtual warps into the shared state, in order.
    for (int w = 0; w < kWarps; ++w) {
      if (warp == w && vw < n_virtual) {
#pragma unroll
        for (int h = 0; h < kG; ++h) {
          if (vw == 0) {
            if (lane == 0) {
              m_s[h] = st.m[h];
              l_s[h] = st.l[h];
            }
            if (v_lane)
              for (int e = 0; e < kE; ++e) acc_s[h * D + d0 + e] = st.acc[h][e];
          } else {
            float mm, a, b;
            fold_weights(m_s[h], st.m[h], mm, a, b);
            if (v_lane)
              for (int e = 0; e < kE; ++e)
                acc_s[h * D + d0 + e] =
                    __fadd_rn(__fmul_rn(acc_s[h * D + d0 + e], a), __fmul_rn(st.acc[h][e], b));
            __syncwarp();  // every lane read m_s before lane 0 rewrites it
            if (lane == 0) {
              m_s[h] = mm;
              l_s[h] = __fadd_rn(__fmul_rn(l_s[h], a), __fmul_rn(st.l[h], b));
            }
          }
        }
      }
      __syncthreads();
    }
  }
  for (uint32_t i = threadIdx.x; i < gh * D; i += kWarps * 32) {
    const uint32_t h = i / D;
    const float inv = l_s[h] > 0.0f ? __fdiv_rn(1.0f, l_s[h]) : 0.0f;  // no keys: zeros
    job.out[size_t{h0 + h} * D + i % D] = __fmul_rn(acc_s[i], inv);
  }
}

// One warp per job: the virtual warps one after another, each folded into
// the running state in order. A block's warps take consecutive jobs, so a
// prompt chunk's queries (one cache row) share K/V through L1 instead of
// each job reading them alone: the variant for steps of many jobs
// (prefill), where attention_kernel leaves warps idle on short rows.
template <int kG, int kE>
__global__ void __launch_bounds__(kWarps * 32, 2)
    attention_warp_kernel(const AttentionJob* jobs, size_t n_jobs, uint32_t group_heads,
                          uint32_t D, float scale) {
  extern __shared__ __align__(16) float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t jid = size_t{blockIdx.x} * kWarps + warp;
  if (jid >= n_jobs) return;  // no block-wide barrier below
  float* q_s = smem + static_cast<size_t>(warp) * kG * D;
  const AttentionJob& job = jobs[jid];
  const uint32_t kvh = blockIdx.y;
  const uint32_t h0 = kvh * group_heads + blockIdx.z * kG;
  const int gh = static_cast<int>(min(static_cast<uint32_t>(kG), group_heads - blockIdx.z * kG));
  load_query<kG>(q_s, job, h0, gh, D, lane, 32);
  __syncwarp();
  JobView jv;
  jv.init(job, kvh);
  const SideView &K = jv.k, &V = jv.v;
  const Keys& keys = jv.keys;
  const uint32_t d0 = lane * kE;
  const bool v_lane = d0 < D;
  State<kG, kE> run, st;
  run.init();
  const size_t n_virtual = min(n_tiles(keys), static_cast<size_t>(kVirtual));
  for (size_t w = 0; w < n_virtual; ++w) {
    st.init();
    for (size_t t0 = 32 * w; t0 < keys.n; t0 += size_t{32} * kVirtual)
      tile<kG, kE>(q_s, K, V, keys, t0, D, scale, lane, st);
    if (w == 0) {
      run = st;
      continue;
    }
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      float mm, a, b;
      fold_weights(run.m[h], st.m[h], mm, a, b);
#pragma unroll
      for (int e = 0; e < kE; ++e)
        run.acc[h][e] = __fadd_rn(__fmul_rn(run.acc[h][e], a), __fmul_rn(st.acc[h][e], b));
      run.l[h] = __fadd_rn(__fmul_rn(run.l[h], a), __fmul_rn(st.l[h], b));
      run.m[h] = mm;
    }
  }
  if (!v_lane) return;
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    if (h >= gh) break;
    const float inv = run.l[h] > 0.0f ? __fdiv_rn(1.0f, run.l[h]) : 0.0f;
    float* o = job.out + size_t{h0 + h} * D + d0;
#pragma unroll
    for (int e = 0; e < kE; ++e) o[e] = __fmul_rn(run.acc[h][e], inv);
  }
}

// Workspace layout of the split variant: per (job, query head, virtual
// warp) one state [m, l, acc[D]].
__device__ __forceinline__ float* split_state(float* ws, size_t job, uint32_t head,
                                              uint32_t n_heads, uint32_t w, uint32_t D) {
  return ws + ((job * n_heads + head) * kVirtual + w) * (D + 2);
}

// One virtual warp of one (job, query head): block (job, kv head, query
// head in the group * kVirtual + w), one warp.
template <int kE>
__global__ void __launch_bounds__(32)
    attention_split_kernel(const AttentionJob* jobs, uint32_t group_heads, uint32_t D,
                           float scale, float* ws) {
  __shared__ __align__(16) float q_s[256];
  const int lane = static_cast<int>(threadIdx.x);
  const uint32_t w = blockIdx.z % kVirtual, kvh = blockIdx.y;
  const uint32_t h = kvh * group_heads + blockIdx.z / kVirtual;
  const AttentionJob& job = jobs[blockIdx.x];
  JobView jv;
  jv.init(job, kvh);
  if (32 * size_t{w} >= jv.keys.n) return;  // no tiles: not folded
  load_query<1>(q_s, job, h, 1, D, lane, 32);
  __syncwarp();
  State<1, kE> st;
  st.init();
  for (size_t t0 = size_t{32} * w; t0 < jv.keys.n; t0 += size_t{32} * kVirtual)
    tile<1, kE>(q_s, jv.k, jv.v, jv.keys, t0, D, scale, lane, st);
  float* o = split_state(ws, blockIdx.x, h, gridDim.y * group_heads, w, D);
  if (lane == 0) {
    o[0] = st.m[0];
    o[1] = st.l[0];
  }
  const uint32_t d0 = lane * kE;
  if (d0 < D)
    for (int e = 0; e < kE; ++e) o[2 + d0 + e] = st.acc[0][e];
}

// Folds a (job, query head)'s virtual warps in order: block (job, head).
template <int kE>
__global__ void __launch_bounds__(32)
    attention_merge_kernel(const AttentionJob* jobs, uint32_t D, const float* ws) {
  const int lane = static_cast<int>(threadIdx.x);
  const AttentionJob& job = jobs[blockIdx.x];
  Keys keys;
  keys.init(job);
  const uint32_t h = blockIdx.y, d0 = lane * kE;
  const bool v_lane = d0 < D;
  const size_t n_virtual = min(n_tiles(keys), static_cast<size_t>(kVirtual));
  State<1, kE> run;
  run.init();
  for (uint32_t w = 0; w < n_virtual; ++w) {
    const float* st = split_state(const_cast<float*>(ws), blockIdx.x, h, gridDim.y, w, D);
    float acc[kE];
    if (v_lane)
      for (int e = 0; e < kE; ++e) acc[e] = st[2 + d0 + e];
    if (w == 0) {
      run.m[0] = st[0];
      run.l[0] = st[1];
      if (v_lane)
        for (int e = 0; e < kE; ++e) run.acc[0][e] = acc[e];
      continue;
    }
    float mm, a, b;
    fold_weights(run.m[0], st[0], mm, a, b);
    if (v_lane)
      for (int e = 0; e < kE; ++e)
        run.acc[0][e] = __fadd_rn(__fmul_rn(run.acc[0][e], a), __fmul_rn(acc[e], b));
    run.l[0] = __fadd_rn(__fmul_rn(run.l[0], a), __fmul_rn(st[1], b));
    run.m[0] = mm;
  }
  if (!v_lane) return;
  const float inv = run.l[0] > 0.0f ? __fdiv_rn(1.0f, run.l[0]) : 0.0f;
  float* o = job.out + size_t{h} * D + d0;
  for (int e = 0; e < kE; ++e) o[e] = __fmul_rn(run.acc[0][e], inv);
}

template <int kE>
void launch_split(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& s,
                  uint32_t group_heads, float* ws, cudaStream_t stream) {
  const uint32_t D = static_cast<uint32_t>(s.head_dim);
  const dim3 grid(static_cast<unsigned>(n_jobs), static_cast<unsigned>(s.n_kv_heads),
                  group_heads * kVirtual);
  attention_split_kernel<kE><<<grid, 32, 0, stream>>>(jobs, group_heads, D, s.scale, ws);
  FERRY_CUDA_LAUNCHED("attention_split_kernel");
  const dim3 mgrid(static_cast<unsigned>(n_jobs), static_cast<unsigned>(s.n_heads));
  attention_merge_kernel<kE><<<mgrid, 32, 0, stream>>>(jobs, D, ws);
  FERRY_CUDA_LAUNCHED("attention_merge_kernel");
}

template <int kG, int kE>
void launch(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& s,
            uint32_t group_heads, bool per_warp, cudaStream_t stream) {
  const unsigned chunks = static_cast<unsigned>((group_heads + kG - 1) / kG);
  const unsigned kvh = static_cast<unsigned>(s.n_kv_heads);
  const uint32_t D = static_cast<uint32_t>(s.head_dim);
  if (per_warp) {
    const dim3 grid(static_cast<unsigned>((n_jobs + kWarps - 1) / kWarps), kvh, chunks);
    const size_t smem = size_t{kWarps} * kG * s.head_dim * sizeof(float);
    attention_warp_kernel<kG, kE>
        <<<grid, kWarps * 32, smem, stream>>>(jobs, n_jobs, group_heads, D, s.scale);
    FERRY_CUDA_LAUNCHED("attention_warp_kernel");
    return;
  }
  const dim3 grid(static_cast<unsigned>(n_jobs), kvh, chunks);
  const size_t smem = (2 * kG * s.head_dim + 2 * kG) * sizeof(float);
  attention_kernel<kG, kE><<<grid, kWarps * 32, smem, stream>>>(jobs, group_heads, D, s.scale);
  FERRY_CUDA_LAUNCHED("attention_kernel");
}

// Below kFewJobs jobs a block takes one query head, not the GQA group: a
// head's arithmetic is the same in every variant (the kG heads of a block
// are computed independently, each in the order above), so this only trades
// K/V re-reads for parallelism (the per-block variant at few jobs, when no
// workspace allows the split one).

template <int kE>
void launch_e(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& s,
              uint32_t group_heads, AttentionVariant variant, float* ws, cudaStream_t stream) {
  if (variant == AttentionVariant::Split) return launch_split<kE>(jobs, n_jobs, s, group_heads, ws, stream);
  const bool per_warp = variant == AttentionVariant::PerWarp;
  if (group_heads == 1 || n_jobs < kFewJobs)
    return launch<1, kE>(jobs, n_jobs, s, group_heads, per_warp, stream);
  if (group_heads == 2) return launch<2, kE>(jobs, n_jobs, s, group_heads, per_warp, stream);
  if (group_heads <= 4) return launch<4, kE>(jobs, n_jobs, s, group_heads, per_warp, stream);
  return launch<8, kE>(jobs, n_jobs, s, group_heads, per_warp, stream);
}

}  // namespace

size_t attention_workspace_floats(size_t n_jobs, const kernels::AttentionShape& shape) {
  return n_jobs < kFewJobs ? n_jobs * shape.n_heads * kVirtual * (shape.head_dim + 2) : 0;
}

void attention_variant(const AttentionJob* jobs, size_t n_jobs,
                       const kernels::AttentionShape& shape, AttentionVariant variant,
                       float* workspace, cudaStream_t stream) {
  if (n_jobs == 0) return;
  const size_t D = shape.head_dim;
  FERRY_CHECK(D % 16 == 0 && D > 0 && D <= 256, "attention", "head_dim=", D);
  FERRY_CHECK(
      shape.n_kv_heads > 0 && shape.n_kv_heads <= 65535 && shape.n_heads % shape.n_kv_heads == 0,
      "attention", "n_heads=", shape.n_heads, " n_kv_heads=", shape.n_kv_heads);
  FERRY_CHECK(n_jobs <= 0x7fffffffu, "attention", n_jobs, " jobs");
  static_assert(sizeof(AttentionJob) % 4 == 0 && sizeof(AttentionJob) / 4 <= kWarps * 32);
  const uint32_t group_heads = static_cast<uint32_t>(shape.n_heads / shape.n_kv_heads);
  if (variant == AttentionVariant::Auto)
    variant = n_jobs >= kManyJobs                         ? AttentionVariant::PerWarp
              : workspace && n_jobs < kFewJobs            ? AttentionVariant::Split
                                                          : AttentionVariant::PerBlock;
  FERRY_CHECK(variant != AttentionVariant::Split || workspace, "attention",
              "the split variant needs a workspace");
  FERRY_CHECK(group_heads * size_t{kVirtual} <= 65535, "attention", "too many heads per group: ",
              group_heads);
  if (D <= 64) return launch_e<2>(jobs, n_jobs, shape, group_heads, variant, workspace, stream);
  if (D <= 128) return launch_e<4>(jobs, n_jobs, shape, group_heads, variant, workspace, stream);
  return launch_e<8>(jobs, n_jobs, shape, group_heads, variant, workspace, stream);
}

void attention(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& shape,
               float* workspace, cudaStream_t stream) {
  attention_variant(jobs, n_jobs, shape, AttentionVariant::Auto, workspace, stream);
}

}  // namespace ferry::cuda
