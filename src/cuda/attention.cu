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
//   then one block per (job, query head) folding them (a thread per output
//   dimension, loads issued ahead of the fold chain). Steps of few jobs
//   (single-stream decode), where the others leave most SMs idle and long
//   contexts latency-bound: one warp per tile up to 4k keys.
//
// Determinism: all of that depends only on the job's own keys and shape,
// never on the other jobs or the grid, so a query's output is bit-identical
// alone or in any batch, whichever kernel runs it.
#include <algorithm>

#include "cuda/common_impl.cuh"
#include "cuda/cuda_internal.h"
#include "cuda/ptx_impl.cuh"

namespace ferry::cuda {
namespace {

using namespace detail;
using Kind = kernels::KvFormat::Kind;

constexpr int kWarps = 8;       // warps of attention_warp_kernel's blocks
constexpr int kBlockWarps = 4;  // warps of attention_kernel's blocks
constexpr int kVirtual = 128;  // virtual warps of the contract

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
                                     const Keys& keys, size_t t0, uint32_t D, float scale,
                                     int lane, State<kG, kE, kAffine>& st) {
  const int nt = static_cast<int>(min(size_t{32}, keys.n - t0));
  tile_core<kG, kE, kAffine>(q_s, K, V, [&](int i) { return keys.slot(t0 + i); }, nt, D, scale,
                             lane, st);
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
    if (c == 16) cp_async_ca<16>(d, src);
    else if (c == 8) cp_async_ca<8>(d, src);
    else if (c == 4) cp_async_ca<4>(d, src);
    else *reinterpret_cast<uint16_t*>(dst + r * pitch + k * c) = static_cast<uint16_t>(ld_u16(src));
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
                                           const SideView& V, const Keys& keys, size_t t0,
                                           int tid, int n_threads) {
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
  tile_core<kG, kE, kAffine>(q_s, sg.view(K, 0, buf), sg.view(V, 1, buf),
                             [](int i) { return size_t(i); },
                    nt, D, scale, lane, st);
  __syncwarp();  // every lane is done with the image before the next tile overwrites it
}

// q_s[h][D] = the job's query heads h0 .. h0 + gh - 1 (zeros past gh), by
// threads first, first + step, ...
// Writes output element i (= head * D + dim) of a job, and its bf16
// rounding where the job asks for one.
__device__ __forceinline__ void store_out(const AttentionJob& job, size_t i, float v) {
  job.out[i] = v;
  if (job.out_bf16) job.out_bf16[i] = f2bf(v);
}

template <int kG>
__device__ __forceinline__ void load_query(float* q_s, const AttentionJob& job, uint32_t h0,
                                           int gh, uint32_t D, uint32_t first, uint32_t step) {
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
    attention_warp_kernel(const AttentionJob* jobs, size_t n_jobs, uint32_t group_heads,
                          uint32_t D, float scale) {
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
// warp) one state [m, l, acc[D]].
__device__ __forceinline__ float* split_state(float* ws, size_t job, uint32_t head,
                                              uint32_t n_heads, uint32_t w, uint32_t D) {
  return ws + ((job * n_heads + head) * kVirtual + w) * (D + 2);
}

// One virtual warp of a (job, kv head)'s query heads: block (job, kv head,
// chunk of up to kSplitHeads heads of the GQA group * kVirtual + w), a warp
// per query head. The block stages each tile of K and V once for all its
// heads (stage_tile), then every warp scores it with its own query.
constexpr int kSplitHeads = 8;
template <int kE, bool kAffine>
__global__ void __launch_bounds__(kSplitHeads * 32, kAffine ? 2 : 4)
    attention_split_kernel(const AttentionJob* jobs, uint32_t group_heads, uint32_t D,
                           float scale, float* ws) {
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
      tile_core<1, kE, kAffine>(q_s, sg.view(jv.k, 0, buf), sg.view(jv.v, 1, buf),
                       [](int i) { return size_t(i); }, nt, D, scale, lane, st);
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
    for (int e = 0; e < kE; ++e) o[2 + d0 + e] = st.acc[0][e];
}

// Folds a (job, query head)'s virtual warps in order: block (job, head),
// a thread per output dimension. The fold of state w into the running one
// uses the running max M(w-1) = max(m_0 .. m_(w-1)) (fold_weights: a_w =
// exp(M(w-1) - M(w)), b_w = exp(m_w - M(w))); the maxima are exact in any
// order, so thread w computes a_w and b_w for all dimensions at once, and
// each thread's chain over w is only acc = acc * a_w + st_w * b_w, with the
// states' loads issued kMergeAhead ahead.
constexpr int kMergeAhead = 16;
__global__ void __launch_bounds__(256)
    attention_merge_kernel(const AttentionJob* jobs, uint32_t D, const float* ws) {
  __shared__ float a_s[kVirtual], b_s[kVirtual], m_s[kVirtual];
  detail::dependency_wait();
  const uint32_t d = threadIdx.x;
  const AttentionJob& job = jobs[blockIdx.x];
  Keys keys;
  keys.init(job);
  const uint32_t h = blockIdx.y;
  const bool v_lane = d < D;
  const uint32_t n_virtual = static_cast<uint32_t>(min(n_tiles(keys), static_cast<size_t>(kVirtual)));
  const float* base = split_state(const_cast<float*>(ws), blockIdx.x, h, gridDim.y, 0, D);
  const size_t pitch = D + 2;
  if (n_virtual == 0) {  // a job without keys writes zeros
    if (v_lane) store_out(job, size_t{h} * D + d, 0.0f);
    return;
  }
  // M(w) by a max-scan over the block's first kVirtual threads (blockDim >=
  // kVirtual), then thread w's weights.
  __shared__ float warp_max_s[kVirtual / 32];
  const uint32_t lane = d % 32, warp = d / 32;
  const float m_w = d < n_virtual ? base[d * pitch] : -INFINITY;
  float mv = m_w;
#pragma unroll
  for (uint32_t off = 1; off < 32; off *= 2) {
    const float o = __shfl_up_sync(0xffffffffu, mv, off);
    if (lane >= off) mv = fmaxf(mv, o);
  }
  if (lane == 31 && warp < kVirtual / 32) warp_max_s[warp] = mv;
  __syncthreads();
  if (d < kVirtual) {
    for (uint32_t k = 0; k < warp; ++k) mv = fmaxf(mv, warp_max_s[k]);
    m_s[d] = mv;
  }
  __syncthreads();
  if (d >= 1 && d < n_virtual) {
    float mm, a, b;
    fold_weights(m_s[d - 1], m_w, mm, a, b);
    a_s[d] = a;
    b_s[d] = b;
  }
  __syncthreads();
  float l_run = base[1], acc_run = v_lane ? base[2 + d] : 0.0f;
  for (uint32_t w0 = 1; w0 < n_virtual; w0 += kMergeAhead) {
    float l[kMergeAhead], acc[kMergeAhead];
#pragma unroll
    for (int i = 0; i < kMergeAhead; ++i) {
      const float* st = base + (w0 + i) * pitch;
      const bool in = w0 + i < n_virtual;
      l[i] = in ? st[1] : 0.0f;
      acc[i] = in && v_lane ? st[2 + d] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kMergeAhead; ++i) {
      if (w0 + i >= n_virtual) break;
      const float a = a_s[w0 + i], b = b_s[w0 + i];
      acc_run = __fadd_rn(__fmul_rn(acc_run, a), __fmul_rn(acc[i], b));
      l_run = __fadd_rn(__fmul_rn(l_run, a), __fmul_rn(l[i], b));
    }
  }
  if (!v_lane) return;
  const float inv = l_run > 0.0f ? __fdiv_rn(1.0f, l_run) : 0.0f;
  store_out(job, size_t{h} * D + d, __fmul_rn(acc_run, inv));
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
  const dim3 mgrid(static_cast<unsigned>(n_jobs), static_cast<unsigned>(s.n_heads));
  detail::launch("attention_merge_kernel", attention_merge_kernel, mgrid,
                 std::max<uint32_t>(kVirtual, (D + 31) / 32 * 32), 0, stream, jobs, D,
                 static_cast<const float*>(ws));
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
  const bool per_warp = variant == AttentionVariant::PerWarp;
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

size_t attention_workspace_floats(size_t n_jobs, const kernels::AttentionShape& shape) {
  return n_jobs < kFewJobs ? n_jobs * shape.n_heads * kVirtual * (shape.head_dim + 2) : 0;
}

void attention_variant(const AttentionJob* jobs, size_t n_jobs,
                       const kernels::AttentionShape& shape, bool affine,
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
  if (variant == AttentionVariant::Auto)
    variant = n_jobs >= kManyJobs                         ? AttentionVariant::PerWarp
              : workspace && n_jobs < kFewJobs            ? AttentionVariant::Split
                                                          : AttentionVariant::PerBlock;
  FERRY_CHECK(variant != AttentionVariant::Split || workspace, "attention",
              "the split variant needs a workspace");
  FERRY_CHECK((group_heads + kSplitHeads - 1) / kSplitHeads * size_t{kVirtual} <= 65535,
              "attention", "too many heads per group: ", group_heads);
  if (affine) return launch_d<true>(jobs, n_jobs, shape, group_heads, variant, workspace, stream);
  launch_d<false>(jobs, n_jobs, shape, group_heads, variant, workspace, stream);
}

void attention(const AttentionJob* jobs, size_t n_jobs, const kernels::AttentionShape& shape,
               bool affine, float* workspace, cudaStream_t stream) {
  attention_variant(jobs, n_jobs, shape, affine, AttentionVariant::Auto, workspace, stream);
}

}  // namespace ferry::cuda
