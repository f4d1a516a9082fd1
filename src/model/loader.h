// Helpers shared by the architecture files: typed metadata and tensor
// look-ups that validate shapes and name the culprit on failure.
#pragma once

#include <string>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace ferry::model {

// Reads the llama-family hyperparameters stored under "<arch>.".
ModelConfig read_llama_config(const gguf::File& f, const std::string& arch);

// Tensor `name` as a weight of n_out rows of n_in; throws naming the tensor
// when it is missing or its shape differs.
kernels::WeightView weight(const gguf::File& f, const std::string& name, size_t n_in, size_t n_out);
// A 1-D F32 tensor of n elements (norm weights, rope factors).
const float* vector_f32(const gguf::File& f, const std::string& name, size_t n);

// Touches every tensor's pages so the first step does not page-fault,
// reporting the fraction done.
void prefault(const gguf::File& f, const LoadProgress& progress);

}  // namespace ferry::model
