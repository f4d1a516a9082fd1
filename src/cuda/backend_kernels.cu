#include <cuda_fp16.h>

#include "cuda/common_impl.cuh"
#include "cuda/cuda_internal.h"
#include "cuda/cuda_ops.h"

namespace ferry::cuda {

namespace {

using detail::dependency_wait;
using detail::launch;

__global__ void gather_rows_kernel(const float* __restrict__ x, const uint32_t* __restrict__ rows,
                                   size_t dim, float* __restrict__ out) {
  dependency_wait();
  const float* src = x + static_cast<size_t>(rows[blockIdx.x]) * dim;
  float* dst = out + static_cast<size_t>(blockIdx.x) * dim;
  for (size_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

__global__ void f32_to_f16_kernel(const float* __restrict__ x, size_t n, __half* __restrict__ out) {
  dependency_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(x[i]);
}

template <class Job>
__global__ void expand_kernel(const Job* __restrict__ base, size_t n,
                              const PlaneShift* __restrict__ shifts, size_t total,
                              Job* __restrict__ out) {
  dependency_wait();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    Job j = base[i % n];
    const PlaneShift s = shifts[i / n];
    for (int p = 0; p < 3; ++p) {
      if (j.k.plane[p]) j.k.plane[p] += s.k[p];
      if (j.v.plane[p]) j.v.plane[p] += s.v[p];
    }
    out[i] = j;
  }
}

template <class Job>
void expand(const Job* base, size_t n, const PlaneShift* shifts, size_t layers, Job* out,
            cudaStream_t stream) {
  const size_t total = n * layers;
  if (total == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((total + 127) / 128, 65535));
  launch("expand_jobs", expand_kernel<Job>, blocks, 128, 0, stream, base, n, shifts, total, out);
}

}  // namespace

void expand_jobs(const KvWrite* base, size_t n, const PlaneShift* shifts, size_t layers,
                 KvWrite* out, cudaStream_t stream) {
  expand(base, n, shifts, layers, out, stream);
}

void expand_jobs(const AttentionJob* base, size_t n, const PlaneShift* shifts, size_t layers,
                 AttentionJob* out, cudaStream_t stream) {
  expand(base, n, shifts, layers, out, stream);
}

void gather_rows(const float* x, const uint32_t* rows, size_t n_rows, size_t dim, float* out,
                 cudaStream_t stream) {
  if (n_rows == 0) return;
  launch("gather_rows", gather_rows_kernel, static_cast<unsigned>(n_rows), 256, 0, stream, x, rows,
         dim, out);
}

void f32_to_f16(const float* x, size_t n, uint16_t* out, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 65535));
  launch("f32_to_f16", f32_to_f16_kernel, blocks, 256, 0, stream, x, n,
         reinterpret_cast<__half*>(out));
}

}  // namespace ferry::cuda
