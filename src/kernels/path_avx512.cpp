#define FERRY_VEC_AVX512
#define FERRY_PATH_NAMESPACE avx512
#include "kernels/path_impl.h"

namespace ferry::kernels {
const PathKernels& avx512_kernels() {
  return avx512::table();
}
}  // namespace ferry::kernels
