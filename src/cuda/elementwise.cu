// Row and elementwise ops: rmsnorm, rope, silu_mul, add_inplace, f32_to_bf16.
// Each element's arithmetic is the CPU's (kernels/ops.cpp) written with
// explicitly rounded intrinsics, so nvcc's FMA contraction cannot change it;
// only rmsnorm's sum of squares (a block tree) and the libm-style functions
// (expf, cosf, sinf: within 2 ulp of the CPU's) differ from the CPU.
#include <algorithm>

#include "core/error.h"
#include "cuda/common_impl.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/fp8_impl.cuh"

namespace ferry::cuda {
namespace {

using namespace detail;

// One block of kNormThreads per row. The row is cut into pieces of 4
// elements (the last one shorter when dim % 4 != 0); thread t owns pieces
// t, t + kNormThreads, ... and sums x[i]^2 over them with FMA in
// increasing i; the block reduces the partials by a fixed tree (warp
// butterflies, then warp 0 over the warp sums). The order depends only on
// dim, so a row's result is the same in any batch (and whichever load path
// below runs: both do this arithmetic). With y, x[i] += y[i] first (written
// back; the norm is of the sum); with out_bf16, the output's bf16 rounding
// is written there too (what f32_to_bf16 of out gives), for the tensor-core
// product that reads it next.
//
// Rows of up to kNormThreads * kRegPieces pieces (8192 elements) stay in
// registers: each thread issues all its loads at once (w's before the
// dependency wait: it is a weight), so a row costs one memory round trip
// before the reduction; longer rows read x again for the output. 16-byte
// loads when dim % 4 == 0 and the rows are 16-byte aligned.
constexpr int kNormThreads = 512, kRegPieces = 4;

struct Piece {
  float v[4];
};
template <bool kVec>
__device__ __forceinline__ Piece load_piece(const float* p, uint32_t n) {
  Piece r;
  if constexpr (kVec) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    r.v[0] = f.x, r.v[1] = f.y, r.v[2] = f.z, r.v[3] = f.w;
  } else {
#pragma unroll
    for (uint32_t k = 0; k < 4; ++k) r.v[k] = k < n ? p[k] : 0.0f;
  }
  return r;
}
template <bool kVec>
__device__ __forceinline__ void store_piece(float* p, const Piece& r, uint32_t n) {
  if constexpr (kVec) {
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else {
#pragma unroll
    for (uint32_t k = 0; k < 4; ++k)
      if (k < n) p[k] = r.v[k];
  }
}
template <bool kVec>
__device__ __forceinline__ void store_piece_bf16(uint16_t* p, const Piece& r, uint32_t n) {
  if constexpr (kVec) {
    *reinterpret_cast<uint2*>(p) =
        make_uint2(f2bf(r.v[0]) | (static_cast<uint32_t>(f2bf(r.v[1])) << 16),
                   f2bf(r.v[2]) | (static_cast<uint32_t>(f2bf(r.v[3])) << 16));
  } else {
#pragma unroll
    for (uint32_t k = 0; k < 4; ++k)
      if (k < n) p[k] = f2bf(r.v[k]);
  }
}

// 1 / sqrt(sum / dim + eps) from each thread's partial sum of squares (the
// CPU formula, each step IEEE-rounded), the same value in every thread.
__device__ __forceinline__ float norm_scale(float ss, uint32_t dim, float eps) {
  __shared__ float warp_ss[kNormThreads / 32];
  __shared__ float scale_s;
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) warp_ss[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < kNormThreads / 32 ? warp_ss[threadIdx.x] : 0.0f;
    v = warp_sum(v);
    if (threadIdx.x == 0)
      scale_s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(v, static_cast<float>(dim)), eps)));
  }
  __syncthreads();  // also orders every read of x before the writes (out may alias x)
  return scale_s;
}

// With out8 (rows held in registers only): the output's E4M3 codes and
// row scales as quantize_fp8_rows makes them from out, for the FP8
// product that reads it next.
template <bool kVec, bool kInRegs>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(float* x, const float* y, const float* w, uint32_t dim, float eps, float* out,
                   uint16_t* out_bf16, Fp8RowsOut out8) {
  const uint32_t n_pieces = (dim + 3) / 4, t = threadIdx.x;
  auto len = [&](uint32_t p) { return min(4u, dim - 4 * p); };
  Piece wv[kRegPieces];
  if constexpr (kInRegs) {
#pragma unroll
    for (int k = 0; k < kRegPieces; ++k) {
      const uint32_t p = t + k * kNormThreads;
      if (p < n_pieces) wv[k] = load_piece<kVec>(w + 4 * p, len(p));
    }
  }
  dependency_wait();
  float* xr = x + size_t{blockIdx.x} * dim;
  const float* yr = y ? y + size_t{blockIdx.x} * dim : nullptr;
  float* o = out + size_t{blockIdx.x} * dim;
  uint16_t* ob = out_bf16 ? out_bf16 + size_t{blockIdx.x} * dim : nullptr;
  float ss = 0.0f;
  // Pieces p0, p0 + kNormThreads, ... (kRegPieces of them) of this thread:
  // loaded (x + y, written back), summed in order.
  auto sum_run = [&](uint32_t p0, Piece(&v)[kRegPieces]) {
#pragma unroll
    for (int k = 0; k < kRegPieces; ++k) {
      const uint32_t p = p0 + k * kNormThreads;
      if (p < n_pieces) {
        v[k] = load_piece<kVec>(xr + 4 * p, len(p));
        if (yr) {
          const Piece b = load_piece<kVec>(yr + 4 * p, len(p));
#pragma unroll
          for (int e = 0; e < 4; ++e) v[k].v[e] = __fadd_rn(v[k].v[e], b.v[e]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kRegPieces; ++k) {
      const uint32_t p = p0 + k * kNormThreads;
      if (p < n_pieces) {
        if (yr) store_piece<kVec>(xr + 4 * p, v[k], len(p));  // read back by this thread only
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (static_cast<uint32_t>(e) < len(p)) ss = __fmaf_rn(v[k].v[e], v[k].v[e], ss);
      }
    }
  };
  auto write = [&](uint32_t p, Piece& v, const Piece& wp, float scale) {
#pragma unroll
    for (int e = 0; e < 4; ++e) v.v[e] = __fmul_rn(__fmul_rn(v.v[e], scale), wp.v[e]);
    store_piece<kVec>(o + 4 * p, v, len(p));
    if (ob) store_piece_bf16<kVec>(ob + 4 * p, v, len(p));
  };
  constexpr uint32_t kRun = kRegPieces * kNormThreads;
  if constexpr (kInRegs) {
    Piece v[kRegPieces];
    sum_run(t, v);
    const float scale = norm_scale(ss, dim, eps);
#pragma unroll
    for (int k = 0; k < kRegPieces; ++k) {
      const uint32_t p = t + k * kNormThreads;
      if (p < n_pieces) write(p, v[k], wv[k], scale);
    }
    if (out8.codes) {
      float a = 0.0f;
#pragma unroll
      for (int k = 0; k < kRegPieces; ++k) {
        const uint32_t p = t + k * kNormThreads;
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (p < n_pieces && static_cast<uint32_t>(e) < len(p)) a = fmaxf(a, fabsf(v[k].v[e]));
      }
      float inv;
      const float s8 = fp8_row_scale(block_max<kNormThreads>(a), &inv);
      if (t == 0) out8.scales[blockIdx.x] = s8;
      uint8_t* c = out8.codes + size_t{blockIdx.x} * dim;
#pragma unroll
      for (int k = 0; k < kRegPieces; ++k) {
        const uint32_t p = t + k * kNormThreads;
        if (p >= n_pieces) continue;
        if constexpr (kVec) {
          *reinterpret_cast<uint32_t*>(c + 4 * p) =
              uint32_t{to_e4m3(v[k].v[0], inv)} | uint32_t{to_e4m3(v[k].v[1], inv)} << 8 |
              uint32_t{to_e4m3(v[k].v[2], inv)} << 16 | uint32_t{to_e4m3(v[k].v[3], inv)} << 24;
        } else {
          for (uint32_t e = 0; e < len(p); ++e) c[4 * p + e] = to_e4m3(v[k].v[e], inv);
        }
      }
    }
  } else {
    for (uint32_t p0 = t; p0 < n_pieces; p0 += kRun) {
      Piece v[kRegPieces];
      sum_run(p0, v);
    }
    const float scale = norm_scale(ss, dim, eps);
    for (uint32_t p = t; p < n_pieces; p += kNormThreads) {
      Piece v = load_piece<kVec>(xr + 4 * p, len(p));
      write(p, v, load_piece<kVec>(w + 4 * p, len(p)), scale);
    }
  }
}

// One thread per (row, pair index i, run of kRopeHeads heads) over a's
// heads and then b's (two tensors rotated by the same positions in one
// launch: q and k): the angle pos[row] * inv_freq[i], its cosine and its
// sine are computed once for the run, whose pairs (2i, 2i+1) then rotate.
// Each pair's arithmetic does not depend on the run it is in.
constexpr uint32_t kRopeHeads = 8;
__global__ void rope_kernel(float* a, uint32_t a_heads, float* b, uint32_t b_heads, uint32_t n_rows,
                            uint32_t half, const int32_t* pos, const float* inv_freq) {
  dependency_wait();
  const uint32_t heads = a_heads + b_heads, runs = (heads + kRopeHeads - 1) / kRopeHeads;
  const size_t n = size_t{n_rows} * runs * half;
  for (size_t t = blockIdx.x * size_t{blockDim.x} + threadIdx.x; t < n;
       t += size_t{gridDim.x} * blockDim.x) {
    const size_t q = t / half;
    const uint32_t i = static_cast<uint32_t>(t - q * half), run = static_cast<uint32_t>(q % runs);
    const size_t row = q / runs;
    const float theta = __fmul_rn(static_cast<float>(pos[row]), inv_freq[i]);
    const float c = cosf(theta), s = sinf(theta);
#pragma unroll
    for (uint32_t j = 0; j < kRopeHeads; ++j) {
      const uint32_t h = run * kRopeHeads + j;
      if (h >= heads) break;
      float2* v = h < a_heads
                      ? reinterpret_cast<float2*>(a) + (row * a_heads + h) * half + i
                      : reinterpret_cast<float2*>(b) + (row * b_heads + (h - a_heads)) * half + i;
      const float2 ab = *v;
      *v = make_float2(__fsub_rn(__fmul_rn(ab.x, c), __fmul_rn(ab.y, s)),
                       __fadd_rn(__fmul_rn(ab.x, s), __fmul_rn(ab.y, c)));
    }
  }
}

__global__ void silu_mul_kernel(float* gate, const float* up, size_t n, uint16_t* gate_bf16) {
  dependency_wait();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float v = silu_mul_one(gate[i], up[i]);
    gate[i] = v;
    if (gate_bf16) gate_bf16[i] = f2bf(v);
  }
}

__global__ void add_kernel(float* x, const float* y, size_t n) {
  dependency_wait();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void f32_to_bf16_kernel(const float* x, size_t n, uint16_t* out) {
  dependency_wait();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    out[i] = f2bf(x[i]);
}

constexpr unsigned kThreads = 256;

}  // namespace

namespace {
void launch_rmsnorm(float* x, const float* y, const float* w, size_t n_rows, size_t dim, float eps,
                    float* out, uint16_t* out_bf16, Fp8RowsOut out8, cudaStream_t stream) {
  if (n_rows == 0) return;
  FERRY_CHECK(n_rows <= 0x7fffffffu && dim > 0 && dim <= 0xffffffffu, "rmsnorm", "rows=", n_rows,
              " dim=", dim);
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = dim % 4 == 0 && aligned(x) && aligned(w) && aligned(out) && (!y || aligned(y)) &&
                   (!out_bf16 || reinterpret_cast<uintptr_t>(out_bf16) % 8 == 0) &&
                   (!out8.codes || reinterpret_cast<uintptr_t>(out8.codes) % 4 == 0);
  const bool in_regs = (dim + 3) / 4 <= size_t{kNormThreads} * kRegPieces;
  // (longer rows: the codes by quantize_fp8_rows after, the same bits)
  const Fp8RowsOut fused = in_regs ? out8 : Fp8RowsOut{};
  auto go = [&](auto kernel) {
    launch("rmsnorm_kernel", kernel, static_cast<unsigned>(n_rows), kNormThreads, 0, stream, x, y,
           w, static_cast<uint32_t>(dim), eps, out, out_bf16, fused);
  };
  if (vec)
    in_regs ? go(rmsnorm_kernel<true, true>) : go(rmsnorm_kernel<true, false>);
  else
    in_regs ? go(rmsnorm_kernel<false, true>) : go(rmsnorm_kernel<false, false>);
  if (out8.codes && !in_regs)
    quantize_fp8_rows(out, DType::F32, n_rows, dim, out8.codes, out8.scales, stream);
}
}  // namespace

void rmsnorm(const float* x, const float* w, size_t n_rows, size_t dim, float eps, float* out,
             cudaStream_t stream, uint16_t* out_bf16, Fp8RowsOut out8) {
  // Without y the kernel only reads x.
  launch_rmsnorm(const_cast<float*>(x), nullptr, w, n_rows, dim, eps, out, out_bf16, out8, stream);
}

void add_rmsnorm(float* x, const float* y, const float* w, size_t n_rows, size_t dim, float eps,
                 float* out, uint16_t* out_bf16, cudaStream_t stream, Fp8RowsOut out8) {
  launch_rmsnorm(x, y, w, n_rows, dim, eps, out, out_bf16, out8, stream);
}

void rope(float* x, size_t n_rows, size_t n_heads, size_t head_dim, const int32_t* pos,
          const float* inv_freq, cudaStream_t stream) {
  rope2(x, n_heads, nullptr, 0, n_rows, head_dim, pos, inv_freq, stream);
}

void rope2(float* a, size_t a_heads, float* b, size_t b_heads, size_t n_rows, size_t head_dim,
           const int32_t* pos, const float* inv_freq, cudaStream_t stream) {
  FERRY_CHECK(head_dim % 2 == 0, "rope", "odd head_dim ", head_dim);
  if (!b) b_heads = 0;
  const size_t heads = a_heads + b_heads, half = head_dim / 2;
  if (n_rows == 0 || heads == 0 || half == 0) return;
  FERRY_CHECK(n_rows <= 0x7fffffffu && heads <= 0xffffu && half <= 0xffffu, "rope", "rows=", n_rows,
              " heads=", heads, " head_dim=", head_dim);
  const size_t threads = n_rows * ((heads + kRopeHeads - 1) / kRopeHeads) * half;
  launch("rope_kernel", rope_kernel, elementwise_blocks(threads, kThreads), kThreads, 0, stream, a,
         static_cast<uint32_t>(a_heads), b, static_cast<uint32_t>(b_heads),
         static_cast<uint32_t>(n_rows), static_cast<uint32_t>(half), pos, inv_freq);
}

void silu_mul(float* gate, const float* up, size_t n, cudaStream_t stream, uint16_t* gate_bf16) {
  if (n == 0) return;
  launch("silu_mul_kernel", silu_mul_kernel, elementwise_blocks(n, kThreads), kThreads, 0, stream,
         gate, up, n, gate_bf16);
}

void add_inplace(float* x, const float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch("add_kernel", add_kernel, elementwise_blocks(n, kThreads), kThreads, 0, stream, x, y, n);
}

void f32_to_bf16(const float* x, size_t n, uint16_t* out, cudaStream_t stream) {
  if (n == 0) return;
  launch("f32_to_bf16_kernel", f32_to_bf16_kernel, elementwise_blocks(n, kThreads), kThreads, 0,
         stream, x, n, out);
}

}  // namespace ferry::cuda
