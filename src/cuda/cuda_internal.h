// Small kernels the CUDA backend needs beside cuda_ops.h (same conventions:
// device pointers, enqueued on `stream`, launch errors checked).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cuda_ops.h"

namespace ferry::cuda {

// out[i, :] = x[rows[i], :] for rows of `dim` floats.
void gather_rows(const float* x, const uint32_t* rows, size_t n_rows, size_t dim, float* out,
                 cudaStream_t stream);

// out[i] = f16(x[i]) (round to nearest even), for cuBLAS's f16 operands.
void f32_to_f16(const float* x, size_t n, uint16_t* out, cudaStream_t stream);

// How one layer's KV planes sit relative to another's with the same
// layout: a byte offset per plane of each side.
struct PlaneShift {
  int64_t k[3] = {0, 0, 0}, v[3] = {0, 0, 0};
};
// out[l * n + t] = base[t] with its planes moved by shifts[l], for every
// layer l < layers: a step's per-layer job lists made on the device from
// one list built on the host.
void expand_jobs(const KvWrite* base, size_t n, const PlaneShift* shifts, size_t layers,
                 KvWrite* out, cudaStream_t stream);
void expand_jobs(const AttentionJob* base, size_t n, const PlaneShift* shifts, size_t layers,
                 AttentionJob* out, cudaStream_t stream);

// attention() with its kernel chosen: one block per job (Auto's choice
// for kFewJobs to kManyJobs jobs; to kManyJobs / 2 for the tensor-core
// kernels of f16, bf16 and affine K/V), one warp per job (many), or one block
// per (job, head, virtual warp) and a merge (fewer than kFewJobs, with a
// workspace of attention_workspace_floats). All give bit-identical
// outputs; tests compare them.
// Shared: the per-warp kernels with a block's tiles staged once for jobs
// whose keys are prefixes of each other (tensor-core tiles of dense K/V;
// elsewhere PerWarp).
enum class AttentionVariant { Auto, PerBlock, PerWarp, Split, Shared };
inline constexpr size_t kFewJobs = 32, kManyJobs = 512;
void attention_variant(const AttentionJob* jobs, size_t n_jobs,
                       const kernels::AttentionShape& shape, const AttentionFormats& formats,
                       AttentionVariant variant, float* workspace, cudaStream_t stream);

}  // namespace ferry::cuda
