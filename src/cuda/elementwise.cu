// Row and elementwise ops: rmsnorm, rope, silu_mul, add_inplace, f32_to_bf16.
// Each element's arithmetic is the CPU's (kernels/ops.cpp) written with
// explicitly rounded intrinsics, so nvcc's FMA contraction cannot change it;
// only rmsnorm's sum of squares (a block tree) and the libm-style functions
// (expf, cosf, sinf: within 2 ulp of the CPU's) differ from the CPU.
#include "core/error.h"
#include "cuda/common_impl.cuh"

namespace ferry::cuda {
namespace {

using namespace detail;

// One block per row. Thread t sums x[i]^2 for i = t, t + 256, ... with FMA in
// increasing i, then the block reduces the 256 partials by a fixed tree
// (warp butterflies, then warp 0 over the 8 warp sums). The order depends
// only on dim, so a row's result is the same in any batch. With y, x[i] +=
// y[i] first (written back; the norm is of the sum); with out_bf16, the
// output's bf16 rounding is written there too (what f32_to_bf16 of out
// gives), for the tensor-core product that reads it next. A thread's loads
// go out in runs of 8 (a row is one block: its latency is the step's).
constexpr int kNormThreads = 256;
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(float* x, const float* y, const float* w, uint32_t dim, float eps, float* out,
                   uint16_t* out_bf16) {
  __shared__ float warp_ss[kNormThreads / 32];
  __shared__ float scale_s;
  dependency_wait();
  float* xr = x + size_t{blockIdx.x} * dim;
  const float* yr = y ? y + size_t{blockIdx.x} * dim : nullptr;
  // Thread t's elements t, t + 256, ... in runs of kRun, each run's loads
  // issued before its stores (x, y and out may alias, so the compiler
  // would not hoist them itself).
  constexpr uint32_t kRun = 8;
  float ss = 0.0f;
  for (uint32_t i0 = threadIdx.x; i0 < dim; i0 += kRun * kNormThreads) {
    float v[kRun];
#pragma unroll
    for (uint32_t k = 0; k < kRun; ++k) {
      const uint32_t i = i0 + k * kNormThreads;
      v[k] = i < dim ? (yr ? __fadd_rn(xr[i], yr[i]) : xr[i]) : 0.0f;
    }
#pragma unroll
    for (uint32_t k = 0; k < kRun; ++k) {
      const uint32_t i = i0 + k * kNormThreads;
      if (i < dim) {
        if (yr) xr[i] = v[k];  // read back below by this thread only
        ss = __fmaf_rn(v[k], v[k], ss);
      }
    }
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) warp_ss[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < kNormThreads / 32 ? warp_ss[threadIdx.x] : 0.0f;
    v = warp_sum(v);
    // The CPU formula: 1 / sqrt(ss / dim + eps), each step IEEE-rounded.
    if (threadIdx.x == 0)
      scale_s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(v, static_cast<float>(dim)), eps)));
  }
  __syncthreads();  // also orders every read of x before the writes (out may alias x)
  const float scale = scale_s;
  float* o = out + size_t{blockIdx.x} * dim;
  uint16_t* ob = out_bf16 ? out_bf16 + size_t{blockIdx.x} * dim : nullptr;
  for (uint32_t i0 = threadIdx.x; i0 < dim; i0 += kRun * kNormThreads) {
    float v[kRun];
#pragma unroll
    for (uint32_t k = 0; k < kRun; ++k) {
      const uint32_t i = i0 + k * kNormThreads;
      v[k] = i < dim ? __fmul_rn(__fmul_rn(xr[i], scale), w[i]) : 0.0f;
    }
#pragma unroll
    for (uint32_t k = 0; k < kRun; ++k) {
      const uint32_t i = i0 + k * kNormThreads;
      if (i < dim) {
        o[i] = v[k];
        if (ob) ob[i] = f2bf(v[k]);
      }
    }
  }
}

// One thread per (row, head, pair): pairs (2i, 2i+1) rotate by pos[row] * inv_freq[i].
__global__ void rope_kernel(float* x, size_t n_pairs, uint32_t n_heads, uint32_t half,
                            const int32_t* pos, const float* inv_freq) {
  dependency_wait();
  for (size_t t = blockIdx.x * size_t{blockDim.x} + threadIdx.x; t < n_pairs;
       t += size_t{gridDim.x} * blockDim.x) {
    const uint32_t i = static_cast<uint32_t>(t % half);
    const size_t row = t / half / n_heads;
    const float theta = __fmul_rn(static_cast<float>(pos[row]), inv_freq[i]);
    const float c = cosf(theta), s = sinf(theta);
    float2* v = reinterpret_cast<float2*>(x) + t;  // pair t is floats 2t, 2t+1
    const float2 ab = *v;
    *v = make_float2(__fsub_rn(__fmul_rn(ab.x, c), __fmul_rn(ab.y, s)),
                     __fadd_rn(__fmul_rn(ab.x, s), __fmul_rn(ab.y, c)));
  }
}

__global__ void silu_mul_kernel(float* gate, const float* up, size_t n, uint16_t* gate_bf16) {
  dependency_wait();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    const float v = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
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
                    float* out, uint16_t* out_bf16, cudaStream_t stream) {
  if (n_rows == 0) return;
  FERRY_CHECK(n_rows <= 0x7fffffffu && dim > 0 && dim <= 0xffffffffu, "rmsnorm", "rows=", n_rows,
              " dim=", dim);
  launch("rmsnorm_kernel", rmsnorm_kernel, static_cast<unsigned>(n_rows), kNormThreads, 0, stream,
         x, y, w, static_cast<uint32_t>(dim), eps, out, out_bf16);
}
}  // namespace

void rmsnorm(const float* x, const float* w, size_t n_rows, size_t dim, float eps, float* out,
             cudaStream_t stream, uint16_t* out_bf16) {
  // Without y the kernel only reads x.
  launch_rmsnorm(const_cast<float*>(x), nullptr, w, n_rows, dim, eps, out, out_bf16, stream);
}

void add_rmsnorm(float* x, const float* y, const float* w, size_t n_rows, size_t dim, float eps,
                 float* out, uint16_t* out_bf16, cudaStream_t stream) {
  launch_rmsnorm(x, y, w, n_rows, dim, eps, out, out_bf16, stream);
}

void rope(float* x, size_t n_rows, size_t n_heads, size_t head_dim, const int32_t* pos,
          const float* inv_freq, cudaStream_t stream) {
  FERRY_CHECK(head_dim % 2 == 0, "rope", "odd head_dim ", head_dim);
  const size_t n_pairs = n_rows * n_heads * (head_dim / 2);
  if (n_pairs == 0) return;
  launch("rope_kernel", rope_kernel, elementwise_blocks(n_pairs, kThreads), kThreads, 0, stream, x,
         n_pairs, static_cast<uint32_t>(n_heads), static_cast<uint32_t>(head_dim / 2), pos,
         inv_freq);
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
