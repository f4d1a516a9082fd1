// MatmulMode::Int8 on the GPU: Q4_K / Q6_K weights against int8-quantized
// activations, integer dot products on the tensor cores (cuda_ops.h:
// quantize_q8, matmul_q8).
//
// Arithmetic of one output (the determinism contract). The weight row is a
// sequence of super-blocks (256 elements), each a sequence of pieces p
// (Q4_K: its 8 sub-blocks of 32 elements; Q6_K: its 16 runs of 16), each
// with integer codes q (Q4_K: 0..15; Q6_K: q - 32, in -32..31), a scale
// dw_p = d * sc_p (f32 product of the f16 d and the integer sub-block
// scale, as the decoders form it) and for Q4_K a min m_p = dmin * mn_p.
// Piece p lies inside activation block b (32 elements: codes c, scale dx_b,
// dsum_b). Then
//   isum_p = sum_i q_i * c_i                    exact int32 (any order)
//   y = +0
//   for each super-block, in increasing order:
//     part = +0
//     for p in the super-block, in increasing order:
//       part = fma(dw_p * dx_b, float(isum_p), part)
//       part = fma(-m_p, dsum_b, part)             (Q4_K)
//     y = y + part
// Every step is one IEEE operation (__fmul_rn, __fmaf_rn, __fadd_rn:
// nothing left for nvcc to contract) and the integer sums are exact
// whatever the tensor core's or dp4a's internal order, so y[r, j] depends
// only on row r of x and row j of W, not on n_rows, r's position, the
// kernel or its tile variant (the tests bit-compare every variant with a
// host evaluation of the formula above). Parts per super-block let the
// few-row kernel put one thread on each (column, super-block) and still
// add the parts in the one order. isum fits easily: |isum| <=
// 32 * 15 * 127 (Q4_K), 16 * 32 * 127 (Q6_K), far below 2^24, so
// float(isum) is exact too.
//
// Kernels. Few rows (up to 4; up to 8 on products of at most 4096
// columns): matvec_q8_kernel (dp4a, described there). More:
// matmul_q8_kernel on the tensor cores, in the orientation of matmul_tc
// ("swap-AB"): the mma computes
// D[m, n] = A[m, k] B[k, n] with A = the weight's codes (m = output column)
// and B = the activation codes (n = activation row). One k32 mma
// (m16n8k32.s8) is exactly one Q4_K sub-block; Q6_K takes one k16 mma per
// piece. The accumulator of each mma starts at zero, so its result is
// isum_p; the thread that holds D[m, n] then applies the float steps to
// its part, and adds the part to y at the end of each super-block.
// A fragments are built in registers straight from the weight's packed
// bytes in shared memory (nibbles masked, Q6_K's high bit pairs merged and
// 32 subtracted bytewise), so nothing is unpacked to memory.
//
// Tiles and pipeline. A CTA owns bm output columns x bn rows and the whole
// K; each stage is one super-block (256 k): the bm weight rows' bytes of it
// (Q4_K: 144 B, 16-byte aligned; Q6_K: the 16-byte-aligned window of 224 B
// around its 210 B, whose offset the readers add back), the bn activation
// rows' 256 codes (row pitch 272 B so the 8 rows of a fragment hit 8 bank
// groups) and their 8 dx (and dsum) values, all by 16-byte cp.async,
// `stages` deep. Out-of-range rows and columns are zero-filled and never
// stored.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>

#include "cuda/gguf_unit_impl.cuh"
#include "cuda/matmul_q8.cuh"
#include "cuda/ptx_impl.cuh"

namespace ferry::cuda {
namespace q8 {
namespace {

using namespace detail;

constexpr int kXPitch = 272;  // smem bytes per activation row per stage (256 codes)

// The weight side of a stage, per type.
template <DType T>
struct WeightLayout;
template <>
struct WeightLayout<DType::Q4_K> {
  static constexpr int kBytes = 144;  // per super-block
  static constexpr int kChunks = 9;   // 16-byte copies per row per stage
  static constexpr int kPitch = 144;  // smem bytes per row (36 words: conflict-free)
  static constexpr bool kMin = true;
};
template <>
struct WeightLayout<DType::Q6_K> {
  static constexpr int kBytes = 210;
  static constexpr int kChunks = 14;  // the aligned window: offset (even, < 16) + 210 <= 224
  static constexpr int kPitch = 240;  // 60 words: rows g = 0..7 in distinct bank groups
  static constexpr bool kMin = false;
};

// One pipeline stage (one super-block of K) for bm weight rows and bn
// activation rows, copied by `threads` threads.
template <DType T, int BM, int BN, int THREADS>
struct Stage {
  using L = WeightLayout<T>;
  static constexpr int kThreads = THREADS;
  static constexpr int kWBytes = BM * L::kPitch;
  static constexpr int kXBytes = BN * kXPitch;
  static constexpr int kDBytes = BN * 32;  // 8 floats per row
  static constexpr int kStageBytes = kWBytes + kXBytes + kDBytes * (L::kMin ? 2 : 1);
  // Copies per stage: weight chunks, code chunks, dx chunks, dsum chunks.
  static constexpr int kWCopies = BM * L::kChunks, kXCopies = BN * 16, kDCopies = BN * 2;
  static constexpr int kCopies = kWCopies + kXCopies + kDCopies * (L::kMin ? 2 : 1);
  static_assert(kStageBytes % 16 == 0, "stages stay 16-byte aligned");
};

// The tensor-core kernel's tiles: wm x wn warps, each a warp tile of whole
// m16 x n8 mma tiles.
template <DType T, int BM, int BN, int WM, int WN, int STAGES>
struct Tile : Stage<T, BM, BN, WM * WN * 32> {
  static constexpr int kTM = BM / WM, kTN = BN / WN;   // warp tile
  static constexpr int kMT = kTM / 16, kNT = kTN / 8;  // m16 / n8 tiles per warp
  static constexpr size_t kSmemBytes = size_t{STAGES} * Tile::kStageBytes;
  static_assert(kTM % 16 == 0 && kTN % 8 == 0, "warp tile must be whole m16 x n8 tiles");
  static_assert(STAGES >= 2, "pipeline");
};

// N consecutive 32-bit words of shared memory from an even byte address.
template <int N>
__device__ __forceinline__ void ld_shared_words(const uint8_t* p, uint32_t (&w)[N]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* q = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
  const uint32_t sh = 8 * static_cast<uint32_t>(a & 3);
  uint32_t prev = q[0];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const uint32_t next = q[k + 1];
    w[k] = __funnelshift_r(prev, next, sh);
    prev = next;
  }
}

// One such word (Q6_K windows start at an even offset).
__device__ __forceinline__ uint32_t ld_shared_u32(const uint8_t* p) {
  uint32_t w[1];
  ld_shared_words(p, w);
  return w[0];
}

// float(v) for |v| < 2^22, exactly as the conversion instruction gives it,
// but on the integer and FP32 pipes: v + 1.5 * 2^23 has v in its low
// mantissa bits, and subtracting 1.5 * 2^23 is exact. (I2F runs at a
// quarter of the FP32 rate and would bound the mma kernel's epilogue.)
__device__ __forceinline__ float exact_float(int32_t v) {
  return __fsub_rn(__int_as_float(v + 0x4b400000), 12582912.0f);
}

constexpr int kMaxWeights = 4;  // weights of one type and n_in in one launch

// A launch: up to kMaxWeights weights (their column tiles follow one
// another in the grid, tiles[i] per weight for the variant launched) and
// the quantized rows.
struct Params {
  size_t row_bytes;
  const int8_t* codes;
  const float* d;
  const float* dsum;
  uint32_t n_in, n_rows, row_tiles;
  const uint8_t* ws[kMaxWeights];
  float* ys[kMaxWeights];
  uint32_t n_outs[kMaxWeights], tiles[kMaxWeights];
  int n_weights;
};

// The weight of a CTA's column tile (kept out of Params: writing to a
// kernel parameter would copy the whole struct to local memory).
struct Target {
  const uint8_t* w;
  float* y;
  uint32_t n_out;
  uint32_t tile;  // the CTA's column tile within the weight
};
__device__ __forceinline__ Target select(const Params& p) {
  uint32_t tile = blockIdx.x / p.row_tiles;
  int i = 0;
  while (tile >= p.tiles[i]) tile -= p.tiles[i++];
  return {p.ws[i], p.ys[i], p.n_outs[i], tile};
}

// Issues the copies of super-block sb into the stage at smem address st.
template <DType T, class Tl>
__device__ __forceinline__ void issue_stage(const Params& p, const Target& t, uint32_t st,
                                            uint32_t sb, uint32_t j0, uint32_t r0) {
  using L = WeightLayout<T>;
  const uint32_t nb = p.n_in / 32;
  for (int i = static_cast<int>(threadIdx.x); i < Tl::kCopies; i += Tl::kThreads) {
    if (i < Tl::kWCopies) {
      const int row = i / L::kChunks, c = i % L::kChunks;
      const uint32_t j = j0 + row;
      const bool ok = j < t.n_out;
      const uintptr_t a =
          reinterpret_cast<uintptr_t>(t.w + (ok ? j : 0) * p.row_bytes + size_t{sb} * L::kBytes);
      const void* src = reinterpret_cast<const void*>((a & ~uintptr_t{15}) + 16 * c);
      cp_async16(st + row * L::kPitch + 16 * c, src, ok);
      continue;
    }
    int k = i - Tl::kWCopies;
    if (k < Tl::kXCopies) {
      const int row = k / 16, c = k % 16;
      const uint32_t r = r0 + row;
      const bool ok = r < p.n_rows;
      const int8_t* src = p.codes + size_t{ok ? r : 0} * p.n_in + size_t{sb} * 256 + 16 * c;
      cp_async16(st + Tl::kWBytes + row * kXPitch + 16 * c, src, ok);
      continue;
    }
    k -= Tl::kXCopies;
    const int which = k / Tl::kDCopies;  // 0: d, 1: dsum
    k %= Tl::kDCopies;
    const int row = k / 2, c = k % 2;
    const uint32_t r = r0 + row;
    const bool ok = r < p.n_rows;
    const float* src = (which ? p.dsum : p.d) + size_t{ok ? r : 0} * nb + size_t{sb} * 8 + 4 * c;
    cp_async16(st + Tl::kWBytes + Tl::kXBytes + which * Tl::kDBytes + row * 32 + 16 * c, src, ok);
  }
}

// One super-block of Q4_K for a warp tile: 8 k32 mma per (m16, n8) tile.
template <class Tl>
__device__ __forceinline__ void stage_q4_k(float (&acc)[Tl::kMT][Tl::kNT][4], const uint8_t* sw,
                                           const uint8_t* sx, const float* sdx, const float* sds,
                                           int a_row0, int b_row0, int g, int c) {
  // Per owned weight row (g and g + 8 of each m16 tile): d, dmin, scales.
  float d[Tl::kMT][2], dmin[Tl::kMT][2];
  uint32_t sc_words[Tl::kMT][2][3];
#pragma unroll
  for (int mt = 0; mt < Tl::kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* wr = sw + (a_row0 + mt * 16 + g + 8 * h) * 144;
      const uint4 head = *reinterpret_cast<const uint4*>(wr);
      d[mt][h] = h2f(static_cast<uint16_t>(head.x & 0xffff));
      dmin[mt][h] = h2f(static_cast<uint16_t>(head.x >> 16));
      sc_words[mt][h][0] = head.y;
      sc_words[mt][h][1] = head.z;
      sc_words[mt][h][2] = head.w;
    }
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    uint32_t b[Tl::kNT][2];
    float dx[Tl::kNT][2], ds[Tl::kNT][2];
#pragma unroll
    for (int nt = 0; nt < Tl::kNT; ++nt) {
      const uint8_t* xr = sx + (b_row0 + nt * 8 + g) * kXPitch + 32 * s + 4 * c;
      b[nt][0] = *reinterpret_cast<const uint32_t*>(xr);
      b[nt][1] = *reinterpret_cast<const uint32_t*>(xr + 16);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = b_row0 + nt * 8 + 2 * c + e;
        dx[nt][e] = sdx[row * 8 + s];
        ds[nt][e] = sds[row * 8 + s];
      }
    }
    const int shift = 4 * (s & 1);
#pragma unroll
    for (int mt = 0; mt < Tl::kMT; ++mt) {
      uint32_t a[4];
      float dw[2], nm[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* q = sw + (a_row0 + mt * 16 + g + 8 * h) * 144 + 16 + 32 * (s / 2) + 4 * c;
        a[h] = (*reinterpret_cast<const uint32_t*>(q) >> shift) & 0x0f0f0f0fu;
        a[2 + h] = (*reinterpret_cast<const uint32_t*>(q + 16) >> shift) & 0x0f0f0f0fu;
        uint32_t sc, mn;
        k_scale_min(s, sc_words[mt][h], &sc, &mn);
        dw[h] = __fmul_rn(d[mt][h], static_cast<float>(sc));
        nm[h] = -__fmul_rn(dmin[mt][h], static_cast<float>(mn));
      }
#pragma unroll
      for (int nt = 0; nt < Tl::kNT; ++nt) {
        int32_t isum[4] = {0, 0, 0, 0};
        mma_s8_k32(isum, a, b[nt][0], b[nt][1]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float t = __fmul_rn(dw[e / 2], dx[nt][e % 2]);
          float v = __fmaf_rn(t, exact_float(isum[e]), acc[mt][nt][e]);
          acc[mt][nt][e] = __fmaf_rn(nm[e / 2], ds[nt][e % 2], v);
        }
      }
    }
  }
}

// One super-block of Q6_K: 16 k16 mma per (m16, n8) tile. Piece p covers
// elements 16p..16p+15: unit u = p / 2 = 4 half + m, i = 16 (p % 2) + 0..15
// (gguf_unit_impl.cuh): low nibble (m >> 1) of ql[64 half + 32 (m & 1) + i],
// bits 2m of qh[32 half + i], scale sc[p].
template <class Tl>
__device__ __forceinline__ void stage_q6_k(float (&acc)[Tl::kMT][Tl::kNT][4], const uint8_t* sw,
                                           const uint8_t* sx, const float* sdx,
                                           const uint32_t (&off)[Tl::kMT][2], int a_row0,
                                           int b_row0, int g, int c) {
  const uint8_t* base[Tl::kMT][2];
  float d[Tl::kMT][2];
  uint32_t sc_words[Tl::kMT][2][4];
#pragma unroll
  for (int mt = 0; mt < Tl::kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      base[mt][h] = sw + (a_row0 + mt * 16 + g + 8 * h) * 240 + off[mt][h];
      d[mt][h] = h2f(static_cast<uint16_t>(ld_shared_u32(base[mt][h] + 208) & 0xffff));
#pragma unroll
      for (int i = 0; i < 4; ++i) sc_words[mt][h][i] = ld_shared_u32(base[mt][h] + 192 + 4 * i);
    }
#pragma unroll
  for (int p = 0; p < 16; ++p) {
    const int u = p / 2, half = u / 4, m = u % 4, ih = p % 2;
    uint32_t b[Tl::kNT];
    float dx[Tl::kNT][2];
#pragma unroll
    for (int nt = 0; nt < Tl::kNT; ++nt) {
      b[nt] =
          *reinterpret_cast<const uint32_t*>(sx + (b_row0 + nt * 8 + g) * kXPitch + 16 * p + 4 * c);
#pragma unroll
      for (int e = 0; e < 2; ++e) dx[nt][e] = sdx[(b_row0 + nt * 8 + 2 * c + e) * 8 + p / 2];
    }
#pragma unroll
    for (int mt = 0; mt < Tl::kMT; ++mt) {
      uint32_t a[2];
      float dw[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* bp = base[mt][h];
        const uint32_t ql = ld_shared_u32(bp + 64 * half + 32 * (m & 1) + 16 * ih + 4 * c);
        const uint32_t qh = ld_shared_u32(bp + 128 + 32 * half + 16 * ih + 4 * c);
        const uint32_t v =
            ((ql >> (4 * (m >> 1))) & 0x0f0f0f0fu) | (((qh >> (2 * m)) & 0x03030303u) << 4);
        a[h] = __vsub4(v, 0x20202020u);  // q - 32 per byte, two's complement
        const int8_t sc = static_cast<int8_t>((sc_words[mt][h][p / 4] >> (8 * (p % 4))) & 0xff);
        dw[h] = __fmul_rn(d[mt][h], static_cast<float>(sc));
      }
#pragma unroll
      for (int nt = 0; nt < Tl::kNT; ++nt) {
        int32_t isum[4] = {0, 0, 0, 0};
        mma_s8_k16(isum, a[0], a[1], b[nt]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float t = __fmul_rn(dw[e / 2], dx[nt][e % 2]);
          acc[mt][nt][e] = __fmaf_rn(t, exact_float(isum[e]), acc[mt][nt][e]);
        }
      }
    }
  }
}

// Where super-block sb of weight row j starts inside its stage window
// (0 for Q4_K, whose rows and super-blocks are 16-byte aligned).
template <DType T>
__device__ __forceinline__ uint32_t window_offset(const Params& p, const Target& t, uint32_t j,
                                                  uint32_t sb) {
  if constexpr (T == DType::Q4_K) return 0;
  const uintptr_t a = reinterpret_cast<uintptr_t>(t.w + (j < t.n_out ? j : 0) * p.row_bytes +
                                                  size_t{sb} * WeightLayout<T>::kBytes);
  return static_cast<uint32_t>(a & 15);
}

// The K loop shared by both kernels. Stage s (super-block s) lives in slot
// s % STAGES. Iteration sb waits until super-block sb has landed (at most
// STAGES - 2 groups in flight), a barrier makes it visible and marks slot
// (sb - 1) % STAGES free (every warp finished iteration sb - 1), then the
// copies of super-block sb + STAGES - 1 go into that slot and
// compute(stage, sb) runs. Every iteration commits one group (empty past
// the end), so the wait count never changes.
template <DType T, class S, int STAGES, class F>
__device__ __forceinline__ void k_loop(const Params& p, const Target& t, uint32_t j0, uint32_t r0,
                                       F&& compute) {
  static_assert(STAGES >= 2, "pipeline");
  extern __shared__ uint4 smem_raw[];
  const uint8_t* smem = reinterpret_cast<const uint8_t*>(smem_raw);
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t n_sb = p.n_in / 256;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (static_cast<uint32_t>(s) < n_sb)
      issue_stage<T, S>(p, t, smem_addr + s * S::kStageBytes, s, j0, r0);
    cp_async_commit();
  }
  for (uint32_t sb = 0; sb < n_sb; ++sb) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const uint32_t next = sb + STAGES - 1;
    if (next < n_sb)
      issue_stage<T, S>(p, t, smem_addr + (next % STAGES) * S::kStageBytes, next, j0, r0);
    cp_async_commit();
    compute(smem + (sb % STAGES) * S::kStageBytes, sb);
  }
  cp_async_wait<0>();
}

// Many rows: warp tiles of m16 x n8 int8 mma tiles.
template <DType T, int BM, int BN, int WM, int WN, int STAGES>
__global__ void __launch_bounds__(Tile<T, BM, BN, WM, WN, STAGES>::kThreads)
    matmul_q8_kernel(const Params p) {
  detail::dependency_wait();
  const Target t = select(p);
  using Tl = Tile<T, BM, BN, WM, WN, STAGES>;
  const uint32_t r0 = (blockIdx.x % p.row_tiles) * BN;
  const uint32_t j0 = t.tile * BM;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, c = lane % 4;
  const int a_row0 = (warp % WM) * Tl::kTM, b_row0 = (warp / WM) * Tl::kTN;

  float acc[Tl::kMT][Tl::kNT][4];
#pragma unroll
  for (int mt = 0; mt < Tl::kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < Tl::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  k_loop<T, Tl, STAGES>(p, t, j0, r0, [&](const uint8_t* st, uint32_t sb) {
    const uint8_t* sx = st + Tl::kWBytes;
    const float* sdx = reinterpret_cast<const float*>(st + Tl::kWBytes + Tl::kXBytes);
    float part[Tl::kMT][Tl::kNT][4];  // this super-block's chain
#pragma unroll
    for (int mt = 0; mt < Tl::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < Tl::kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[mt][nt][e] = 0.0f;
    if constexpr (T == DType::Q4_K) {
      stage_q4_k<Tl>(part, st, sx, sdx, sdx + BN * 8, a_row0, b_row0, g, c);
    } else {
      uint32_t off[Tl::kMT][2];
#pragma unroll
      for (int mt = 0; mt < Tl::kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          off[mt][h] = window_offset<T>(p, t, j0 + a_row0 + mt * 16 + g + 8 * h, sb);
      stage_q6_k<Tl>(part, st, sx, sdx, off, a_row0, b_row0, g, c);
    }
#pragma unroll
    for (int mt = 0; mt < Tl::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < Tl::kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = __fadd_rn(acc[mt][nt][e], part[mt][nt][e]);
  });

#pragma unroll
  for (int mt = 0; mt < Tl::kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < Tl::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t j = j0 + a_row0 + mt * 16 + g + 8 * (e / 2);
        const uint32_t r = r0 + b_row0 + nt * 8 + 2 * c + e % 2;
        if (j < t.n_out && r < p.n_rows) t.y[size_t{r} * t.n_out + j] = acc[mt][nt][e];
      }
}

// The dot of 8 code words (32 int8 codes) or 4, against activation codes.
template <int N>
__device__ __forceinline__ int32_t dot_words(const uint32_t* w, const uint8_t* x) {
  int32_t isum = 0;
#pragma unroll
  for (int k = 0; k < N; k += 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(x + 4 * k);
    isum = __dp4a(static_cast<int>(w[k]), static_cast<int>(v.x), isum);
    isum = __dp4a(static_cast<int>(w[k + 1]), static_cast<int>(v.y), isum);
    isum = __dp4a(static_cast<int>(w[k + 2]), static_cast<int>(v.z), isum);
    isum = __dp4a(static_cast<int>(w[k + 3]), static_cast<int>(v.w), isum);
  }
  return isum;
}

// One super-block of one Q4_K weight row (at w) for NR activation rows.
// Activation row r's codes of the super-block are at sx + r * XP, its 8
// block scales at sdx[r * DP ...] (and sds).
template <int NR, int XP, int DP>
__device__ __forceinline__ void lane_q4_k(float (&acc)[NR], const uint8_t* w, const uint8_t* sx,
                                          const float* sdx, const float* sds) {
  const uint4 head = *reinterpret_cast<const uint4*>(w);
  const float d = h2f(static_cast<uint16_t>(head.x & 0xffff));
  const float dmin = h2f(static_cast<uint16_t>(head.x >> 16));
  const uint32_t sc_words[3] = {head.y, head.z, head.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // sub-blocks 2i (low nibbles) and 2i + 1 (high)
    const uint4 q0 = *reinterpret_cast<const uint4*>(w + 16 + 32 * i);
    const uint4 q1 = *reinterpret_cast<const uint4*>(w + 32 + 32 * i);
    const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int s = 2 * i + h;
      uint32_t codes[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) codes[k] = (q[k] >> (4 * h)) & 0x0f0f0f0fu;
      uint32_t sc, mn;
      k_scale_min(s, sc_words, &sc, &mn);
      const float dw = __fmul_rn(d, static_cast<float>(sc));
      const float nm = -__fmul_rn(dmin, static_cast<float>(mn));
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const int32_t isum = dot_words<8>(codes, sx + r * XP + 32 * s);
        const float t = __fmul_rn(dw, sdx[r * DP + s]);
        const float v = __fmaf_rn(t, exact_float(isum), acc[r]);
        acc[r] = __fmaf_rn(nm, sds[r * DP + s], v);
      }
    }
  }
}

// One super-block of one Q6_K weight row (its window starts at w) for NR
// activation rows; pieces 2u and 2u + 1 are the halves of unit u.
template <int NR, int XP, int DP>
__device__ __forceinline__ void lane_q6_k(float (&acc)[NR], const uint8_t* w, const uint8_t* sx,
                                          const float* sdx) {
  uint32_t tail[5];  // scales (16 bytes), then d
  ld_shared_words(w + 192, tail);
  const float d = h2f(static_cast<uint16_t>(tail[4] & 0xffff));
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int half = u / 4, m = u % 4;
    uint32_t ql[8], qh[8], codes[8];
    ld_shared_words(w + 64 * half + 32 * (m & 1), ql);
    ld_shared_words(w + 128 + 32 * half, qh);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      codes[k] = __vsub4(
          ((ql[k] >> (4 * (m >> 1))) & 0x0f0f0f0fu) | (((qh[k] >> (2 * m)) & 0x03030303u) << 4),
          0x20202020u);
#pragma unroll
    for (int ih = 0; ih < 2; ++ih) {
      const int p = 2 * u + ih;
      const int8_t sc = static_cast<int8_t>((tail[p / 4] >> (8 * (p % 4))) & 0xff);
      const float dw = __fmul_rn(d, static_cast<float>(sc));
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const int32_t isum = dot_words<4>(codes + 4 * ih, sx + r * XP + 32 * u + 16 * ih);
        const float t = __fmul_rn(dw, sdx[r * DP + u]);
        acc[r] = __fmaf_rn(t, exact_float(isum), acc[r]);
      }
    }
  }
}

// Few rows: one thread per (output column, super-block), integer sums by
// dp4a (the same exact integers as the mma), the same per-super-block
// chain; then one thread per row adds the column's super-block parts in
// order. A CTA of kVWarps warps owns kVWarps * CPW columns; each warp
// walks its CPW columns chunk by chunk (32 super-blocks, lane l taking
// super-block 32 ch + l), the weight bytes of the next (column, chunk)
// copied into shared memory (cp.async, double-buffered per warp) while the
// current one is computed. The activation codes of a chunk are staged once
// per CTA for all its columns.
constexpr int kVWarps = 4;
constexpr int kVChunk = 32;  // super-blocks per chunk (one per lane)
template <DType T>
constexpr int v_wbuf_bytes() {  // one (column, chunk) of weight bytes, 16-byte windowed
  return (kVChunk * WeightLayout<T>::kBytes + 15 + 15) / 16 * 16;
}
template <DType T, int NR>
constexpr size_t v_smem_bytes() {
  return size_t{kVWarps} * 2 * v_wbuf_bytes<T>() +  // weights
         size_t{NR} * kVChunk * kXPitch +           // codes
         size_t{NR} * kVChunk * 8 * 4 * 2 +         // dx, dsum
         size_t{kVWarps} * NR * kVChunk * 4;        // parts
}

template <DType T, int NR, int CPW>
__global__ void __launch_bounds__(kVWarps * 32) matvec_q8_kernel(const Params p) {
  const Target tg = select(p);
  using L = WeightLayout<T>;
  constexpr int kWBuf = v_wbuf_bytes<T>();
  extern __shared__ uint4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  uint8_t* wbuf = smem + warp * 2 * kWBuf;
  uint8_t* sx = smem + kVWarps * 2 * kWBuf;
  float* sdx = reinterpret_cast<float*>(sx + NR * kVChunk * kXPitch);
  float* sds = sdx + NR * kVChunk * 8;
  float* parts = sds + NR * kVChunk * 8 + warp * NR * kVChunk;

  const uint32_t r0 = (blockIdx.x % p.row_tiles) * NR;
  const uint32_t jw = tg.tile * (kVWarps * CPW) + warp * CPW;
  const uint32_t n_sb = p.n_in / 256, nb = p.n_in / 32;
  const uint32_t n_chunks = (n_sb + kVChunk - 1) / kVChunk;
  const uint32_t n_items = n_chunks * CPW;  // (chunk, column) pairs, chunk-major

  // Copies item i's weight bytes into buffer i % 2: one row's super-blocks
  // [32 ch, 32 ch + n) from the 16-byte boundary below their start.
  auto issue = [&](uint32_t i) {
    const uint32_t ch = i / CPW, j = jw + i % CPW;
    if (i < n_items && j < tg.n_out) {
      const uint32_t n = min(n_sb - ch * kVChunk, static_cast<uint32_t>(kVChunk));
      const uintptr_t a = reinterpret_cast<uintptr_t>(tg.w + size_t{j} * p.row_bytes +
                                                      size_t{ch} * kVChunk * L::kBytes);
      const uintptr_t base = a & ~uintptr_t{15};
      const uint32_t chunks = static_cast<uint32_t>((a - base + n * L::kBytes + 15) / 16);
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(wbuf + (i % 2) * kWBuf));
      for (uint32_t c = lane; c < chunks; c += 32)
        cp_async16(dst + 16 * c, reinterpret_cast<const void*>(base + 16 * c), true);
    }
    cp_async_commit();
  };

  float y[CPW];  // lane r < NR: row r's sum for each of the warp's columns
#pragma unroll
  for (int c = 0; c < CPW; ++c) y[c] = 0.0f;
  issue(0);  // weights only: may run before the wait
  detail::dependency_wait();
  for (uint32_t i = 0; i < n_items; ++i) {
    const uint32_t ch = i / CPW, c = i % CPW, j = jw + c;
    const uint32_t n = min(n_sb - ch * kVChunk, static_cast<uint32_t>(kVChunk));
    if (c == 0) {       // stage the chunk's activations for the whole CTA
      __syncthreads();  // every warp is done with the previous chunk's
      for (uint32_t e = threadIdx.x; e < NR * kVChunk * 16; e += kVWarps * 32) {
        const uint32_t r = e / (kVChunk * 16), sbl = (e / 16) % kVChunk, q = e % 16;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < p.n_rows && sbl < n)
          v = *reinterpret_cast<const uint4*>(p.codes + size_t{r0 + r} * p.n_in +
                                              (size_t{ch} * kVChunk + sbl) * 256 + 16 * q);
        *reinterpret_cast<uint4*>(sx + (r * kVChunk + sbl) * kXPitch + 16 * q) = v;
      }
      for (uint32_t e = threadIdx.x; e < NR * kVChunk * 8; e += kVWarps * 32) {
        const uint32_t r = e / (kVChunk * 8), k = e % (kVChunk * 8);
        const bool ok = r0 + r < p.n_rows && k / 8 < n;
        const size_t at = size_t{r0 + r} * nb + size_t{ch} * kVChunk * 8 + k;
        sdx[e] = ok ? p.d[at] : 0.0f;
        sds[e] = ok && L::kMin ? p.dsum[at] : 0.0f;
      }
      __syncthreads();
    }
    issue(i + 1);
    cp_async_wait<1>();  // item i has landed
    __syncwarp();
    if (j < tg.n_out) {
      float part[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r) part[r] = 0.0f;
      if (static_cast<uint32_t>(lane) < n) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(tg.w + size_t{j} * p.row_bytes +
                                                        size_t{ch} * kVChunk * L::kBytes);
        const uint8_t* w = wbuf + (i % 2) * kWBuf + (a & 15) + lane * L::kBytes;
        const uint8_t* x = sx + lane * kXPitch;
        if constexpr (T == DType::Q4_K)
          lane_q4_k<NR, kVChunk * kXPitch, kVChunk * 8>(part, w, x, sdx + lane * 8, sds + lane * 8);
        else
          lane_q6_k<NR, kVChunk * kXPitch, kVChunk * 8>(part, w, x, sdx + lane * 8);
      }
#pragma unroll
      for (int r = 0; r < NR; ++r) parts[r * kVChunk + lane] = part[r];
      __syncwarp();
      if (lane < NR)
        for (uint32_t k = 0; k < n; ++k) y[c] = __fadd_rn(y[c], parts[lane * kVChunk + k]);
    }
    __syncwarp();  // buffer i % 2 and the parts are free again
  }
  cp_async_wait<0>();
#pragma unroll
  for (int c = 0; c < CPW; ++c)
    if (lane < NR && jw + c < tg.n_out && r0 + lane < p.n_rows)
      tg.y[size_t{r0 + lane} * tg.n_out + jw + c] = y[c];
}

// Launches kernel on (row tiles x column tiles) CTAs, raising its dynamic
// shared-memory limit once per device first.
template <auto Kernel>
void launch(Params p, int bm, int threads, size_t smem, cudaStream_t stream) {
  detail::raise_smem_limit<Kernel>(smem);
  size_t col_tiles = 0;
  for (int i = 0; i < p.n_weights; ++i) {
    p.tiles[i] = (p.n_outs[i] + bm - 1) / bm;
    col_tiles += p.tiles[i];
  }
  FERRY_CHECK(size_t{p.row_tiles} * col_tiles <= 0x7fffffffu, "matmul_q8",
              "too many tiles: n_rows=", p.n_rows, " column tiles=", col_tiles);
  detail::launch("matmul_q8", Kernel, static_cast<unsigned>(p.row_tiles * col_tiles), threads, smem,
                 stream, p);
}

template <int BM, int BN, int WM, int WN, int STAGES>
struct Variant {
  static constexpr tc::TileConfig kConfig = {nullptr, BM, BN, WM, WN, 256, STAGES};
  template <DType T>
  static void run(const Params& p, cudaStream_t stream) {
    using Tl = Tile<T, BM, BN, WM, WN, STAGES>;
    launch<matmul_q8_kernel<T, BM, BN, WM, WN, STAGES>>(p, BM, Tl::kThreads, Tl::kSmemBytes,
                                                        stream);
  }
};

// bm = columns per CTA, bn = NR rows; wn = 0 marks the kind.
template <int NR, int CPW>
struct MatvecVariant {
  static constexpr tc::TileConfig kConfig = {nullptr, kVWarps* CPW, NR, kVWarps, 0, 256, 2};
  template <DType T>
  static void run(const Params& p, cudaStream_t stream) {
    launch<matvec_q8_kernel<T, NR, CPW>>(p, kVWarps * CPW, kVWarps * 32, v_smem_bytes<T, NR>(),
                                         stream);
  }
};

// The menu. V<rows>c<columns per warp>: dp4a (few rows); S = skinny (one
// m16 tile per warp), L = 2-D warp tiles (mma). Measured on the H200 with
// gpu_matmul_bench --q8 --sweep (docs/CUDA.md); choose_config's picks are
// the fastest or within about 15% of it on the 8B shapes.
using Variants = std::tuple<MatvecVariant<1, 2>,         // 0 V1c2
                            MatvecVariant<2, 2>,         // 1 V2c2
                            MatvecVariant<4, 2>,         // 2 V4c2
                            MatvecVariant<1, 8>,         // 3 V1c8
                            MatvecVariant<2, 8>,         // 4 V2c8
                            MatvecVariant<4, 8>,         // 5 V4c8
                            Variant<16, 8, 1, 1, 8>,     // 6 S16x8
                            Variant<64, 8, 4, 1, 4>,     // 7 S64x8
                            Variant<64, 16, 4, 1, 4>,    // 8 S64x16
                            Variant<64, 32, 4, 1, 4>,    // 9 S64x32
                            Variant<128, 64, 4, 2, 3>>;  // 10 L128x64, 8 warps of 32x32
constexpr const char* kNames[] = {"V1c2",  "V2c2",  "V4c2",   "V1c8",   "V2c8",   "V4c8",
                                  "S16x8", "S64x8", "S64x16", "S64x32", "L128x64"};
constexpr size_t kN = std::tuple_size_v<Variants>;
static_assert(std::size(kNames) == kN);

using LaunchFn = void (*)(const Params&, cudaStream_t);

template <size_t... I>
constexpr auto make_table(std::index_sequence<I...>) {
  struct Table {
    tc::TileConfig cfg[kN];
    LaunchFn q4_k[kN], q6_k[kN];
  } t{};
  ((t.cfg[I] = std::tuple_element_t<I, Variants>::kConfig, t.cfg[I].name = kNames[I],
    t.q4_k[I] = &std::tuple_element_t<I, Variants>::template run<DType::Q4_K>,
    t.q6_k[I] = &std::tuple_element_t<I, Variants>::template run<DType::Q6_K>),
   ...);
  return t;
}
const auto kTable = make_table(std::make_index_sequence<kN>{});

// One warp per 32-element block: lane i holds element i.
constexpr unsigned kQuantWarps = 8;
__global__ void __launch_bounds__(kQuantWarps * 32)
    quantize_q8_kernel(const float* __restrict__ x, size_t n_blocks, int8_t* __restrict__ codes,
                       float* __restrict__ d, float* __restrict__ dsum) {
  detail::dependency_wait();
  const size_t blk = size_t{blockIdx.x} * kQuantWarps + threadIdx.x / 32;
  if (blk >= n_blocks) return;
  const unsigned lane = threadIdx.x % 32;
  const float v = x[blk * 32 + lane];
  // The CPU's amax: the largest |x| (fmaxf skips NaN as std::max does when
  // the NaN is its second argument), replaced by the block's last NaN.
  float amax = warp_max(fabsf(v));
  const unsigned nan = __ballot_sync(0xffffffffu, isnan(v));
  if (nan) amax = __shfl_sync(0xffffffffu, v, 31 - __clz(nan));
  const float dd = __fdiv_rn(amax, 127.0f);
  float q = 0.0f;
  if (dd > 0.0f && isfinite(dd)) {
    constexpr float kMagic = 0x1.8p23f;  // round half to even, as ops.cpp's round_even
    q = __fsub_rn(__fadd_rn(__fdiv_rn(v, dd), kMagic), kMagic);
  }
  q = fminf(127.0f, fmaxf(-127.0f, q));
  const int code = static_cast<int>(q);
  codes[blk * 32 + lane] = static_cast<int8_t>(code);
  int sum = code;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    d[blk] = dd;
    dsum[blk] = __fmul_rn(static_cast<float>(sum), dd);
  }
}

}  // namespace

size_t n_configs() {
  return kN;
}
const tc::TileConfig& config(size_t i) {
  FERRY_CHECK(i < kN, "matmul_q8", "config ", i, " of ", kN);
  return kTable.cfg[i];
}

// Any choice computes the same bits; these are the fastest measured.
size_t choose_config(size_t n_out, size_t n_rows) {
  // Up to 4 rows: dp4a, one thread per (column, super-block), all rows in
  // one pass, 8 columns per warp for the widest products (the head). 5 to
  // 8 rows: the same in two passes of 4 for up to 4096 columns.
  if (n_rows <= 4) {
    const size_t nr = n_rows <= 1 ? 0 : n_rows <= 2 ? 1 : 2;
    return n_out >= 32768 ? 3 + nr : nr;
  }
  if (n_rows <= 8 && n_out <= 4096) return n_out <= 2048 ? 2 : 5;
  // Then the mma tiles by pick_tile.
  constexpr size_t kMinCtas = 100;
  static constexpr size_t kRows8[] = {7, 6}, kRows16[] = {8, 7}, kRows32[] = {9, 8},
                          kRowsMore[] = {10, 9};
  static constexpr tc::RowRange kRanges[] = {
      {8, kRows8}, {16, kRows16}, {32, kRows32}, {SIZE_MAX, kRowsMore}};
  return tc::pick_tile(kRanges, config, n_out, n_rows, kMinCtas);
}

void matmul_q8_many_with(size_t cfg, std::span<const uint8_t* const> w, DType type, size_t n_in,
                         std::span<const size_t> n_out, const int8_t* codes, const float* d,
                         const float* dsum, size_t n_rows, std::span<float* const> y,
                         cudaStream_t stream) {
  FERRY_CHECK(cfg < kN, "matmul_q8", "config ", cfg, " of ", kN);
  FERRY_CHECK(q8_supported(type), "matmul_q8", "int8 mode does not take ", dtype_traits(type).name,
              " weights");
  FERRY_CHECK(!w.empty() && w.size() <= size_t{kMaxWeights} && n_out.size() == w.size() &&
                  y.size() == w.size(),
              "matmul_q8", w.size(), " weights (at most ", kMaxWeights, ")");
  FERRY_CHECK(n_in % 256 == 0, "matmul_q8", "n_in=", n_in,
              " is not a whole number of super-blocks");
  FERRY_CHECK(reinterpret_cast<uintptr_t>(codes) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(d) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(dsum) % 16 == 0,
              "matmul_q8", "codes, d and dsum must be 16-byte aligned");
  const tc::TileConfig& c = kTable.cfg[cfg];
  Params p{};
  p.row_bytes = row_bytes(type, n_in);
  p.codes = codes;
  p.d = d;
  p.dsum = dsum;
  p.n_in = static_cast<uint32_t>(n_in);
  p.n_rows = static_cast<uint32_t>(n_rows);
  p.row_tiles = static_cast<uint32_t>((n_rows + c.bn - 1) / c.bn);
  for (size_t i = 0; i < w.size(); ++i) {
    FERRY_CHECK(
        n_in < (size_t{1} << 31) && n_out[i] < (size_t{1} << 31) && n_rows < (size_t{1} << 31),
        "matmul_q8", "shape too large: n_in=", n_in, " n_out=", n_out[i], " n_rows=", n_rows);
    FERRY_CHECK(reinterpret_cast<uintptr_t>(w[i]) % 16 == 0, "matmul_q8",
                "weights must be 16-byte aligned");
    if (n_out[i] == 0) continue;
    p.ws[p.n_weights] = w[i];
    p.ys[p.n_weights] = y[i];
    p.n_outs[p.n_weights++] = static_cast<uint32_t>(n_out[i]);
  }
  if (n_rows == 0 || p.n_weights == 0) return;
  (type == DType::Q4_K ? kTable.q4_k : kTable.q6_k)[cfg](p, stream);
}

void matmul_q8_with(size_t cfg, const uint8_t* w, DType type, size_t n_in, size_t n_out,
                    const int8_t* codes, const float* d, const float* dsum, size_t n_rows, float* y,
                    cudaStream_t stream) {
  matmul_q8_many_with(cfg, std::span<const uint8_t* const>(&w, 1), type, n_in,
                      std::span<const size_t>(&n_out, 1), codes, d, dsum, n_rows,
                      std::span<float* const>(&y, 1), stream);
}

}  // namespace q8

bool q8_supported(DType type) {
  return type == DType::Q4_K || type == DType::Q6_K;
}

void quantize_q8(const float* x, size_t n_rows, size_t n_in, int8_t* codes, float* d, float* dsum,
                 cudaStream_t stream) {
  FERRY_CHECK(n_in % 32 == 0, "quantize_q8", "n_in=", n_in, " is not a multiple of 32");
  const size_t n_blocks = n_rows * (n_in / 32);
  if (n_blocks == 0) return;
  const size_t grid = (n_blocks + q8::kQuantWarps - 1) / q8::kQuantWarps;
  FERRY_CHECK(grid <= 0x7fffffffu, "quantize_q8", n_rows, " rows of ", n_in, " too large");
  detail::launch("quantize_q8_kernel", q8::quantize_q8_kernel, static_cast<unsigned>(grid),
                 q8::kQuantWarps * 32, 0, stream, x, n_blocks, codes, d, dsum);
}

void matmul_q8_many(std::span<const uint8_t* const> w, DType type, size_t n_in,
                    std::span<const size_t> n_out, const int8_t* codes, const float* d,
                    const float* dsum, size_t n_rows, std::span<float* const> y,
                    cudaStream_t stream) {
  size_t total = 0;
  for (size_t n : n_out) total += n;
  q8::matmul_q8_many_with(q8::choose_config(total, n_rows), w, type, n_in, n_out, codes, d, dsum,
                          n_rows, y, stream);
}

void matmul_q8(const uint8_t* w, DType type, size_t n_in, size_t n_out, const int8_t* codes,
               const float* d, const float* dsum, size_t n_rows, float* y, cudaStream_t stream) {
  matmul_q8_many(std::span<const uint8_t* const>(&w, 1), type, n_in,
                 std::span<const size_t>(&n_out, 1), codes, d, dsum, n_rows,
                 std::span<float* const>(&y, 1), stream);
}

}  // namespace ferry::cuda
