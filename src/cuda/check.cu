#include "core/error.h"
#include "cuda/cuda_ops.h"

namespace ferry::cuda {

void check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  fail("cuda", what, ": ", cudaGetErrorString(err), " at ", file, ":", line);
}

}  // namespace ferry::cuda
