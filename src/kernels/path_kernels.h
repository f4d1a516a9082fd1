// Internal: the per-path kernel table. Each path is one translation unit
// (path_reference.cpp, path_avx2.cpp, path_avx512.cpp) that includes
// path_impl.h compiled with that path's ISA.
#pragma once

#include "kernels/ops.h"

namespace ferry::kernels {

struct PathKernels {
  float (*dot)(const float* a, const float* b, size_t n);
  // Columns [j0, j1) of y for all n_rows rows.
  void (*matmul_cols)(const WeightView& w, const float* x, size_t n_rows, float* y, size_t j0,
                      size_t j1);
  // One attention head of one task; scratch holds n_keys + 2 * head_dim floats.
  void (*attention_head)(const AttentionShape& s, const AttentionTask& t, size_t head,
                         float* scratch);
};

const PathKernels& reference_kernels();
const PathKernels& avx2_kernels();
const PathKernels& avx512_kernels();
const PathKernels& kernels_for(CpuPath p);

}  // namespace ferry::kernels
