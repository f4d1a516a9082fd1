// FP8 (E4M3) quantization and rescaling kernels for --fp8 (fp8.h).
#include <cuda_fp8.h>

#include <algorithm>

#include "core/error.h"
#include "cuda/common_impl.cuh"
#include "cuda/fp8.h"

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
