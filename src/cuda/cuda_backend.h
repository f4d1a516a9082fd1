// The CUDA backend: model::Backend on one NVIDIA GPU (docs/CUDA.md).
//
// Weights are copied to the device at set_backend() in their GGUF types
// (quantized blocks stay quantized). Activations live in one device arena;
// the KV cache's planes are device memory from kv_allocator(), so BatchKv's
// row operations (merge, extend, filter, extract, align, rollback) run as
// device copies with the same bytes as on the CPU. Ops enqueue on one
// stream; the only host synchronisation of a step is the logits' copy
// back (to_host).
//
// Launches: a step shape (the activation sizes a forward asks for) seen
// before is captured once into a CUDA graph and then replayed: the ops of
// later steps of that shape only build their job lists on the host, into
// the same pinned staging the graph's copies read (docs/CUDA.md).
//
// Modes:
// - deterministic (default): every product runs ferry's own kernels
//   (cuda_ops.h), whose reduction order per output is fixed, so a row's
//   logits are bit-identical whatever else is in the batch (dense bf16/f16
//   weights on tensor cores with bf16 activations, GGUF block types on
//   matmul_gguf in f32, or Q4_K / Q6_K on matmul_q8 in int8 mode);
// - fast: products of more than a few rows go through cuBLAS in bf16
//   (whose kernel choice depends on the batch size), for throughput; with
//   fp8, the layers' products read FP8 weights: a W8A16 kernel for up to
//   8 rows, cuBLASLt on FP8 activations above that.
#pragma once

#include <cstddef>
#include <memory>

#include "model/backend.h"

namespace ferry::cuda {

struct CudaOptions {
  int device = 0;
  bool deterministic = true;
  // Replay repeated step shapes (decode steps of the same batch size) as
  // CUDA graphs: one launch per step instead of one per kernel.
  bool graphs = true;
  // How quantized weights multiply (kernels::MatmulMode, as on the CPU):
  // Exact decodes them to f32 (matmul_gguf); Int8 quantizes the activations
  // per 32-element block and takes Q4_K / Q6_K weights to matmul_q8's
  // integer tensor-core products (other types stay on matmul_gguf). The
  // CLI's --matmul (default int8) sets it.
  kernels::MatmulMode matmul = kernels::MatmulMode::Exact;
  // The layers' dense weights (Q/K/V, o, gate, up, down in BF16, F16 or
  // F32) stored as FP8 E4M3 codes with one scale per output column. Up to
  // 8 rows (decode) multiply them against bf16 activations in ferry's
  // gemv_fp8; more rows run on FP8 tensor cores through cuBLASLt, with the
  // call's activations quantized per row (cuda/fp8.h). Halves the bytes a
  // decode step streams. The embedding table and the output head keep
  // their file's type. Needs compute capability 8.9+ and deterministic =
  // false (cuBLASLt's kernel choice depends on the batch); the backend's
  // constructor throws otherwise.
  bool fp8 = false;
};

// Throws ferry::Error("[cuda] ...") when no usable GPU is present.
std::unique_ptr<model::Backend> make_backend(const CudaOptions& opts);

// Whether this build can run CUDA and a device is visible (never throws).
bool device_available();

}  // namespace ferry::cuda
