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
// Affine V is applied in factored form: for key t, p * V adds
// (p * scale) * code to each of the lane's acc and p * bias to its bias sum
// vb (a lane's kE dimensions lie in one group), vb is rescaled with acc by
// the online softmax, and acc + vb closes each virtual warp's state (two
// operations per element instead of three; affine K is decoded as
// scale * code + bias, each rounded, then FMA'd with q: one fma does the
// first two, as scale * code is exact, and the scale and bias are loaded
// once per group).
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
//   then one block per (job, query head, 32 output dimensions) folding
//   them (the states copied to shared memory at once, a thread per
//   dimension running the fold chain). Steps of few jobs
//   (single-stream decode), where the others leave most SMs idle and long
//   contexts latency-bound: one warp per tile up to 4k keys.
//
// Determinism: all of that depends only on the job's own keys and shape,
// never on the other jobs or the grid, so a query's output is bit-identical
// alone or in any batch, whichever kernel runs it.
//
// Calls whose K and V are both f16, both bf16 or both affine (same bits,
// group 32 or 64) at head_dim 64 or 128 run a second arithmetic on tensor
// cores instead, in three kernels of the same shapes ("tensor-core tiles"
// below); the choice follows the cache's formats, never the batch.
#include <algorithm>

#include <cuda_bf16.h>

#include "cuda/common_impl.cuh"
#include "cuda/cuda_internal.h"
#include "cuda/knobs.h"
#include "cuda/ptx_impl.cuh"

namespace ferry::cuda {
namespace {

using namespace detail;
using Kind = kernels::KvFormat::Kind;

constexpr int kWarps = 8;       // warps of attention_warp_kernel's blocks
constexpr int kBlockWarps = 4;  // warps of attention_kernel's blocks
constexpr int kVirtual = 128;   // virtual warps of the contract

// One side (K or V) of one kv head, with the plane pointers advanced to the head.
struct SideView {
  const uint8_t* p[3];
  size_t unit[3];
  Kind kind;
  int bits, group_shift;  // affine: log2 of the group
  __device__ void init(const kernels::KvSide& s, uint32_t h) {
    for (int i = 0; i < 3; ++i) {
      p[i] = s.plane[i] + h * s.head_stride[i];
      unit[i] = s.unit[i];
    }
    kind = s.format.kind;
    bits = s.format.bits;
    group_shift = s.format.group ? __ffs(s.format.group) - 1 : 0;
  }
};

// float(c) for a code c < 2^23, exactly, without the integer-to-float
// conversion (a quarter- or sixteenth-rate instruction that bound the
// affine decode): c in the low mantissa bits of 2^23, then 2^23 subtracted.
__device__ __forceinline__ float code_to_float(uint32_t c) {
  return __fsub_rn(__uint_as_float(0x4b000000u | c), 8388608.0f);
}

// Elements [i0, i0 + N) of an affine row whose codes start at `codes`,
// with their group's scale and bias: one fma each where the contract says
// scale * code, rounded, then + bias, rounded. The product of an f16 scale
// (11 significant bits) and a code below 256 (8 bits) is exact in float,
// so rounding it changes nothing and the fma gives the same bits.
template <int N>
__device__ __forceinline__ void affine_run(const uint8_t* codes, uint32_t i0, int bits, float sc,
                                           float bi, float* out) {
  if (bits == 4) {
    const auto b = load_bytes<N / 2>(codes + i0 / 2);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __fmaf_rn(sc, code_to_float(b.field(i, 4)), bi);
  } else {
    const auto b = load_bytes<N>(codes + i0);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __fmaf_rn(sc, code_to_float(b.field(i, 8)), bi);
  }
}

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
      if (s.kind == Kind::F16) {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = h2f(static_cast<uint16_t>(b.field(i, 16)));
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = bf2f(static_cast<uint16_t>(b.field(i, 16)));
      }
      return;
    }
    case Kind::Affine: {
      const uint32_t g = i0 >> s.group_shift;
      const float sc = h2f(static_cast<uint16_t>(ld_u16(s.p[1] + j * s.unit[1] + 2 * g)));
      const float bi = h2f(static_cast<uint16_t>(ld_u16(s.p[2] + j * s.unit[2] + 2 * g)));
      return affine_run<N>(row, i0, s.bits, sc, bi, out);
    }
  }
}

// The codes of elements [i0, i0 + N) of token slot j of an affine side, as
// exact floats (no scale, no bias), and their group's scale and bias.
template <int N>
__device__ __forceinline__ void affine_codes(const SideView& s, size_t j, uint32_t i0, float* out,
                                             float& sc, float& bi) {
  const uint8_t* row = s.p[0] + j * s.unit[0];
  const uint32_t g = i0 >> s.group_shift;
  sc = h2f(static_cast<uint16_t>(ld_u16(s.p[1] + j * s.unit[1] + 2 * g)));
  bi = h2f(static_cast<uint16_t>(ld_u16(s.p[2] + j * s.unit[2] + 2 * g)));
  if (s.bits == 4) {
    const auto b = load_bytes<N / 2>(row + i0 / 2);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = code_to_float(b.field(i, 4));
  } else {
    const auto b = load_bytes<N>(row + i0);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = code_to_float(b.field(i, 8));
  }
}

// One query's running softmax state for kG heads as one warp holds it: m
// and l are warp-uniform, acc[h][e] is output dimension d0 + e of the lane.
// With affine V, acc holds sum p * scale * code and vb sum p * bias (the
// lane's dimensions share one group), added by finish().
// kAffine: the kernels compiled for calls with affine K or V (they carry
// vb); dense calls compile without it (fewer registers).
template <int kG, int kE, bool kAffine>
struct State {
  float m[kG], l[kG], acc[kG][kE], vb[kAffine ? kG : 1];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.0f;
      if constexpr (kAffine) vb[h] = 0.0f;
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[h][e] = 0.0f;
    }
  }
  // After a virtual warp's last tile, with affine V: acc = acc + vb.
  __device__ __forceinline__ void finish(const SideView& V) {
    if constexpr (kAffine) {
      if (V.kind != Kind::Affine) return;
#pragma unroll
      for (int h = 0; h < kG; ++h)
#pragma unroll
        for (int e = 0; e < kE; ++e) acc[h][e] = __fadd_rn(acc[h][e], vb[h]);
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
  __device__ __forceinline__ size_t slot(size_t i) const {
    return i < len0 ? b0 + i : b1 + (i - len0);
  }
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

// acc[h] += q[h][c .. c + 16) . k[0 .. 16), FMA in element order.
template <int kG>
__device__ __forceinline__ void dot16(float (&acc)[kG], const float (&k)[16], const float* q_s,
                                      uint32_t D, uint32_t c) {
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    const float4* q4 = reinterpret_cast<const float4*>(q_s + h * D + c);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float4 qv = q4[e];
      acc[h] = __fmaf_rn(qv.x, k[4 * e], acc[h]);
      acc[h] = __fmaf_rn(qv.y, k[4 * e + 1], acc[h]);
      acc[h] = __fmaf_rn(qv.z, k[4 * e + 2], acc[h]);
      acc[h] = __fmaf_rn(qv.w, k[4 * e + 3], acc[h]);
    }
  }
}

// One tile of nt <= 32 keys into a warp's state: lane l scores the tile's
// key l (its K row row(l), canonical chunks of 16, FMA in element order, q
// from shared memory q_s[kG][D]) for every head, the warp updates the online
// softmax (max and sum by fixed butterflies), then walks the tile's keys in
// order with each lane accumulating p * V for its kE dimensions. K and V
// are global planes (row = the key's slot) or a staged copy of the tile
// (row = its index in the tile): the same bytes, the same arithmetic.
template <int kG, int kE, bool kAffine, class Row>
__device__ __forceinline__ void tile_core(const float* q_s, const SideView& K, const SideView& V,
                                          Row row, int nt, uint32_t D, float scale, int lane,
                                          State<kG, kE, kAffine>& st) {
  const uint32_t d0 = lane * kE;
  const bool v_lane = d0 < D;
  const bool valid = lane < nt;
  float s[kG];
#pragma unroll
  for (int h = 0; h < kG; ++h) s[h] = 0.0f;
  if (valid) {
    const size_t j = row(lane);
    if (kAffine && K.kind == Kind::Affine) {
      // decode_run's arithmetic, with each group's scale and bias loaded
      // once instead of once per 16 elements (runs of 16 lie in one group).
      const uint8_t* codes = K.p[0] + j * K.unit[0];
      const uint8_t* scales = K.p[1] + j * K.unit[1];
      const uint8_t* biases = K.p[2] + j * K.unit[2];
      const uint32_t group = 1u << K.group_shift;
      for (uint32_t g0 = 0, g = 0; g0 < D; g0 += group, ++g) {
        const float sc = h2f(static_cast<uint16_t>(ld_u16(scales + 2 * g)));
        const float bi = h2f(static_cast<uint16_t>(ld_u16(biases + 2 * g)));
#pragma unroll 2
        for (uint32_t c = g0; c < g0 + group; c += 16) {
          float kv[16];
          affine_run<16>(codes, c, K.bits, sc, bi, kv);
          dot16<kG>(s, kv, q_s, D, c);
        }
      }
    } else {
#pragma unroll 2
      for (uint32_t c = 0; c < D; c += 16) {
        float kv[16];
        decode_run<16>(K, j, c, kv);
        dot16<kG>(s, kv, q_s, D, c);
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
    if constexpr (kAffine) st.vb[h] = __fmul_rn(st.vb[h], corr);
#pragma unroll
    for (int e = 0; e < kE; ++e) st.acc[h][e] = __fmul_rn(st.acc[h][e], corr);
  }
  // p * V over the tile's keys in order; lanes split the dimensions.
  if (kAffine && V.kind == Kind::Affine) {
    // p (scale code + bias), factored: acc += (p scale) code, vb += p bias.
#pragma unroll 4
    for (int t = 0; t < nt; ++t) {
      float code[kE], sc = 0.0f, bi = 0.0f;
      if (v_lane) affine_codes<kE>(V, row(t), d0, code, sc, bi);
#pragma unroll
      for (int h = 0; h < kG; ++h) {
        const float pt = __shfl_sync(0xffffffffu, p[h], t);
        if (v_lane) {
          const float ps = __fmul_rn(pt, sc);
#pragma unroll
          for (int e = 0; e < kE; ++e) st.acc[h][e] = __fmaf_rn(ps, code[e], st.acc[h][e]);
          if constexpr (kAffine) st.vb[h] = __fmaf_rn(pt, bi, st.vb[h]);
        }
      }
    }
    return;
  }
#pragma unroll 4
  for (int t = 0; t < nt; ++t) {
    float vv[kE];
    if (v_lane) decode_run<kE>(V, row(t), d0, vv);
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

// The tile of keys from t0, read from the global planes.
template <int kG, int kE, bool kAffine>
__device__ __forceinline__ void tile(const float* q_s, const SideView& K, const SideView& V,
                                     const Keys& keys, size_t t0, uint32_t D, float scale, int lane,
                                     State<kG, kE, kAffine>& st) {
  const int nt = static_cast<int>(min(size_t{32}, keys.n - t0));
  tile_core<kG, kE, kAffine>(
      q_s, K, V, [&](int i) { return keys.slot(t0 + i); }, nt, D, scale, lane, st);
}

// ---- staged tiles -------------------------------------------------------------
//
// The per-block and split kernels first copy a tile's K and V rows (every
// plane) into shared memory with cp.async, all at once, then compute from
// there: one memory round trip per tile instead of one per few keys. The
// image holds each plane's 32 rows at a 16-byte-multiple pitch (K's code
// plane 16 bytes wider, so the lanes of a QK chunk hit different banks).
// Formats whose image does not fit the buffer (f32 K/V) read the planes
// directly.

// Buffer bytes per staged tile for head_dim D: room for 2-byte dense K and V.
__host__ __device__ constexpr uint32_t stage_bytes(uint32_t D) {
  return 32 * (2 * D + 16) + 32 * (2 * D);
}
__device__ __forceinline__ uint32_t round16(size_t b) {
  return static_cast<uint32_t>((b + 15) / 16 * 16);
}

// Where each plane of K and V sits in the image, and its pitch.
struct Stage {
  uint32_t off[2][3], pitch[2][3];
  bool fits;
  __device__ void init(const SideView& K, const SideView& V, uint32_t cap) {
    uint32_t at = 0;
    const SideView* sides[2] = {&K, &V};
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < 3; ++i) {
        const size_t u = sides[s]->unit[i];
        pitch[s][i] = u == 0 ? 0 : round16(u) + (s == 0 && i == 0 ? 16 : 0);
        off[s][i] = at;
        at += 32 * pitch[s][i];
      }
    fits = at <= cap;
  }
  // The staged side, as a SideView whose rows are the tile's keys.
  __device__ SideView view(const SideView& g, int s, uint8_t* buf) const {
    SideView v = g;
    for (int i = 0; i < 3; ++i) {
      v.p[i] = buf + off[s][i];
      v.unit[i] = pitch[s][i];
    }
    return v;
  }
};

// Copies rows [0, nt) of one plane (row i at slot row(i)) into the image at
// dst, threads tid, tid + n_threads, ... each taking whole chunks of the
// widest size (16, 8, 4 or 2 bytes) that the plane's alignment allows.
template <class Row>
__device__ __forceinline__ void stage_plane(uint8_t* dst, uint32_t pitch, const uint8_t* p,
                                            size_t unit, int nt, Row row, int tid, int n_threads) {
  if (unit == 0) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) | unit;
  const uint32_t c = (a & 15) == 0 ? 16 : (a & 7) == 0 ? 8 : (a & 3) == 0 ? 4 : 2;
  const uint32_t per_row = static_cast<uint32_t>(unit / c);
  // Chunk i = r * per_row + k, walked without a division per chunk.
  const uint32_t step_r = n_threads / per_row, step_k = n_threads - step_r * per_row;
  uint32_t r = tid / per_row, k = tid - r * per_row;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  for (; r < static_cast<uint32_t>(nt);) {
    const uint8_t* src = p + row(static_cast<int>(r)) * unit + k * c;
    const uint32_t d = base + r * pitch + k * c;
    if (c == 16)
      cp_async_ca<16>(d, src);
    else if (c == 8)
      cp_async_ca<8>(d, src);
    else if (c == 4)
      cp_async_ca<4>(d, src);
    else
      *reinterpret_cast<uint16_t*>(dst + r * pitch + k * c) = static_cast<uint16_t>(ld_u16(src));
    r += step_r;
    k += step_k;
    if (k >= per_row) {
      k -= per_row;
      ++r;
    }
  }
}

// Issues the copies of the tile of keys from t0 (K and V, every plane).
__device__ __forceinline__ void stage_tile(const Stage& sg, uint8_t* buf, const SideView& K,
                                           const SideView& V, const Keys& keys, size_t t0, int tid,
                                           int n_threads) {
  const int nt = static_cast<int>(min(size_t{32}, keys.n - t0));
  auto row = [&](int i) { return keys.slot(t0 + i); };
  for (int i = 0; i < 3; ++i) {
    stage_plane(buf + sg.off[0][i], sg.pitch[0][i], K.p[i], K.unit[i], nt, row, tid, n_threads);
    stage_plane(buf + sg.off[1][i], sg.pitch[1][i], V.p[i], V.unit[i], nt, row, tid, n_threads);
  }
}

// A warp's tile from its own staging buffer (or from the planes when the
// formats do not fit one).
template <int kG, int kE, bool kAffine>
__device__ __forceinline__ void tile_staged(const float* q_s, const SideView& K, const SideView& V,
                                            const Stage& sg, uint8_t* buf, const Keys& keys,
                                            size_t t0, uint32_t D, float scale, int lane,
                                            State<kG, kE, kAffine>& st) {
  if (!sg.fits) return tile<kG, kE, kAffine>(q_s, K, V, keys, t0, D, scale, lane, st);
  stage_tile(sg, buf, K, V, keys, t0, lane, 32);
  cp_async_wait_all();
  __syncwarp();
  const int nt = static_cast<int>(min(size_t{32}, keys.n - t0));
  tile_core<kG, kE, kAffine>(
      q_s, sg.view(K, 0, buf), sg.view(V, 1, buf), [](int i) { return size_t(i); }, nt, D, scale,
      lane, st);
  __syncwarp();  // every lane is done with the image before the next tile overwrites it
}

// What a kernel may do before its dependency wait: nothing; read its job
// and stage settled keys (AttentionFormats::jobs_settled); also fold the
// settled keys with the query (and query_settled).
constexpr int kEarlyNone = 0, kEarlyStage = 1, kEarlyCompute = 2;

// Copies *src into dst (shared memory) by the whole block, through L2,
// before the dependency wait of a call whose jobs are settled
// (AttentionFormats::jobs_settled); the block meets a barrier after.
__device__ __forceinline__ void early_job(unsigned char* dst, const AttentionJob* src) {
  static_assert(sizeof(AttentionJob) % 4 == 0);
  for (uint32_t i = threadIdx.x; i < sizeof(AttentionJob) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(dst)[i] = __ldcg(reinterpret_cast<const unsigned int*>(src) + i);
  __syncthreads();
}

// Writes output element i (= head * D + dim) of a job, and its bf16
// rounding where the job asks for one.
__device__ __forceinline__ void store_out(const AttentionJob& job, size_t i, float v) {
  job.out[i] = v;
  if (job.out_bf16) job.out_bf16[i] = f2bf(v);
}

// q_s[h][D] = the job's query heads h0 .. h0 + gh - 1 (zeros past gh), by
// threads first, first + step, ...
template <int kG>
__device__ __forceinline__ void load_query(float* q_s, const AttentionJob& job, uint32_t h0, int gh,
                                           uint32_t D, uint32_t first, uint32_t step) {
#pragma unroll
  for (int h = 0; h < kG; ++h)
    for (uint32_t i = first; i < D; i += step)
      q_s[h * D + i] = h < gh ? job.q[size_t{h0 + h} * D + i] : 0.0f;
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
// kMinBlocks: the register bound (blocks of kBlockWarps warps per SM the
// compiler must fit): 2 (up to 255 registers) for steps of fewer than
// kDenseJobs jobs, 3 (168 registers) for more, where more resident blocks
// pay; 3 is also the most blocks a staged block's shared memory allows
// (head_dim up to 128). Measured on the H200: 2 against 4 at 64 and 256
// jobs, each 8-18% faster in its own range (2026-11-30); 3 against 4 at
// 256 jobs, 12-16% faster (bf16, 128 and 1,024 keys; 2026-12-01), and no
// spills with affine V's bias sums. The arithmetic is the same.
constexpr size_t kDenseJobs = 128;
template <int kG, int kE, int kMinBlocks, bool kAffine>
__global__ void __launch_bounds__(kBlockWarps * 32, kMinBlocks)
    attention_kernel(const AttentionJob* jobs, uint32_t group_heads, uint32_t D, float scale,
                     uint32_t stage_cap) {
  extern __shared__ __align__(16) float smem[];
  detail::dependency_wait();
  float* q_s = smem;
  float* acc_s = q_s + kG * D;
  float* m_s = acc_s + kG * D;
  float* l_s = m_s + kG;
  // Then each warp's staging buffer of stage_cap bytes (0: no staging).
  uint8_t* buf = reinterpret_cast<uint8_t*>(smem) + round16((2 * kG * D + 2 * kG) * sizeof(float)) +
                 static_cast<size_t>(threadIdx.x / 32) * stage_cap;
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
  load_query<kG>(q_s, job, h0, gh, D, threadIdx.x, kBlockWarps * 32);
  __syncthreads();

  JobView jv;
  jv.init(job, kvh);
  const SideView &K = jv.k, &V = jv.v;
  const Keys& keys = jv.keys;
  const uint32_t d0 = lane * kE;  // this lane's output dims [d0, d0 + kE)
  const bool v_lane = d0 < D;
  // The block's state starts empty (a job without keys writes zeros).
  for (uint32_t i = threadIdx.x; i < kG * D; i += kBlockWarps * 32) acc_s[i] = 0.0f;
  if (threadIdx.x < kG) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  __syncthreads();
  Stage sg;
  sg.init(K, V, stage_cap);
  const size_t n_virtual = min(n_tiles(keys), static_cast<size_t>(kVirtual));
  for (size_t round = 0; round * kBlockWarps < n_virtual; ++round) {
    const size_t vw = round * kBlockWarps + warp;
    State<kG, kE, kAffine> st;
    st.init();
    for (size_t t0 = 32 * vw; t0 < keys.n; t0 += size_t{32} * kVirtual)
      tile_staged<kG, kE, kAffine>(q_s, K, V, sg, buf, keys, t0, D, scale, lane, st);
    st.finish(V);
    // Fold this round's virtual warps into the shared state, in order.
    for (int w = 0; w < kBlockWarps; ++w) {
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
  for (uint32_t i = threadIdx.x; i < gh * D; i += kBlockWarps * 32) {
    const uint32_t h = i / D;
    const float inv = l_s[h] > 0.0f ? __fdiv_rn(1.0f, l_s[h]) : 0.0f;  // no keys: zeros
    store_out(job, size_t{h0 + h} * D + i % D, __fmul_rn(acc_s[i], inv));
  }
}

// One warp per job: the virtual warps one after another, each folded into
// the running state in order. A block's warps take consecutive jobs, so a
// prompt chunk's queries (one cache row) share K/V through L1 instead of
// each job reading them alone: the variant for steps of many jobs
// (prefill), where attention_kernel leaves warps idle on short rows.
template <int kG, int kE, bool kAffine>
__global__ void __launch_bounds__(kWarps * 32, 2)
    attention_warp_kernel(const AttentionJob* jobs, size_t n_jobs, uint32_t group_heads, uint32_t D,
                          float scale) {
  extern __shared__ __align__(16) float smem[];
  detail::dependency_wait();
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
  State<kG, kE, kAffine> run, st;
  run.init();
  const size_t n_virtual = min(n_tiles(keys), static_cast<size_t>(kVirtual));
  for (size_t w = 0; w < n_virtual; ++w) {
    st.init();
    for (size_t t0 = 32 * w; t0 < keys.n; t0 += size_t{32} * kVirtual)
      tile<kG, kE, kAffine>(q_s, K, V, keys, t0, D, scale, lane, st);
    st.finish(V);
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
    const size_t o = size_t{h0 + h} * D + d0;
#pragma unroll
    for (int e = 0; e < kE; ++e) store_out(job, o + e, __fmul_rn(run.acc[h][e], inv));
  }
}

// Workspace layout of the split variant: per (job, query head, virtual
// warp) one state [m, l, (unused), (unused), acc[D]] of D + kStateHead
// floats, so every state and its acc start 16-byte aligned (D % 16 == 0)
// for the merge's copies.
constexpr uint32_t kStateHead = 4;
__device__ __forceinline__ float* split_state(float* ws, size_t job, uint32_t head,
                                              uint32_t n_heads, uint32_t w, uint32_t D) {
  return ws + ((job * n_heads + head) * kVirtual + w) * (D + kStateHead);
}

// One virtual warp of a (job, kv head)'s query heads: block (job, kv head,
// chunk of up to kSplitHeads heads of the GQA group * kVirtual + w), a warp
// per query head. The block stages each tile of K and V once for all its
// heads (stage_tile), then every warp scores it with its own query.
constexpr int kSplitHeads = 8;
template <int kE, bool kAffine>
__global__ void __launch_bounds__(kSplitHeads * 32, kAffine ? 2 : 4)
    attention_split_kernel(const AttentionJob* jobs, uint32_t group_heads, uint32_t D, float scale,
                           float* ws) {
  extern __shared__ __align__(16) float smem[];
  detail::dependency_wait();
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const uint32_t w = blockIdx.z % kVirtual, kvh = blockIdx.y;
  const uint32_t hg = blockIdx.z / kVirtual * kSplitHeads + warp;  // head in the group
  const bool head = hg < group_heads;
  const uint32_t h = kvh * group_heads + hg;
  float* q_s = smem + warp * D;
  uint8_t* buf = reinterpret_cast<uint8_t*>(smem + blockDim.x / 32 * D);
  const AttentionJob& job = jobs[blockIdx.x];
  JobView jv;
  jv.init(job, kvh);
  if (32 * size_t{w} >= jv.keys.n) return;  // no tiles: not folded (uniform over the block)
  if (head) load_query<1>(q_s, job, h, 1, D, lane, 32);
  __syncwarp();
  Stage sg;
  sg.init(jv.k, jv.v, stage_bytes(D));
  State<1, kE, kAffine> st;
  st.init();
  for (size_t t0 = size_t{32} * w; t0 < jv.keys.n; t0 += size_t{32} * kVirtual) {
    if (!sg.fits) {
      if (head) tile<1, kE, kAffine>(q_s, jv.k, jv.v, jv.keys, t0, D, scale, lane, st);
      continue;
    }
    stage_tile(sg, buf, jv.k, jv.v, jv.keys, t0, static_cast<int>(threadIdx.x),
               static_cast<int>(blockDim.x));
    cp_async_wait_all();
    __syncthreads();
    const int nt = static_cast<int>(min(size_t{32}, jv.keys.n - t0));
    if (head)
      tile_core<1, kE, kAffine>(
          q_s, sg.view(jv.k, 0, buf), sg.view(jv.v, 1, buf), [](int i) { return size_t(i); }, nt, D,
          scale, lane, st);
    __syncthreads();  // the image is read before the next tile's copies
  }
  if (!head) return;
  st.finish(jv.v);
  float* o = split_state(ws, blockIdx.x, h, gridDim.y * group_heads, w, D);
  if (lane == 0) {
    o[0] = st.m[0];
    o[1] = st.l[0];
  }
  const uint32_t d0 = lane * kE;
  if (d0 < D)
    for (int e = 0; e < kE; ++e) o[kStateHead + d0 + e] = st.acc[0][e];
}

// Folds a (job, query head)'s virtual warps in order: block (job, head,
// chunk of kMergeDims output dimensions). The fold of state w into the
// running one uses the running max M(w-1) = max(m_0 .. m_(w-1))
// (fold_weights: a_w = exp(M(w-1) - M(w)), b_w = exp(m_w - M(w))); the
// maxima are exact in any order, so thread w computes a_w and b_w for all
// dimensions at once, and each dimension's chain over w is only acc = acc *
// a_w + st_w * b_w. Thread w first copies state w's m, l and the chunk's
// dimensions into shared memory, so the states cost one round trip to L2
// (where the split kernel just wrote them) instead of one per batch of
// loads ahead of the chain: at 4k keys (128 states) that chain of rounds
// took about as long as the split kernel (Nsight Compute, docs/BENCHMARKS.md).
constexpr uint32_t kMergeDims = 32;
__global__ void __launch_bounds__(kVirtual)
    attention_merge_kernel(const AttentionJob* jobs, uint32_t D, const float* ws, int early) {
  __shared__ __align__(16) float st_s[kVirtual][kMergeDims];
  __shared__ __align__(16) float ml_s[kVirtual][kStateHead];
  __shared__ float a_s[kVirtual], b_s[kVirtual], m_s[kVirtual], warp_max_s[kVirtual / 32];
  __shared__ __align__(16) unsigned char job_raw[sizeof(AttentionJob)];
  if (early != kEarlyNone) early_job(job_raw, jobs + blockIdx.x);
  detail::dependency_wait();
  const uint32_t t = threadIdx.x, d0 = blockIdx.z * kMergeDims;
  const AttentionJob& job =
      early != kEarlyNone ? *reinterpret_cast<const AttentionJob*>(job_raw) : jobs[blockIdx.x];
  Keys keys;
  keys.init(job);
  const uint32_t h = blockIdx.y;
  const uint32_t n_virtual =
      static_cast<uint32_t>(min(n_tiles(keys), static_cast<size_t>(kVirtual)));
  if (n_virtual == 0) {  // a job without keys writes zeros
    if (t < kMergeDims && d0 + t < D) store_out(job, size_t{h} * D + d0 + t, 0.0f);
    return;
  }
  if (t < n_virtual) {
    const float* st = split_state(const_cast<float*>(ws), blockIdx.x, h, gridDim.y, t, D);
    cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(ml_s[t])), st, true);
#pragma unroll
    for (uint32_t i = 0; i < kMergeDims; i += 4)  // D % 16 == 0: whole units or none
      cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(st_s[t] + i)),
                 st + kStateHead + d0 + i, d0 + i < D);
  }
  cp_async_wait_all();
  __syncthreads();
  // M(w) by a max-scan over the block's kVirtual threads, then thread w's
  // weights.
  const uint32_t lane = t % 32, warp = t / 32;
  const float m_w = t < n_virtual ? ml_s[t][0] : -INFINITY;
  float mv = m_w;
#pragma unroll
  for (uint32_t off = 1; off < 32; off *= 2) {
    const float o = __shfl_up_sync(0xffffffffu, mv, off);
    if (lane >= off) mv = fmaxf(mv, o);
  }
  if (lane == 31) warp_max_s[warp] = mv;
  __syncthreads();
  for (uint32_t k = 0; k < warp; ++k) mv = fmaxf(mv, warp_max_s[k]);
  m_s[t] = mv;
  __syncthreads();
  if (t >= 1 && t < n_virtual) {
    float mm, a, b;
    fold_weights(m_s[t - 1], m_w, mm, a, b);
    a_s[t] = a;
    b_s[t] = b;
  }
  __syncthreads();
  if (t >= kMergeDims || d0 + t >= D) return;
  float l_run = ml_s[0][1], acc_run = st_s[0][t];
#pragma unroll 8
  for (uint32_t w = 1; w < n_virtual; ++w) {
    const float a = a_s[w], b = b_s[w];
    acc_run = __fadd_rn(__fmul_rn(acc_run, a), __fmul_rn(st_s[w][t], b));
    l_run = __fadd_rn(__fmul_rn(l_run, a), __fmul_rn(ml_s[w][1], b));
  }
  const float inv = l_run > 0.0f ? __fdiv_rn(1.0f, l_run) : 0.0f;
  store_out(job, size_t{h} * D + d0 + t, __fmul_rn(acc_run, inv));
}

// Launches the merge of a split call's states.
void launch_merge(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& s,
                  const float* ws, int early, cudaStream_t stream) {
  const uint32_t D = static_cast<uint32_t>(s.head_dim);
  const dim3 grid(static_cast<unsigned>(n_jobs), static_cast<unsigned>(s.n_heads),
                  (D + kMergeDims - 1) / kMergeDims);
  detail::launch("attention_merge_kernel", attention_merge_kernel, grid, kVirtual, 0, stream,
                 jobs, D, ws, early);
}

// ---- tensor-core tiles ------------------------------------------------------------
//
// Calls whose K and V are both f16, both bf16 or both affine, with head_dim
// 64 or 128, run kernels with a second arithmetic (the "tc" contract; the
// format and head_dim are the cache's, never the batch's, so every kernel
// that can run a job uses the same one). The tiles of 32 keys, the virtual
// warps and the fold of their states are those above; inside a tile one
// warp computes up to kTcHeads query heads of a kv head with mma m16n8k16
// (f32 accumulation):
// - q of head h is split into three 16-bit parts, rows h, 4 + h and 8 + h of
//   the A operand. bf16 parts (bf16 and affine K) are exact: hi = bf16(q),
//   mid = bf16(q - hi), lo = bf16(q - hi - mid) sum to q. f16 parts (f16 K)
//   split q * 2^-e, e making the head's largest |q| lie in [2^13, 2^14), and
//   lose only what falls below f16's subnormals (2^-24 of that scale).
// - Scores: S = A K^T over the tile's keys, a key's score (S_hi + S_mid) +
//   S_lo, times 2^e for f16; affine K: the same over each group's codes
//   (exact in bf16) gives T_g, and the score is the sum over groups, in
//   order from 0.0, of fma(scale, T_g, bias * qsum_g), qsum_g the head's q
//   summed over the group (each lane its 8-element runs in order, then two
//   butterflies).
// - Online softmax per head over the tile (a lane's 8 keys in key order,
//   then butterflies over the 4 lanes of a row; exp as above).
// - p split likewise into three bf16 parts (f16 V: three f16 parts of
//   p * 2^14; affine V: of p * scale per V group, with bias * p summed per
//   group as vb), O += P V per part row; a virtual warp's state closes as
//   (O_hi + O_mid) + O_lo (times 2^-14 for f16; + vb for affine).
// The mma's own summation is fixed by the hardware and the same for every
// row and column position, so a head's result does not depend on the
// other heads or jobs.

// A family of formats, as a template argument: kTcF16, kTcBF16, or affine K
// and V with the same bits and group (tc_affine).
constexpr int kTcNone = 0, kTcF16 = 1, kTcBF16 = 2;
constexpr int tc_affine(int bits, int group) {
  return bits * 1024 + group;
}
constexpr bool tc_aff(int F) {
  return F >= 1024;
}
constexpr int tc_bits(int F) {
  return F / 1024;
}
constexpr int tc_group(int F) {
  return F % 1024;
}
// The element type of the mma operands: f16 for f16 K/V, else bf16 (affine
// codes are exact in bf16).
constexpr int tc_elem(int F) {
  return F == kTcF16 ? kTcF16 : kTcBF16;
}
constexpr int kTcHeads = 4;
constexpr int kTcWarps = 4;  // warps of the per-warp tc kernel's blocks

// One tile's image for head_dim D. Dense: K and V as 16-bit matrices
// [32 keys][D]; 16-byte chunk c of row r sits at chunk k_at / v_at(c, r)
// so that the fragment loads hit distinct banks (K: 16 bytes per lane from
// two rows per 8-lane phase; V: ldmatrix, eight rows of one chunk).
// Affine: K's and V's codes as stored (raw rows at a padded pitch), and
// the scale and bias planes of both, raw f16 [32][D / 32]; tc_tile turns
// the codes into bf16 fragments in registers (K: image_codes, V: v_codes).
template <int D, int F>
struct TcImage {
  static constexpr bool kAff = tc_aff(F);
  static constexpr uint32_t kRow = 2 * D, kChunks = D / 8, kGroups = D / 32;
  // Affine codes per key, and their pitches: K 16 (4-bit) or 32 (8-bit)
  // bytes past the row so the lanes' 4- or 8-byte reads of eight rows hit
  // distinct banks; V 16 past it so ldmatrix's eight rows of 16 bytes do.
  static constexpr uint32_t kCodes = kAff ? D * tc_bits(F) / 8 : 0;
  static constexpr uint32_t kKPitch = kAff ? kCodes + (tc_bits(F) == 4 ? 16 : 32) : kRow;
  static constexpr uint32_t kVPitch = kAff ? kCodes + 16 : kRow;
  static constexpr uint32_t kK = 0;                   // dense K / affine K codes
  static constexpr uint32_t kV = 32 * kKPitch;        // dense V / affine V codes
  static constexpr uint32_t kSb = kV + 32 * kVPitch;  // affine scales and biases
  static constexpr uint32_t kSbPlane = 32 * kGroups * 2;
  static constexpr uint32_t kBytes =
      kSb + (kAff ? 4 * kSbPlane : 0);  // K scale, K bias, V scale, V bias
  __device__ static uint32_t k_at(uint32_t r, uint32_t c) {
    return kK + r * kRow + 16 * (c ^ ((r & 1) << 2));
  }
  __device__ static uint32_t v_at(uint32_t r, uint32_t c) {
    return kV + r * kRow + 16 * (c ^ (r & 7));
  }
  __device__ static uint32_t sb_at(int plane, uint32_t r, uint32_t g) {
    return kSb + plane * kSbPlane + 2 * (r * kGroups + g);
  }
};

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts128(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w));
}
__device__ __forceinline__ uint32_t lds16(uint32_t addr) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts16(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<unsigned short>(v)));
}

// The generic pointer of a shared-memory address (stage_plane takes one).
__device__ __forceinline__ uint8_t* tc_ptr(uint32_t addr) {
  extern __shared__ __align__(16) float smem[];
  return reinterpret_cast<uint8_t*>(smem) +
         (addr - static_cast<uint32_t>(__cvta_generic_to_shared(smem)));
}

// Eight codes (4-bit: one word; 8-bit: two) as eight exact bf16 values,
// pairs (0, 1), (2, 3), (4, 5), (6, 7) in .x .. .w.
__device__ __forceinline__ uint4 codes_to_bf16(uint32_t w0, uint32_t w1, int bits) {
  uint32_t r[4];
  if (bits == 4) {
    // bf16 0x4300 | c is 128 + c (c < 128), exactly; minus 128, exactly c.
    const uint32_t lo = w0 & 0x0f0f0f0fu, hi = (w0 >> 4) & 0x0f0f0f0fu;
    const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.0f, 128.0f);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = (__byte_perm(lo, hi, 0x0400u + 0x0101u * i) & 0x00ff00ffu) | 0x43004300u;
      const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), k128);
      r[i] = *reinterpret_cast<const uint32_t*>(&d);
    }
  } else {
    const uint32_t w[2] = {w0, w1};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t x = w[i / 2];
      const int b = 2 * (i % 2);
      const float a = code_to_float((x >> (8 * b)) & 0xffu),
                  c = code_to_float((x >> (8 * b + 8)) & 0xffu);
      const __nv_bfloat162 d = __floats2bfloat162_rn(a, c);  // exact: codes < 256
      r[i] = *reinterpret_cast<const uint32_t*>(&d);
    }
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}
// Eight codes of an affine row in the image, from element e0 (a multiple of 8).
__device__ __forceinline__ uint4 image_codes(uint32_t row_addr, uint32_t e0, int bits) {
  if (bits == 4) return codes_to_bf16(lds32(row_addr + e0 / 2), 0, 4);
  const uint2 w = lds64(row_addr + e0);
  return codes_to_bf16(w.x, w.y, 8);
}

// The codes at unit position s of a transposed pair of 16-bit units
// (ldmatrix: keys 2c and 2c + 1 in the low and high half) as two exact
// bf16 values: 4-bit codes s of each unit, 8-bit bytes s.
template <int kBits>
__device__ __forceinline__ uint32_t v_codes(uint32_t r, int s) {
  if constexpr (kBits == 4) {
    const uint32_t v = ((r >> (4 * s)) & 0x000f000fu) | 0x43004300u;  // 128 + c, as above
    const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v),
                                     __floats2bfloat162_rn(128.0f, 128.0f));
    return *reinterpret_cast<const uint32_t*>(&d);
  } else {
    const __nv_bfloat162 d = __floats2bfloat162_rn(code_to_float((r >> (8 * s)) & 0xffu),
                                                   code_to_float((r >> (8 * s + 16)) & 0xffu));
    return *reinterpret_cast<const uint32_t*>(&d);
  }
}

// Issues the copies of the tile of keys from t0 into the image (threads
// tid, tid + n_threads, ...; every plane by cp.async, stage_plane): dense
// K and V into their 16-bit matrices; affine codes and scale/bias planes
// raw. Rows past the tile's keys meet p = 0, so they must hold finite
// values: dense V's become zeros, and so do affine V's scales and biases
// (any code is finite).
template <int D, int F>
__device__ __forceinline__ void tc_stage(uint32_t img, uint8_t* img_ptr, const JobView& jv,
                                         size_t t0, int tid, int n_threads) {
  using Img = TcImage<D, F>;
  constexpr uint32_t C = Img::kChunks;
  const int nt = static_cast<int>(min(size_t{32}, jv.keys.n - t0));
  auto slot = [&](int i) { return jv.keys.slot(t0 + i); };
  const SideView &K = jv.k, &V = jv.v;
  if constexpr (!tc_aff(F)) {
    const bool a16 = ((reinterpret_cast<uintptr_t>(K.p[0]) | K.unit[0] |
                       reinterpret_cast<uintptr_t>(V.p[0]) | V.unit[0]) &
                      15) == 0;
    for (uint32_t i = tid; i < 32 * C; i += n_threads) {
      const uint32_t r = i / C, c = i % C;
      if (r >= static_cast<uint32_t>(nt)) {
        sts128(img + Img::v_at(r, c), make_uint4(0, 0, 0, 0));
        continue;
      }
      const size_t j = slot(static_cast<int>(r));
      const uint8_t* ks = K.p[0] + j * K.unit[0] + 16 * c;
      const uint8_t* vs = V.p[0] + j * V.unit[0] + 16 * c;
      if (a16) {
        cp_async_ca<16>(img + Img::k_at(r, c), ks);
        cp_async_ca<16>(img + Img::v_at(r, c), vs);
      } else {
        uint32_t w[4], x[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          w[k] = ld_u16(ks + 4 * k) | ld_u16(ks + 4 * k + 2) << 16;
          x[k] = ld_u16(vs + 4 * k) | ld_u16(vs + 4 * k + 2) << 16;
        }
        sts128(img + Img::k_at(r, c), make_uint4(w[0], w[1], w[2], w[3]));
        sts128(img + Img::v_at(r, c), make_uint4(x[0], x[1], x[2], x[3]));
      }
    }
  } else {
    // Codes in 16-byte chunks and scales and biases a key's row at a time,
    // with the sizes known here, where the planes are aligned for them (any
    // cache the KV layer allocates); else stage_plane's general copies.
    constexpr uint32_t kCC = Img::kCodes / 16, kSU = 2 * D / tc_group(F);
    auto bits = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    const bool fast =
        kSU >= 4 && K.unit[0] == Img::kCodes && V.unit[0] == Img::kCodes && K.unit[1] == kSU &&
        K.unit[2] == kSU && V.unit[1] == kSU && V.unit[2] == kSU &&
        ((bits(K.p[0]) | bits(V.p[0])) & 15) == 0 &&
        ((bits(K.p[1]) | bits(K.p[2]) | bits(V.p[1]) | bits(V.p[2])) & (kSU - 1)) == 0;
    if constexpr (kSU >= 4) {
      if (fast) {
        for (uint32_t i = tid; i < nt * kCC; i += n_threads) {
          const uint32_t r = i / kCC, c = i % kCC;
          const size_t j = slot(static_cast<int>(r));
          cp_async_ca<16>(img + Img::kK + r * Img::kKPitch + 16 * c,
                          K.p[0] + j * kCC * 16 + 16 * c);
          cp_async_ca<16>(img + Img::kV + r * Img::kVPitch + 16 * c,
                          V.p[0] + j * kCC * 16 + 16 * c);
        }
        for (uint32_t r = tid; r < static_cast<uint32_t>(nt); r += n_threads) {
          const size_t j = slot(static_cast<int>(r));
#pragma unroll
          for (int pl = 0; pl < 4; ++pl) {
            const SideView& s = pl < 2 ? K : V;
            cp_async_ca<kSU>(img + Img::sb_at(pl, r, 0), s.p[1 + pl % 2] + j * kSU);
          }
        }
      }
    }
    if (!fast) {
      stage_plane(img_ptr + Img::kK, Img::kKPitch, K.p[0], K.unit[0], nt, slot, tid, n_threads);
      stage_plane(img_ptr + Img::kV, Img::kVPitch, V.p[0], V.unit[0], nt, slot, tid, n_threads);
      for (int pl = 0; pl < 4; ++pl) {
        const SideView& s = pl < 2 ? K : V;
        stage_plane(img_ptr + Img::kSb + pl * Img::kSbPlane, 2 * Img::kGroups, s.p[1 + pl % 2],
                    s.unit[1 + pl % 2], nt, slot, tid, n_threads);
      }
    }
    for (uint32_t i = nt * Img::kGroups + tid; i < 32 * Img::kGroups; i += n_threads) {
      sts16(img + Img::sb_at(2, i / Img::kGroups, i % Img::kGroups), 0);
      sts16(img + Img::sb_at(3, i / Img::kGroups, i % Img::kGroups), 0);
    }
  }
}

// Two floats as a packed pair of 16-bit values (round to nearest even,
// one conversion instruction), and back.
template <int F>
__device__ __forceinline__ uint32_t pack16(float a, float b) {
  if constexpr (F == kTcF16) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
template <int F>
__device__ __forceinline__ float2 unpack16(uint32_t v) {
  if constexpr (F == kTcF16)
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  else
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
// A pair (a, b)'s three parts (above), as the lane's two A rows take them:
// row g the high part (lanes of rows 0-3) or the middle one (rows 4-7),
// row g + 8 the low part (lanes of rows 8-11) or zero (rows 12-15).
template <int F>
__device__ __forceinline__ void split3(float a, float b, bool upper, uint32_t& row_g,
                                       uint32_t& row_g8) {
  const uint32_t hi = pack16<F>(a, b);
  const float2 h = unpack16<F>(hi);
  const float ra = __fsub_rn(a, h.x), rb = __fsub_rn(b, h.y);
  const uint32_t mid = pack16<F>(ra, rb);
  const float2 m = unpack16<F>(mid);
  const uint32_t lo = pack16<F>(__fsub_rn(ra, m.x), __fsub_rn(rb, m.y));
  row_g = upper ? mid : hi;
  row_g8 = upper ? 0u : lo;
}
// A fragment from x values at k pairs (2c, 2c + 1) -> x0, and (2c + 8, 2c + 9) -> x1.
template <int F>
__device__ __forceinline__ void a_frag(const float (&x0)[2], const float (&x1)[2], bool upper,
                                       uint32_t (&a)[4]) {
  split3<F>(x0[0], x0[1], upper, a[0], a[1]);
  split3<F>(x1[0], x1[1], upper, a[2], a[3]);
}

template <int F>
__device__ __forceinline__ void tc_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  if constexpr (F == kTcF16)
    mma_f16(d, a, b0, b1);
  else
    mma_bf16(d, a, b0, b1);
}

// (hi + mid) + lo of an accumulator pair: x = row g (hi in lower lanes, mid
// in upper), y = row g + 8 (lo in lower lanes); every lane gets its head's.
__device__ __forceinline__ float tc_combine(float x, float y, bool upper) {
  const float xo = __shfl_xor_sync(0xffffffffu, x, 16), yo = __shfl_xor_sync(0xffffffffu, y, 16);
  const float hi = upper ? xo : x, mid = upper ? x : xo, lo = upper ? yo : y;
  return __fadd_rn(__fadd_rn(hi, mid), lo);
}

// What a lane keeps of its query (head g % 4 of the warp's heads): the score
// factor 2^e (f16 K) and, for affine K, the head's q summed over each group.
template <int D>
struct TcQuery {
  float pow2;
  float qsum[D / 32];  // affine K's groups (at most D / 32 of them)
};

// Writes the warp's A fragments of q to qf[k step][lane] (when `write`) and
// fills tq. Heads past gh are zeros. Lane (g, c) holds, for k step 2p + s,
// dims 32 p + 8 c + 4 s + {0, 1} at k (2c, 2c + 1) and + {2, 3} at (2c + 8,
// 2c + 9): the K fragments read the same dims.
template <int D, int F>
__device__ __forceinline__ void tc_query(uint4* qf, bool write, const AttentionJob& job,
                                         uint32_t h0, int gh, int lane, TcQuery<D>& tq) {
  const int g = lane >> 2, c = lane & 3;
  const bool upper = g >= 4, valid = (g & 3) < gh;
  const float* q = job.q + size_t{h0 + (g & 3)} * D;
  float x[D / 4];  // this lane's dims: pair p, run element i at x[8 p + i]
#pragma unroll
  for (int p = 0; p < D / 32; ++p)
#pragma unroll
    for (int i = 0; i < 8; i += 4) {
      // (Through L2: the split kernel may read it before its wait.)
      const float4 v = valid ? __ldcg(reinterpret_cast<const float4*>(q + 32 * p + 8 * c + i))
                             : make_float4(0.f, 0.f, 0.f, 0.f);
      x[8 * p + i] = v.x;
      x[8 * p + i + 1] = v.y;
      x[8 * p + i + 2] = v.z;
      x[8 * p + i + 3] = v.w;
    }
  tq.pow2 = 1.0f;
  if constexpr (F == kTcF16) {
    float mx = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 4; ++i) mx = fmaxf(mx, fabsf(x[i]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    int e = 0;
    if (mx > 0.0f && mx <= 3.4e38f) e = min(max(ilogbf(mx) - 13, -100), 100);
    const float down = ldexpf(1.0f, -e);
    tq.pow2 = ldexpf(1.0f, e);
#pragma unroll
    for (int i = 0; i < D / 4; ++i) x[i] = __fmul_rn(x[i], down);
  }
  if constexpr (tc_aff(F)) {
    // Group gr's dims are pairs [gr * ppg, (gr + 1) * ppg): the lane's runs
    // summed in order from 0.0, then the row's 4 lanes by butterflies.
    constexpr int ppg = tc_group(F) / 32;
#pragma unroll
    for (int gr = 0; gr < D / tc_group(F); ++gr) {
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < 8 * ppg; ++i) v = __fadd_rn(v, x[8 * ppg * gr + i]);
      v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
      tq.qsum[gr] = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
    }
  }
  if (!write) return;
#pragma unroll
  for (int p = 0; p < D / 32; ++p)
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const float* v = x + 8 * p + 4 * s;
      uint32_t a[4];
      a_frag<tc_elem(F)>({v[0], v[1]}, {v[2], v[3]}, upper, a);
      qf[(2 * p + s) * 32 + lane] = make_uint4(a[0], a[1], a[2], a[3]);
    }
}

// A warp's running state: m and l of the lane's head, the P V accumulators
// (n tile j: rows g / g + 8, dims 8 j + 2c + {0, 1}), affine V's bias sums.
template <int D, int F>
struct TcState {
  float m, l;
  float o[D / 8][4];
  float vb[tc_aff(F) ? D / tc_group(F) : 1];
  __device__ __forceinline__ void init() {
    m = -INFINITY;
    l = 0.0f;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[j][i] = 0.0f;
#pragma unroll
    for (int i = 0; i < (tc_aff(F) ? D / tc_group(F) : 1); ++i) vb[i] = 0.0f;
  }
};
// A closed state: lanes of rows 0-3 (g < 4) hold head g's m, l and dims
// 8 j + 2c + e at o[2 j + e].
template <int D>
struct TcOut {
  float m, l;
  float o[D / 4];
};

// Scale or bias (plane) of group gr of key r in the image, as a float.
template <int D, int F>
__device__ __forceinline__ float sb_value(uint32_t img, int plane, uint32_t r, uint32_t gr) {
  return h2f(static_cast<uint16_t>(lds16(img + TcImage<D, F>::sb_at(plane, r, gr))));
}

// One tile of nt keys from the image into the warp's state. kMaskV (dense
// images): the V fragments of keys nt and above are zeroed in registers, as
// the image's V rows past nt would be had the warp staged the tile itself
// (the same operands, so the same bits); the image may hold real keys there.
template <int D, int F, bool kMaskV = false>
__device__ __forceinline__ void tc_tile(uint32_t img, const uint4* qf, const TcQuery<D>& tq, int nt,
                                        float scale, int lane, TcState<D, F>& st) {
  using Img = TcImage<D, F>;
  constexpr int AF = tc_elem(F);  // the A/B element type
  const int g = lane >> 2, c = lane & 3;
  const bool upper = g >= 4;
  float sc[4][2];  // scores of keys 8 j + 2c + e (affine: summed over K's groups)
#pragma unroll
  for (int j = 0; j < 4; ++j) sc[j][0] = sc[j][1] = 0.0f;
  {
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    constexpr int ppg = tc_aff(F) ? tc_group(F) / 32 : D / 32;  // pairs of k steps per group
#pragma unroll
    for (int p = 0; p < D / 32; ++p) {
      const uint4 qa = qf[(2 * p) * 32 + lane], qb = qf[(2 * p + 1) * 32 + lane];
      const uint32_t a0[4] = {qa.x, qa.y, qa.z, qa.w}, a1[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4 b = tc_aff(F) ? image_codes(img + Img::kK + (8 * j + g) * Img::kKPitch,
                                                32 * p + 8 * c, tc_bits(F))
                                  : lds128(img + Img::k_at(8 * j + g, 4 * p + c));
        tc_mma<AF>(acc[j], a0, b.x, b.y);
        tc_mma<AF>(acc[j], a1, b.z, b.w);
      }
      if ((p + 1) % ppg != 0) continue;  // the group (affine) or the row goes on
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = tc_combine(acc[j][e], acc[j][2 + e], upper);
          if constexpr (tc_aff(F)) {
            const uint32_t key = 8 * j + 2 * c + e, gr = p / ppg;
            const float term = __fmaf_rn(sb_value<D, F>(img, 0, key, gr), v,
                                         __fmul_rn(sb_value<D, F>(img, 1, key, gr), tq.qsum[gr]));
            sc[j][e] = __fadd_rn(sc[j][e], term);
          } else {
            sc[j][e] = F == kTcF16 ? __fmul_rn(v, tq.pow2) : v;
          }
          acc[j][e] = acc[j][2 + e] = 0.0f;
        }
    }
  }
  // Online softmax over the tile.
  float mt = -INFINITY;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool valid = 8 * j + 2 * c + e < nt;
      sc[j][e] = valid ? __fmul_rn(sc[j][e], scale) : -INFINITY;
      mt = fmaxf(mt, sc[j][e]);
    }
  mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
  mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
  const float m_new = fmaxf(st.m, mt);  // finite: the tile has a key
  const float corr = expf(st.m - m_new);
  float p[4][2], sum = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      p[j][e] = 8 * j + 2 * c + e < nt ? expf(sc[j][e] - m_new) : 0.0f;
      sum = __fadd_rn(sum, p[j][e]);
    }
  sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
  sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
  // (A virtual warp's first tile, uniform over the warp: nothing to rescale,
  // the accumulators are +0 and would stay so.)
  const bool first = st.m == -INFINITY;
  st.l = __fadd_rn(__fmul_rn(st.l, corr), sum);
  st.m = m_new;
  if (!first) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) st.o[j][i] = __fmul_rn(st.o[j][i], corr);
  }
  // P V, k steps of 16 keys (n tiles 2 ks and 2 ks + 1 of the scores).
  const int mat = lane >> 3, mrow = lane & 7;
  constexpr int vpg = tc_aff(F) ? tc_group(F) / 16 : D / 16;  // n-tile pairs per V group
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    uint32_t a[4], raw[4];
    const uint32_t key = 16 * ks + ((mat & 1) << 3) + mrow;
#pragma unroll
    for (int jp = 0; jp < D / 16; ++jp) {
      if (jp % vpg == 0) {  // (affine: a V group starts: A = p * its keys' scales)
        float x0[2], x1[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          x0[e] = p[2 * ks][e];
          x1[e] = p[2 * ks + 1][e];
          if constexpr (tc_aff(F)) {
            x0[e] = __fmul_rn(x0[e], sb_value<D, F>(img, 2, 16 * ks + 2 * c + e, jp / vpg));
            x1[e] = __fmul_rn(x1[e], sb_value<D, F>(img, 2, 16 * ks + 8 + 2 * c + e, jp / vpg));
          } else if constexpr (F == kTcF16) {
            x0[e] = __fmul_rn(x0[e], 16384.0f);
            x1[e] = __fmul_rn(x1[e], 16384.0f);
          }
        }
        a_frag<AF>(x0, x1, upper, a);
      }
      uint32_t b0, b1, b2, b3;
      if constexpr (tc_aff(F)) {
        // The codes of 16-byte chunks 2 (jp / U), + 1 (U dims per 16-bit
        // unit), transposed: raw[2 h + k] holds, for chunk h of the pair
        // and keys 2c, 2c + 1 (+ 8 k), unit g (dims U g .. U g + U - 1);
        // n tile j is the chunk's dims U n + j % U (tc_dim).
        constexpr int U = 16 / tc_bits(F);
        if (jp % U == 0)
          ldsm_x4_trans(img + Img::kV + key * Img::kVPitch + 16 * (2 * (jp / U) + (mat >> 1)),
                        raw[0], raw[1], raw[2], raw[3]);
        const int h = (2 * jp / U) % 2, s = 2 * jp % U;
        b0 = v_codes<tc_bits(F)>(raw[2 * h], s);
        b1 = v_codes<tc_bits(F)>(raw[2 * h + 1], s);
        b2 = v_codes<tc_bits(F)>(raw[2 * h], s + 1);
        b3 = v_codes<tc_bits(F)>(raw[2 * h + 1], s + 1);
      } else {
        ldsm_x4_trans(img + Img::v_at(key, 2 * jp + (mat >> 1)), b0, b1, b2, b3);
        if constexpr (kMaskV) {
          // b0, b2: keys 16 ks + 2c and + 1 (low and high halves); b1, b3: + 8.
          const int k0 = 16 * ks + 2 * c;
          const uint32_t lo = (k0 < nt ? 0xffffu : 0u) | (k0 + 1 < nt ? 0xffff0000u : 0u);
          const uint32_t hi = (k0 + 8 < nt ? 0xffffu : 0u) | (k0 + 9 < nt ? 0xffff0000u : 0u);
          b0 &= lo, b2 &= lo, b1 &= hi, b3 &= hi;
        }
      }
      tc_mma<AF>(st.o[2 * jp], a, b0, b1);
      tc_mma<AF>(st.o[2 * jp + 1], a, b2, b3);
    }
  }
  if constexpr (tc_aff(F)) {
    // vb[group] = vb * corr + sum over the tile's keys (the lane's in key
    // order, then the row's 4 lanes) of p * bias.
#pragma unroll
    for (int gr = 0; gr < D / tc_group(F); ++gr) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s = __fmaf_rn(p[j][e], sb_value<D, F>(img, 3, 8 * j + 2 * c + e, gr), s);
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));
      st.vb[gr] = __fadd_rn(__fmul_rn(st.vb[gr], corr), s);
    }
  }
}

// Closes a virtual warp's state (lanes of rows 0-3 get its outputs).
template <int D, int F>
__device__ __forceinline__ void tc_finish(const TcState<D, F>& st, TcOut<D>& out) {
  out.m = st.m;
  out.l = st.l;
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float x = st.o[j][e];
      const float mid = __shfl_xor_sync(0xffffffffu, x, 16);
      float v = __fadd_rn(__fadd_rn(x, mid), st.o[j][2 + e]);
      if constexpr (F == kTcF16) v = __fmul_rn(v, 1.0f / 16384.0f);
      if constexpr (tc_aff(F)) {
        v = __fadd_rn(v, st.vb[8 * j / tc_group(F)]);
      }
      out.o[2 * j + e] = v;
    }
}

// run = run folded with st (fold_weights; both closed states of one head).
template <int D>
__device__ __forceinline__ void tc_fold(TcOut<D>& run, const TcOut<D>& st) {
  float mm, a, b;
  fold_weights(run.m, st.m, mm, a, b);
#pragma unroll
  for (int i = 0; i < D / 4; ++i)
    run.o[i] = __fadd_rn(__fmul_rn(run.o[i], a), __fmul_rn(st.o[i], b));
  run.l = __fadd_rn(__fmul_rn(run.l, a), __fmul_rn(st.l, b));
  run.m = mm;
}

// Dim of a closed state's o[i] for lane (g, c).
template <int F>
__device__ __forceinline__ uint32_t tc_dim(int i, int c) {
  const int j = i / 2, n = 2 * c + i % 2;  // n tile and column
  if constexpr (tc_aff(F)) {
    // Affine V (tc_tile): dims U n + j % U of 16-byte chunk j / U, which
    // lies in the group that dims 8 j .. 8 j + 7 would (so vb's index and
    // the A operand's scales are those of the dense layout).
    constexpr int U = 16 / tc_bits(F);
    return 8 * U * (j / U) + U * n + j % U;
  } else {
    return 8 * j + n;
  }
}

// Waits for a tile whose copies are issued (by tc_stage, here or before
// the dependency wait) until it is ready for tc_tile (kBlock: the whole
// block staged it, else one warp); `meanwhile` runs while the copies are
// in flight. Returns the tile's key count.
template <bool kBlock, class Meanwhile>
__device__ __forceinline__ int tc_staged(const JobView& jv, size_t t0, Meanwhile&& meanwhile) {
  meanwhile();
  cp_async_wait_all();
  if constexpr (kBlock)
    __syncthreads();
  else
    __syncwarp();
  return static_cast<int>(min(size_t{32}, jv.keys.n - t0));
}

// Stages the tile of keys from t0 (threads tid .. of n_threads) and waits
// for it as tc_staged does.
template <int D, int F, bool kBlock, class Meanwhile>
__device__ __forceinline__ int tc_load(uint32_t img, const JobView& jv, size_t t0, int tid,
                                       int n_threads, Meanwhile&& meanwhile) {
  tc_stage<D, F>(img, tc_ptr(img), jv, t0, tid, n_threads);
  return tc_staged<kBlock>(jv, t0, meanwhile);
}

// Whether the tile of keys from t0 exists and holds only keys the job
// calls settled (AttentionJob::settled): it may be staged before the wait.
__device__ __forceinline__ bool settled_tile(const JobView& jv, const AttentionJob& job,
                                             size_t t0) {
  return t0 < jv.keys.n && t0 + min(size_t{32}, jv.keys.n - t0) <= job.settled;
}

// The kv head (blockIdx.y) of a per-block or per-warp tc block and its
// chunk blockIdx.z of kTcHeads query heads: the first, h0, and how many.
struct TcChunk {
  uint32_t kvh, h0;
  int gh;
};
__device__ __forceinline__ TcChunk tc_chunk(uint32_t group_heads) {
  const uint32_t first = blockIdx.z * kTcHeads;
  return {blockIdx.y, blockIdx.y * group_heads + first,
          static_cast<int>(min(static_cast<uint32_t>(kTcHeads), group_heads - first))};
}
// A per-block or per-warp tc block's start: its chunk, the job's view at
// its kv head, and the query (tc_query; its fragments written when `write`).
template <int D, int F>
__device__ __forceinline__ TcChunk tc_begin(const AttentionJob& job, uint32_t group_heads,
                                            uint4* qf, bool write, int lane, JobView& jv,
                                            TcQuery<D>& tq) {
  const TcChunk ch = tc_chunk(group_heads);
  jv.init(job, ch.kvh);
  tc_query<D, F>(qf, write, job, ch.h0, ch.gh, lane, tq);
  return ch;
}

// Per-block tc kernel: a block per (job, kv head, chunk of kTcHeads query
// heads); its warps run the virtual warps in rounds (as attention_kernel),
// each staging its tiles into its own image. Dynamic shared memory: q
// fragments [D / 16][32] uint4, acc [kTcHeads][D], m, l [kTcHeads], then
// the warps' images.
template <int D, int F, int kMinBlocks>
__global__ void __launch_bounds__(kBlockWarps * 32, kMinBlocks)
    attention_tc_kernel(const AttentionJob* jobs, uint32_t group_heads, float scale) {
  extern __shared__ __align__(16) float smem[];
  detail::dependency_wait();
  uint4* qf = reinterpret_cast<uint4*>(smem);
  float* acc_s = smem + D * 8;  // after D / 16 * 32 uint4
  float* m_s = acc_s + kTcHeads * D;
  float* l_s = m_s + kTcHeads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t img = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) +
                       round16((D * 8 + kTcHeads * D + 2 * kTcHeads) * sizeof(float)) +
                       warp * TcImage<D, F>::kBytes;
  __shared__ __align__(16) unsigned char job_raw[sizeof(AttentionJob)];
  const AttentionJob& job = *reinterpret_cast<const AttentionJob*>(job_raw);
  if (threadIdx.x < sizeof(AttentionJob) / 4)
    reinterpret_cast<uint32_t*>(job_raw)[threadIdx.x] =
        reinterpret_cast<const uint32_t*>(jobs + blockIdx.x)[threadIdx.x];
  __syncthreads();
  JobView jv;
  TcQuery<D> tq;
  const TcChunk ch = tc_begin<D, F>(job, group_heads, qf, warp == 0, lane, jv, tq);
  const uint32_t h0 = ch.h0;
  const int gh = ch.gh;
  for (uint32_t i = threadIdx.x; i < kTcHeads * D; i += kBlockWarps * 32) acc_s[i] = 0.0f;
  if (threadIdx.x < kTcHeads) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  __syncthreads();
  const int g = lane >> 2, c = lane & 3;
  const bool out_lane = g < gh;  // rows 0-3: head g
  const size_t n_virtual = min(n_tiles(jv.keys), static_cast<size_t>(kVirtual));
  for (size_t round = 0; round * kBlockWarps < n_virtual; ++round) {
    const size_t vw = round * kBlockWarps + warp;
    TcState<D, F> st;
    st.init();
    for (size_t t0 = 32 * vw; t0 < jv.keys.n; t0 += size_t{32} * kVirtual) {
      const int nt = tc_load<D, F, false>(img, jv, t0, lane, 32, [] {});
      tc_tile<D, F>(img, qf, tq, nt, scale, lane, st);
      __syncwarp();
    }
    TcOut<D> out;
    tc_finish<D, F>(st, out);
    for (int w = 0; w < kBlockWarps; ++w) {
      if (warp == w && vw < n_virtual && out_lane) {
        float* acc = acc_s + g * D;
        if (vw == 0) {
          if (c == 0) {
            m_s[g] = out.m;
            l_s[g] = out.l;
          }
#pragma unroll
          for (int i = 0; i < D / 4; ++i) acc[tc_dim<F>(i, c)] = out.o[i];
        } else {
          float mm, a, b;
          fold_weights(m_s[g], out.m, mm, a, b);
#pragma unroll
          for (int i = 0; i < D / 4; ++i)
            acc[tc_dim<F>(i, c)] =
                __fadd_rn(__fmul_rn(acc[tc_dim<F>(i, c)], a), __fmul_rn(out.o[i], b));
          __syncwarp((1u << (4 * gh)) - 1);  // every row's lanes read m_s before c == 0 rewrites it
          if (c == 0) {
            m_s[g] = mm;
            l_s[g] = __fadd_rn(__fmul_rn(l_s[g], a), __fmul_rn(out.l, b));
          }
        }
      }
      __syncthreads();
    }
  }
  for (uint32_t i = threadIdx.x; i < gh * D; i += kBlockWarps * 32) {
    const uint32_t h = i / D;
    const float inv = l_s[h] > 0.0f ? __fdiv_rn(1.0f, l_s[h]) : 0.0f;  // no keys: zeros
    store_out(job, size_t{h0 + h} * D + i % D, __fmul_rn(acc_s[i], inv));
  }
}

// Per-warp tc kernel: a warp per job (prefill), the virtual warps one after
// another, each tile staged into the warp's own image.
template <int D, int F>
__global__ void __launch_bounds__(kTcWarps * 32, 2)
    attention_tc_warp_kernel(const AttentionJob* jobs, size_t n_jobs, uint32_t group_heads,
                             float scale) {
  extern __shared__ __align__(16) float smem[];
  detail::dependency_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t jid = size_t{blockIdx.x} * kTcWarps + warp;
  if (jid >= n_jobs) return;  // no block-wide barrier below
  uint4* qf = reinterpret_cast<uint4*>(smem) + warp * (D / 16) * 32;
  const uint32_t img = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + kTcWarps * D * 32 +
                       warp * TcImage<D, F>::kBytes;
  const AttentionJob& job = jobs[jid];
  JobView jv;
  TcQuery<D> tq;
  const TcChunk ch = tc_begin<D, F>(job, group_heads, qf, true, lane, jv, tq);
  const uint32_t h0 = ch.h0;
  const int gh = ch.gh;
  __syncwarp();
  TcOut<D> run;
  TcState<D, F> st;
  const size_t n_virtual = min(n_tiles(jv.keys), static_cast<size_t>(kVirtual));
  for (size_t w = 0; w < n_virtual; ++w) {
    st.init();
    for (size_t t0 = 32 * w; t0 < jv.keys.n; t0 += size_t{32} * kVirtual) {
      const int nt = tc_load<D, F, false>(img, jv, t0, lane, 32, [] {});
      tc_tile<D, F>(img, qf, tq, nt, scale, lane, st);
      __syncwarp();
    }
    if (w == 0) {
      tc_finish<D, F>(st, run);
      continue;
    }
    TcOut<D> out;
    tc_finish<D, F>(st, out);
    tc_fold<D>(run, out);
  }
  const int g = lane >> 2, c = lane & 3;
  if (g >= gh) return;
  if (n_virtual == 0) run.l = 0.0f;
  const float inv = n_virtual > 0 && run.l > 0.0f ? __fdiv_rn(1.0f, run.l) : 0.0f;
  const size_t o = size_t{h0 + g} * D;
#pragma unroll
  for (int i = 0; i < D / 4; ++i)
    store_out(job, o + tc_dim<F>(i, c), n_virtual > 0 ? __fmul_rn(run.o[i], inv) : 0.0f);
}

// Whether the keys of s are the first s.n keys of l (the same slots in the
// same order): prompt chunks, where each query sees one key more than the
// one before.
__device__ __forceinline__ bool keys_prefix(const Keys& s, const Keys& l) {
  if (s.b0 != l.b0 || s.n > l.n) return false;
  if (s.n <= s.len0) return s.n <= l.len0;
  return s.len0 == l.len0 && s.b1 == l.b1;
}
__device__ __forceinline__ bool same_side(const kernels::KvSide& a, const kernels::KvSide& b) {
  static_assert(sizeof(kernels::KvSide) % 4 == 0);
  const uint32_t* x = reinterpret_cast<const uint32_t*>(&a);
  const uint32_t* y = reinterpret_cast<const uint32_t*>(&b);
  for (size_t i = 0; i < sizeof(kernels::KvSide) / 4; ++i)
    if (x[i] != y[i]) return false;
  return true;
}

// Per-warp tc kernel with shared staging (prefill, dense K/V): a block's
// kTcWarps warps take consecutive jobs as attention_tc_warp_kernel does,
// but where the jobs' keys are prefixes of the longest one's (a prompt
// chunk's queries over the same cache row) the block stages each tile once,
// with all its threads, into one image that every warp computes from.
// A warp whose keys end inside a staged tile (nt below the staged count)
// masks the V fragments past its nt in registers (tc_tile's kMaskV): the
// operands its own staging would have given, so each warp's tiles are
// exactly those of attention_tc_warp_kernel. Blocks whose
// jobs are not prefixes of one another (rows' boundaries, wrapped windows
// of other lengths, decode steps) stage each warp's tiles in turn.
template <int D, int F>
__global__ void __launch_bounds__(kTcWarps * 32, 3)
    attention_tc_shared_kernel(const AttentionJob* jobs, size_t n_jobs, uint32_t group_heads,
                               float scale) {
  static_assert(!tc_aff(F), "dense images (tc_tile's kMaskV)");
  extern __shared__ __align__(16) float smem[];
  __shared__ int longest, all_prefix;
  detail::dependency_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  constexpr int kThreads = kTcWarps * 32;
  const size_t j0 = size_t{blockIdx.x} * kTcWarps;
  const int n_here = static_cast<int>(min(static_cast<size_t>(kTcWarps), n_jobs - j0));
  const bool active = warp < n_here;
  uint4* qf = reinterpret_cast<uint4*>(smem) + warp * (D / 16) * 32;
  const uint32_t img = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + kTcWarps * D * 32;
  JobView jv;
  TcQuery<D> tq;
  TcChunk ch{};
  if (active) ch = tc_begin<D, F>(jobs[j0 + warp], group_heads, qf, true, lane, jv, tq);
  if (tid == 0) {
    Keys k[kTcWarps];
    int lw = 0;
    for (int j = 0; j < n_here; ++j) {
      k[j].init(jobs[j0 + j]);
      if (k[j].n > k[lw].n) lw = j;
    }
    bool ok = true;
    for (int j = 0; j < n_here && ok; ++j)
      ok = j == lw || (keys_prefix(k[j], k[lw]) && same_side(jobs[j0 + j].k, jobs[j0 + lw].k) &&
                       same_side(jobs[j0 + j].v, jobs[j0 + lw].v));
    longest = lw;
    all_prefix = ok;
  }
  __syncthreads();
  const size_t my_n = active ? jv.keys.n : 0;
  const size_t my_nv = min((my_n + 31) / 32, static_cast<size_t>(kVirtual));
  TcOut<D> run;
  TcState<D, F> st;
  const bool shared = all_prefix != 0;
  // Groups of warps that share staging: all of them, or each alone in turn.
  for (int grp = 0; grp < (shared ? 1 : n_here); ++grp) {
    const int src = shared ? longest : grp;
    const bool mine = active && (shared || warp == grp);
    JobView jl;
    jl.init(jobs[j0 + src], blockIdx.y);
    const size_t n_long = jl.keys.n;
    const size_t nv = min((n_long + 31) / 32, static_cast<size_t>(kVirtual));
    for (size_t w = 0; w < nv; ++w) {
      if (mine && w < my_nv) st.init();
      for (size_t t0 = 32 * w; t0 < n_long; t0 += size_t{32} * kVirtual) {
        tc_stage<D, F>(img, tc_ptr(img), jl, t0, tid, kThreads);
        cp_async_wait_all();
        __syncthreads();
        // This warp's keys in the tile (0: none); V rows past them are
        // masked in registers.
        const int nt = mine && t0 < my_n ? static_cast<int>(min(size_t{32}, my_n - t0)) : 0;
        if (nt > 0) tc_tile<D, F, true>(img, qf, tq, nt, scale, lane, st);
        __syncthreads();  // the image is read before the next tile's copies
      }
      if (mine && w < my_nv) {
        if (w == 0) {
          tc_finish<D, F>(st, run);
        } else {
          TcOut<D> out;
          tc_finish<D, F>(st, out);
          tc_fold<D>(run, out);
        }
      }
    }
  }
  if (!active) return;
  const int g = lane >> 2, c = lane & 3;
  if (g >= ch.gh) return;
  if (my_nv == 0) run.l = 0.0f;
  const float inv = my_nv > 0 && run.l > 0.0f ? __fdiv_rn(1.0f, run.l) : 0.0f;
  const size_t o = size_t{ch.h0 + g} * D;
  const AttentionJob& job = jobs[j0 + warp];
#pragma unroll
  for (int i = 0; i < D / 4; ++i)
    store_out(job, o + tc_dim<F>(i, c), my_nv > 0 ? __fmul_rn(run.o[i], inv) : 0.0f);
}

// Split tc kernel: block (job, kv head, chunk of kSplitHeads heads *
// kVirtual + w), a warp per kTcHeads heads of the chunk, one image staged
// by the whole block; states to the workspace for attention_merge_kernel.
template <int D, int F>
__global__ void __launch_bounds__(kSplitHeads / kTcHeads * 32)
    attention_tc_split_kernel(const AttentionJob* jobs, uint32_t group_heads, float scale,
                              float* ws, int early) {
  extern __shared__ __align__(16) float smem[];
  __shared__ __align__(16) unsigned char job_raw[sizeof(AttentionJob)];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const uint32_t w = blockIdx.z % kVirtual, kvh = blockIdx.y;
  const uint32_t hg0 =
      blockIdx.z / kVirtual * kSplitHeads + warp * kTcHeads;  // first head in the group
  const int gh = hg0 < group_heads
                     ? static_cast<int>(min(static_cast<uint32_t>(kTcHeads), group_heads - hg0))
                     : 0;
  const uint32_t h0 = kvh * group_heads + hg0;
  uint4* qf = reinterpret_cast<uint4*>(smem) + warp * (D / 16) * 32;
  const uint32_t img =
      static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + blockDim.x / 32 * D * 32;
  const int tid = static_cast<int>(threadIdx.x), n_threads = static_cast<int>(blockDim.x);
  // With settled jobs (early), the job and a first tile of settled keys
  // are read while the kernel before still runs; with a settled query too
  // (kEarlyCompute), every tile of settled keys is folded then, in the
  // order the loop after the wait would fold it.
  JobView jv;
  TcQuery<D> tq;
  TcState<D, F> st;
  st.init();
  const AttentionJob& job =
      early != kEarlyNone ? *reinterpret_cast<const AttentionJob*>(job_raw) : jobs[blockIdx.x];
  size_t t0 = size_t{32} * w;
  bool staged = false, waited = early == kEarlyNone;
  if (early == kEarlyNone) {
    detail::dependency_wait();
    jv.init(job, kvh);
  } else {
    early_job(job_raw, jobs + blockIdx.x);
    jv.init(job, kvh);
    if (early == kEarlyStage && settled_tile(jv, job, t0)) {
      tc_stage<D, F>(img, tc_ptr(img), jv, t0, tid, n_threads);
      staged = true;
    }
  }
  // One loop, so that the tile's code exists once: a lone warp runs it
  // once a tile from an instruction cache the kernels before have filled
  // with their own code, and at short contexts the fetches of its several
  // thousand instructions, not its arithmetic, set its time (Nsight
  // Compute: most stall samples "no instruction"; two inlined copies of
  // the tile, before and after the wait, made it worse; docs/BENCHMARKS.md,
  // session 30). The dependency wait comes at the first tile that may not
  // be folded before it.
  for (;;) {
    if (!waited && !(early == kEarlyCompute && settled_tile(jv, job, t0))) {
      detail::dependency_wait();
      waited = true;
    }
    if (t0 >= jv.keys.n) break;
    if (!staged) tc_stage<D, F>(img, tc_ptr(img), jv, t0, tid, n_threads);
    const int nt = tc_staged<true>(jv, t0, [&] {
      if (t0 == size_t{32} * w && gh > 0) tc_query<D, F>(qf, true, job, h0, gh, lane, tq);
    });
    if (gh > 0) tc_tile<D, F>(img, qf, tq, nt, scale, lane, st);
    __syncthreads();  // the image is read before the next tile's copies
    staged = false;  // (only the first tile may have been staged before the wait)
    t0 += size_t{32} * kVirtual;
  }
  if (32 * size_t{w} >= jv.keys.n) return;  // no tiles: not folded (uniform over the block)
  if (gh == 0) return;
  TcOut<D> out;
  tc_finish<D, F>(st, out);
  const int g = lane >> 2, c = lane & 3;
  if (g >= gh) return;
  float* o = split_state(ws, blockIdx.x, h0 + g, gridDim.y * group_heads, w, D);
  if (c == 0) {
    o[0] = out.m;
    o[1] = out.l;
  }
#pragma unroll
  for (int i = 0; i < D / 4; ++i) o[kStateHead + tc_dim<F>(i, c)] = out.o[i];
}

template <int D, int F>
void launch_tc(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& s,
               uint32_t group_heads, AttentionVariant variant, float* ws, int early,
               cudaStream_t stream) {
  const unsigned kvh = static_cast<unsigned>(s.n_kv_heads);
  const unsigned chunks = static_cast<unsigned>((group_heads + kTcHeads - 1) / kTcHeads);
  constexpr uint32_t kImg = TcImage<D, F>::kBytes;
  if (variant == AttentionVariant::Split) {
    const uint32_t warps =
        (min(group_heads, static_cast<uint32_t>(kSplitHeads)) + kTcHeads - 1) / kTcHeads;
    const uint32_t split_chunks = (group_heads + kSplitHeads - 1) / kSplitHeads;
    const dim3 grid(static_cast<unsigned>(n_jobs), kvh, split_chunks * kVirtual);
    const size_t smem = warps * D * 32 + kImg;
    raise_smem_limit<attention_tc_split_kernel<D, F>>(smem);
    detail::launch("attention_tc_split_kernel", attention_tc_split_kernel<D, F>, grid, warps * 32,
                   smem, stream, jobs, group_heads, s.scale, ws, early);
    launch_merge(jobs, n_jobs, s, ws, early, stream);
    return;
  }
  if constexpr (!tc_aff(F)) {
    if (variant == AttentionVariant::Shared) {
      const dim3 grid(static_cast<unsigned>((n_jobs + kTcWarps - 1) / kTcWarps), kvh, chunks);
      const size_t smem = kTcWarps * D * 32 + kImg;
      raise_smem_limit<attention_tc_shared_kernel<D, F>>(smem);
      detail::launch("attention_tc_shared_kernel", attention_tc_shared_kernel<D, F>, grid,
                     kTcWarps * 32, smem, stream, jobs, n_jobs, group_heads, s.scale);
      return;
    }
  }
  if (variant == AttentionVariant::PerWarp || variant == AttentionVariant::Shared) {
    const dim3 grid(static_cast<unsigned>((n_jobs + kTcWarps - 1) / kTcWarps), kvh, chunks);
    const size_t smem = kTcWarps * (D * 32 + kImg);
    raise_smem_limit<attention_tc_warp_kernel<D, F>>(smem);
    detail::launch("attention_tc_warp_kernel", attention_tc_warp_kernel<D, F>, grid, kTcWarps * 32,
                   smem, stream, jobs, n_jobs, group_heads, s.scale);
    return;
  }
  const dim3 grid(static_cast<unsigned>(n_jobs), kvh, chunks);
  const size_t smem = (D * 8 + kTcHeads * D + 2 * kTcHeads) * sizeof(float);
  const size_t total = (smem + 15) / 16 * 16 + size_t{kBlockWarps} * kImg;
  auto go = [&](auto kernel) {
    detail::launch("attention_tc_kernel", kernel, grid, kBlockWarps * 32, total, stream, jobs,
                   group_heads, s.scale);
  };
  // Three blocks per SM where their shared memory fits (228 KB, 1 KB each
  // reserved): dense and affine images (8-bit ones since session 21's
  // images without a bf16 V matrix; q8g32 at head_dim 128 spills 12 bytes
  // under that register bound; not measured against two blocks).
  if (n_jobs >= kDenseJobs && 3 * (total + 1024) <= 233472) {
    raise_smem_limit<attention_tc_kernel<D, F, 3>>(total);
    go(attention_tc_kernel<D, F, 3>);
  } else {
    raise_smem_limit<attention_tc_kernel<D, F, 2>>(total);
    go(attention_tc_kernel<D, F, 2>);
  }
}

// The tc family of a call's formats (kTcNone: the scalar kernels).
int tc_family(const AttentionFormats& f, size_t D) {
  static const bool off = knob_off("FERRY_CUDA_ATTN_TC");
  if (off || (D != 64 && D != 128) || f.k.kind != f.v.kind) return kTcNone;
  switch (f.k.kind) {
    case Kind::F16:
      return kTcF16;
    case Kind::BF16:
      return kTcBF16;
    case Kind::Affine:
      if (f.k.bits != f.v.bits || f.k.group != f.v.group || (f.k.group != 32 && f.k.group != 64) ||
          (f.k.bits != 4 && f.k.bits != 8))
        return kTcNone;
      return tc_affine(f.k.bits, f.k.group);
    default:
      return kTcNone;
  }
}

template <int D>
void launch_tc_fam(int fam, const AttentionJob* jobs, size_t n_jobs,
                   const kernels::AttentionShape& s, uint32_t group_heads, AttentionVariant variant,
                   float* ws, int early, cudaStream_t stream) {
  auto go = [&](auto f) {
    launch_tc<D, decltype(f)::value>(jobs, n_jobs, s, group_heads, variant, ws, early, stream);
  };
  switch (fam) {
    case kTcF16:
      return go(std::integral_constant<int, kTcF16>{});
    case kTcBF16:
      return go(std::integral_constant<int, kTcBF16>{});
    case tc_affine(4, 32):
      return go(std::integral_constant<int, tc_affine(4, 32)>{});
    case tc_affine(4, 64):
      return go(std::integral_constant<int, tc_affine(4, 64)>{});
    case tc_affine(8, 32):
      return go(std::integral_constant<int, tc_affine(8, 32)>{});
    default:
      return go(std::integral_constant<int, tc_affine(8, 64)>{});
  }
}

template <int kE, bool kAffine>
void launch_split(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& s,
                  uint32_t group_heads, float* ws, cudaStream_t stream) {
  const uint32_t D = static_cast<uint32_t>(s.head_dim);
  const uint32_t chunks = (group_heads + kSplitHeads - 1) / kSplitHeads;
  const uint32_t warps = min(group_heads, static_cast<uint32_t>(kSplitHeads));
  const dim3 grid(static_cast<unsigned>(n_jobs), static_cast<unsigned>(s.n_kv_heads),
                  chunks * kVirtual);
  const size_t smem = warps * D * sizeof(float) + stage_bytes(D);
  raise_smem_limit<attention_split_kernel<kE, kAffine>>(smem);
  detail::launch("attention_split_kernel", attention_split_kernel<kE, kAffine>, grid, warps * 32,
                 smem, stream, jobs, group_heads, D, s.scale, ws);
  launch_merge(jobs, n_jobs, s, ws, kEarlyNone, stream);
}

template <int kG, int kE, bool kAffine>
void launch(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& s,
            uint32_t group_heads, bool per_warp, cudaStream_t stream) {
  const unsigned chunks = static_cast<unsigned>((group_heads + kG - 1) / kG);
  const unsigned kvh = static_cast<unsigned>(s.n_kv_heads);
  const uint32_t D = static_cast<uint32_t>(s.head_dim);
  if (per_warp) {
    const dim3 grid(static_cast<unsigned>((n_jobs + kWarps - 1) / kWarps), kvh, chunks);
    const size_t smem = size_t{kWarps} * kG * D * sizeof(float);
    // (over 48 KB at D 256, kG 8)
    raise_smem_limit<attention_warp_kernel<kG, kE, kAffine>>(smem);
    detail::launch("attention_warp_kernel", attention_warp_kernel<kG, kE, kAffine>, grid,
                   kWarps * 32, smem, stream, jobs, n_jobs, group_heads, D, s.scale);
    return;
  }
  const dim3 grid(static_cast<unsigned>(n_jobs), kvh, chunks);
  // Per-warp staging buffers up to head_dim 128 (8 x 17 KB); wider heads
  // read the planes directly.
  const uint32_t cap = D <= 128 ? stage_bytes(D) : 0;
  const size_t smem = (2 * kG * s.head_dim + 2 * kG) * sizeof(float);
  const size_t total = (smem + 15) / 16 * 16 + size_t{kBlockWarps} * cap;
  auto go = [&](auto kernel) {
    detail::launch("attention_kernel", kernel, grid, kBlockWarps * 32, total, stream, jobs,
                   group_heads, D, s.scale, cap);
  };
  if (n_jobs >= kDenseJobs) {
    raise_smem_limit<attention_kernel<kG, kE, 3, kAffine>>(total);
    go(attention_kernel<kG, kE, 3, kAffine>);
  } else {
    raise_smem_limit<attention_kernel<kG, kE, 2, kAffine>>(total);
    go(attention_kernel<kG, kE, 2, kAffine>);
  }
}

// Below kFewJobs jobs a block takes one query head, not the GQA group: a
// head's arithmetic is the same in every variant (the kG heads of a block
// are computed independently, each in the order above), so this only trades
// K/V re-reads for parallelism (the per-block variant at few jobs, when no
// workspace allows the split one).

template <int kE, bool kAffine>
void launch_e(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& s,
              uint32_t group_heads, AttentionVariant variant, float* ws, cudaStream_t stream) {
  if (variant == AttentionVariant::Split)
    return launch_split<kE, kAffine>(jobs, n_jobs, s, group_heads, ws, stream);
  const bool per_warp = variant == AttentionVariant::PerWarp || variant == AttentionVariant::Shared;
  if (group_heads == 1 || n_jobs < kFewJobs)
    return launch<1, kE, kAffine>(jobs, n_jobs, s, group_heads, per_warp, stream);
  if (group_heads == 2)
    return launch<2, kE, kAffine>(jobs, n_jobs, s, group_heads, per_warp, stream);
  if (group_heads <= 4)
    return launch<4, kE, kAffine>(jobs, n_jobs, s, group_heads, per_warp, stream);
  return launch<8, kE, kAffine>(jobs, n_jobs, s, group_heads, per_warp, stream);
}

template <bool kAffine>
void launch_d(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& shape,
              uint32_t group_heads, AttentionVariant variant, float* ws, cudaStream_t stream) {
  const size_t D = shape.head_dim;
  if (D <= 64) return launch_e<2, kAffine>(jobs, n_jobs, shape, group_heads, variant, ws, stream);
  if (D <= 128) return launch_e<4, kAffine>(jobs, n_jobs, shape, group_heads, variant, ws, stream);
  return launch_e<8, kAffine>(jobs, n_jobs, shape, group_heads, variant, ws, stream);
}

}  // namespace

// Shared staging for prompt chunks (attention_tc_shared_kernel); off with
// FERRY_CUDA_ATTN_SHARED=0 (for measuring).
static bool shared_staging() {
  static const bool on = !knob_off("FERRY_CUDA_ATTN_SHARED");
  return on;
}

size_t attention_workspace_floats(size_t n_jobs, const kernels::AttentionShape& shape) {
  return n_jobs < kFewJobs ? n_jobs * shape.n_heads * kVirtual * (shape.head_dim + kStateHead) : 0;
}

void attention_variant(const AttentionJob* jobs, size_t n_jobs,
                       const kernels::AttentionShape& shape, const AttentionFormats& formats,
                       AttentionVariant variant, float* workspace, cudaStream_t stream) {
  if (n_jobs == 0) return;
  const size_t D = shape.head_dim;
  FERRY_CHECK(D % 16 == 0 && D > 0 && D <= 256, "attention", "head_dim=", D);
  FERRY_CHECK(
      shape.n_kv_heads > 0 && shape.n_kv_heads <= 65535 && shape.n_heads % shape.n_kv_heads == 0,
      "attention", "n_heads=", shape.n_heads, " n_kv_heads=", shape.n_kv_heads);
  FERRY_CHECK(n_jobs <= 0x7fffffffu, "attention", n_jobs, " jobs");
  static_assert(sizeof(AttentionJob) % 4 == 0 && sizeof(AttentionJob) / 4 <= kBlockWarps * 32);
  const uint32_t group_heads = static_cast<uint32_t>(shape.n_heads / shape.n_kv_heads);
  const int fam = tc_family(formats, D);
  // The tc per-warp kernel overtakes the per-block one from about 256 jobs
  // (gpu_attention_bench, H200: bf16 256 x 1,024 keys 296 against 321 us,
  // q8g64 256 x 128 70 against 84); the scalar one from 512.
  const size_t many = fam != kTcNone ? kManyJobs / 2 : kManyJobs;
  if (variant == AttentionVariant::Auto)
    variant = n_jobs >= many
                  ? (formats.prompt_chunks && shared_staging() ? AttentionVariant::Shared
                                                               : AttentionVariant::PerWarp)
              : workspace && n_jobs < kFewJobs ? AttentionVariant::Split
                                               : AttentionVariant::PerBlock;
  FERRY_CHECK(variant != AttentionVariant::Split || workspace, "attention",
              "the split variant needs a workspace");
  FERRY_CHECK((group_heads + kSplitHeads - 1) / kSplitHeads * size_t{kVirtual} <= 65535,
              "attention", "too many heads per group: ", group_heads);
  if (fam != kTcNone) {
    const int early = !formats.jobs_settled   ? kEarlyNone
                      : formats.query_settled ? kEarlyCompute
                                              : kEarlyStage;
    if (D == 64)
      return launch_tc_fam<64>(fam, jobs, n_jobs, shape, group_heads, variant, workspace, early,
                               stream);
    return launch_tc_fam<128>(fam, jobs, n_jobs, shape, group_heads, variant, workspace, early,
                              stream);
  }
  const bool affine = formats.k.kind == Kind::Affine || formats.v.kind == Kind::Affine;
  if (affine) return launch_d<true>(jobs, n_jobs, shape, group_heads, variant, workspace, stream);
  launch_d<false>(jobs, n_jobs, shape, group_heads, variant, workspace, stream);
}

void attention(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& shape,
               const AttentionFormats& formats, float* workspace, cudaStream_t stream) {
  attention_variant(jobs, n_jobs, shape, formats, AttentionVariant::Auto, workspace, stream);
}

}  // namespace ferry::cuda
