// Device helpers of the E4M3 row quantization (quantize_fp8_rows's
// formula and its block max), shared by fp8.cu and the ops that write an
// FP8 copy of their output (rmsnorm's out8), so every writer gives the
// same codes.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/fp8.h"

namespace ferry::cuda::detail {

// v times the row's factor, rounded to nearest even E4M3, saturated to +-448.
__device__ __forceinline__ uint8_t to_e4m3(float v, float inv) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, inv), __NV_SATFINITE, __NV_E4M3);
}

// The largest of every thread's `a` (>= 0) over a block of kThreads (a
// multiple of 32, at most 1024): a max, exact in any order.
template <int kThreads>
__device__ __forceinline__ float block_max(float a) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024);
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = a;
  __syncthreads();
  a = threadIdx.x % 32 < kThreads / 32 ? part[threadIdx.x % 32] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

// For a row whose largest magnitude is a: the factor its codes are made
// with (448 / a) in *inv, and the row's scale (a / 448) returned; a row of
// zeros gets 1 and 1.
__device__ __forceinline__ float fp8_row_scale(float a, float* inv) {
  const bool zero = !(a > 0.0f);
  *inv = zero ? 1.0f : __fdiv_rn(kFp8Max, a);
  return zero ? 1.0f : __fdiv_rn(a, kFp8Max);
}

}  // namespace ferry::cuda::detail
