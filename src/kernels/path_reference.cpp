#define FERRY_PATH_NAMESPACE reference
#include "kernels/path_impl.h"

namespace ferry::kernels {
const PathKernels& reference_kernels() {
  return reference::table();
}
}  // namespace ferry::kernels
