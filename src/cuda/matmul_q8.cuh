// Internal to src/cuda (plus its tests and benchmark): the tile variants
// behind cuda::matmul_q8 (MatmulMode::Int8 on the GPU), so that tests can
// bit-compare every variant and the benchmark can time each one. Host
// declarations only.
//
// Every variant computes every output element with the same arithmetic (see
// matmul_q8.cu); they differ only in how the [n_out, n_rows] output is cut
// into CTA tiles and in the pipeline depth.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "cuda/matmul_tc.cuh"

namespace ferry::cuda::q8 {

// bk is always 256 (one super-block per pipeline stage).
size_t n_configs();
const tc::TileConfig& config(size_t i);

// The variant matmul_q8 uses for this shape (an index into config()).
size_t choose_config(size_t n_out, size_t n_rows);

// matmul_q8 / matmul_q8_many with the variant forced (same preconditions,
// same results).
void matmul_q8_with(size_t config, const uint8_t* w, DType type, size_t n_in, size_t n_out,
                    const int8_t* codes, const float* d, const float* dsum, size_t n_rows, float* y,
                    cudaStream_t stream);
void matmul_q8_many_with(size_t config, std::span<const uint8_t* const> w, DType type, size_t n_in,
                         std::span<const size_t> n_out, const int8_t* codes, const float* d,
                         const float* dsum, size_t n_rows, std::span<float* const> y,
                         cudaStream_t stream);

}  // namespace ferry::cuda::q8
