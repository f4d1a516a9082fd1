// y = x W^T for dense bf16 / f16 weights on the tensor cores, deterministic
// and batch-invariant at every row count (cuda_ops.h: matmul_tc).
//
// Orientation ("swap-AB", always). The mma computes D[m, n] += A[m, k] B[k, n]
// with A = W (m = output column j) and B = x^T (n = activation row r), so
// D = y^T. Both operands are k-contiguous in memory ([n_out, n_in] and
// [n_rows, n_in]), which is the layout ldmatrix (non-transposed) feeds to
// mma.sync.m16n8k16.row.col directly. Every variant uses this one orientation:
// a weight row is always an A row and an activation row always a B column.
//
// Arithmetic of one output (the determinism contract). For every (r, j):
//   acc = +0.0f
//   for k0 = 0, 16, ..., n_in - 16:          (increasing, every variant)
//     acc = mma(W[j, k0:k0+16], x[r, k0:k0+16], acc)       (bf16 weights)
//     acc = mma(hi(W[j, k0:k0+16]), x[r, ...], acc)         (f16 weights:
//     acc = mma(lo(W[j, k0:k0+16]), x[r, ...], acc)          two steps)
//   y[r, j] = acc
// where one mma step is the tensor core's fixed function of the 16 products
// and the accumulator. No split-K, no atomics, no cross-warp reduction: the
// accumulator lives in one register of one thread for the whole K loop.
// Tile variants differ only in where (r, j) sits inside the CTA, the warp and
// the m16 x n8 fragment; an mma's D[m, n] depends only on A's row m, B's
// column n and C[m, n], so that position cannot change the bits (the tests
// bit-compare all variants and every row position to check exactly this).
// Stage boundaries (bk) do not matter either: k steps past n_in are never
// issued, so each output sees exactly n_in / 16 steps (times 2 for f16).
//
// f16 weights. mma.sync needs both operands of one type and x is bf16, so a
// weight w (f16, 11 significant bits) is split into hi = bf16_rn(w) and
// lo = w - hi; lo has at most 4 significant bits and fits bf16 exactly, so
// hi + lo = w exactly and the products are those of the f16 weights (an inf
// weight gives NaN, not inf).
//
// Tiles and pipeline. A CTA owns bm output columns x bn rows and the whole
// K. Each stage (bk of k) of W [bm, bk] and x [bn, bk] is copied by cp.async
// (16 bytes a thread, L2 only) into shared memory, rows of bk bf16 with
// 16-byte chunks XOR-swizzled by (row & 7) so that ldmatrix's 8 row reads hit
// 8 different bank groups; `stages` stages are in flight. Out-of-range rows,
// columns and k chunks are zero-filled (cp.async src-size 0) and never
// stored. The pipeline order is described at the kernel.
//
// Variants (the table below; choose_config picks by n_rows and the CTA
// count, from measurements on the H200):
// - n_rows <= 64, "skinny" S<bm>x<bn>: one m16 x bn tile per warp, bm = 16
//   (1 warp) or 64 (4 warps), bn = 8/16/32, bk = 128 or 256, 3-8 stages.
//   Weight-bandwidth-bound: the weights stream once per row tile and N is
//   cut into CTAs as small as 16 columns so that every SM has loads in
//   flight. Without split-K each CTA's accumulators form a chain of
//   n_in / 16 dependent mma steps, so small n_out (few CTAs) is bounded by
//   that chain (and launch) latency rather than bandwidth.
// - "M"/"L" <bm>x<bn>: classic tiles of 32..256 x 64..128 with 4 or 8 warps
//   (warp tiles 16x32 .. 64x64), bk = 64, 3-4 stages, for n_rows > 32.
// The grid is 1-D with row tiles fastest, so CTAs that run together share
// weight tiles (read once from HBM) and the small x stays in L2.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "cuda/common_impl.cuh"
#include "cuda/knobs.h"
#include "cuda/matmul_tc.cuh"
#include "cuda/ptx_impl.cuh"

namespace ferry::cuda {
namespace tc {
namespace {

// A device property worked out once per device (ordinals 0-63; others
// every time): `known` holds 0 until `compute(dev)` (never 0) is stored.
template <class T, class Compute>
T per_device(std::atomic<T> (&known)[64], Compute compute) {
  int dev = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < 64;
  if (cached) {
    const T v = known[dev].load(std::memory_order_relaxed);
    if (v != 0) return v;
  }
  const T v = compute(dev);
  if (cached) known[dev].store(v, std::memory_order_relaxed);
  return v;
}

// How many pipeline stages of weights a producer requests before its
// dependency wait (FERRY_CUDA_PRE_STAGES overrides; a large value: all of
// its ring). Two: more copies in flight while the kernel before finishes
// slow that kernel's tail more than they gain (one lease: single-stream
// decode 227 tok/s with 2, 224 with the whole ring, 225 with none; another:
// 231 against 228, and 4k-context bf16 KV 218 against 214;
// docs/BENCHMARKS.md, sessions 27-28). The fed and wgmma products read it;
// the S tiles issue STAGES - 1 as before. Set once per device by the first
// such launch (a synchronous copy: the backend's first step runs directly,
// never inside a graph capture).
__constant__ uint32_t c_pre_stages = 2;
void set_pre_stages() {
  static std::atomic<int> known[64];
  per_device(known, [](int) {
    if (const uint32_t v = pre_stages(); v != 2)
      FERRY_CUDA_CHECK(cudaMemcpyToSymbol(c_pre_stages, &v, sizeof v));
    return 1;
  });
}

using detail::bf2f;
using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::f2bf;
using detail::f2h;
using detail::h2f;
using detail::ldsm_x2;
using detail::ldsm_x4;
using detail::mma_bf16;

// Two f16 -> their exact bf16 high parts (hi) and remainders (lo).
__device__ __forceinline__ void split_f16x2(uint32_t h, uint32_t& hi, uint32_t& lo) {
  const float f0 = h2f(static_cast<uint16_t>(h & 0xffffu));
  const float f1 = h2f(static_cast<uint16_t>(h >> 16));
  const uint16_t h0 = f2bf(f0), h1 = f2bf(f1);
  const uint16_t l0 = f2bf(f0 - bf2f(h0)), l1 = f2bf(f1 - bf2f(h1));  // exact
  hi = static_cast<uint32_t>(h0) | (static_cast<uint32_t>(h1) << 16);
  lo = static_cast<uint32_t>(l0) | (static_cast<uint32_t>(l1) << 16);
}

// ---- the kernel ----------------------------------------------------------------

// Up to kMaxWeights weights of the same n_in in one launch (Q/K/V,
// gate/up): their column tiles follow one another in the grid; tiles[i] is
// weight i's count of column tiles for the variant launched.
struct Weights {
  const uint16_t* w[kMaxWeights];
  float* y[kMaxWeights];
  uint32_t n_out[kMaxWeights];
  uint32_t tiles[kMaxWeights];
  int n = 0;
};

// The fused epilogue of a decode step's Q/K/V product (matmul_tc_qkv_rope):
// per weight, its role: 0 plain, 1 rotated (q), 2 rotated and stored as
// the step's K rows (k), 3 stored as its V rows (v); the rotation is
// rope_kernel's (elementwise.cu) and the store kv_store_kernel's for dense
// formats (kv: the cache's kind; Affine: no store), so the bits are theirs.
struct RopeKv {
  const int32_t* pos = nullptr;     // [n_rows]
  const float* inv_freq = nullptr;  // [half]
  const KvWrite* writes = nullptr;  // [n_rows]: row r's cache slots
  uint32_t half = 0;                // head_dim / 2
  kernels::KvFormat::Kind kv = kernels::KvFormat::Kind::Affine;
  uint8_t role[kMaxWeights] = {};
};

template <int BM, int BN, int WM, int WN, int BK, int STAGES>
struct Tile {
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kTM = BM / WM, kTN = BN / WN;   // warp tile
  static constexpr int kMT = kTM / 16, kNT = kTN / 8;  // m16 / n8 tiles per warp
  static constexpr int kChunks = BK / 8;               // 16-byte chunks per smem row
  static constexpr int kStageElems = (BM + BN) * BK;   // bf16 per stage (W then x)
  static constexpr size_t kSmemBytes = size_t{STAGES} * kStageElems * 2;
  static_assert(kTM % 16 == 0 && kTN % 8 == 0, "warp tile must be whole m16 x n8 tiles");
  static_assert(BK % 64 == 0, "swizzle needs 8-chunk groups");
  static_assert((BM * kChunks) % kThreads == 0 && (BN * kChunks) % kThreads == 0,
                "each thread copies whole chunks");
  static_assert(STAGES >= 2, "pipeline");
};

// Element offset of chunk c of smem row `row` (XOR swizzle inside 8-chunk
// groups: ldmatrix's 8 rows at one logical chunk land in 8 bank groups).
template <int BK>
__device__ __forceinline__ uint32_t swz(int row, int c) {
  return static_cast<uint32_t>(row * BK + ((c ^ (row & 7)) * 8));
}

// One thread's share of copying a [ROWS, BK] tile of a row-major [*, n_in]
// matrix into a stage, computed once: the thread always copies chunk
// c = tid % kChunks of rows tid / kChunks + i * kRowStep (THREADS is a
// multiple of kChunks), so per stage only the k offset moves.
template <int ROWS, int BK, int THREADS>
struct CopyPlan {
  static constexpr int kChunks = BK / 8;
  static constexpr int kRowStep = THREADS / kChunks;
  static constexpr int kN = ROWS / kRowStep;  // chunks per thread per stage
  static_assert(THREADS % kChunks == 0 && ROWS % kRowStep == 0, "whole chunks per thread");

  const uint16_t* base;  // matrix start (a valid address for zero-fill copies)
  const uint16_t* src;   // this thread's first chunk in k tile 0
  size_t row_step;       // kRowStep * n_in: elements between this thread's rows
  uint32_t k;            // element offset of the chunk in a k tile
  uint32_t dst[kN];      // byte offsets in the stage
  uint32_t row_ok;       // bit i: row i is inside the matrix

  __device__ __forceinline__ CopyPlan(const uint16_t* m, uint32_t row0, uint32_t row_end,
                                      uint32_t n_in)
      : CopyPlan(m, row0, row_end, n_in, static_cast<int>(threadIdx.x)) {}
  // The same for thread t of the THREADS that copy (a producer warp's).
  __device__ __forceinline__ CopyPlan(const uint16_t* m, uint32_t row0, uint32_t row_end,
                                      uint32_t n_in, int t) {
    const int c = t % kChunks, r = t / kChunks;
    base = m;
    k = static_cast<uint32_t>(c) * 8;
    src = m + size_t{row0 + r} * n_in + k;
    row_step = size_t{kRowStep} * n_in;
    row_ok = 0;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int row = r + i * kRowStep;
      dst[i] = 2 * swz<BK>(row, c);
      if (row0 + row < row_end) row_ok |= 1u << i;
    }
  }
  // Issues the copies of k tile kt into the stage at smem byte address
  // `stage`. Chunks past n_in (and rows past row_end) are zero-filled
  // without reading memory (n_in % 8 == 0: a chunk never straddles n_in).
  __device__ __forceinline__ void issue(uint32_t stage, uint32_t kt, uint32_t n_in) const {
    const bool k_ok = kt * BK + k < n_in;
    const uint16_t* p = src + size_t{kt} * BK;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const bool ok = k_ok && (row_ok >> i & 1u);
      cp_async16(stage + dst[i], ok ? p + i * row_step : base, ok);
    }
  }
};

// Fragments of one k16 step for a warp tile: A (kMT m16 tiles of W) and B
// (kNT n8 tiles of x), loaded by ldmatrix from a stage.
template <int kMT, int kNT>
struct Frags {
  uint32_t a[kMT][4];
  uint32_t b[kNT][2];
};

template <int BK, int kMT, int kNT>
__device__ __forceinline__ void load_frags(Frags<kMT, kNT>& f, uint32_t sw, uint32_t sx, int kk,
                                           int a_row0, int b_row0, int lane) {
  // A: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15);
  // lane l addresses row l % 16, chunk l / 16.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const int row = a_row0 + mt * 16 + lane % 16;
    ldsm_x4(sw + 2 * swz<BK>(row, kk * 2 + lane / 16), f.a[mt][0], f.a[mt][1], f.a[mt][2],
            f.a[mt][3]);
  }
  // B: per n8 tile, matrices (n 0-7, k 0-7) and (n 0-7, k 8-15); x4 loads
  // two n8 tiles: lane l addresses n (l % 8) + 8 (l / 16), chunk (l / 8) % 2.
#pragma unroll
  for (int nt = 0; nt + 1 < kNT; nt += 2) {
    const int row = b_row0 + nt * 8 + lane % 8 + 8 * (lane / 16);
    ldsm_x4(sx + 2 * swz<BK>(row, kk * 2 + (lane / 8) % 2), f.b[nt][0], f.b[nt][1], f.b[nt + 1][0],
            f.b[nt + 1][1]);
  }
  if constexpr (kNT % 2 == 1) {
    constexpr int nt = kNT - 1;
    const int row = b_row0 + nt * 8 + lane % 8;
    ldsm_x2(sx + 2 * swz<BK>(row, kk * 2 + (lane / 8) % 2), f.b[nt][0], f.b[nt][1]);
  }
}

// acc += this k16 step, for every (m16, n8) tile of the warp. f16 weights:
// per element the hi step, then the lo step.
template <bool kF16, int kMT, int kNT>
__device__ __forceinline__ void mma_step(float (&acc)[kMT][kNT][4], const Frags<kMT, kNT>& f) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    if constexpr (kF16) {
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) split_f16x2(f.a[mt][e], hi[e], lo[e]);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mma_bf16(acc[mt][nt], hi, f.b[nt][0], f.b[nt][1]);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mma_bf16(acc[mt][nt], lo, f.b[nt][0], f.b[nt][1]);
    } else {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mma_bf16(acc[mt][nt], f.a[mt], f.b[nt][0], f.b[nt][1]);
    }
  }
}

// The fused SwiGLU epilogue of the skinny tiles (matmul_tc_kernel and
// matmul_fed_kernel with kSwiglu): warp w + half holds up's accumulators at
// the (j, r) positions gate's warp w holds in the same registers. They pass
// through xs (element i of lane l at i * 32 + l; `meet` synchronizes the
// warps between the writes and the reads), and gate's warps write
// silu_mul_one(gate, up) to y and its bf16 rounding to y_bf16. j0, r0: the
// first column and row of gate's warp tile.
template <int kNT, class Meet>
__device__ __forceinline__ void swiglu_epilogue(const float (&acc)[kNT][4], float* xs, int warp,
                                                int half, int lane, uint32_t j0, uint32_t r0,
                                                float* __restrict__ y, uint32_t n_out,
                                                uint32_t n_rows, uint16_t* __restrict__ y_bf16,
                                                Meet meet) {
  constexpr int kN = kNT * 4;
  if (warp >= half)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) xs[((warp - half) * kN + nt * 4 + e) * 32 + lane] = acc[nt][e];
  meet();
  if (warp >= half) return;
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t j = j0 + g + 8 * (e / 2);
      const uint32_t r = r0 + nt * 8 + 2 * c + e % 2;
      if (j < n_out && r < n_rows) {
        const float v = detail::silu_mul_one(acc[nt][e], xs[(warp * kN + nt * 4 + e) * 32 + lane]);
        y[size_t{r} * n_out + j] = v;
        if (y_bf16) y_bf16[size_t{r} * n_out + j] = f2bf(v);
      }
    }
}

// Pipeline (CUTLASS's sm80 multistage order). Stage s of the k loop lives in
// slot s % STAGES. Within k tile kt, at step kk:
//   - the fragments of step kk + 1 are loaded before step kk's mma (those of
//     tile kt + 1's step 0 at kk = KK - 1), so ldmatrix hides under the mma;
//   - at kk = 0 the copies of tile kt + STAGES - 1 are issued into the slot
//     tile kt - 1 used (every warp finished reading it before the barrier
//     at kk = KK - 2 of tile kt - 1);
//   - at kk = KK - 2 the group is committed, the wait leaves at most
//     STAGES - 2 groups in flight (so tile kt + 1 has landed) and a barrier
//     makes it visible to every warp.
// Every tile commits exactly one group (tiles past the end are zero-fills
// that read no memory), so the wait count is the same every time. Steps past
// n_in (only in the last tile when n_in % BK != 0) are skipped (kGuard), so
// each output sees exactly n_in / 16 mma steps whatever BK is.
//
// kSwiglu (skinny tiles of one m16 row of warps per half): the fused FFN
// input of a decode step, ws.w[0] = gate and ws.w[1] = up of the same
// shape. A CTA's column tile is BM / 2 columns of both: the stage holds
// gate's rows, then up's, so the first WM / 2 warps compute gate's chains
// and the others up's (the same chains as separate products); the
// epilogue passes up's accumulators through shared memory and writes
// silu_mul_one(gate, up) to ws.y[0] (its bf16 rounding to y_bf16).
template <int BM, int BN, int WM, int WN, int BK, int STAGES, bool kF16, bool kSwiglu = false>
__global__ void __launch_bounds__(Tile<BM, BN, WM, WN, BK, STAGES>::kThreads)
    matmul_tc_kernel(Weights ws, const uint16_t* __restrict__ x, uint32_t n_in, uint32_t n_rows,
                     uint32_t row_tiles, uint16_t* __restrict__ y_bf16) {
  using T = Tile<BM, BN, WM, WN, BK, STAGES>;
  static_assert(!kSwiglu || (WN == 1 && WM % 2 == 0 && T::kMT == 1), "one m16 tile per warp");
  constexpr int kWRows = kSwiglu ? BM / 2 : BM;  // rows of each weight in a stage
  constexpr int KK = BK / 16;                    // k16 steps per tile
  constexpr uint32_t kStageBytes = T::kStageElems * 2;
  extern __shared__ uint4 smem_raw[];
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));

  const uint32_t r0 = (blockIdx.x % row_tiles) * BN;  // first activation row
  // The weight this CTA's column tile belongs to, and the tile within it.
  uint32_t col_tile = blockIdx.x / row_tiles, wi = 0;
  if constexpr (!kSwiglu)
    while (col_tile >= ws.tiles[wi]) col_tile -= ws.tiles[wi++];
  const uint16_t* __restrict__ w = ws.w[wi];
  float* __restrict__ y = ws.y[wi];
  const uint32_t n_out = ws.n_out[wi];
  const uint32_t j0 = col_tile * kWRows;  // first output column
  const uint32_t k_steps = n_in / 16;
  const uint32_t full_tiles = n_in / BK, k_tiles = (n_in + BK - 1) / BK;

  CopyPlan<kWRows, BK, T::kThreads> wcopy(w, j0, n_out, n_in);
  CopyPlan<kWRows, BK, T::kThreads> ucopy(kSwiglu ? ws.w[1] : w, j0, n_out, n_in);
  CopyPlan<BN, BK, T::kThreads> xcopy(x, r0, n_rows, n_in);
  auto issue_w = [&](uint32_t st, uint32_t kt) {
    wcopy.issue(st, kt, n_in);
    if constexpr (kSwiglu) ucopy.issue(st + kWRows * BK * 2, kt, n_in);
  };
  auto issue = [&](uint32_t slot, uint32_t kt) {
    const uint32_t st = smem + slot * kStageBytes;
    issue_w(st, kt);
    xcopy.issue(st + BM * BK * 2, kt, n_in);
  };

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int a_row0 = (warp % WM) * T::kTM, b_row0 = (warp / WM) * T::kTN;

  float acc[T::kMT][T::kNT][4];
#pragma unroll
  for (int mt = 0; mt < T::kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < T::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  }

  // The first stages' weights are requested before the dependency wait
  // (weights are constant: with dependent launch they stream while the
  // previous kernel finishes), the activations after it. Group s holds
  // stage s's activations (group 0 also every prologue weight copy), so the
  // loop's wait counts are those of one group per stage.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue_w(smem + s * kStageBytes, s);
  detail::dependency_wait();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    xcopy.issue(smem + s * kStageBytes + BM * BK * 2, s, n_in);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();
  __syncthreads();

  uint32_t read_slot = 0, write_slot = STAGES - 1;
  Frags<T::kMT, T::kNT> f[2];
  load_frags<BK>(f[0], smem, smem + BM * BK * 2, 0, a_row0, b_row0, lane);

  auto tile = [&](uint32_t kt, auto guard) {
    constexpr bool kGuard = decltype(guard)::value;
    const uint32_t sw = smem + read_slot * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      if (kk < KK - 1) {
        load_frags<BK>(f[(kk + 1) % 2], sw, sw + BM * BK * 2, kk + 1, a_row0, b_row0, lane);
      } else {  // step 0 of the next tile (already visible: barrier at KK - 2)
        const uint32_t nw = smem + read_slot * kStageBytes;
        load_frags<BK>(f[(kk + 1) % 2], nw, nw + BM * BK * 2, 0, a_row0, b_row0, lane);
      }
      if (kk == 0) {
        issue(write_slot, kt + STAGES - 1);
        write_slot = write_slot + 1 == STAGES ? 0 : write_slot + 1;
      }
      if (!kGuard || kt * KK + kk < k_steps) mma_step<kF16>(acc, f[kk % 2]);
      if (kk == KK - 2) {
        cp_async_commit();
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        read_slot = read_slot + 1 == STAGES ? 0 : read_slot + 1;
      }
    }
  };
  for (uint32_t kt = 0; kt < full_tiles; ++kt) tile(kt, std::false_type{});
  if (k_tiles > full_tiles) tile(full_tiles, std::true_type{});
  cp_async_wait<0>();  // nothing in flight at exit (the tail groups are zero-fills)

  // D[m = j, n = r]: d0, d1 at (g, 2c), (g, 2c + 1); d2, d3 at (g + 8, ...).
  const int g = lane / 4, c = lane % 4;
  if constexpr (kSwiglu) {
    // Up's accumulators through shared memory: the stages are free once
    // every warp passes the barrier.
    __syncthreads();
    swiglu_epilogue<T::kNT>(acc[0], reinterpret_cast<float*>(smem_raw), warp, WM / 2, lane,
                            j0 + a_row0, r0 + b_row0, y, n_out, n_rows, y_bf16,
                            [] { __syncthreads(); });
  } else {
    (void)y_bf16;
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t j = j0 + a_row0 + mt * 16 + g + 8 * (e / 2);
          const uint32_t r = r0 + b_row0 + nt * 8 + 2 * c + e % 2;
          if (j < n_out && r < n_rows) y[size_t{r} * n_out + j] = acc[mt][nt][e];
        }
  }
}

// The Q/K/V epilogue (RopeKv) of a consumer lane's accumulators: columns
// j0 and j0 + 8, rows r0 + 8 nt and + 1. A rope pair (2i, 2i + 1) is two
// neighbouring columns, held by lanes gl and gl ^ 1 (lane ^ 4) for the same
// rows, so each lane takes its partner's value by one shuffle and computes
// its own half of the rotation with rope_kernel's operations; K and V
// values then go to the row's cache slot as kv_store_kernel encodes them.
// What does not depend on the product (the angles' cos and sin, the cache
// addresses) is prepared while the tile's mma chains run: its loads are
// issued when the tile starts (rope_load) and used after its first stage
// (rope_finish), so neither the loads' latency nor the libm calls follow
// the last mma.
template <int kNT>
struct RopePrep {
  int32_t pos[kNT][2];  // rows r0 + 8 nt, + 1
  float freq[2];        // columns j0, j0 + 8
  const uint8_t* plane[kNT][2];
  size_t stride[kNT][2], unit[kNT][2];
  uint32_t slot[kNT][2];
  bool rotate, store;
  float cs[kNT][4], sn[kNT][4];
  uint8_t* dst[kNT][4];  // the value's cache bytes, or null
};
template <int kNT>
__device__ __forceinline__ void rope_load(RopePrep<kNT>& p, const RopeKv& rk, uint32_t role,
                                          uint32_t j0, uint32_t r0, uint32_t n_out,
                                          uint32_t n_rows) {
  const uint32_t head_dim = 2 * rk.half;
  p.rotate = role == 1 || role == 2;
  p.store = (role == 2 || role == 3) && rk.kv != kernels::KvFormat::Kind::Affine;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t j = j0 + 8 * h;
    p.freq[h] = p.rotate && j < n_out ? rk.inv_freq[j % head_dim / 2] : 0.0f;
  }
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t r = r0 + nt * 8 + k;
      const bool in = r < n_rows;
      p.pos[nt][k] = p.rotate && in ? rk.pos[r] : 0;
      p.plane[nt][k] = nullptr;
      p.stride[nt][k] = p.unit[nt][k] = 0;
      p.slot[nt][k] = 0;
      if (p.store && in) {
        const KvWrite& w = rk.writes[r];
        const kernels::KvSide& side = role == 2 ? w.k : w.v;
        p.plane[nt][k] = side.plane[0];
        p.stride[nt][k] = side.head_stride[0];
        p.unit[nt][k] = side.unit[0];
        p.slot[nt][k] = w.slot;
      }
    }
}
template <int kNT>
__device__ __forceinline__ void rope_finish(RopePrep<kNT>& p, const RopeKv& rk, uint32_t j0,
                                            uint32_t r0, uint32_t n_out, uint32_t n_rows) {
  const uint32_t head_dim = 2 * rk.half, bytes = rk.kv == kernels::KvFormat::Kind::F32 ? 4 : 2;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t j = j0 + 8 * (e / 2), r = r0 + nt * 8 + e % 2;
      const bool in = j < n_out && r < n_rows;
      p.cs[nt][e] = p.sn[nt][e] = 0.0f;
      p.dst[nt][e] = nullptr;
      if (in && p.rotate) {
        const float theta = __fmul_rn(static_cast<float>(p.pos[nt][e % 2]), p.freq[e / 2]);
        p.cs[nt][e] = cosf(theta);
        p.sn[nt][e] = sinf(theta);
      }
      if (in && p.store)
        p.dst[nt][e] = const_cast<uint8_t*>(p.plane[nt][e % 2]) +
                       (j / head_dim) * p.stride[nt][e % 2] +
                       size_t{p.slot[nt][e % 2]} * p.unit[nt][e % 2] + bytes * (j % head_dim);
    }
}
template <int kNT>
__device__ __forceinline__ void rope_kv_epilogue(const float (&acc)[kNT][4], const RopeKv& rk,
                                                 const RopePrep<kNT>& p, uint32_t j0, uint32_t r0,
                                                 uint32_t n_out, uint32_t n_rows, float* y,
                                                 int gl) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t j = j0 + 8 * (e / 2), r = r0 + nt * 8 + e % 2;
      float v = acc[nt][e];
      const float other = __shfl_xor_sync(0xffffffffu, v, 4);  // column j ^ 1, row r
      if (j >= n_out || r >= n_rows) continue;
      if (p.rotate) {
        const float cs = p.cs[nt][e], sn = p.sn[nt][e];
        v = (gl & 1) == 0 ? __fsub_rn(__fmul_rn(v, cs), __fmul_rn(other, sn))
                          : __fadd_rn(__fmul_rn(other, sn), __fmul_rn(v, cs));
      }
      y[size_t{r} * n_out + j] = v;
      if (uint8_t* d = p.dst[nt][e]) {
        if (rk.kv == kernels::KvFormat::Kind::F32)
          *reinterpret_cast<float*>(d) = v;
        else
          *reinterpret_cast<uint16_t*>(d) =
              rk.kv == kernels::KvFormat::Kind::F16 ? f2h(v) : f2bf(v);
      }
    }
}

// Producer-fed skinny tiles (sm_90a), "F<bm>x<bn>": decode products of a
// few rows on few output columns (Q/K/V, o, down), where the S tiles'
// warps both copy and run their mma chains, so a stage is refilled only
// after every warp has finished computing on it and met at the block
// barrier. Here PW producer warps only copy (cp.async, 16 bytes a thread,
// the same swizzled stages as the S tiles) and complete stage s's `full`
// mbarrier through cp.async arrivals; BM / 16 consumer warps each own one
// m16 x BN tile (the S tiles' warp tile), wait on `full`, run the stage's
// k16 steps (fragments double-buffered, the next stage's first step
// loaded before the last mma) and release the stage through its `empty`
// mbarrier. The grid is persistent (as many CTAs as fit at once, each
// taking tiles i, i + grid, ...), and the stage ring runs on from one tile
// to the next, so the producer streams the next tile's weights while the
// consumers finish the last. Each output is the same chain of n_in / 16
// mma steps, so the bits are the S tiles'. The measured gain:
// docs/BENCHMARKS.md (2026-12-02, session 19).
template <int BM, int BN, int BK, int STAGES, int PW>
struct FedTile {
  static constexpr int kConsumers = BM / 16, kCopyThreads = PW * 32;
  static constexpr int kThreads = kConsumers * 32 + kCopyThreads;
  static constexpr int kNT = BN / 8;
  static constexpr uint32_t kStageBytes = (BM + BN) * BK * 2;
  // + the barriers, + the SwiGLU epilogue's exchange (up's accumulators)
  static constexpr size_t kSmemBytes =
      size_t{STAGES} * kStageBytes + 16 * STAGES + kConsumers / 2 * kNT * 4 * 32 * 4;
  static_assert(BM % 16 == 0 && BN % 8 == 0 && BK % 64 == 0 && STAGES >= 2, "tile shape");
};

// kSwiglu: the fused FFN input (as matmul_tc_kernel's): ws.w[0] = gate,
// ws.w[1] = up; a tile is BM / 2 columns of both, the first half of the
// consumer warps run gate's chains, the others up's, and the epilogue
// writes silu_mul_one(gate, up) to ws.y[0] and its bf16 rounding to y_bf16.
// kRope: the Q/K/V epilogue of RopeKv (rk) instead of plain stores.
template <int BM, int BN, int BK, int STAGES, int PW, bool kF16, bool kSwiglu = false,
          bool kRope = false>
__global__ void __launch_bounds__(FedTile<BM, BN, BK, STAGES, PW>::kThreads)
    matmul_fed_kernel(Weights ws, const uint16_t* __restrict__ x, uint32_t n_in, uint32_t n_rows,
                      uint32_t row_tiles, uint32_t n_tiles, uint16_t* __restrict__ y_bf16,
                      RopeKv rk) {
#if FERRY_SM90A
  using T = FedTile<BM, BN, BK, STAGES, PW>;
  constexpr int KK = BK / 16;
  constexpr int kWRows = kSwiglu ? BM / 2 : BM;  // rows of each weight in a stage
  static_assert(!kSwiglu || T::kConsumers % 2 == 0, "gate and up: half the consumers each");
  extern __shared__ uint4 smem_raw[];
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t full = smem + STAGES * T::kStageBytes, empty = full + 8 * STAGES;
  const uint32_t k_steps = n_in / 16, k_tiles = (n_in + BK - 1) / BK, full_tiles = n_in / BK;

  // Tile t of the launch: row tile t % row_tiles of column tile t /
  // row_tiles, the weights' column tiles one after another.
  struct Where {
    uint32_t wi, j0, r0, n_out;
  };
  auto where = [&](uint32_t t) {
    uint32_t col_tile = t / row_tiles, wi = 0;
    if constexpr (!kSwiglu)
      while (col_tile >= ws.tiles[wi]) col_tile -= ws.tiles[wi++];
    return Where{wi, col_tile * kWRows, (t % row_tiles) * BN, ws.n_out[wi]};
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      detail::mbar_init(full + 8 * s, T::kCopyThreads);
      detail::mbar_init(empty + 8 * s, T::kConsumers);
    }
    detail::mbar_init_fence();
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;

  // The stage ring runs on across the CTA's tiles: stage g (counted from the
  // CTA's start) sits in slot g % STAGES, its barriers in phase g / STAGES.
  if (warp >= T::kConsumers) {  // a producer warp
    const int tid = static_cast<int>(threadIdx.x) - T::kConsumers * 32;
    uint32_t g = 0, pre = 0;
    for (uint32_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
      const Where at = where(t);
      const CopyPlan<kWRows, BK, T::kCopyThreads> wcopy(ws.w[at.wi], at.j0, at.n_out, n_in, tid);
      const CopyPlan<kWRows, BK, T::kCopyThreads> ucopy(kSwiglu ? ws.w[1] : ws.w[at.wi], at.j0,
                                                        at.n_out, n_in, tid);
      const CopyPlan<BN, BK, T::kCopyThreads> xcopy(x, at.r0, n_rows, n_in, tid);
      auto issue_w = [&](uint32_t st, uint32_t kt) {
        wcopy.issue(st, kt, n_in);
        if constexpr (kSwiglu) ucopy.issue(st + kWRows * BK * 2, kt, n_in);
      };
      if (g == 0) {
        // The first stages' weights before the dependency wait (constant:
        // they stream while the previous kernel finishes), then the
        // activations.
        pre = min(min(static_cast<uint32_t>(STAGES), c_pre_stages), k_tiles);
        for (uint32_t kt = 0; kt < pre; ++kt) issue_w(smem + kt * T::kStageBytes, kt);
        detail::dependency_wait();
      }
      for (uint32_t kt = 0; kt < k_tiles; ++kt, ++g) {
        const uint32_t slot = g % STAGES, st = smem + slot * T::kStageBytes;
        if (g >= pre) {
          if (g >= STAGES) detail::mbar_wait(empty + 8 * slot, (g / STAGES - 1) & 1);
          issue_w(st, kt);
        }
        xcopy.issue(st + BM * BK * 2, kt, n_in);
        detail::cp_async_mbar_arrive(full + 8 * slot);
      }
    }
    cp_async_wait<0>();
    return;
  }
  detail::dependency_wait();  // (y may still be read by the kernel before)

  const int a_row0 = warp * 16, gl = lane / 4, c = lane % 4;
  Frags<1, T::kNT> f[2];
  float acc[1][T::kNT][4];
  uint32_t g = 0;
  // Stage g (k tile kt of the tile) into acc; at its last step the
  // fragments of the tile's next stage are loaded, if it has one.
  auto stage = [&](uint32_t gs, uint32_t kt, auto guard) {
    constexpr bool kGuard = decltype(guard)::value;
    const uint32_t slot = gs % STAGES, st = smem + slot * T::kStageBytes;
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      if (kk < KK - 1) {
        load_frags<BK>(f[(kk + 1) % 2], st, st + BM * BK * 2, kk + 1, a_row0, 0, lane);
      } else if (kt + 1 < k_tiles) {  // step 0 of the next stage
        const uint32_t ns = (gs + 1) % STAGES, nst = smem + ns * T::kStageBytes;
        detail::mbar_wait(full + 8 * ns, ((gs + 1) / STAGES) & 1);
        load_frags<BK>(f[(kk + 1) % 2], nst, nst + BM * BK * 2, 0, a_row0, 0, lane);
      }
      if (!kGuard || kt * KK + kk < k_steps) mma_step<kF16>(acc, f[kk % 2]);
    }
    __syncwarp();  // every lane's reads of the stage are done
    detail::mbar_arrive_if(empty + 8 * slot, lane == 0);
  };
  for (uint32_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
    const Where at = where(t);
#pragma unroll
    for (int nt = 0; nt < T::kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.0f;
    }
    [[maybe_unused]] RopePrep<T::kNT> prep;
    [[maybe_unused]] const uint32_t ej0 = at.j0 + a_row0 + gl,
                                    er0 = at.r0 + 2 * c;  // the lane's first output
    if constexpr (kRope) rope_load<T::kNT>(prep, rk, rk.role[at.wi], ej0, er0, at.n_out, n_rows);
    auto after_stage = [&](uint32_t kt) {
      if constexpr (kRope)
        if (kt == 0) rope_finish<T::kNT>(prep, rk, ej0, er0, at.n_out, n_rows);
    };
    {
      const uint32_t st = smem + (g % STAGES) * T::kStageBytes;
      detail::mbar_wait(full + 8 * (g % STAGES), (g / STAGES) & 1);
      load_frags<BK>(f[0], st, st + BM * BK * 2, 0, a_row0, 0, lane);
    }
    for (uint32_t kt = 0; kt < full_tiles; ++kt) {
      stage(g + kt, kt, std::false_type{});
      after_stage(kt);
    }
    if (k_tiles > full_tiles) {
      stage(g + full_tiles, full_tiles, std::true_type{});
      after_stage(full_tiles);
    }
    g += k_tiles;

    float* __restrict__ y = ws.y[at.wi];
    if constexpr (kSwiglu) {
      // Through the exchange buffer after the stages; the consumers meet at
      // named barrier 1 (the producers do not), and again after the reads
      // (the next tile's epilogue reuses the buffer).
      float* xs = reinterpret_cast<float*>(smem_raw) + (STAGES * T::kStageBytes + 16 * STAGES) / 4;
      auto meet = [] { detail::bar_sync(1, T::kConsumers * 32); };
      swiglu_epilogue<T::kNT>(acc[0], xs, warp, T::kConsumers / 2, lane, at.j0 + a_row0, at.r0, y,
                              at.n_out, n_rows, y_bf16, meet);
      meet();
    } else if constexpr (kRope) {
      rope_kv_epilogue<T::kNT>(acc[0], rk, prep, ej0, er0, at.n_out, n_rows, y, gl);
    } else {
#pragma unroll
      for (int nt = 0; nt < T::kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t j = at.j0 + a_row0 + gl + 8 * (e / 2);
          const uint32_t r = at.r0 + nt * 8 + 2 * c + e % 2;
          if (j < at.n_out && r < n_rows) y[size_t{r} * at.n_out + j] = acc[0][nt][e];
        }
    }
  }
#else
  (void)ws, (void)x, (void)n_in, (void)n_rows, (void)row_tiles, (void)n_tiles, (void)y_bf16;
  (void)rk;
  (void)FedTile<BM, BN, BK, STAGES, PW>::kNT;  // (the sm_90a image's)
#endif
}

// Hopper variant (sm_90a): the same arithmetic on warpgroup mma. A CTA of
// WGM warpgroups owns 64 * WGM output columns x BN rows; warpgroup g issues,
// per k16 step, one wgmma.m64nBNk16 with A = its 64 weight rows and B = the
// BN activation rows, both read by the tensor cores straight from the stage
// (bk = 64: one 128-byte swizzled row per weight or activation row, with
// 1024-byte aligned stages). One wgmma's D[m, n] is, like mma.sync's, the
// tensor core's function of A's row m, B's column n and C[m, n] for 16
// products, so every output keeps the n_in / 16 step chain of the contract
// (the variant test compares the bits with the mma.sync variants).
// Feeding: one producer warp after the WGM consumer warpgroups issues each
// stage's weight and activation boxes as two TMA copies (tensor maps with
// the 128-byte swizzle, so the stage holds the layout wgmma reads;
// out-of-range rows and k zero-filled), completing the stage's `full`
// barrier; the consumers wait on it, issue the tile's wgmmas as one group,
// and once the group before it has completed (wgmma wait 1) release that
// group's stage through its `empty` barrier (one arrival per warpgroup).
// No thread copies and no block-wide barrier runs inside the K loop: on
// the H200 this is 20-30% faster than the same tiles staged by cp.async
// from every thread (docs/BENCHMARKS.md, 2026-12-02).
template <int WGM, int BN, int STAGES>
struct WgTile {
  static constexpr int kThreads = WGM * 128 + 32;  // + the producer warp
  static constexpr int kBM = WGM * 64, kBK = 64;
  static constexpr uint32_t kWBytes = kBM * kBK * 2;
  static constexpr uint32_t kStageBytes = (kBM + BN) * kBK * 2;
  // + alignment, + the stages' full and empty barriers
  static constexpr size_t kSmemBytes = size_t{STAGES} * kStageBytes + 1024 + 16 * STAGES;
  static_assert(BN == 64 || BN == 128 || BN == 256, "wgmma_bf16 shapes");
  static_assert(STAGES >= 2, "one stage computing, one landing");
};
struct TmaMaps {
  CUtensorMap w[kMaxWeights];  // weight i: boxes of 64 k x (64 * WGM, or 64 for SwiGLU) rows
  CUtensorMap x;               // activations: boxes of 64 k x BN rows
};

// The epilogue of a wgmma CTA (after its last wgmma completed): each
// warpgroup's accumulators (64 weight rows x BN activation rows from j0,
// r0) to y. kSwiglu: warpgroup 1's (up) through the shared-memory stages
// at `smem` (free by then) to warpgroup 0's threads, which write
// silu_mul_one(gate, up) to y and its bf16 rounding to y_bf16 (the
// warpgroups meet at named barrier 1: the producer warp has left).
template <int WGM, int BN, bool kSwiglu>
__device__ __forceinline__ void wg_epilogue(const float (&acc)[BN / 2], uint4* smem_raw,
                                            uint32_t smem, uint32_t r0, uint32_t j0,
                                            float* __restrict__ y, uint32_t n_out, uint32_t n_rows,
                                            uint16_t* __restrict__ y_bf16) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = (threadIdx.x / 32) % 4;
  const int g = lane / 4, c = lane % 4;
  const uint32_t wg = threadIdx.x / 128;
  if constexpr (kSwiglu) {
    // Up's accumulators to shared memory (the stages are free: every copy
    // and wgmma is done once all threads pass the barrier), element i of
    // thread t at i * 128 + t; gate's thread t of warpgroup 0 holds the same
    // (j, r) positions in the same order.
    float* up_s = reinterpret_cast<float*>(smem_raw) +
                  (smem - static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw))) / 4;
    const uint32_t t = threadIdx.x % 128;
    detail::bar_sync(1, WGM * 128);
    if (wg == 1)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) up_s[i * 128 + t] = acc[i];
    detail::bar_sync(1, WGM * 128);
    if (wg == 1) return;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t j = j0 + warp * 16 + g + 8 * (e / 2);
        const uint32_t r = r0 + i * 8 + 2 * c + e % 2;
        if (j < n_out && r < n_rows) {
          const float v = detail::silu_mul_one(acc[i * 4 + e], up_s[(i * 4 + e) * 128 + t]);
          y[size_t{r} * n_out + j] = v;
          if (y_bf16) y_bf16[size_t{r} * n_out + j] = f2bf(v);
        }
      }
  } else {
    (void)smem_raw, (void)smem, (void)y_bf16;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t j = j0 + wg * 64 + warp * 16 + g + 8 * (e / 2);
        const uint32_t r = r0 + i * 8 + 2 * c + e % 2;
        if (j < n_out && r < n_rows) y[size_t{r} * n_out + j] = acc[i * 4 + e];
      }
  }
}

// kSwiglu (two warpgroups): the fused FFN input, ws.w[0] = gate and
// ws.w[1] = up of the same shape. A CTA's column tile is 64 columns of both:
// warpgroup 0 computes gate's, warpgroup 1 up's (the same chains as in
// separate products), and the epilogue writes silu_mul_one(gate, up) to
// ws.y[0] (and its bf16 rounding to y_bf16) instead of either product.
template <int WGM, int BN, int STAGES, bool kSwiglu>
__global__ void __launch_bounds__(WgTile<WGM, BN, STAGES>::kThreads)
    matmul_wg_kernel(const __grid_constant__ TmaMaps maps, Weights ws, uint32_t n_in,
                     uint32_t n_rows, uint32_t row_tiles, uint16_t* __restrict__ y_bf16) {
#if FERRY_SM90A
  using T = WgTile<WGM, BN, STAGES>;
  static_assert(!kSwiglu || WGM == 2, "gate and up: one warpgroup each");
  constexpr int BM = T::kBM, KK = T::kBK / 16;
  constexpr int kWRows = kSwiglu ? 64 : BM;  // weight rows per box
  extern __shared__ uint4 smem_raw[];
  const uint32_t smem =
      (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t full = smem + STAGES * T::kStageBytes, empty = full + 8 * STAGES;

  const uint32_t r0 = (blockIdx.x % row_tiles) * BN;
  uint32_t col_tile = blockIdx.x / row_tiles, wi = 0;
  if constexpr (!kSwiglu)
    while (col_tile >= ws.tiles[wi]) col_tile -= ws.tiles[wi++];
  float* __restrict__ y = ws.y[wi];
  const uint32_t n_out = ws.n_out[wi];
  const uint32_t j0 = col_tile * kWRows;
  const uint32_t k_steps = n_in / 16, k_tiles = (k_steps + KK - 1) / KK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      detail::mbar_init(full + 8 * s, 1);
      detail::mbar_init(empty + 8 * s, WGM);
    }
    detail::mbar_init_fence();
  }
  __syncthreads();

  if (threadIdx.x >= WGM * 128) {  // the producer warp
    if (threadIdx.x == WGM * 128) {
      const void* wmap = &maps.w[kSwiglu ? 0 : wi];
      const void* umap = &maps.w[1];
      auto issue_w = [&](uint32_t kt) {
        const uint32_t st = smem + (kt % STAGES) * T::kStageBytes, bar = full + 8 * (kt % STAGES);
        detail::mbar_expect_tx(bar, T::kStageBytes);
        detail::tma_load_2d(st, wmap, static_cast<int>(kt * 64), static_cast<int>(j0), bar);
        if constexpr (kSwiglu)
          detail::tma_load_2d(st + 64 * 128, umap, static_cast<int>(kt * 64), static_cast<int>(j0),
                              bar);
      };
      auto issue_x = [&](uint32_t kt) {
        const uint32_t st = smem + (kt % STAGES) * T::kStageBytes, bar = full + 8 * (kt % STAGES);
        detail::tma_load_2d(st + T::kWBytes, &maps.x, static_cast<int>(kt * 64),
                            static_cast<int>(r0), bar);
      };
      // The first stages' weights before the dependency wait (they do not
      // depend on the previous kernel), then their activations.
      const uint32_t ring = min(static_cast<uint32_t>(STAGES), k_tiles),
                     pre = min(ring, c_pre_stages);
      for (uint32_t kt = 0; kt < pre; ++kt) issue_w(kt);
      detail::dependency_wait();
      for (uint32_t kt = pre; kt < ring; ++kt) issue_w(kt);
      for (uint32_t kt = 0; kt < ring; ++kt) issue_x(kt);
      for (uint32_t kt = STAGES; kt < k_tiles; ++kt) {
        detail::mbar_wait(empty + 8 * (kt % STAGES), (kt / STAGES - 1) & 1);
        issue_w(kt);
        issue_x(kt);
      }
    }
    return;
  }
  detail::dependency_wait();  // (y may still be read by the kernel before)

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  detail::wgmma_pin(acc);
  const uint32_t wg = threadIdx.x / 128;
  const bool leader = threadIdx.x % 128 == 0;
  auto tile = [&](uint32_t kt, auto steps) {
    constexpr int kSteps = decltype(steps)::value;
    const uint32_t slot = kt % STAGES;
    detail::mbar_wait(full + 8 * slot, (kt / STAGES) & 1);
    const uint32_t st = smem + slot * T::kStageBytes;
    const uint32_t a = st + wg * 64 * T::kBK * 2, b = st + T::kWBytes;
    detail::wgmma_pin(acc);
    detail::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
      detail::wgmma_bf16<BN>(acc, detail::wgmma_desc_sw128(a + kk * 32),
                             detail::wgmma_desc_sw128(b + kk * 32));
    detail::wgmma_commit();
    detail::wgmma_pin(acc);
    detail::wgmma_wait<1>();  // tile kt - 1's group is done: its stage is free
    detail::wgmma_pin(acc);
    detail::mbar_arrive_if(empty + 8 * ((kt + STAGES - 1) % STAGES), kt > 0 && leader);
  };
  const uint32_t full_tiles = k_steps / KK;
  for (uint32_t kt = 0; kt < full_tiles; ++kt) tile(kt, std::integral_constant<int, KK>{});
  static_assert(KK == 4, "the tail below handles 1..3 steps");
  switch (k_steps % KK) {  // n_in % 64: the last tile's steps, exactly
    case 1:
      tile(full_tiles, std::integral_constant<int, 1>{});
      break;
    case 2:
      tile(full_tiles, std::integral_constant<int, 2>{});
      break;
    case 3:
      tile(full_tiles, std::integral_constant<int, 3>{});
      break;
    default:
      break;
  }
  detail::wgmma_wait<0>();
  wg_epilogue<WGM, BN, kSwiglu>(acc, smem_raw, smem, r0, j0, y, n_out, n_rows, y_bf16);
#else
  (void)maps, (void)ws, (void)n_in, (void)n_rows, (void)row_tiles, (void)y_bf16;
  (void)WgTile<WGM, BN, STAGES>::kWBytes;  // (the sm_90a image's)
#endif
}

// ---- variants ----------------------------------------------------------------

struct Args {
  Weights ws;  // tiles filled by launch
  size_t n_in;
  const uint16_t* x;
  size_t n_rows;
  cudaStream_t stream;
};

// A launch's 1-D grid: ws.tiles[i] = weight i's column tiles of bm (set
// here), times the row tiles of bn.
struct Grid {
  unsigned ctas;
  uint32_t row_tiles;
};
Grid cut(Weights& ws, size_t n_rows, int bm, int bn) {
  size_t col_tiles = 0;
  for (int i = 0; i < ws.n; ++i) {
    ws.tiles[i] = (ws.n_out[i] + bm - 1) / bm;
    col_tiles += ws.tiles[i];
  }
  const size_t row_tiles = (n_rows + bn - 1) / bn;
  FERRY_CHECK(row_tiles * col_tiles <= 0x7fffffffu, "matmul_tc", "too many tiles: n_rows=", n_rows,
              " column tiles=", col_tiles);
  return {static_cast<unsigned>(row_tiles * col_tiles), static_cast<uint32_t>(row_tiles)};
}

// launch_swiglu of a skinny variant V (CRTP) whose kernel has the fused
// SwiGLU epilogue when kSwiglu: the grid is cut over gate's columns, BM / 2
// a tile (ws.w[1]: up).
template <class V, int BM, bool kSwiglu>
struct SwigluLaunch {
  static void launch_swiglu(const Args& a, uint16_t* y_bf16) {
    if constexpr (kSwiglu) {
      Weights gate = a.ws;
      gate.n = 1;
      V::template go<false, true>(a, gate, BM / 2, y_bf16);
    } else {
      (void)a, (void)y_bf16;
      FERRY_CHECK(false, "matmul_tc_swiglu", "needs a variant with a fused epilogue");
    }
  }
};

// kSwiglu: the variant also runs the fused SwiGLU input (matmul_tc_kernel).
template <int BM, int BN, int WM, int WN, int BK, int STAGES, bool kSwiglu = false>
struct Variant : SwigluLaunch<Variant<BM, BN, WM, WN, BK, STAGES, kSwiglu>, BM, kSwiglu> {
  static constexpr TileConfig kConfig = {nullptr, BM, BN, WM, WN, BK, STAGES, false, 0, kSwiglu};

  template <bool kF16, bool kFused = false>
  static void go(const Args& a, Weights ws, int bm, uint16_t* y_bf16) {
    using T = Tile<BM, BN, WM, WN, BK, STAGES>;
    auto* kernel = matmul_tc_kernel<BM, BN, WM, WN, BK, STAGES, kF16, kFused>;
    detail::raise_smem_limit<matmul_tc_kernel<BM, BN, WM, WN, BK, STAGES, kF16, kFused>>(
        T::kSmemBytes);
    const Grid grid = cut(ws, a.n_rows, bm, BN);
    detail::launch(kFused ? "matmul_tc_swiglu_kernel" : "matmul_tc_kernel", kernel, grid.ctas,
                   T::kThreads, T::kSmemBytes, a.stream, ws, a.x, static_cast<uint32_t>(a.n_in),
                   static_cast<uint32_t>(a.n_rows), grid.row_tiles, y_bf16);
  }
  template <bool kF16>
  static void launch(const Args& a) {
    go<kF16>(a, a.ws, BM, nullptr);
  }
};

// A producer-fed variant (Hopper). Elsewhere f16 weights (which the tests
// run on every variant) take S16x8k256 (same bits); bf16 weights need sm_90a.
template <int BM, int BN, int BK, int STAGES, int PW, bool kSwiglu = false>
struct FedVariant : SwigluLaunch<FedVariant<BM, BN, BK, STAGES, PW, kSwiglu>, BM, kSwiglu> {
  static constexpr TileConfig kConfig = {nullptr, BM,     BN,   BM / 16, 1,
                                         BK,      STAGES, true, PW,      kSwiglu};
  using T = FedTile<BM, BN, BK, STAGES, PW>;

  template <bool kF16, bool kFused = false, bool kRope = false>
  static void go(const Args& a, Weights ws, int bm, uint16_t* y_bf16, const RopeKv& rk = {}) {
    auto* kernel = matmul_fed_kernel<BM, BN, BK, STAGES, PW, kF16, kFused, kRope>;
    detail::raise_smem_limit<matmul_fed_kernel<BM, BN, BK, STAGES, PW, kF16, kFused, kRope>>(
        T::kSmemBytes);
    set_pre_stages();
    const Grid grid = cut(ws, a.n_rows, bm, BN);
    // Persistent: as many CTAs as fit on the device at once, each taking
    // tiles i, i + grid, ... with its stage ring running on between them.
    detail::launch(kFused  ? "matmul_fed_swiglu_kernel"
                   : kRope ? "matmul_fed_rope_kernel"
                           : "matmul_fed_kernel",
                   kernel, std::min(grid.ctas, resident<kF16, kFused, kRope>()), T::kThreads,
                   T::kSmemBytes, a.stream, ws, a.x, static_cast<uint32_t>(a.n_in),
                   static_cast<uint32_t>(a.n_rows), grid.row_tiles, grid.ctas, y_bf16, rk);
  }
  template <bool kF16>
  static void launch(const Args& a) {
    if (kF16 && !wgmma_available()) return Variant<16, 8, 1, 1, 256, 4>::launch<kF16>(a);
    go<kF16>(a, a.ws, BM, nullptr);
  }
  // The Q/K/V epilogue (bf16 weights; sm_90a).
  static void launch_rope(const Args& a, const RopeKv& rk) {
    go<false, false, true>(a, a.ws, BM, nullptr, rk);
  }
  // The CTAs of that kernel that fit on this device at once (per kernel
  // and device, once: the kernels share one signature, not their registers).
  template <bool kF16, bool kFused, bool kRope>
  static unsigned resident() {
    static std::atomic<unsigned> known[64];
    return per_device(known, [&](int) {
      int per_sm = 0;
      FERRY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, matmul_fed_kernel<BM, BN, BK, STAGES, PW, kF16, kFused, kRope>, T::kThreads,
          T::kSmemBytes));
      return static_cast<unsigned>(std::max<size_t>(1, device_sms() * std::max(per_sm, 0)));
    });
  }
};

// The tensor map encoder of the driver (no link to libcuda: the runtime
// hands out the entry point).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    FERRY_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                      cudaEnableDefault, &q));
    FERRY_CHECK(q == cudaDriverEntryPointSuccess && p, "matmul_tc",
                "the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}
}  // namespace

CUtensorMap tensor_map_sw128(const void* base, size_t elem_bytes, size_t inner, size_t outer,
                             uint32_t box_rows) {
  FERRY_CHECK(elem_bytes == 1 || elem_bytes == 2, "matmul_tc", "tensor map of ", elem_bytes,
              "-byte elements");
  CUtensorMap m{};
  const cuuint64_t dims[2] = {inner, outer}, strides[1] = {inner * elem_bytes};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / elem_bytes), box_rows}, unit[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &m, elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
      const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FERRY_CHECK(r == CUDA_SUCCESS, "matmul_tc", "tensor map of ", outer, " x ", inner,
              ": driver error ", static_cast<int>(r));
  return m;
}

namespace {

// A Hopper variant. f16 weights need the hi / lo split in registers, which
// wgmma's shared-memory A operand cannot take: they run L128x128 (same bits).
template <int WGM, int BN, int STAGES>
struct WgVariant {
  static constexpr TileConfig kConfig = {nullptr, WGM * 64, BN,   WGM, 1,
                                         64,      STAGES,   true, 0,   WGM == 2};
  using T = WgTile<WGM, BN, STAGES>;

  static TmaMaps maps(const Args& a, int n_w, uint32_t w_rows) {
    TmaMaps m{};
    for (int i = 0; i < n_w; ++i)
      m.w[i] = tensor_map_sw128(a.ws.w[i], 2, a.n_in, a.ws.n_out[i], w_rows);
    m.x = tensor_map_sw128(a.x, 2, a.n_in, a.n_rows, BN);
    return m;
  }
  template <bool kSwiglu>
  static void go(const Args& a, const Weights& ws, const Grid& grid, uint32_t w_rows,
                 uint16_t* y_bf16) {
    auto* kernel = matmul_wg_kernel<WGM, BN, STAGES, kSwiglu>;
    detail::raise_smem_limit<matmul_wg_kernel<WGM, BN, STAGES, kSwiglu>>(T::kSmemBytes);
    set_pre_stages();
    detail::launch(kSwiglu ? "matmul_wg_swiglu_kernel" : "matmul_wg_kernel", kernel, grid.ctas,
                   T::kThreads, T::kSmemBytes, a.stream, maps(a, ws.n, w_rows), ws,
                   static_cast<uint32_t>(a.n_in), static_cast<uint32_t>(a.n_rows), grid.row_tiles,
                   y_bf16);
  }
  template <bool kF16>
  static void launch(const Args& a) {
    if constexpr (kF16) {
      Variant<128, 128, 2, 4, 64, 3>::launch<true>(a);
    } else {
      Weights ws = a.ws;
      const Grid grid = cut(ws, a.n_rows, WGM * 64, BN);
      go<false>(a, ws, grid, WGM * 64, nullptr);
    }
  }
  static void launch_swiglu(const Args& a, uint16_t* y_bf16) {
    if constexpr (WGM == 2) {
      Weights gate = a.ws;  // the grid: gate's columns, 64 a CTA
      gate.n = 1;
      const Grid grid = cut(gate, a.n_rows, 64, BN);
      go<true>(a, a.ws, grid, 64, y_bf16);
    } else {
      (void)a, (void)y_bf16;
      FERRY_CHECK(false, "matmul_tc_swiglu", "needs a two-warpgroup variant");
    }
  }
};

// The menu. Names: S = skinny (one m16 tile per warp), M = mid, L = large;
// then bm x bn. Shared memory per CTA = stages * (bm + bn) * bk * 2 bytes.
// choose_config uses those marked *; the others stay for the tests (every
// variant must give the same bits) and for re-tuning with
// gpu_matmul_bench --sweep on other shapes or GPUs.
using Variants =
    std::tuple<Variant<16, 8, 1, 1, 128, 8>,        // 0 S16x8*    48 KB, 1 warp
               Variant<32, 8, 2, 1, 128, 6>,        // 1 S32x8     60 KB
               Variant<64, 8, 4, 1, 128, 4>,        // 2 S64x8*    72 KB
               Variant<16, 16, 1, 1, 128, 6>,       // 3 S16x16    48 KB
               Variant<32, 16, 2, 1, 128, 6>,       // 4 S32x16*   72 KB
               Variant<16, 32, 1, 1, 128, 6>,       // 5 S16x32    72 KB
               Variant<32, 32, 2, 1, 128, 4>,       // 6 S32x32    64 KB
               Variant<32, 64, 2, 2, 64, 4>,        // 7 M32x64    48 KB, warp 16x32
               Variant<64, 64, 2, 2, 64, 4>,        // 8 M64x64*   64 KB, warp 32x32
               Variant<128, 64, 2, 2, 64, 4>,       // 9 L128x64*  96 KB, warp 64x32
               Variant<64, 128, 2, 2, 64, 4>,       // 10 L64x128  96 KB, warp 32x64
               Variant<128, 128, 2, 4, 64, 3>,      // 11 L128x128 96 KB, 8 warps of 64x32
               Variant<128, 128, 2, 2, 64, 3>,      // 12 L128x128w4 96 KB, 4 warps of 64x64
               Variant<256, 128, 4, 2, 64, 3>,      // 13 L256x128* 144 KB, 8 warps of 64x64
               Variant<16, 8, 1, 1, 256, 4>,        // 14 S16x8k256 48 KB, 1 warp
               Variant<16, 8, 1, 1, 128, 4>,        // 15 S16x8s4   24 KB, 1 warp
               Variant<64, 16, 4, 1, 128, 4>,       // 16 S64x16*   80 KB
               Variant<64, 32, 4, 1, 128, 4>,       // 17 S64x32*   96 KB
               Variant<64, 8, 4, 1, 256, 3, true>,  // 18 S64x8k256* 108 KB (+ SwiGLU)
               Variant<32, 8, 2, 1, 256, 4>,        // 19 S32x8k256* 80 KB
               Variant<32, 8, 2, 1, 512, 3>,        // 20 S32x8k512* 120 KB
               WgVariant<2, 256, 4>,                // 21 W128x256  192 KB, 2 warpgroups (sm_90a)
               WgVariant<2, 128, 5>,                // 22 W128x128  160 KB
               WgVariant<1, 128, 6>,                // 23 W64x128   144 KB, 1 warpgroup
               WgVariant<2, 64, 6>,                 // 24 W128x64   144 KB (swiglu_config)
               WgVariant<1, 256, 4>,                // 25 W64x256   160 KB
               WgVariant<1, 64, 8>,                 // 26 W64x64    128 KB
               FedVariant<16, 8, 256, 6, 1>,        // 27 F16x8     72 KB, 1 + 1 warps (sm_90a)
               FedVariant<32, 8, 256, 6, 2, true>,  // 28 F32x8 120 KB, 2 + 2 warps (+ SwiGLU)
               FedVariant<16, 8, 256, 8, 1>,        // 29 F16x8s8   96 KB, 1 + 1 warps
               FedVariant<16, 8, 128, 8, 1>>;       // 30 F16x8k128 48 KB, 1 + 1 warps

constexpr const char* kNames[] = {
    "S16x8",     "S32x8",    "S64x8",    "S16x16",  "S32x16",    "S16x32",     "S32x32",
    "M32x64",    "M64x64",   "L128x64",  "L64x128", "L128x128",  "L128x128w4", "L256x128",
    "S16x8k256", "S16x8s4",  "S64x16",   "S64x32",  "S64x8k256", "S32x8k256",  "S32x8k512",
    "W128x256",  "W128x128", "W64x128",  "W128x64", "W64x256",   "W64x64",     "F16x8",
    "F32x8",     "F16x8s8",  "F16x8k128"};
constexpr size_t kN = std::tuple_size_v<Variants>;
static_assert(std::size(kNames) == kN);

using LaunchFn = void (*)(const Args&);
using SwigluFn = void (*)(const Args&, uint16_t*);
using RopeFn = void (*)(const Args&, const RopeKv&);

// A variant's launch_rope (the producer-fed ones), else null.
template <class V>
constexpr RopeFn rope_launch() {
  if constexpr (requires { &V::launch_rope; })
    return &V::launch_rope;
  else
    return nullptr;
}

template <size_t... I>
constexpr auto make_table(std::index_sequence<I...>) {
  struct Table {
    TileConfig cfg[kN];
    LaunchFn bf16[kN], f16[kN];
    SwigluFn swiglu[kN];
    RopeFn rope[kN];
  } t{};
  ((t.cfg[I] = std::tuple_element_t<I, Variants>::kConfig, t.cfg[I].name = kNames[I],
    t.bf16[I] = &std::tuple_element_t<I, Variants>::template launch<false>,
    t.f16[I] = &std::tuple_element_t<I, Variants>::template launch<true>,
    t.swiglu[I] = &std::tuple_element_t<I, Variants>::launch_swiglu,
    t.rope[I] = rope_launch<std::tuple_element_t<I, Variants>>()),
   ...);
  return t;
}
const auto kTable = make_table(std::make_index_sequence<kN>{});

}  // namespace

size_t n_configs() {
  return kN;
}
const TileConfig& config(size_t i) {
  FERRY_CHECK(i < kN, "matmul_tc", "config ", i, " of ", kN);
  return kTable.cfg[i];
}

// Up to 8 rows by the rule below; more rows by pick_tile with at least
// kMinCtas CTAs (about 3/4 of an H200's 132 SMs). Measured on the H200
// (bench/gpu_matmul_bench --sweep): each pick was within 5% of the best
// variant for the 8B shapes at rows 1..256 (2026-11-30; rows <= 8 re-picked
// with dependent launch on 2026-12-01). Any choice computes the same bits.
bool wgmma_available() {
  static std::atomic<int> known[64];  // 1 no, 2 yes
  return per_device(known, [](int) {
           // The kernel's image: sm_90a SASS reports PTX version 90; a JIT
           // from the portable compute_80 PTX (any other GPU) reports 80.
           cudaFuncAttributes attr{};
           FERRY_CUDA_CHECK(cudaFuncGetAttributes(&attr, matmul_wg_kernel<1, 64, 8, false>));
           return attr.ptxVersion >= 90 && attr.binaryVersion == 90 ? 2 : 1;
         }) == 2;
}

size_t device_sms() {
  static std::atomic<int> known[64];
  return static_cast<size_t>(per_device(known, [](int dev) {
    int sms = 0;
    FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return std::max(sms, 1);
  }));
}

uint32_t pre_stages() {
  static const uint32_t v =
      static_cast<uint32_t>(std::min<size_t>(knob_size("FERRY_CUDA_PRE_STAGES", 2), 1u << 16));
  return v;
}

size_t choose_config(size_t n_in, size_t n_out, size_t n_rows, bool wgmma, size_t sms) {
  (void)n_in;
  constexpr size_t kMinCtas = 100;
  if (n_rows <= 8) {
    // Decode of a few streams. Measured with dependent launch (2026-12-01,
    // --sweep=1): stages of 256 k (512 bytes of each weight row per
    // stage) beat 128 k by 5-15% on the 8B shapes, the head aside, whose
    // 2,000 CTAs of S64x8 already stream at the copy bandwidth; S64x8
    // itself lost 30% on 4096 -> 14336 (its CTAs three to an SM).
    // Long rows over few columns (14336 -> 4096) gain another 4% from
    // stages of 512 k.
    // On Hopper the producer-fed tiles (2026-12-02, session 19, us at one
    // row): the few-column shapes with as many stages as keeps every tile
    // resident at once (two CTAs of F16x8s8, three of F16x8 per SM: o
    // 13.5 -> 10.7, down 35.2 -> 29.4, Q/K/V 15.5 -> 15.0), the wide ones
    // with F32x8's persistent CTAs (gate+up 58.6 -> 56.7, head 246.6 ->
    // 238.6).
    const size_t ctas64 = (n_out + 63) / 64, ctas32 = (n_out + 31) / 32;
    const size_t ctas16 = (n_out + 15) / 16;
    if (wgmma)
      return ctas16 <= 2 * sms ? 29 : ctas16 <= 3 * sms ? 27 : 28;  // F16x8s8, F16x8, F32x8
    if (ctas64 >= 1000) return 2;                                   // S64x8
    if (ctas64 >= 200) return 18;                                   // S64x8k256
    if (ctas32 >= kMinCtas && n_in >= 8192) return 20;              // S32x8k512
    if (ctas32 >= kMinCtas) return 19;                              // S32x8k256
    return 0;                                                       // S16x8
  }
  // Indices into Variants (names in kNames). The last (finest) entries only
  // matter for n_out below the measured shapes.
  static constexpr size_t kRows16[] = {16, 4, 3},  // S64x16, S32x16, S16x16
      kRows32[] = {17, 16, 4, 3},  // S64x32, S64x16 / S32x16 (two row tiles), S16x16
      kRows64[] = {9, 17, 4},      // L128x64, S64x32, S32x16
      kRows128[] = {13, 9, 8, 7},  // L256x128, L128x64, M64x64, M32x64
      kRowsMore[] = {13, 9};       // L256x128, L128x64
  static constexpr RowRange kRanges[] = {
      {16, kRows16}, {32, kRows32}, {64, kRows64}, {128, kRows128}, {SIZE_MAX, kRowsMore}};
  if (wgmma && n_rows > kWgmmaAboveRows) {
    // Hopper (2026-12-01, --sweep=64..8192 on the 8B shapes): the wgmma
    // variants beat every mma.sync one from 64 rows on (prefill 500-580
    // TFLOP/s against 400 for L256x128); the largest tile that still fills
    // about 0.7 of the 132 SMs wins, and tiles taller than the rows waste
    // their mma. Each pick below was the measured best or within 3% of it.
    constexpr size_t kMinWgCtas = 90;
    static constexpr size_t kWg64[] = {24, 26},  // W128x64, W64x64
        kWg128[] = {22, 24, 26},                 // W128x128, W128x64, W64x64
        kWgMore[] = {21, 22, 24, 26};            // W128x256, W128x128, W128x64, W64x64
    static constexpr RowRange kWgRanges[] = {{64, kWg64}, {128, kWg128}, {SIZE_MAX, kWgMore}};
    return pick_tile(kWgRanges, config, n_out, n_rows, kMinWgCtas);
  }
  return pick_tile(kRanges, config, n_out, n_rows, kMinCtas);
}

namespace {

void check_args(size_t n_in, size_t n_out, size_t n_rows, const uint16_t* w, const uint16_t* x) {
  FERRY_CHECK(n_in % 16 == 0, "matmul_tc", "n_in=", n_in, " not a multiple of 16");
  FERRY_CHECK(n_in < (size_t{1} << 31) && n_out < (size_t{1} << 31) && n_rows < (size_t{1} << 31),
              "matmul_tc", "shape too large: n_in=", n_in, " n_out=", n_out, " n_rows=", n_rows);
  FERRY_CHECK(reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
              "matmul_tc", "w and x must be 16-byte aligned");
}

}  // namespace

void matmul_tc_many_with(size_t cfg, std::span<const uint16_t* const> w, bool w_f16, size_t n_in,
                         std::span<const size_t> n_out, const uint16_t* x, size_t n_rows,
                         std::span<float* const> y, cudaStream_t stream) {
  FERRY_CHECK(cfg < kN, "matmul_tc", "config ", cfg, " of ", kN);
  FERRY_CHECK(!kTable.cfg[cfg].sm90a || w_f16 || wgmma_available(), "matmul_tc", "variant ",
              kTable.cfg[cfg].name, " needs a Hopper GPU (sm_90a)");
  FERRY_CHECK(
      !w.empty() && w.size() <= kMaxWeights && n_out.size() == w.size() && y.size() == w.size(),
      "matmul_tc", w.size(), " weights (at most ", kMaxWeights, ")");
  Args a{{}, n_in, x, n_rows, stream};
  for (size_t i = 0; i < w.size(); ++i) {
    check_args(n_in, n_out[i], n_rows, w[i], x);
    if (n_out[i] == 0) continue;
    a.ws.w[a.ws.n] = w[i];
    a.ws.y[a.ws.n] = y[i];
    a.ws.n_out[a.ws.n++] = static_cast<uint32_t>(n_out[i]);
  }
  if (n_rows == 0 || a.ws.n == 0) return;
  (w_f16 ? kTable.f16 : kTable.bf16)[cfg](a);
}

bool swiglu_variant(size_t cfg) {
  return cfg < kN && kTable.cfg[cfg].swiglu;
}

bool rope_variant(size_t cfg) {
  return cfg < kN && kTable.rope[cfg] != nullptr;
}

void matmul_tc_qkv_rope_with(size_t cfg, const uint16_t* const (&w)[3], size_t n_in,
                             const size_t (&n_out)[3], const uint16_t* x, size_t n_rows,
                             float* const (&y)[3], const QkvEpilogue& ep, cudaStream_t stream) {
  FERRY_CHECK(rope_variant(cfg), "matmul_tc_qkv_rope", "config ", cfg, " has no Q/K/V epilogue");
  FERRY_CHECK(wgmma_available(), "matmul_tc_qkv_rope", "variant ", kTable.cfg[cfg].name,
              " needs a Hopper GPU (sm_90a)");
  FERRY_CHECK(ep.head_dim % 2 == 0 && ep.head_dim > 0 && n_out[0] % ep.head_dim == 0 &&
                  n_out[1] % ep.head_dim == 0 && n_out[2] % ep.head_dim == 0,
              "matmul_tc_qkv_rope", "head_dim ", ep.head_dim, " does not divide the outputs");
  FERRY_CHECK(ep.kv == kernels::KvFormat::Kind::Affine || ep.writes != nullptr,
              "matmul_tc_qkv_rope", "a dense KV store needs its writes");
  Args a{{}, n_in, x, n_rows, stream};
  RopeKv rk;
  rk.pos = ep.pos;
  rk.inv_freq = ep.inv_freq;
  rk.writes = ep.writes;
  rk.half = static_cast<uint32_t>(ep.head_dim / 2);
  rk.kv = ep.kv;
  for (int i = 0; i < 3; ++i) {
    check_args(n_in, n_out[i], n_rows, w[i], x);
    if (n_out[i] == 0) continue;
    a.ws.w[a.ws.n] = w[i];
    a.ws.y[a.ws.n] = y[i];
    a.ws.n_out[a.ws.n] = static_cast<uint32_t>(n_out[i]);
    rk.role[a.ws.n++] = static_cast<uint8_t>(i + 1);  // q, k, v
  }
  if (n_rows == 0 || a.ws.n == 0) return;
  kTable.rope[cfg](a, rk);
}

void matmul_tc_swiglu_with(size_t cfg, const uint16_t* w_gate, const uint16_t* w_up, size_t n_in,
                           size_t n_out, const uint16_t* x, size_t n_rows, float* gate,
                           uint16_t* gate_bf16, cudaStream_t stream) {
  FERRY_CHECK(swiglu_variant(cfg), "matmul_tc_swiglu", "config ", cfg,
              " has no fused SwiGLU epilogue");
  FERRY_CHECK(!kTable.cfg[cfg].sm90a || wgmma_available(), "matmul_tc_swiglu", "variant ",
              kTable.cfg[cfg].name, " needs a Hopper GPU (sm_90a)");
  check_args(n_in, n_out, n_rows, w_gate, x);
  check_args(n_in, n_out, n_rows, w_up, x);
  if (n_rows == 0 || n_out == 0) return;
  Args a{{}, n_in, x, n_rows, stream};
  a.ws.w[0] = w_gate;
  a.ws.w[1] = w_up;
  a.ws.y[0] = gate;
  a.ws.y[1] = nullptr;
  a.ws.n_out[0] = a.ws.n_out[1] = static_cast<uint32_t>(n_out);
  a.ws.n = 2;
  kTable.swiglu[cfg](a, gate_bf16);
}

void matmul_tc_with(size_t cfg, const uint16_t* w, bool w_f16, size_t n_in, size_t n_out,
                    const uint16_t* x, size_t n_rows, float* y, cudaStream_t stream) {
  matmul_tc_many_with(cfg, std::span<const uint16_t* const>(&w, 1), w_f16, n_in,
                      std::span<const size_t>(&n_out, 1), x, n_rows, std::span<float* const>(&y, 1),
                      stream);
}

}  // namespace tc

void matmul_tc_many(std::span<const uint16_t* const> w, bool w_f16, size_t n_in,
                    std::span<const size_t> n_out, const uint16_t* x, size_t n_rows,
                    std::span<float* const> y, cudaStream_t stream) {
  size_t total = 0;
  for (size_t n : n_out) total += n;
  const bool wgmma = tc::wgmma_available();
  tc::matmul_tc_many_with(tc::choose_config(n_in, total, n_rows, wgmma, tc::device_sms()), w, w_f16,
                          n_in, n_out, x, n_rows, y, stream);
}

bool matmul_tc_qkv_rope_applies(size_t n_in, size_t n_out_total, size_t n_rows) {
  const bool wgmma = tc::wgmma_available();
  return wgmma && n_rows >= 1 &&
         tc::rope_variant(tc::choose_config(n_in, n_out_total, n_rows, wgmma, tc::device_sms()));
}

void matmul_tc_qkv_rope(const uint16_t* const (&w)[3], size_t n_in, const size_t (&n_out)[3],
                        const uint16_t* x, size_t n_rows, float* const (&y)[3],
                        const QkvEpilogue& ep, cudaStream_t stream) {
  const bool wgmma = tc::wgmma_available();
  tc::matmul_tc_qkv_rope_with(
      tc::choose_config(n_in, n_out[0] + n_out[1] + n_out[2], n_rows, wgmma, tc::device_sms()), w,
      n_in, n_out, x, n_rows, y, ep, stream);
}

namespace {
// The fused tile. Decode steps (up to 8 rows): where matmul_tc_many would
// stream gate and up in one launch of a wide tile (wide FFNs; on narrow
// ones the fused tile's columns would leave SMs idle), F32x8 on Hopper
// (16 columns of each a tile), S64x8k256 elsewhere (32 of each). Above 32 rows (Hopper): the tile
// matmul_tc_many would take when it has two warpgroups, W128x64 where it picked the one-warpgroup
// W64x64 (few columns: about as many CTAs either way). None (kN) elsewhere: 9-32 rows, narrow FFNs,
// other GPUs above 32 rows.
size_t swiglu_config(size_t n_in, size_t n_out, size_t n_rows) {
  constexpr size_t kS64x8 = 2, kS64x8k256 = 18, kF32x8 = 28;
  if (n_rows <= 8) {
    const size_t cfg =
        tc::choose_config(n_in, 2 * n_out, n_rows, tc::wgmma_available(), tc::device_sms());
    if (cfg == kF32x8) return kF32x8;
    return cfg == kS64x8 || cfg == kS64x8k256 ? kS64x8k256 : tc::n_configs();
  }
  if (n_rows <= tc::kWgmmaAboveRows || !tc::wgmma_available()) return tc::n_configs();
  const size_t cfg = tc::choose_config(n_in, 2 * n_out, n_rows, true, tc::device_sms());
  if (tc::swiglu_variant(cfg)) return cfg;
  return tc::config(cfg).sm90a ? 24 : tc::n_configs();  // 24: W128x64
}
}  // namespace

bool matmul_tc_swiglu_applies(size_t n_in, size_t n_out, size_t n_rows) {
  return swiglu_config(n_in, n_out, n_rows) < tc::n_configs();
}
void matmul_tc_swiglu(const uint16_t* w_gate, const uint16_t* w_up, size_t n_in, size_t n_out,
                      const uint16_t* x, size_t n_rows, float* gate, uint16_t* gate_bf16,
                      cudaStream_t stream) {
  const size_t cfg = swiglu_config(n_in, n_out, n_rows);
  FERRY_CHECK(cfg < tc::n_configs(), "matmul_tc_swiglu", "no fused tile for n_in=", n_in,
              " n_out=", n_out, " n_rows=", n_rows);
  tc::matmul_tc_swiglu_with(cfg, w_gate, w_up, n_in, n_out, x, n_rows, gate, gate_bf16, stream);
}

void matmul_tc(const uint16_t* w, bool w_f16, size_t n_in, size_t n_out, const uint16_t* x,
               size_t n_rows, float* y, cudaStream_t stream) {
  matmul_tc_many(std::span<const uint16_t* const>(&w, 1), w_f16, n_in,
                 std::span<const size_t>(&n_out, 1), x, n_rows, std::span<float* const>(&y, 1),
                 stream);
}

}  // namespace ferry::cuda
