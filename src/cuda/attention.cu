// Attention of each query token over its own cache row's keys, reading
// dense (f32/f16/bf16) or affine K/V in place.
//
// Blocking. A block is (job, kv head, chunk of up to kG query heads of that
// kv head's GQA group), so K and V are read once for the whole group. Its
// kWarps warps split the job's keys (logical index n over seg[0] then
// seg[1]) in tiles of 32: warp w takes tiles w, w + kWarps, ... For a tile,
// lane l scores key 32 t + l for every head (its own K row, 16 elements at a
// time, q from shared memory), the warp updates an online softmax (max and
// sum by fixed butterflies), then walks the tile's keys in order with each
// lane accumulating p * V for its kE output dimensions (V rows read
// coalesced). Finally the warps' states are folded into warp 0's in the
// fixed order 1, 2, ..., kWarps - 1.
//
// Determinism: all of that depends only on the job's own keys and shape,
// never on the other jobs or the grid, so a query's output is bit-identical
// alone or in any batch.
//
// Bandwidth: K and V bytes are read once per (job, kv head); with few jobs
// (single-stream decode) a block takes one query head instead (kFewJobs),
// reading K/V once per head for n_heads blocks in parallel. Long contexts
// stay latency-bound there; a fixed split over keys with a second merge
// pass (needs a workspace) is the next step.
#include <algorithm>

#include "cuda/common_impl.cuh"
#include "cuda/cuda_internal.h"

namespace ferry::cuda {
namespace {

using namespace detail;
using Kind = kernels::KvFormat::Kind;

constexpr int kWarps = 8;

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
// Dynamic shared memory: q [kG][D], acc [kG][D], m [kG], l [kG] floats.
// Warp w runs tiles w, w + kWarps, ...; the warps' states are then folded
// into warp 0's in the fixed order 1, 2, ..., kWarps - 1.
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
  State<kG, kE> st;
  st.init();
  for (size_t t0 = size_t{32} * warp; t0 < keys.n; t0 += size_t{32} * kWarps)
    tile<kG, kE>(q_s, K, V, keys, t0, D, scale, lane, st);

  // Fold warps into the shared state in order 0, 1, ..., kWarps - 1.
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int h = 0; h < kG; ++h) {
        if (w == 0) {
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
  for (uint32_t i = threadIdx.x; i < gh * D; i += kWarps * 32) {
    const uint32_t h = i / D;
    const float inv = l_s[h] > 0.0f ? __fdiv_rn(1.0f, l_s[h]) : 0.0f;  // no keys: zeros
    job.out[size_t{h0 + h} * D + i % D] = __fmul_rn(acc_s[i], inv);
  }
}

// The same arithmetic per job with one warp per job: the warp runs the
// kWarps "virtual warps" of attention_kernel one after another (virtual
// warp w: tiles w, w + kWarps, ...) and folds each into its running state
// in the same order with the same operations, so every output is
// bit-identical to attention_kernel's. A block's warps take consecutive
// jobs, so a prompt chunk's queries (one cache row) share K/V through L1
// instead of each job reading them alone: the variant for steps of many
// jobs (prefill), where attention_kernel leaves warps idle on short rows.
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
  for (int w = 0; w < kWarps; ++w) {
    st.init();
    for (size_t t0 = size_t{32} * w; t0 < keys.n; t0 += size_t{32} * kWarps)
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

// Below this many jobs a block takes one query head, not the GQA group:
// a head's arithmetic is the same in every variant (the kG heads of a block
// are computed independently, each in the order above), so this only trades
// K/V re-reads for parallelism (single-stream decode: 32 blocks, not 8).
constexpr size_t kFewJobs = 32;

template <int kE>
void launch_e(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& s,
              uint32_t group_heads, bool per_warp, cudaStream_t stream) {
  if (group_heads == 1 || n_jobs < kFewJobs)
    return launch<1, kE>(jobs, n_jobs, s, group_heads, per_warp, stream);
  if (group_heads == 2) return launch<2, kE>(jobs, n_jobs, s, group_heads, per_warp, stream);
  if (group_heads <= 4) return launch<4, kE>(jobs, n_jobs, s, group_heads, per_warp, stream);
  return launch<8, kE>(jobs, n_jobs, s, group_heads, per_warp, stream);
}

}  // namespace

void attention_variant(const AttentionJob* jobs, size_t n_jobs,
                       const kernels::AttentionShape& shape, AttentionVariant variant,
                       cudaStream_t stream) {
  if (n_jobs == 0) return;
  const size_t D = shape.head_dim;
  FERRY_CHECK(D % 16 == 0 && D > 0 && D <= 256, "attention", "head_dim=", D);
  FERRY_CHECK(
      shape.n_kv_heads > 0 && shape.n_kv_heads <= 65535 && shape.n_heads % shape.n_kv_heads == 0,
      "attention", "n_heads=", shape.n_heads, " n_kv_heads=", shape.n_kv_heads);
  FERRY_CHECK(n_jobs <= 0x7fffffffu, "attention", n_jobs, " jobs");
  static_assert(sizeof(AttentionJob) % 4 == 0 && sizeof(AttentionJob) / 4 <= kWarps * 32);
  const uint32_t group_heads = static_cast<uint32_t>(shape.n_heads / shape.n_kv_heads);
  const bool per_warp = variant == AttentionVariant::PerWarp ||
                        (variant == AttentionVariant::Auto && n_jobs >= kManyJobs);
  if (D <= 64) return launch_e<2>(jobs, n_jobs, shape, group_heads, per_warp, stream);
  if (D <= 128) return launch_e<4>(jobs, n_jobs, shape, group_heads, per_warp, stream);
  return launch_e<8>(jobs, n_jobs, shape, group_heads, per_warp, stream);
}

void attention(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& shape,
               cudaStream_t stream) {
  attention_variant(jobs, n_jobs, shape, AttentionVariant::Auto, stream);
}

}  // namespace ferry::cuda
