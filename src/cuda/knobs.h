// FERRY_CUDA_* environment variables: measuring knobs that turn one of the
// CUDA backend's paths off or fix one of its choices (docs/CUDA.md lists
// them). Each is read where it applies, usually once per process.
#pragma once

#include <cstddef>

namespace ferry::cuda {

// Whether variable `name` is set to "0": a path that is on unless turned off.
bool knob_off(const char* name);

// Variable `name` as an unsigned decimal number, or `fallback` when it is
// unset, empty or not wholly such a number.
size_t knob_size(const char* name, size_t fallback);

}  // namespace ferry::cuda
