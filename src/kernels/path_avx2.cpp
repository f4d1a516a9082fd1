#define FERRY_VEC_AVX2
#define FERRY_PATH_NAMESPACE avx2
#include "kernels/path_impl.h"

namespace ferry::kernels {
const PathKernels& avx2_kernels() {
  return avx2::table();
}
}  // namespace ferry::kernels
