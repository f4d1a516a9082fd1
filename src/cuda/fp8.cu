// FP8 (E4M3) quantization and rescaling kernels for --fp8 (fp8.h).
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "cuda/common_impl.cuh"
#include "cuda/fp8.h"
#include "cuda/matmul_tc.cuh"
#include "cuda/ptx_impl.cuh"

namespace ferry::cuda {
namespace {

using detail::dependency_wait;
using detail::launch;

constexpr int kQuantThreads = 1024;
// Rows of F32 values up to this long (a multiple of 4, 16-byte aligned)
// stay in registers: one memory round trip a row (decode steps quantize
// one row per product, so the row's latency is the kernel's).
constexpr int kRegVecs = 4;
constexpr uint32_t kRegRow = kQuantThreads * kRegVecs * 4;

template <DType T>
__device__ __forceinline__ float load_value(const void* p, size_t i) {
  if constexpr (T == DType::F32)
    return static_cast<const float*>(p)[i];
  else if constexpr (T == DType::BF16)
    return detail::bf2f(static_cast<const uint16_t*>(p)[i]);
  else
    return detail::h2f(static_cast<const uint16_t*>(p)[i]);
}

// The block's largest of every thread's `a` (a max: exact in any order).
__device__ __forceinline__ float block_max(float a) {
  __shared__ float part[kQuantThreads / 32];
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = a;
  __syncthreads();
  a = part[threadIdx.x % 32];
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

__device__ __forceinline__ uint8_t to_e4m3(float v, float inv) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, inv), __NV_SATFINITE, __NV_E4M3);
}

// One block per row: the row's largest magnitude, then each value times
// 448 / max rounded to E4M3. kVec: F32 rows of at most kRegRow values, a
// multiple of 4, read once into registers as float4s.
template <DType T, bool kVec>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_fp8_kernel(const void* __restrict__ x, uint32_t n, uint8_t* __restrict__ codes,
                        float* __restrict__ scales) {
  dependency_wait();
  const size_t row = size_t{blockIdx.x} * n;
  float a = 0.0f;
  float4 v[kRegVecs];
  if constexpr (kVec) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(x) + row);
#pragma unroll
    for (int i = 0; i < kRegVecs; ++i) {
      const uint32_t at = threadIdx.x + i * kQuantThreads;
      v[i] = at < n / 4 ? p[at] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      a = fmaxf(a, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
    }
  } else {
    for (uint32_t i = threadIdx.x; i < n; i += kQuantThreads)
      a = fmaxf(a, fabsf(load_value<T>(x, row + i)));
  }
  a = block_max(a);
  const bool zero = !(a > 0.0f);
  const float inv = zero ? 1.0f : __fdiv_rn(kFp8Max, a);
  if (threadIdx.x == 0) scales[blockIdx.x] = zero ? 1.0f : __fdiv_rn(a, kFp8Max);
  if constexpr (kVec) {
    uint32_t* out = reinterpret_cast<uint32_t*>(codes + row);
#pragma unroll
    for (int i = 0; i < kRegVecs; ++i) {
      const uint32_t at = threadIdx.x + i * kQuantThreads;
      if (at < n / 4)
        out[at] = uint32_t{to_e4m3(v[i].x, inv)} | uint32_t{to_e4m3(v[i].y, inv)} << 8 |
                  uint32_t{to_e4m3(v[i].z, inv)} << 16 | uint32_t{to_e4m3(v[i].w, inv)} << 24;
    }
  } else {
    for (uint32_t i = threadIdx.x; i < n; i += kQuantThreads)
      codes[row + i] = to_e4m3(load_value<T>(x, row + i), inv);
  }
}

template <bool kBf16>
__global__ void scale_fp8_kernel(const void* __restrict__ acc, const float* __restrict__ rs,
                                 const float* __restrict__ cs, uint32_t n_out, size_t total,
                                 float* __restrict__ y) {
  dependency_wait();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const float v = kBf16 ? detail::bf2f(static_cast<const uint16_t*>(acc)[i])
                          : static_cast<const float*>(acc)[i];
    y[i] = __fmul_rn(v, __fmul_rn(rs[i / n_out], cs[i % n_out]));
  }
}

// Decode steps (1-8 rows): y = (x W^T) * scale per column, with W's E4M3
// codes and x's bf16 values multiplied in f32 (no activation rounding to
// FP8). A block of kGemvWarps warps takes C columns for all R rows; warp w
// walks 512-value stretches w, w + kGemvWarps, ... of k (a lane 16 values:
// one 16-byte load of codes per column), and the warps' partial sums meet
// in shared memory. Many small blocks keep every SM's loads in flight even
// for the narrow products (K and V: 1,024 columns).
constexpr int kGemvWarps = 8;

__device__ __forceinline__ void e4m3x16_to_f32(const uint4& v, float (&f)[16]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(u[i] >> (16 * h)), __NV_E4M3);
      const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&r));
      f[4 * i + 2 * h] = p.x;
      f[4 * i + 2 * h + 1] = p.y;
    }
  }
}

template <int R, int C>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_fp8_kernel(const uint8_t* __restrict__ w, const float* __restrict__ sw,
                    const uint16_t* __restrict__ x, uint32_t n_in, uint32_t n_out,
                    float* __restrict__ y) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t j0 = blockIdx.x * C;
  const uint8_t* wr[C];
#pragma unroll
  for (int c = 0; c < C; ++c) wr[c] = w + static_cast<size_t>(min(j0 + c, n_out - 1)) * n_in;
  float acc[C][R] = {};
  uint32_t k = (warp * 32 + lane) * 16;
  constexpr uint32_t kStep = kGemvWarps * 512;
  // The first stretch of codes is a weight: loaded before the wait.
  uint4 wv[C];
  if (k < n_in)
#pragma unroll
    for (int c = 0; c < C; ++c) wv[c] = __ldcs(reinterpret_cast<const uint4*>(wr[c] + k));
  dependency_wait();
  for (; k < n_in; k += kStep) {
    float wf[C][16];
#pragma unroll
    for (int c = 0; c < C; ++c) e4m3x16_to_f32(wv[c], wf[c]);
    if (k + kStep < n_in)
#pragma unroll
      for (int c = 0; c < C; ++c) wv[c] = __ldcs(reinterpret_cast<const uint4*>(wr[c] + k + kStep));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4* xp = reinterpret_cast<const uint4*>(x + static_cast<size_t>(r) * n_in + k);
      const uint4 a = xp[0], b = xp[1];
      const uint32_t u[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float x0 = __uint_as_float(u[i] << 16), x1 = __uint_as_float(u[i] & 0xffff0000u);
#pragma unroll
        for (int c = 0; c < C; ++c) {
          acc[c][r] = fmaf(wf[c][2 * i], x0, acc[c][r]);
          acc[c][r] = fmaf(wf[c][2 * i + 1], x1, acc[c][r]);
        }
      }
    }
  }
  __shared__ float part[kGemvWarps][C * R];
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[c][r];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][c * R + r] = v;
    }
  __syncthreads();
  if (threadIdx.x < C * R) {
    const int c = threadIdx.x / R, r = threadIdx.x % R;
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < kGemvWarps; ++i) v += part[i][threadIdx.x];
    if (j0 + c < n_out) y[static_cast<size_t>(r) * n_out + j0 + c] = v * sw[j0 + c];
  }
}

template <int R>
void gemv_rows(const uint8_t* w, const float* sw, const uint16_t* x, uint32_t n_in, uint32_t n_out,
               float* y, cudaStream_t stream) {
  constexpr int C = R <= 2 ? 2 : 4;
  const unsigned blocks = (n_out + C - 1) / C;
  launch("gemv_fp8", gemv_fp8_kernel<R, C>, blocks, kGemvWarps * 32, 0, stream, w, sw, x, n_in,
         n_out, y);
}

// Steps of a few dozen rows (matmul_fp8): both operands E4M3, one
// m16n8k32 FP8 mma per 32 k, in matmul_tc's orientation (A = the weight's
// codes, m = output column; B = the activation codes, n = row). A block of
// kMmaWarps warps takes MT * 16 columns for NT * 8 rows; warp w walks the
// 64-value chunks w, w + kMmaWarps, ... of k, the next chunk's weights in
// flight while it multiplies the last. A thread loads 16 codes a row
// straight from global memory (weights evict-first, as gemv_fp8's: each is
// read once; activations through L1/L2: every block reads them): thread
// (g, t) = (lane / 4, lane % 4) holds k = 16t .. 16t + 15 of the chunk for
// weight rows g and g + 8 and activation row g, and its words 2s and
// 2s + 1 are the k32 fragments of step s. The mma's slots thus hold a
// permutation of k, the same one in A and B, so the sum is of the right
// products. Each chunk's two steps start from zero and are then added to
// the f32 accumulator: Hopper's FP8 tensor cores add at reduced precision,
// so a long chain of steps is not left to them (cuBLASLt and DeepSeek-V3
// promote every 128 values). The warps' sums meet by a fixed tree in
// shared memory; y = sum * (x_scale * w_scale) as scale_fp8_product forms
// it.
// MT m16 tiles of columns a block (2; 1 for products too narrow to give
// every multiprocessor a block of 32 columns).
constexpr int kMmaWarps = 8;
constexpr uint32_t kMmaChunk = 64;  // k a warp takes at a time

template <int MT, int NT>
__global__ void __launch_bounds__(kMmaWarps * 32)
    mma_fp8_kernel(const uint8_t* __restrict__ w, const float* __restrict__ ws,
                   const uint8_t* __restrict__ x, const float* __restrict__ xs, uint32_t n_in,
                   uint32_t n_out, uint32_t n_rows, float* __restrict__ y) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  // Row tiles are the grid's fastest dimension: the blocks that run
  // together share a column tile, read from HBM once.
  const uint32_t r0 = blockIdx.x * (NT * 8), j0 = blockIdx.y * (MT * 16);
  // Rows and columns past the end are read (clamped) and never stored.
  const uint8_t* wr[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      wr[m][h] = w + static_cast<size_t>(min(j0 + m * 16 + h * 8 + g, n_out - 1)) * n_in + 16 * t;
  uint32_t xr[NT];  // offsets of this thread's activation rows
#pragma unroll
  for (int n = 0; n < NT; ++n) xr[n] = min(r0 + n * 8 + g, n_rows - 1) * n_in + 16 * t;
  float acc[MT][NT][4] = {};
  uint32_t k = warp * kMmaChunk;
  constexpr uint32_t kStep = kMmaWarps * kMmaChunk;
  uint4 a[MT][2];  // [tile][row g, g + 8]
  const auto load_a = [&](uint4(&dst)[MT][2], uint32_t at) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) dst[m][h] = __ldcs(reinterpret_cast<const uint4*>(wr[m][h] + at));
  };
  // The first chunk is a weight's: loaded before the wait.
  if (k < n_in) load_a(a, k);
  dependency_wait();
  for (; k < n_in; k += kStep) {
    uint4 b[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) b[n] = *reinterpret_cast<const uint4*>(x + xr[n] + k);
    uint4 next[MT][2];
    if (k + kStep < n_in) load_a(next, k + kStep);
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float c[4] = {};
        const uint4 &lo = a[m][0], &hi = a[m][1];
        detail::mma_e4m3_k32(c, {lo.x, hi.x, lo.y, hi.y}, b[n].x, b[n].y);
        detail::mma_e4m3_k32(c, {lo.z, hi.z, lo.w, hi.w}, b[n].z, b[n].w);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][n][i] += c[i];
      }
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) a[m][h] = next[m][h];
  }
  // Warps w and w + half meet in w, half = 4, 2, 1.
  __shared__ float part[kMmaWarps / 2][MT][NT][4][32];
#pragma unroll
  for (int half = kMmaWarps / 2; half >= 1; half /= 2) {
    const bool give = warp >= half && warp < 2 * half, take = warp < half;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (give) part[warp - half][m][n][i][lane] = acc[m][n][i];
    __syncthreads();
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (take) acc[m][n][i] += part[warp][m][n][i][lane];
    __syncthreads();
  }
  // Warp 0 stores: d[i] of tile (m, n) is column j0 + 16m + g (+ 8 for
  // i >= 2), row r0 + 8n + 2t + (i & 1).
  if (warp != 0) return;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t j = j0 + m * 16 + g + (i >> 1) * 8, r = r0 + n * 8 + 2 * t + (i & 1);
        if (j < n_out && r < n_rows)
          y[static_cast<size_t>(r) * n_out + j] = __fmul_rn(acc[m][n][i], __fmul_rn(xs[r], ws[j]));
      }
}

template <int MT, int NT>
void mma_rows(const uint8_t* w, const float* ws, const uint8_t* x, const float* xs, uint32_t n_in,
              uint32_t n_out, uint32_t n_rows, float* y, cudaStream_t stream) {
  const dim3 grid((n_rows + NT * 8 - 1) / (NT * 8), (n_out + MT * 16 - 1) / (MT * 16));
  launch("matmul_fp8", mma_fp8_kernel<MT, NT>, grid, kMmaWarps * 32, 0, stream, w, ws, x, xs, n_in,
         n_out, n_rows, y);
}

}  // namespace

bool fp8_supported(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;
  return major * 10 + minor >= 89;
}

void quantize_fp8_rows(const void* x, DType type, size_t n_rows, size_t n, uint8_t* codes,
                       float* scales, cudaStream_t stream) {
  if (n_rows == 0) return;
  FERRY_CHECK(n_rows < (size_t{1} << 31) && n < (size_t{1} << 31), "fp8", "rows of ", n,
              " values x ", n_rows, " too large");
  const unsigned rows = static_cast<unsigned>(n_rows);
  const uint32_t len = static_cast<uint32_t>(n);
  const auto go = [&](auto kernel) {
    launch("quantize_fp8", kernel, rows, kQuantThreads, 0, stream, x, len, codes, scales);
  };
  switch (type) {
    case DType::F32:
      // Rows of 4k floats from 16-byte boundaries (codes then land on 4-byte ones).
      if (n % 4 == 0 && n <= kRegRow && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
          reinterpret_cast<uintptr_t>(codes) % 4 == 0)
        return go(quantize_fp8_kernel<DType::F32, true>);
      return go(quantize_fp8_kernel<DType::F32, false>);
    case DType::BF16:
      return go(quantize_fp8_kernel<DType::BF16, false>);
    case DType::F16:
      return go(quantize_fp8_kernel<DType::F16, false>);
    default:
      fail("fp8", "cannot quantize ", dtype_traits(type).name, " values to FP8");
  }
}

void gemv_fp8(const uint8_t* w, const float* w_scales, const uint16_t* x, size_t n_in, size_t n_out,
              size_t n_rows, float* y, cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  FERRY_CHECK(n_rows <= kFp8GemvRows && n_in % 16 == 0 && n_in < (size_t{1} << 31) &&
                  n_out < (size_t{1} << 31),
              "fp8", "gemv_fp8: ", n_rows, " rows of ", n_in, " -> ", n_out);
  // One unrolled kernel per row count.
  using Launch = void (*)(const uint8_t*, const float*, const uint16_t*, uint32_t, uint32_t, float*,
                          cudaStream_t);
  static constexpr Launch kByRows[kFp8GemvRows] = {gemv_rows<1>, gemv_rows<2>, gemv_rows<3>,
                                                   gemv_rows<4>, gemv_rows<5>, gemv_rows<6>,
                                                   gemv_rows<7>, gemv_rows<8>};
  kByRows[n_rows - 1](w, w_scales, x, static_cast<uint32_t>(n_in), static_cast<uint32_t>(n_out), y,
                      stream);
}

bool matmul_fp8_applies(size_t n_in) {
  return n_in % kMmaChunk == 0 && n_in < (size_t{1} << 24) && tc::wgmma_available();
}

void matmul_fp8(const uint8_t* w, const float* w_scales, const uint8_t* x, const float* x_scales,
                size_t n_in, size_t n_out, size_t n_rows, float* y, cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  FERRY_CHECK(
      matmul_fp8_applies(n_in) && n_out <= size_t{65535} * 16 && n_rows * n_in < (size_t{1} << 32),
      "fp8", "matmul_fp8: ", n_rows, " rows of ", n_in, " -> ", n_out);
  // Row tiles of 8 (up to 8 rows) to 64: the fewest tiles of at most 64
  // rows; column tiles of 32 where that gives every multiprocessor one.
  const size_t tiles = (n_rows + 63) / 64, nt = (n_rows + tiles * 8 - 1) / (tiles * 8);
  // FERRY_CUDA_FP8_MMA_TILES=1 or 2 forces MT (for measuring).
  static const int forced = [] {
    const char* e = std::getenv("FERRY_CUDA_FP8_MMA_TILES");
    return e ? std::atoi(e) : 0;
  }();
  const bool wide = forced ? forced == 2 : n_out >= 32 * tc::device_sms();
  using Launch = void (*)(const uint8_t*, const float*, const uint8_t*, const float*, uint32_t,
                          uint32_t, uint32_t, float*, cudaStream_t);
  static constexpr Launch kByTiles[2][8] = {
      {mma_rows<1, 1>, mma_rows<1, 2>, mma_rows<1, 3>, mma_rows<1, 4>, mma_rows<1, 5>,
       mma_rows<1, 6>, mma_rows<1, 7>, mma_rows<1, 8>},
      {mma_rows<2, 1>, mma_rows<2, 2>, mma_rows<2, 3>, mma_rows<2, 4>, mma_rows<2, 5>,
       mma_rows<2, 6>, mma_rows<2, 7>, mma_rows<2, 8>}};
  kByTiles[wide][nt - 1](w, w_scales, x, x_scales, static_cast<uint32_t>(n_in),
                         static_cast<uint32_t>(n_out), static_cast<uint32_t>(n_rows), y, stream);
}

void scale_fp8_product(const void* acc, bool acc_bf16, const float* row_scale,
                       const float* col_scale, size_t n_rows, size_t n_out, float* y,
                       cudaStream_t stream) {
  const size_t total = n_rows * n_out;
  if (total == 0) return;
  const unsigned blocks = detail::elementwise_blocks(total, 256);
  const uint32_t cols = static_cast<uint32_t>(n_out);
  if (acc_bf16)
    launch("scale_fp8", scale_fp8_kernel<true>, blocks, 256, 0, stream, acc, row_scale, col_scale,
           cols, total, y);
  else
    launch("scale_fp8", scale_fp8_kernel<false>, blocks, 256, 0, stream, acc, row_scale, col_scale,
           cols, total, y);
}

}  // namespace ferry::cuda
