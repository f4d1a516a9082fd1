// Small kernels the CUDA backend needs beside cuda_ops.h (same conventions:
// device pointers, enqueued on `stream`, launch errors checked).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ferry::cuda {

// out[i, :] = x[rows[i], :] for rows of `dim` floats.
void gather_rows(const float* x, const uint32_t* rows, size_t n_rows, size_t dim, float* out,
                 cudaStream_t stream);

// out[i] = f16(x[i]) (round to nearest even), for cuBLAS's f16 operands.
void f32_to_f16(const float* x, size_t n, uint16_t* out, cudaStream_t stream);

}  // namespace ferry::cuda
